// libcurl helpers shared by the HTTP(S) and S3 transports (internal header).
//
// One place for: owned easy handles, the options every request gets (TLS
// trust, timeouts, stall detection, user agent, identity encoding), request signing (AWS SigV4 via
// libcurl), response-header parsing, error classification and retry backoff. Never logs or
// formats credentials.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensorizer/error.h"
#include "tensorizer/transport.h"
#include "transport/libcurl.h"

namespace tensorizer::net {

// Where requests go and how they are authenticated; shared by every handle of one object.
struct HttpTarget {
  std::string url;                   // request URL, without credentials
  std::string display_uri;           // what messages show (the http(s) URL, or s3://bucket/key)
  std::vector<std::string> headers;  // extra request headers, "Name: value"
  // AWS SigV4 signing by libcurl; empty sigv4 = unsigned (anonymous) requests.
  std::string sigv4;  // e.g. "aws:amz:us-east-1:s3"
  std::string access_key;
  std::string secret_key;
  std::string session_token;
  std::string credential_note;  // e.g. "credentials from ~/.s3cfg"; added to access errors
  bool s3 = false;              // error bodies are S3 XML (<Code>, <Message>)
};

// An easy handle with its own multi handle, which keeps its connections alive between requests
// and lets perform() wait in short polls, so a cancelled load (tensorizer/cancel.h) stops within
// 100 ms even while the server sends nothing. Move-only.
class CurlEasy {
 public:
  CurlEasy() = default;
  explicit CurlEasy(CURL* h) : easy_(h) {}
  CurlEasy(CurlEasy&& o) noexcept : easy_(o.easy_), multi_(o.multi_), running_(o.running_) {
    o.easy_ = nullptr, o.multi_ = nullptr, o.running_ = false;
  }
  CurlEasy& operator=(CurlEasy&& o) noexcept;
  ~CurlEasy();
  CURL* get() const { return easy_; }
  explicit operator bool() const { return easy_ != nullptr; }
  void reset() { *this = CurlEasy(); }
  // Runs the request set up on the handle, like curl_easy_perform. Throws as check_cancelled()
  // when this thread's load is cancelled meanwhile. With `parked`: returns CURLE_OK as soon as
  // *parked is true (the write callback paused the transfer), leaving the transfer running, to be
  // continued by resume() (or dropped with the handle).
  CURLcode perform(const bool* parked = nullptr);
  // Unpauses a parked transfer and runs it as perform() does (the write callback may be called
  // at once).
  CURLcode resume(const bool* parked = nullptr);
  // A parked transfer is waiting for resume().
  bool running() const { return running_; }
  // The multi handle that carries this easy handle's transfers (created on first use), for
  // callers that drive them step by step; the handle must not be in it during perform().
  CURLM* multi();

 private:
  CURLcode drive(const bool* parked);
  CURL* easy_ = nullptr;
  CURLM* multi_ = nullptr;
  bool running_ = false;  // added to multi_
};

// How long curl waits in one poll before the caller checks for cancellation.
inline constexpr int kPollMs = 100;

// A curl_slist that frees itself.
class CurlHeaders {
 public:
  CurlHeaders() = default;
  CurlHeaders(const CurlHeaders&) = delete;
  CurlHeaders& operator=(const CurlHeaders&) = delete;
  ~CurlHeaders() {
    if (list_) libcurl().slist_free_all(list_);
  }
  void add(const std::string& line);
  curl_slist* get() const { return list_; }

 private:
  curl_slist* list_ = nullptr;
};

// A new easy handle (libcurl is initialised by libcurl(), libcurl.h).
CurlEasy make_easy();

// The CA bundle when the caller gave none: $CURL_CA_BUNDLE, else $SSL_CERT_FILE (as the curl
// tool and OpenSSL users expect), else the first system bundle found (Debian, RHEL, SUSE paths);
// "" leaves libcurl's compiled-in default.
std::string default_ca_file();

// A transfer below this rate for RetryOptions::stall_timeout_s is stalled (a trickling server is
// treated like a silent one).
inline constexpr long kStallFloorBytesPerSecond = 4096;

// Resets `h` and applies what every request gets: TLS trust and extra headers from `http`,
// connect timeout and stall detection (LOW_SPEED over stall_timeout_s) from `retry`, keep-alive,
// user agent, identity encoding, large receive buffer, redirects (HttpOptions::max_redirects), and
// the target's signing. `headers` receives the target's headers plus `extra`, and is installed on
// the handle (it must outlive the request).
void prepare_request(CURL* h, const HttpTarget& target, const HttpOptions& http,
                     const RetryOptions& retry, CurlHeaders& headers,
                     const std::vector<std::string>& extra = {});

// What the response headers said (the last response, when curl saw several).
struct ResponseMeta {
  long status = 0;
  std::optional<uint64_t> content_length;
  bool has_content_range = false;
  uint64_t range_first = 0, range_last = 0;  // "bytes first-last/total"
  std::optional<uint64_t> range_total;       // also set by "bytes */total" (416)
  std::string etag;
  std::string last_modified;
  std::string accept_ranges;
  std::optional<std::string> cache_status;  // X-Cache-Status
  double retry_after_s = -1;
  bool complete = false;  // the blank line after the headers was seen

  // Feeds one header line (as libcurl's header callback gets it). A status line starts anew.
  void feed(const char* line, size_t size);
};

// Extracts <Code> and <Message> from an S3 XML error body ("" when absent).
std::string s3_error_summary(const std::string& body);

// True for curl failures worth retrying (connection refused/dropped/reset, timeouts, short bodies).
bool retryable(CURLcode code);

// "curl: MESSAGE (cURL exit code N)": libcurl's message (the handle's error buffer when it has
// one) and the code, which is also the curl command's exit code (60: the peer's certificate
// could not be verified), as the reference's messages name it.
std::string curl_error_text(CURLcode code, const char* errbuf);
// True for HTTP statuses worth retrying (408, 429, 5xx).
bool retryable_status(long status);
// The delay before retry number `attempt` (1-based): exponential from `base_s`, capped at 5 s,
// with jitter; a server's Retry-After (capped at 10 s) wins when larger.
double backoff_delay(int attempt, double base_s, double retry_after_s);
// Sleeps, checking for cancellation (tensorizer/cancel.h) every 50 ms.
void sleep_for_seconds(double s);
// Seconds on a monotonic clock.
double now_seconds();

// "HTTP 404 Not Found" style text, plus the S3 code/message when the target is S3.
std::string describe_status(long status, const std::string& body, bool s3);

// Percent-encodes everything except RFC 3986 unreserved characters (and '/' when keep_slash).
std::string uri_encode(const std::string& s, bool keep_slash);

// `url` fit for messages: user information in the authority ("user:secret@", "token@") and the
// values of query parameters that carry secrets (signatures, tokens, credentials, keys: presigned
// URLs) become "***"; everything else is kept.
std::string redact_url(const std::string& url);

}  // namespace tensorizer::net
