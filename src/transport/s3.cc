// S3 transport: s3://bucket/key over libcurl with AWS SigV4 (CURLOPT_AWS_SIGV4).
//
// Reads: the HTTP range source (http.cc) with signed ranged GETs, path-style addressing
// (endpoint/bucket/key) unless virtual-hosted is asked for or the host requires it.
//
// Writes, and why they stage: the Writer writes tensor data at precomputed offsets and then
// rewrites the header and index at offset 0 after every batch, and S3 objects cannot be patched.
// So the sink stages the object in a temporary file (system temp dir, deleted afterwards) and on
// commit() uploads it: one PUT when small, else a multipart upload whose parts (16 MiB or more)
// are read from the file by several threads, each part retried with backoff; if any part still
// fails the upload is aborted (AbortMultipartUpload), so nothing half-written ever becomes
// visible. abort() just deletes the temporary file. Memory stays bounded (parts stream from disk).
#include "transport/s3.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/worker_pool.h"
#include "tensorizer/cancel.h"
#include "tensorizer/error.h"
#include "transport/curl_util.h"
#include "transport/http.h"
#include "transport/s3_config.h"
#include "transport/staging.h"

namespace tensorizer {
namespace {

constexpr uint64_t kSinglePutMax = 16ull << 20;
constexpr uint64_t kMinPart = 16ull << 20;
constexpr uint64_t kMaxParts = 10000;
constexpr int kUploadThreads = 8;

struct S3Location {
  std::string bucket, key;
};

S3Location parse_s3_uri(const std::string& uri) {
  // s3://bucket/key (scheme already checked, case-insensitively)
  std::string rest = uri.substr(5);
  size_t slash = rest.find('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 >= rest.size())
    fail(ErrorCode::kInvalidArgument, "'" + uri + "' is not an s3://bucket/key URI");
  return {rest.substr(0, slash), rest.substr(slash + 1)};
}

net::HttpTarget make_target(const std::string& uri, const S3Options& options, bool for_write) {
  S3Location loc = parse_s3_uri(uri);
  s3::ResolvedS3 r = s3::resolve(options, for_write);
  net::HttpTarget t;
  t.display_uri = "s3://" + loc.bucket + "/" + loc.key;
  const std::string key = net::uri_encode(loc.key, true);
  if (r.virtual_hosted) {
    size_t p = r.endpoint.find("://") + 3;
    t.url = r.endpoint.substr(0, p) + loc.bucket + "." + r.endpoint.substr(p) + "/" + key;
  } else {
    t.url = r.endpoint + "/" + net::uri_encode(loc.bucket, false) + "/" + key;
  }
  if (!r.anonymous) {
    t.sigv4 = "aws:amz:" + r.region + ":s3";
    t.access_key = r.access_key;
    t.secret_key = r.secret_key;
    t.session_token = r.session_token;
  }
  t.credential_note = r.credential_source + ", endpoint " + r.endpoint;
  t.s3 = true;
  return t;
}

// Reads a request body from the staged file, [offset, offset+size).
struct BodyReader {
  int fd;
  uint64_t offset, size, pos = 0;
};

size_t read_body(char* buf, size_t size, size_t n, void* user) {
  auto* b = static_cast<BodyReader*>(user);
  size_t want = static_cast<size_t>(std::min<uint64_t>(size * n, b->size - b->pos));
  if (want == 0) return 0;
  ssize_t r;
  do r = ::pread(b->fd, buf, want, static_cast<off_t>(b->offset + b->pos));
  while (r < 0 && errno == EINTR);
  if (r <= 0) return CURL_READFUNC_ABORT;
  b->pos += static_cast<uint64_t>(r);
  return static_cast<size_t>(r);
}

int seek_body(void* user, curl_off_t offset, int origin) {
  auto* b = static_cast<BodyReader*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<uint64_t>(offset) > b->size)
    return CURL_SEEKFUNC_FAIL;
  b->pos = static_cast<uint64_t>(offset);
  return CURL_SEEKFUNC_OK;
}

struct Response {
  long status = 0;
  net::ResponseMeta meta;
  std::string body;
  CURLcode code = CURLE_OK;
  std::string curl_error;
};

size_t collect_header(char* data, size_t size, size_t n, void* user) {
  static_cast<net::ResponseMeta*>(user)->feed(data, size * n);
  return size * n;
}

size_t collect_body(char* data, size_t size, size_t n, void* user) {
  auto* s = static_cast<std::string*>(user);
  if (s->size() < (1u << 20)) s->append(data, size * n);
  return size * n;
}

// One S3 request. `query` is appended to the object URL; `file_body` or `text_body` is sent.
Response request(net::CurlEasy& easy, const net::HttpTarget& target, const HttpOptions& http,
                 const RetryOptions& retry, const char* method, const std::string& query,
                 BodyReader* file_body, const std::string* text_body) {
  CURL* h = easy.get();
  net::HttpTarget t = target;
  t.url += query;
  net::CurlHeaders headers;
  std::vector<std::string> extra;
  if (text_body) extra.push_back("Content-Type: application/xml");
  net::prepare_request(h, t, http, retry, headers, extra);
  Response r;
  char errbuf[CURL_ERROR_SIZE] = {0};
  net::setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  net::setopt(h, CURLOPT_HEADERFUNCTION, collect_header);
  net::setopt(h, CURLOPT_HEADERDATA, &r.meta);
  net::setopt(h, CURLOPT_WRITEFUNCTION, collect_body);
  net::setopt(h, CURLOPT_WRITEDATA, &r.body);
  if (file_body) {
    net::setopt(h, CURLOPT_UPLOAD, 1L);
    net::setopt(h, CURLOPT_READFUNCTION, read_body);
    net::setopt(h, CURLOPT_READDATA, file_body);
    net::setopt(h, CURLOPT_SEEKFUNCTION, seek_body);
    net::setopt(h, CURLOPT_SEEKDATA, file_body);
    net::setopt(h, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(file_body->size));
  } else if (std::strcmp(method, "POST") == 0) {
    net::setopt(h, CURLOPT_POST, 1L);
    net::setopt(h, CURLOPT_POSTFIELDS, text_body ? text_body->data() : "");
    net::setopt(h, CURLOPT_POSTFIELDSIZE_LARGE,
                static_cast<curl_off_t>(text_body ? text_body->size() : 0));
  }
  if (std::strcmp(method, "GET") != 0 && std::strcmp(method, "POST") != 0 &&
      std::strcmp(method, "PUT") != 0)
    net::setopt(h, CURLOPT_CUSTOMREQUEST, method);
  r.code = easy.perform();
  net::setopt(h, CURLOPT_ERRORBUFFER, nullptr);
  r.status = r.meta.status;
  if (r.code != CURLE_OK) r.curl_error = net::curl_error_text(r.code, errbuf);
  return r;
}

// Runs `make()` until it returns a 2xx (with no S3 <Error> body), retrying transient failures.
template <typename Make>
Response with_retries(const RetryOptions& options, const net::HttpTarget& target,
                      const std::string& what, Make make) {
  std::string last;
  for (int attempt = 1;; ++attempt) {
    Response r = make();
    const bool error_body = r.body.find("<Error>") != std::string::npos;
    if (r.code == CURLE_OK && r.status >= 200 && r.status < 300 && !error_body) return r;
    bool again;
    if (r.code != CURLE_OK) {
      last = r.curl_error;
      again = net::retryable(r.code);
    } else {
      last = net::describe_status(r.status, r.body, true);
      again = net::retryable_status(r.status) || (error_body && r.status < 300);
      if (r.status == 401 || r.status == 403)
        fail(ErrorCode::kIO, "'" + target.display_uri + "': " + what + ": access denied (" + last +
                                 "); " + target.credential_note);
      if (r.status == 404)
        fail(ErrorCode::kNotFound, "'" + target.display_uri + "': " + what + ": " + last);
    }
    if (!again || attempt > options.max_retries)
      fail(ErrorCode::kIO, "'" + target.display_uri + "': " + what + " failed after " +
                               std::to_string(attempt) + " attempt" + (attempt == 1 ? "" : "s") +
                               " (last: " + last + ")");
    net::sleep_for_seconds(
        net::backoff_delay(attempt, options.retry_delay_s, r.meta.retry_after_s));
  }
}

std::string xml_value(const std::string& body, const std::string& tag) {
  size_t a = body.find("<" + tag + ">");
  if (a == std::string::npos) return "";
  a += tag.size() + 2;
  size_t b = body.find("</" + tag + ">", a);
  return b == std::string::npos ? "" : body.substr(a, b - a);
}

class S3Sink final : public Sink {
 public:
  S3Sink(const std::string& uri, const S3Options& s3, const HttpOptions& http,
         const RetryOptions& retry)
      : target_(make_target(uri, s3, true)), http_(http), retry_(retry), staging_("tz-s3-upload") {}
  ~S3Sink() override { abort(); }

