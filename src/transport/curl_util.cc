// libcurl helpers shared by the HTTP(S) and S3 transports (see curl_util.h).
#include "transport/curl_util.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "tensorizer/cancel.h"

namespace tensorizer::net {
namespace {

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

bool iequals_prefix(const std::string& line, const char* name, std::string* value) {
  size_t n = std::strlen(name);
  if (line.size() <= n || line[n] != ':') return false;
  for (size_t i = 0; i < n; ++i)
    if (std::tolower(static_cast<unsigned char>(line[i])) !=
        std::tolower(static_cast<unsigned char>(name[i])))
      return false;
  *value = trim(line.substr(n + 1));
  return true;
}

std::string xml_field(const std::string& body, const char* tag) {
  std::string open = std::string("<") + tag + ">", close = std::string("</") + tag + ">";
  size_t a = body.find(open);
  if (a == std::string::npos) return "";
  a += open.size();
  size_t b = body.find(close, a);
  if (b == std::string::npos) return "";
  return body.substr(a, std::min<size_t>(b - a, 300));
}

}  // namespace

void CurlHeaders::add(const std::string& line) {
  curl_slist* next = libcurl().slist_append(list_, line.c_str());
  if (!next) fail(ErrorCode::kIO, "out of memory building HTTP headers");
  list_ = next;
}

CurlEasy& CurlEasy::operator=(CurlEasy&& o) noexcept {
  if (this != &o) {
    this->~CurlEasy();
    easy_ = o.easy_, multi_ = o.multi_, running_ = o.running_;
    o.easy_ = nullptr, o.multi_ = nullptr, o.running_ = false;
  }
  return *this;
}

CurlEasy::~CurlEasy() {
  if (running_) libcurl().multi_remove_handle(multi_, easy_);
  if (easy_) libcurl().easy_cleanup(easy_);
  if (multi_) libcurl().multi_cleanup(multi_);
  easy_ = nullptr, multi_ = nullptr;
}

CURLM* CurlEasy::multi() {
  if (!multi_ && !(multi_ = libcurl().multi_init()))
    fail(ErrorCode::kIO, "cannot create a libcurl multi handle");
  return multi_;
}

CURLcode CurlEasy::perform(const bool* parked) {
  CURLM* m = multi();
  if (libcurl().multi_add_handle(m, easy_) != CURLM_OK) return CURLE_FAILED_INIT;
  running_ = true;
  return drive(parked);
}

CURLcode CurlEasy::resume(const bool* parked) {
  if (!running_) return CURLE_FAILED_INIT;
  libcurl().easy_pause(easy_, CURLPAUSE_CONT);  // may deliver the data it holds right here
  return drive(parked);
}

CURLcode CurlEasy::drive(const bool* parked) {
  CURLM* m = multi_;
  CURLcode result = CURLE_OK;
  for (bool done = false; !done;) {
    int running = 0;
    if (libcurl().multi_perform(m, &running) != CURLM_OK) {
      result = CURLE_FAILED_INIT;
      break;
    }
    int left = 0;
    while (CURLMsg* msg = libcurl().multi_info_read(m, &left))
      if (msg->msg == CURLMSG_DONE) done = true, result = msg->data.result;
    if (done) break;
    if (parked && *parked) return CURLE_OK;  // stays in the multi handle, paused
    if (cancel_requested()) {
      result = CURLE_ABORTED_BY_CALLBACK;
      break;
    }
    libcurl().multi_poll(m, nullptr, 0, kPollMs, nullptr);
  }
  libcurl().multi_remove_handle(m, easy_);
  running_ = false;
  if (result == CURLE_ABORTED_BY_CALLBACK) check_cancelled();
  return result;
}

CurlEasy make_easy() {
  CURL* h = libcurl().easy_init();
  if (!h) fail(ErrorCode::kIO, "cannot create a libcurl handle");
  return CurlEasy(h);
}

std::string default_ca_file() {
  for (const char* var : {"CURL_CA_BUNDLE", "SSL_CERT_FILE"}) {
    const char* v = std::getenv(var);
    if (v && *v) return v;
  }
  // libcurl's compiled-in bundle path is the building system's; a wheel runs on others.
  static const std::string system_bundle = [] {
    for (const char* p : {"/etc/ssl/certs/ca-certificates.crt",  // Debian, Ubuntu, Alpine, Arch
                          "/etc/pki/tls/certs/ca-bundle.crt",    // RHEL, Fedora, Amazon Linux
                          "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
                          "/etc/ssl/ca-bundle.pem",  // SUSE
                          "/etc/ssl/cert.pem"})
      if (::access(p, R_OK) == 0) return std::string(p);
    return std::string();
  }();
  return system_bundle;
}

void prepare_request(CURL* h, const HttpTarget& target, const HttpOptions& http,
                     const RetryOptions& retry, CurlHeaders& headers,
                     const std::vector<std::string>& extra) {
  libcurl().easy_reset(h);  // keeps live connections and caches, drops per-request options
  setopt(h, CURLOPT_URL, target.url.c_str());
  setopt(h, CURLOPT_NOSIGNAL, 1L);
  setopt(h, CURLOPT_USERAGENT, "tensorizer-cpp/0.1 (libcurl)");
  setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
  setopt(h, CURLOPT_BUFFERSIZE, 512L * 1024);
  const long connect_ms = std::max(1L, static_cast<long>(retry.connect_timeout_s * 1000));
  setopt(h, CURLOPT_CONNECTTIMEOUT_MS, connect_ms);
  if (retry.stall_timeout_s > 0) {
    // Slower than the floor rate for stall_timeout_s = a stalled transfer.
    setopt(h, CURLOPT_LOW_SPEED_LIMIT, kStallFloorBytesPerSecond);
    setopt(h, CURLOPT_LOW_SPEED_TIME, std::max(1L, std::lround(retry.stall_timeout_s)));
  }
  const std::string ca_file = http.ca_file.empty() ? default_ca_file() : http.ca_file;
  if (!ca_file.empty()) setopt(h, CURLOPT_CAINFO, ca_file.c_str());
  if (!http.ca_path.empty()) setopt(h, CURLOPT_CAPATH, http.ca_path.c_str());
  if (http.allow_untrusted) {
    setopt(h, CURLOPT_SSL_VERIFYPEER, 0L);
    setopt(h, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!target.s3 && http.max_redirects > 0) {
    // Model hubs and CDNs answer with a redirect to where the bytes are (a signed URL); follow it
    // on every request, so that a short-lived target is asked afresh. S3 requests are signed for
    // their own host, and S3's redirects name a region instead: those stay errors.
    setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    setopt(h, CURLOPT_MAXREDIRS, http.max_redirects);
    setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
  }
  headers.add("Accept-Encoding: identity");
  for (const auto& line : http.headers) headers.add(line);
  for (const auto& line : target.headers) headers.add(line);
  for (const auto& line : extra) headers.add(line);
  if (!target.sigv4.empty()) {
    setopt(h, CURLOPT_AWS_SIGV4, target.sigv4.c_str());
    setopt(h, CURLOPT_USERNAME, target.access_key.c_str());
    setopt(h, CURLOPT_PASSWORD, target.secret_key.c_str());
    // S3 wants the payload hash header; bodies are not hashed (TLS or the part ETag covers them).
    headers.add("x-amz-content-sha256: UNSIGNED-PAYLOAD");
    if (!target.session_token.empty()) headers.add("x-amz-security-token: " + target.session_token);
  }
  setopt(h, CURLOPT_HTTPHEADER, headers.get());
}

void ResponseMeta::feed(const char* data, size_t size) {
  std::string line(data, size);
  if (line.rfind("HTTP/", 0) == 0) {
    *this = ResponseMeta();
    size_t sp = line.find(' ');
    if (sp != std::string::npos) status = std::strtol(line.c_str() + sp + 1, nullptr, 10);
    return;
  }
  if (trim(line).empty()) {
    complete = status >= 200;  // interim 1xx responses are followed by the real one
    return;
  }
  std::string v;
  if (iequals_prefix(line, "Content-Length", &v)) {
    content_length = std::strtoull(v.c_str(), nullptr, 10);
  } else if (iequals_prefix(line, "Content-Range", &v)) {
    // "bytes first-last/total" or "bytes */total"
    size_t sp = v.find(' ');
    std::string spec = sp == std::string::npos ? v : v.substr(sp + 1);
    size_t slash = spec.find('/');
    if (slash != std::string::npos && spec.substr(slash + 1) != "*")
      range_total = std::strtoull(spec.c_str() + slash + 1, nullptr, 10);
    size_t dash = spec.find('-');
    if (spec[0] != '*' && dash != std::string::npos && dash < slash) {
      has_content_range = true;
      range_first = std::strtoull(spec.c_str(), nullptr, 10);
      range_last = std::strtoull(spec.c_str() + dash + 1, nullptr, 10);
    }
  } else if (iequals_prefix(line, "ETag", &v)) {
    etag = v;
  } else if (iequals_prefix(line, "Last-Modified", &v)) {
    last_modified = v;
  } else if (iequals_prefix(line, "X-Cache-Status", &v)) {
    cache_status = v;
  } else if (iequals_prefix(line, "Accept-Ranges", &v)) {
    accept_ranges = v;
  } else if (iequals_prefix(line, "Retry-After", &v)) {
    if (!v.empty() && std::isdigit(static_cast<unsigned char>(v[0])))
      retry_after_s = std::strtod(v.c_str(), nullptr);
  }
}

std::string s3_error_summary(const std::string& body) {
  std::string code = xml_field(body, "Code"), message = xml_field(body, "Message");
  if (code.empty()) return "";
  return message.empty() ? code : code + ": " + message;
}

bool retryable(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_READ_ERROR:
    case CURLE_AGAIN:
      return true;
    default:
      return false;
  }
}

std::string curl_error_text(CURLcode code, const char* errbuf) {
  return std::string("curl: ") + (errbuf && errbuf[0] ? errbuf : libcurl().easy_strerror(code)) +
         " (cURL exit code " + std::to_string(static_cast<int>(code)) + ")";
}

bool retryable_status(long status) { return status == 408 || status == 429 || status >= 500; }

double backoff_delay(int attempt, double base_s, double retry_after_s) {
  static thread_local std::mt19937 rng(std::random_device{}());
  double d = std::min(5.0, base_s * std::pow(2.0, std::max(0, attempt - 1)));
  d *= std::uniform_real_distribution<double>(0.5, 1.0)(rng);
  if (retry_after_s > d) d = std::min(retry_after_s, 10.0);
  return d;
}

void sleep_for_seconds(double s) {
  const double end = now_seconds() + s;
  for (double left = s; left > 0; left = end - now_seconds()) {
    check_cancelled();
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(left, 0.05)));
  }
  check_cancelled();
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string describe_status(long status, const std::string& body, bool s3) {
  std::string text = "HTTP " + std::to_string(status);
  switch (status) {
    case 400:
      text += " Bad Request";
      break;
    case 401:
      text += " Unauthorized";
      break;
    case 403:
      text += " Forbidden";
      break;
    case 404:
      text += " Not Found";
      break;
    case 416:
      text += " Range Not Satisfiable";
      break;
    case 429:
      text += " Too Many Requests";
      break;
    case 500:
      text += " Internal Server Error";
      break;
    case 502:
      text += " Bad Gateway";
      break;
    case 503:
      text += " Service Unavailable";
      break;
    case 504:
      text += " Gateway Timeout";
      break;
    default:
      break;
  }
  if (s3) {
    std::string summary = s3_error_summary(body);
    if (!summary.empty()) text += " (" + summary + ")";
  }
  return text;
}

