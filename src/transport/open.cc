// URI dispatch: picks the transport for a path or URI. The one place that knows every scheme.
#include <algorithm>
#include <cctype>

#include "tensorizer/error.h"
#include "transport/file.h"
#include "transport/http.h"
#include "transport/redis.h"
#include "transport/s3.h"

namespace tensorizer {
namespace {

std::string scheme_of(const std::string& uri) {
  size_t pos = uri.find("://");
  if (pos == std::string::npos) return "";
  std::string s = uri.substr(0, pos);
  if (!std::all_of(s.begin(), s.end(), [](unsigned char c) { return std::isalnum(c) || c == '+'; }))
    return "";
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

[[noreturn]] void unsupported(const std::string& scheme, const std::string& uri, const char* dir) {
  fail(ErrorCode::kUnsupported, "no " + std::string(dir) + " transport for scheme '" + scheme +
                                    "' (" + net::redact_url(uri) + ")");
}

}  // namespace

std::unique_ptr<Source> open_source(const std::string& uri, const TransportOptions& options) {
  std::string scheme = scheme_of(uri);
  if (scheme.empty()) return open_file_source(uri);
  if (scheme == "file") return open_file_source(uri.substr(7));
  if (scheme == "http" || scheme == "https") {
    net::HttpTarget target;
    target.url = scheme + uri.substr(scheme.size());  // curl wants a lower-case scheme
    target.display_uri = net::redact_url(uri);
    return open_http_source(std::move(target), options);
  }
  if (scheme == "s3") return open_s3_source(uri, options);
  if (scheme == "redis") return open_redis_source(uri, options);
  unsupported(scheme, uri, "read");
}

std::unique_ptr<Sink> open_sink(const std::string& uri, const TransportOptions& options) {
  std::string scheme = scheme_of(uri);
  if (scheme.empty()) return open_file_sink(uri, options);
  if (scheme == "file") return open_file_sink(uri.substr(7), options);
  if (scheme == "s3") return open_s3_sink(uri, options);
  if (scheme == "redis") return open_redis_sink(uri, options);
  if (scheme == "http" || scheme == "https")
    fail(ErrorCode::kUnsupported, "cannot write to '" + uri + "': HTTP(S) is read-only");
  unsupported(scheme, uri, "write");
}

}  // namespace tensorizer