  void write_gather(uint64_t offset, const IoSlice* slices, size_t count) override {
    staging_.write_gather(offset, slices, count, target_.display_uri);
  }
  void reserve(uint64_t size) override { staging_.reserve(size); }

  void commit() override {
    if (done_)
      fail(ErrorCode::kIO, "'" + target_.display_uri + "' was already committed or aborted");
    const uint64_t size = staging_.size();
    if (size <= kSinglePutMax)
      put_whole(size);
    else
      multipart(size);
    done_ = true;
    staging_.remove();
  }

  void abort() override {
    done_ = true;
    staging_.remove();
  }

  const std::string& uri() const override { return target_.display_uri; }

 private:
  void put_whole(uint64_t size) {
    net::CurlEasy h = net::make_easy();
    with_retries(retry_, target_, "upload", [&] {
      BodyReader body{staging_.fd(), 0, size};
      return request(h, target_, http_, retry_, "PUT", "", &body, nullptr);
    });
  }

  void multipart(uint64_t size) {
    net::CurlEasy h = net::make_easy();
    Response created = with_retries(retry_, target_, "starting a multipart upload", [&] {
      return request(h, target_, http_, retry_, "POST", "?uploads=", nullptr, nullptr);
    });
    const std::string upload_id = xml_value(created.body, "UploadId");
    if (upload_id.empty())
      fail(ErrorCode::kIO, "'" + target_.display_uri + "': the server returned no UploadId");
    const std::string id_query = "uploadId=" + net::uri_encode(upload_id, false);
    try {
      uint64_t part = std::max(kMinPart, (size + kMaxParts - 1) / kMaxParts);
      part = (part + 4095) / 4096 * 4096;
      const size_t parts = static_cast<size_t>((size + part - 1) / part);
      std::vector<std::string> etags(parts);
      const int workers = static_cast<int>(std::min<size_t>(kUploadThreads, parts));
      std::vector<net::CurlEasy> handles(static_cast<size_t>(workers));  // a connection per worker
      parallel_for_workers(parts, workers, [&](size_t i, int w) {
        net::CurlEasy& ph = handles[static_cast<size_t>(w)];
        if (!ph) ph = net::make_easy();
        const uint64_t off = i * part, len = std::min(part, size - off);
        Response r = with_retries(retry_, target_, "uploading part " + std::to_string(i + 1), [&] {
          BodyReader body{staging_.fd(), off, len};
          return request(ph, target_, http_, retry_, "PUT",
                         "?partNumber=" + std::to_string(i + 1) + "&" + id_query, &body, nullptr);
        });
        etags[i] = r.meta.etag;
      });
      std::string xml = "<CompleteMultipartUpload>";
      for (size_t i = 0; i < parts; ++i)
        xml += "<Part><PartNumber>" + std::to_string(i + 1) + "</PartNumber><ETag>" + etags[i] +
               "</ETag></Part>";
      xml += "</CompleteMultipartUpload>";
      with_retries(retry_, target_, "completing the multipart upload", [&] {
        return request(h, target_, http_, retry_, "POST", "?" + id_query, nullptr, &xml);
      });
    } catch (...) {
      // Nothing half-written may become visible: drop the parts (even when the upload was
      // cancelled: this request itself is not).
      CancelScope uncancellable(nullptr);
      try {
        request(h, target_, http_, retry_, "DELETE", "?" + id_query, nullptr, nullptr);
      } catch (...) {
      }
      throw;
    }
  }

  net::HttpTarget target_;
  HttpOptions http_;
  RetryOptions retry_;
  StagingFile staging_;
  bool done_ = false;
};

}  // namespace

std::unique_ptr<Source> open_s3_source(const std::string& uri, const S3Options& s3,
                                       const HttpOptions& http, const RetryOptions& retry) {
  return open_http_source(make_target(uri, s3, false), http, retry);
}

std::unique_ptr<Sink> open_s3_sink(const std::string& uri, const S3Options& s3,
                                   const HttpOptions& http, const RetryOptions& retry) {
  return std::make_unique<S3Sink>(uri, s3, http, retry);
}

}  // namespace tensorizer