std::string uri_encode(const std::string& s, bool keep_slash) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' ||
        (keep_slash && c == '/')) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

namespace {

bool secret_parameter(std::string name) {
  std::transform(name.begin(), name.end(), name.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  for (const char* word : {"sig", "token", "credential", "key", "secret", "password", "auth"})
    if (name.find(word) != std::string::npos) return true;
  return false;
}

}  // namespace

std::string redact_url(const std::string& url) {
  std::string out = url;
  const size_t scheme_end = out.find("://");
  const size_t auth_begin = scheme_end == std::string::npos ? 0 : scheme_end + 3;
  const size_t auth_end = std::min(out.find_first_of("/?#", auth_begin), out.size());
  const size_t at = out.substr(0, auth_end).rfind('@');
  if (at != std::string::npos && at >= auth_begin) out.replace(auth_begin, at - auth_begin, "***");
  size_t q = out.find('?');
  if (q == std::string::npos) return out;
  const size_t end = std::min(out.find('#', q), out.size());
  std::string redacted = out.substr(0, q + 1);
  for (size_t pos = q + 1; pos <= end;) {
    const size_t amp = std::min(out.find('&', pos), end);
    std::string param = out.substr(pos, amp - pos);
    const size_t eq = param.find('=');
    if (eq != std::string::npos && secret_parameter(param.substr(0, eq)))
      param.replace(eq + 1, std::string::npos, "***");
    if (pos > q + 1) redacted += '&';
    redacted += param;
    pos = amp + 1;
  }
  redacted += out.substr(end);
  return redacted;
}

}  // namespace tensorizer::net
