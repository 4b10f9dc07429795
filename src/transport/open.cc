// URI dispatch: picks the transport for a path or URI. The one place that knows every scheme: one
// row per scheme says how to open a source and a sink, what the sink accepts and whether the
// local cache may keep its objects. Also the environment's say in transport options (*_from_env).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "tensorizer/error.h"
#include "transport/cache.h"
#include "transport/file.h"
#include "transport/http.h"
#include "transport/redis.h"
#include "transport/s3.h"

namespace tensorizer {
namespace {

using SourceOpener = std::unique_ptr<Source> (*)(const std::string& uri,
                                                 const TransportOptions& options);
using SinkOpener = std::unique_ptr<Sink> (*)(const std::string& uri,
                                             const TransportOptions& options);

struct Scheme {
  const char* name;
  SourceOpener open_source;
  SinkOpener open_sink;   // null: read-only
  bool sink_takes_bytes;  // false: the sink stores named parts (Sink::wants_parts)
  bool cacheable;         // remote objects with versions: CacheOptions applies to their sources
};

std::unique_ptr<Source> open_http(const std::string& uri, const TransportOptions& options) {
  const size_t colon = uri.find(':');
  std::string scheme = uri.substr(0, colon);
  std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  net::HttpTarget target;
  target.url = scheme + uri.substr(colon);  // curl wants a lower-case scheme
  target.display_uri = net::redact_url(uri);
  return open_http_source(std::move(target), options.http, options.retry);
}

const Scheme kSchemes[] = {
    {"file",
     [](const std::string& uri, const TransportOptions& o) {
       return open_file_source(uri.substr(7), o.file);
     },
     [](const std::string& uri, const TransportOptions& o) {
       return open_file_sink(uri.substr(7), o.file);
     },
     true, false},
    {"http", open_http, nullptr, false, true},
    {"https", open_http, nullptr, false, true},
    {"s3",
     [](const std::string& uri, const TransportOptions& o) {
       return open_s3_source(uri, o.s3, o.http, o.retry);
     },
     [](const std::string& uri, const TransportOptions& o) {
       return open_s3_sink(uri, o.s3, o.http, o.retry);
     },
     true, true},
    {"redis",
     [](const std::string& uri, const TransportOptions& o) {
       return open_redis_source(uri, o.retry);
     },
     [](const std::string& uri, const TransportOptions& o) {
       return open_redis_sink(uri, o.retry);
     },
     false, false},
};

// The scheme of `uri` in lower case; "" for a plain path.
std::string scheme_of(const std::string& uri) {
  size_t pos = uri.find("://");
  if (pos == std::string::npos) return "";
  std::string s = uri.substr(0, pos);
  if (!std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isalnum(c) || c == '+'; }))
    return "";
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

const Scheme* find_scheme(const std::string& name) {
  for (const Scheme& s : kSchemes)
    if (name == s.name) return &s;
  return nullptr;
}

[[noreturn]] void unsupported(const std::string& scheme, const std::string& uri, const char* dir) {
  fail(ErrorCode::kUnsupported, "no " + std::string(dir) + " transport for scheme '" + scheme +
                                    "' (" + net::redact_url(uri) + ")");
}

}  // namespace

std::unique_ptr<Source> open_source(const std::string& uri, const TransportOptions& options) {
  const std::string scheme = scheme_of(uri);
  if (scheme.empty()) return open_file_source(uri, options.file);
  const Scheme* s = find_scheme(scheme);
  if (!s) unsupported(scheme, uri, "read");
  if (s->cacheable && !options.cache.dir.empty()) {
    // A hit needs only the probe's answer: no open transfer behind it.
    TransportOptions bounded = options;
    bounded.http.continue_probe = false;
    return open_cached_source(s->open_source(uri, bounded), options.cache);
  }
  return s->open_source(uri, options);
}

std::unique_ptr<Sink> open_sink(const std::string& uri, const TransportOptions& options) {
  const std::string scheme = scheme_of(uri);
  if (scheme.empty()) return open_file_sink(uri, options.file);
  const Scheme* s = find_scheme(scheme);
  if (!s) unsupported(scheme, uri, "write");
  if (!s->open_sink)
    fail(ErrorCode::kUnsupported,
         "cannot write to '" + net::redact_url(uri) + "': " + scheme + ":// is read-only");
  return s->open_sink(uri, options);
}

namespace {

// `$name` as a finite number > 0 of `unit`s, or `fallback` when unset or empty.
double positive_from_env(const char* name, double fallback, const char* unit) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v, &end);
  if (errno || *end || !std::isfinite(x) || x <= 0)
    fail(ErrorCode::kInvalidArgument,
         std::string(name) + " must be a number of " + unit + " greater than 0, not '" + v + "'");
  return x;
}

}  // namespace

double seconds_from_env(const char* name, double fallback) {
  return positive_from_env(name, fallback, "seconds");
}

uint64_t gib_from_env(const char* name) {
  const double gib = positive_from_env(name, 0, "GiB");
  if (gib >= 1e9) fail(ErrorCode::kInvalidArgument, std::string(name) + " is too large");
  return static_cast<uint64_t>(gib * static_cast<double>(1ull << 30));
}

std::string string_from_env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

std::optional<TransportInfo> transport_info(const std::string& uri) {
  const std::string scheme = scheme_of(uri);
  if (scheme.empty()) return TransportInfo{"file", true, true, true};
  const Scheme* s = find_scheme(scheme);
  if (!s) return std::nullopt;
  return TransportInfo{s->name, scheme == "file", s->open_sink != nullptr, s->sink_takes_bytes};
}

}  // namespace tensorizer
