// HTTP(S) Source with libcurl: ranged GETs written straight into the caller's slices.
//
// Each concurrent read takes an easy handle from the object's pool (a handle keeps its connection
// alive between requests), asks for `Range: bytes=a-b`, and the write callback copies the body
// into the destination slices as it arrives. A failed or short transfer (drop, reset, stall,
// 408/429/5xx) is retried with exponential backoff from the first byte not yet delivered, until
// `max_retries` consecutive failures, or failures without progress for `stall_timeout_s`. The first
// response's ETag (else Last-Modified) pins the object: a later response naming another version is
// an error, never mixed data. Servers that ignore Range (200 with the whole body) are read through
// one whole-object transfer kept open across sequential reads (StreamCursor); such a source prefers
// one reader. The probe itself asks for the whole object and is parked after its first 512 KiB:
// the load's first long read continues it (see HttpOptions::continue_probe).
#include "transport/http.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>

#include "common/stream_copy.h"
#include "tensorizer/cancel.h"
#include "transport/slices.h"

namespace tensorizer {
namespace {

using net::CurlEasy;
using net::ResponseMeta;

constexpr size_t kMaxErrorBody = 8192;
constexpr size_t kHeadBytes = 512 * 1024;    // what the probe asks for (see HttpSource::probe)
constexpr uint64_t kWholeGetSkip = 2 << 20;  // see HttpSource::whole_object_get

// Outcome of one request, for the retry loop.
struct Attempt {
  CURLcode code = CURLE_OK;
  char errbuf[CURL_ERROR_SIZE] = {0};
  ResponseMeta meta;
  std::string error_body;
  uint64_t delivered = 0;  // bytes written into the slices by this attempt
  bool fatal = false;      // stop retrying: `fatal_code` / `fatal_message`
  ErrorCode fatal_code = ErrorCode::kIO;
  std::string fatal_message;
  bool retry = false;  // the callbacks found a retryable condition
  std::string retry_reason;
};

class StreamCursor;

// A transfer to the object's end, paused: the probe's after its head, or a continuation of it
// after the read that continued it had all it wanted.
struct ParkedTransfer {
  CurlEasy handle;  // running, paused
  net::ResponseMeta meta;
  std::string spill;  // bytes [spill_at, position): what came after the last read's end
  uint64_t spill_at = 0;
  uint64_t position = 0;  // stream offset of the next byte the transfer delivers

  // Holds `bytes`, which start at stream offset `at` and end where the transfer stands.
  void hold(uint64_t at, std::string bytes) {
    spill_at = at;
    spill = std::move(bytes);
    position = at + spill.size();
  }
};

struct Shared {
  ~Shared();
  net::HttpTarget target;
  HttpOptions http;
  RetryOptions retry;
  std::mutex mu;
  std::vector<CurlEasy> idle;  // pooled handles (each keeps its connection alive)
  bool probed = false;
  uint64_t size = 0;
  bool ranges = true;
  std::string etag, last_modified;
  std::optional<std::string> cache_status;  // of the first response
  std::string head;         // the object's first bytes, from the probe (servers that honour Range)
  double first_byte_s = 0;  // the probe's wait for its first byte
  std::atomic<uint64_t> bytes_read{0};
  std::mutex stream_mu;                    // serialises reads through the cursor
  std::unique_ptr<StreamCursor> cursor;    // for servers that ignore Range
  std::unique_ptr<ParkedTransfer> parked;  // until a long read continues it

  CurlEasy take() {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!idle.empty()) {
        CurlEasy h = std::move(idle.back());
        idle.pop_back();
        return h;
      }
    }
    return net::make_easy();
  }
  void give(CurlEasy h) {
    std::lock_guard<std::mutex> lock(mu);
    idle.push_back(std::move(h));
  }
};

// One ranged GET in flight: where its bytes go.
struct Transfer {
  Shared* shared;
  Attempt* attempt;
  uint64_t request_first;  // absolute offset of the first byte asked for
  uint64_t want;           // bytes asked for
  uint64_t skip = 0;       // bytes to discard first (server ignored the Range)
  bool unranged = false;   // asked for the whole object on purpose (see whole_object_get)
  // The probe and continuations: bytes after `want` go to `spill`, then the transfer pauses
  // (`parked`) for the next read to continue.
  std::string* spill = nullptr;
  bool parked = false;
  bool checked = false;  // headers validated
  bool body_ok = false;  // a 2xx body we are consuming
  // destination
  const IoSlice* slices = nullptr;
  size_t count = 0;
  size_t slice = 0;
  size_t in_slice = 0;
  // a long read (read_stream): asked before each write, told as bytes land
  StreamBudget* budget = nullptr;
  uint64_t stream_done = 0;            // bytes of the read delivered before this attempt
  bool stopped = false;                // the budget ended the read
  std::exception_ptr error = nullptr;  // thrown by the budget; rethrown after the transfer
};

size_t on_header(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  t->attempt->meta.feed(data, size * n);
  return size * n;
}

// Checks a 2xx response against what was asked and what the object was; false = abort.
bool check_response(Transfer& t) {
  t.checked = true;
  Attempt& a = *t.attempt;
  const ResponseMeta& m = a.meta;
  Shared& s = *t.shared;
  if (m.status < 200 || m.status >= 300)
    return true;  // the body is an error text; classified later
  {
    std::lock_guard<std::mutex> lock(s.mu);
    const bool etag_changed = !s.etag.empty() && !m.etag.empty() && m.etag != s.etag;
    const bool date_changed = s.etag.empty() && m.etag.empty() && !s.last_modified.empty() &&
                              !m.last_modified.empty() && m.last_modified != s.last_modified;
    if (etag_changed || date_changed) {
      a.fatal = true;
      a.fatal_message =
          "the object changed during the load (" +
          (etag_changed ? "ETag " + s.etag + " became " + m.etag
                        : "Last-Modified " + s.last_modified + " became " + m.last_modified) +
          ")";
      return false;
    }
  }
  if (m.status == 206) {
    if (!m.has_content_range || m.range_first != t.request_first) {
      a.fatal = true;
      a.fatal_message = "the server answered a request for offset " +
                        std::to_string(t.request_first) + " with " +
                        (m.has_content_range ? "offset " + std::to_string(m.range_first)
                                             : std::string("no Content-Range"));
      return false;
    }
    std::lock_guard<std::mutex> lock(s.mu);
    if (m.range_total && *m.range_total != s.size && s.probed) {
      a.fatal = true;
      a.fatal_message = "the object changed during the load (size " + std::to_string(s.size) +
                        " became " + std::to_string(*m.range_total) + ")";
      return false;
    }
  } else {
    // 200: the whole object from byte 0, whatever Range said (or as asked).
    t.skip = t.request_first;
    std::lock_guard<std::mutex> lock(s.mu);
    if (!t.unranged) s.ranges = false;
  }
  t.body_ok = true;
  return true;
}

size_t on_body(char* data, size_t size, size_t n, void* user) {
  auto* t = static_cast<Transfer*>(user);
  Attempt& a = *t->attempt;
  const size_t total = size * n;
  if (!t->checked && !check_response(*t)) return 0;
  if (!t->body_ok) {
    if (a.error_body.size() < kMaxErrorBody)
      a.error_body.append(data, std::min(total, kMaxErrorBody - a.error_body.size()));
    return total;
  }
  if (t->spill && a.delivered == t->want) {
    t->parked = true;
    return CURL_WRITEFUNC_PAUSE;  // this write comes again on resume
  }
  size_t pos = 0;
  if (t->skip > 0) {
    size_t k = static_cast<size_t>(std::min<uint64_t>(t->skip, total));
    t->skip -= k;
    pos += k;
  }
  while (pos < total && a.delivered < t->want) {
    while (t->slice < t->count && t->in_slice == t->slices[t->slice].size) {
      ++t->slice;
      t->in_slice = 0;
    }
    const IoSlice& d = t->slices[t->slice];
    size_t k = std::min(total - pos, d.size - t->in_slice);
    if (t->budget) {
      k = static_cast<size_t>(t->budget->reserve(t->stream_done + a.delivered, k));
      if (k == 0) {
        t->stopped = true;
        break;
      }
    }
    char* to = static_cast<char*>(d.data) + t->in_slice;
    if (d.size >= kStreamCopyMinDestination)
      copy_streaming(to, data + pos, k);
    else
      std::memcpy(to, data + pos, k);
    t->in_slice += k;
    pos += k;
    a.delivered += k;
  }
  if (t->budget) {
    try {
      t->budget->landed(t->stream_done + a.delivered);
    } catch (...) {
      t->error = std::current_exception();
      return 0;
    }
    if (t->stopped) return 0;  // the rest is no longer wanted: end the transfer
  }
  if (t->spill && pos < total) {
    t->spill->append(data + pos, total - pos);
    return total;
  }
  // Everything wanted has arrived: stop here (a server ignoring Range keeps sending).
  if (a.delivered == t->want && pos < total) return 0;
  return total;
}

// One whole-object GET kept open across reads, for servers that ignore Range: reads at or after
// the current position continue the transfer (curl's multi interface, paused between reads);
// a read behind it starts a new one. So a sequential reader downloads the object once.
class StreamCursor {
 public:
  explicit StreamCursor(Shared& s) : s_(s), multi_(net::libcurl().multi_init()) {
    if (!multi_) fail(ErrorCode::kIO, "cannot create a libcurl multi handle");
  }
  ~StreamCursor() {
    stop();
    net::libcurl().multi_cleanup(multi_);
  }

  // Reads [offset, offset+total) into `slices` (advanced as bytes land); returns the bytes
  // delivered. On a failure, `error` says why (then the next read starts a new transfer).
  uint64_t read(uint64_t offset, std::vector<IoSlice>& slices, uint64_t total, std::string& error,
                long& status) {
    const std::vector<IoSlice> original = slices;
    uint64_t from_history = 0;
    if (easy_ && offset < pos_ && offset >= history_at_ &&
        pos_ - offset <= history_.size() - (offset - history_at_)) {
      // A read a little behind the stream (e.g. the first tensors after the index): from history.
      from_history = std::min(total, pos_ - offset);
      std::vector<IoSlice>* keep = slices_;
      slices_ = &slices;
      want_ = from_history;
      got_ = skip_ = 0;
      const uint64_t save_pos = pos_;
      consume(history_.data() + (offset - history_at_), static_cast<size_t>(from_history));
      pos_ = save_pos;
      slices_ = keep;
      offset += from_history;
      total -= from_history;
    }
    if (!easy_ || offset < pos_) start();
    slices_ = &slices;
    skip_ = offset - pos_;
    want_ = total;
    got_ = 0;
    drain_leftover();
    while (got_ < want_ && error_.empty()) {
      if (finished_) {
        error_ = result_ != CURLE_OK ? net::curl_error_text(result_, errbuf_)
                                     : "the response ended at byte " + std::to_string(pos_);
        break;
      }
      if (paused_) {
        paused_ = false;
        net::libcurl().easy_pause(easy_.get(),
                                  CURLPAUSE_CONT);  // may deliver buffered data right here
        continue;
      }
      int running = 0;
      net::libcurl().multi_perform(multi_, &running);
      int left = 0;
      while (CURLMsg* m = net::libcurl().multi_info_read(multi_, &left))
        if (m->msg == CURLMSG_DONE) finished_ = true, result_ = m->data.result;
      if (!finished_ && got_ < want_ && !paused_) {
        if (cancel_requested()) {
          stop();
          check_cancelled();
        }
        net::libcurl().multi_poll(multi_, nullptr, 0, net::kPollMs, nullptr);
      }
    }
    status = meta_.status;
    if (!error_.empty()) {
      error = error_;
      stop();
    } else if (from_history == 0 && total <= kHistory) {
      history_.clear();
      for (const IoSlice& sl : original)
        history_.append(static_cast<const char*>(sl.data), sl.size);
      history_at_ = offset;
    }
    slices_ = nullptr;
    return from_history + got_;
  }

 private:
  void start() {
    stop();
    easy_ = net::make_easy();
    headers_ = std::make_unique<net::CurlHeaders>();
    net::prepare_request(easy_.get(), s_.target, s_.http, s_.retry, *headers_);
    net::setopt(easy_.get(), CURLOPT_HEADERFUNCTION, on_header);
    net::setopt(easy_.get(), CURLOPT_HEADERDATA, this);
    net::setopt(easy_.get(), CURLOPT_WRITEFUNCTION, on_data);
    net::setopt(easy_.get(), CURLOPT_WRITEDATA, this);
    net::setopt(easy_.get(), CURLOPT_ERRORBUFFER, errbuf_);
    net::libcurl().multi_add_handle(multi_, easy_.get());
  }

  void stop() {
    if (easy_) {
      net::libcurl().multi_remove_handle(multi_, easy_.get());
      easy_.reset();
    }
    headers_.reset();
    pos_ = 0;
    leftover_.clear();
    leftover_at_ = 0;
    history_.clear();
    history_at_ = 0;
    meta_ = ResponseMeta();
    checked_ = paused_ = finished_ = false;
    result_ = CURLE_OK;
    error_.clear();
    errbuf_[0] = 0;
  }

  static size_t on_header(char* data, size_t size, size_t n, void* user) {
    static_cast<StreamCursor*>(user)->meta_.feed(data, size * n);
    return size * n;
  }

  static size_t on_data(char* data, size_t size, size_t n, void* user) {
    auto* c = static_cast<StreamCursor*>(user);
    const size_t total = size * n;
    if (!c->checked_ && !c->check()) return 0;
    if (!c->slices_ || c->got_ == c->want_) {
      c->paused_ = true;
      return CURL_WRITEFUNC_PAUSE;  // called again with the same bytes once resumed
    }
    size_t used = c->consume(data, total);
    if (used < total) {  // the read is complete: keep the rest for the next one
      c->leftover_.assign(data + used, total - used);
      c->leftover_at_ = 0;
    }
    return total;
  }

  bool check() {
    checked_ = true;
    if (meta_.status < 200 || meta_.status >= 300) {
      error_ = net::describe_status(meta_.status, "", s_.target.s3);
      return false;
    }
    std::lock_guard<std::mutex> lock(s_.mu);
    if ((!s_.etag.empty() && !meta_.etag.empty() && meta_.etag != s_.etag) ||
        (s_.etag.empty() && !s_.last_modified.empty() && !meta_.last_modified.empty() &&
         meta_.last_modified != s_.last_modified)) {
      error_ = "the object changed during the load (its ETag/Last-Modified differs)";
      return false;
    }
    return true;
  }

  // Skips, then copies into the slices; returns the bytes of `data` used.
  size_t consume(const char* data, size_t n) {
    size_t at = static_cast<size_t>(std::min<uint64_t>(skip_, n));
    skip_ -= at;
    pos_ += at;
    while (at < n && got_ < want_) {
      IoSlice& d = slices_->front();
      const size_t k = std::min(n - at, d.size);
      if (d.size >= kStreamCopyMinDestination)
        copy_streaming(d.data, data + at, k);
      else
        std::memcpy(d.data, data + at, k);
      d.data = static_cast<char*>(d.data) + k;
      d.size -= k;
      if (d.size == 0) slices_->erase(slices_->begin());
      at += k;
      got_ += k;
      pos_ += k;
    }
    return at;
  }

  void drain_leftover() {
    if (leftover_at_ >= leftover_.size()) return;
    leftover_at_ += consume(leftover_.data() + leftover_at_, leftover_.size() - leftover_at_);
    if (leftover_at_ == leftover_.size()) leftover_.clear(), leftover_at_ = 0;
  }

  static constexpr uint64_t kHistory = 1 << 20;  // small reads are kept to serve a read just behind

  Shared& s_;
  CURLM* multi_;
  CurlEasy easy_;
  std::unique_ptr<net::CurlHeaders> headers_;
  char errbuf_[CURL_ERROR_SIZE] = {0};
  ResponseMeta meta_;
  bool checked_ = false, paused_ = false, finished_ = false;
  CURLcode result_ = CURLE_OK;
  std::string error_;
  uint64_t pos_ = 0;  // stream offset of the next byte not yet handed out (leftover first)
  std::string leftover_;
  size_t leftover_at_ = 0;
  std::string history_;  // the bytes of the last small read, starting at history_at_
  uint64_t history_at_ = 0;
  // the read in progress
  std::vector<IoSlice>* slices_ = nullptr;
  uint64_t skip_ = 0, want_ = 0, got_ = 0;
};

Shared::~Shared() = default;

class HttpSource final : public Source {
 public:
  explicit HttpSource(std::shared_ptr<Shared> s) : s_(std::move(s)) {}

  uint64_t size() override {
    probe();
    return s_->size;
  }

  // HEAD on a handle of its own (pooled afterwards, for the load's next request: prepare_request
  // resets it). Only a 200 with a Content-Length counts.
  std::optional<uint64_t> size_without_body() override {
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (s_->probed) return s_->size;
    }
    try {
      CurlEasy h = net::make_easy();
      net::CurlHeaders headers;
      net::prepare_request(h.get(), s_->target, s_->http, s_->retry, headers);
      Attempt a;
      Transfer t{s_.get(), &a, 0, 0};
      net::setopt(h.get(), CURLOPT_NOBODY, 1L);
      net::setopt(h.get(), CURLOPT_HEADERFUNCTION, on_header);
      net::setopt(h.get(), CURLOPT_HEADERDATA, &t);
      if (h.perform() != CURLE_OK || a.meta.status != 200 || !a.meta.content_length)
        return std::nullopt;
      s_->give(std::move(h));
      return a.meta.content_length;
    } catch (const std::exception&) {  // cancelled: size() reports it
      return std::nullopt;
    }
  }

  void read_scatter(uint64_t offset, const IoSlice* slices, size_t count) override {
    probe();
    uint64_t total;
    std::vector<IoSlice> rest = slices_within(offset, slices, count, s_->size, uri(), total);
    if (total == 0) return;
    if (offset + total <= s_->head.size()) {  // what the probe brought: no request
      const char* from = s_->head.data() + offset;
      for (const IoSlice& sl : rest) std::memcpy(sl.data, from, sl.size), from += sl.size;
      s_->bytes_read += total;
      return;
    }
    bool ranges;
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      ranges = s_->ranges;
    }
    if (ranges)
      fetch(offset, rest, total, /*probe=*/false);
    else
      fetch_streamed(offset, rest, total);
    s_->bytes_read += total;
  }

  uint64_t read_stream(uint64_t offset, const IoSlice* slices, size_t count,
                       StreamBudget& budget) override {
    probe();
    uint64_t total;
    std::vector<IoSlice> rest = slices_within(offset, slices, count, s_->size, uri(), total);
    if (total == 0) return 0;
    // Short reads (no ranges) or bytes the probe brought: piece by piece through read_scatter.
    if (!prefers_long_reads() || offset + total <= s_->head.size())
      return Source::read_stream(offset, slices, count, budget);
    const uint64_t done = fetch(offset, rest, total, /*probe=*/false, &budget);
    s_->bytes_read += done;
    return done;
  }

  bool prefers_long_reads() const override {
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->probed && s_->ranges;
  }

  std::unique_ptr<Source> clone() override { return std::make_unique<HttpSource>(s_); }
  const std::string& uri() const override { return s_->target.display_uri; }
  uint64_t bytes_read() const override { return s_->bytes_read.load(); }
  int preferred_readers() const override {
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->ranges ? 8 : 1;
  }
  int max_readers() const override {
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->ranges ? 0 : 1;  // one whole-object transfer, read in order (StreamCursor)
  }
  uint64_t preferred_read_bytes() const override { return s_->http.read_bytes; }
  bool versioned() const override {
    std::lock_guard<std::mutex> lock(s_->mu);
    return !s_->etag.empty() || !s_->last_modified.empty();
  }
  std::optional<std::string> cache_status() const override {
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->cache_status;
  }
  double first_byte_seconds() const override {
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->first_byte_s;
  }
  std::string version() const override {
    std::lock_guard<std::mutex> lock(s_->mu);
    return !s_->etag.empty()            ? "etag " + s_->etag
           : !s_->last_modified.empty() ? "last-modified " + s_->last_modified
                                        : "";
  }

 private:
  // First contact: `Range: bytes=0-524287` gives the size (Content-Range total, or the whole
  // body's Content-Length when ranges are ignored), range support and the ETag, and the object's
  // first bytes, which a reader's open reads next (the prelude and a reference-sized index), all
  // in one request: later reads within them need none.
  void probe() {
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (s_->probed) return;
    }
    std::string head(kHeadBytes, '\0');
    std::vector<IoSlice> slices{{head.data(), head.size()}};
    fetch(0, slices, head.size(), /*probe=*/true);
  }

  // Whether a read of [first, first+n) is asked for as the whole object, its first bytes dropped
  // and the transfer ended after its last: when it misses at most kWholeGetSkip bytes at either
  // end (a load streamed by one reader). Costs at most that many bytes more at each end, and saves
  // the servers whose ranged responses cost more than whole ones (moto copies the object for each
  // range and slices it). Only a first attempt: a retry resumes with a range, so that a connection
  // dropped early still makes progress.
  bool whole_object_get(uint64_t first, uint64_t n) const {
    std::lock_guard<std::mutex> lock(s_->mu);
    return s_->ranges && first <= kWholeGetSkip && s_->size - (first + n) <= kWholeGetSkip;
  }

  // Reads [offset, offset+total) into `slices`, retrying from the first missing byte; returns the
  // bytes delivered (all of them, unless `budget` stopped the read).
  uint64_t fetch(uint64_t offset, std::vector<IoSlice>& slices, uint64_t total, bool probe,
                 StreamBudget* budget = nullptr) {
    const RetryOptions& opt = s_->retry;
    uint64_t done = 0;
    int failures = 0;
    double failing_since = -1;  // start of the current run of failures without progress
    std::string last_error;
    std::unique_ptr<ParkedTransfer> parked = probe ? nullptr : take_parked(offset, total);
    std::string spill;  // bytes after the read's end, for the next read through the transfer
    CurlEasy h = s_->take();
    for (;;) {
      Attempt a;
      Transfer t{s_.get(), &a, offset + done, total - done};
      t.slices = slices.data();
      t.count = slices.size();
      t.budget = budget;
      t.stream_done = done;
      if (parked) {
        t.spill = &spill;
        a.code = continue_parked(*parked, t);
        if (t.parked) put_back(std::move(parked));
        parked.reset();  // its connection goes with it, unless the object ended
      } else {
        net::CurlHeaders headers;
        std::vector<std::string> extra;
        t.unranged = !probe && done == 0 && failures == 0 && whole_object_get(offset, total);
        if (probe && s_->http.continue_probe) {
          extra.push_back("Range: bytes=" + std::to_string(offset + done) + "-");
          t.spill = &spill;
        } else if (!t.unranged) {
          extra.push_back("Range: bytes=" + std::to_string(offset + done) + "-" +
                          std::to_string(offset + total - 1));
        }
        if (std::string v = validator(); !v.empty()) extra.push_back(std::move(v));
        net::prepare_request(h.get(), s_->target, s_->http, opt, headers, extra);
        net::setopt(h.get(), CURLOPT_HEADERFUNCTION, on_header);
        net::setopt(h.get(), CURLOPT_HEADERDATA, &t);
        net::setopt(h.get(), CURLOPT_WRITEFUNCTION, on_body);
        net::setopt(h.get(), CURLOPT_WRITEDATA, &t);
        net::setopt(h.get(), CURLOPT_ERRORBUFFER, a.errbuf);
        a.code = h.perform(&t.parked);
        net::setopt(h.get(), CURLOPT_ERRORBUFFER, nullptr);
      }

      if (probe && a.meta.complete && handle_probe(a, slices[0].data, h.get())) {
        park(std::move(h), a, std::move(spill));
        return a.delivered;
      }
      if (t.error) std::rethrow_exception(t.error);  // the connection is dropped with the handle
      if (t.stopped) {
        s_->give(std::move(h));  // curl closes an aborted transfer's connection itself
        return done + a.delivered;
      }
      if (a.delivered > 0) {
        advance(slices, a.delivered);
        done += a.delivered;
        // An attempt abandoned as too slow counts as progress only if it moved more than the
        // floor rate allows in one stall period: a trickling server still fails.
        const double trickle = net::kStallFloorBytesPerSecond * std::max(opt.stall_timeout_s, 1.0);
        if (a.code != CURLE_OPERATION_TIMEDOUT || static_cast<double>(a.delivered) > trickle) {
          failures = 0;
          failing_since = -1;
        }
      }
      if (done == total) {
        if (probe) {
          std::lock_guard<std::mutex> lock(s_->mu);
          if (!s_->probed)
            fail(ErrorCode::kIO, "'" + uri() + "': cannot tell the object's size (HTTP " +
                                     std::to_string(a.meta.status) +
                                     " without Content-Range or Content-Length)");
        }
        s_->give(std::move(h));
        return total;
      }
      if (a.fatal) fail(a.fatal_code, where(offset, total, done) + ": " + a.fatal_message);
      // Classify the failure.
      const long status = a.meta.status;
      if (a.meta.complete && status == 412)
        fail(ErrorCode::kIO, where(offset, total, done) +
                                 ": the object changed during the load (HTTP 412 Precondition "
                                 "Failed to " +
                                 validator() + ")");
      // A redirect with a curl error: curl stopped following it (a loop, another scheme).
      const bool redirect_refused = status >= 300 && status < 400 && a.code != CURLE_OK;
      if (a.meta.complete && status >= 300 && !redirect_refused) {
        std::string text = net::describe_status(status, a.error_body, s_->target.s3);
        if (!net::retryable_status(status)) fail_status(status, text, offset, total, done);
        last_error = text;
      } else if (a.code != CURLE_OK) {
        last_error = net::curl_error_text(a.code, a.errbuf);
        char* last_url = nullptr;  // where the redirects led
        if (redirect_refused &&
            net::getinfo(h.get(), CURLINFO_EFFECTIVE_URL, &last_url) == CURLE_OK && last_url)
          last_error += " after a redirect (HTTP " + std::to_string(status) + ") to " +
                        net::redact_url(last_url);
        if (!net::retryable(a.code))
          fail(ErrorCode::kIO, where(offset, total, done) + ": " + last_error);
      } else {
        last_error = "the response ended early (HTTP " + std::to_string(status) + ", " +
                     std::to_string(done) + " of " + std::to_string(total) + " bytes)";
      }
      ++failures;
      if (failing_since < 0) failing_since = net::now_seconds();
      const double idle = net::now_seconds() - failing_since;
      if (failures > opt.max_retries || (opt.stall_timeout_s > 0 && idle >= opt.stall_timeout_s))
        fail(ErrorCode::kIO, where(offset, total, done) + ": gave up at offset " +
                                 std::to_string(offset + done) + " after " +
                                 std::to_string(failures) + " failed attempt" +
                                 (failures == 1 ? "" : "s") + " (last: " + last_error + ")");
      double delay = net::backoff_delay(failures, opt.retry_delay_s, a.meta.retry_after_s);
      if (opt.stall_timeout_s > 0)
        delay = std::min(delay, std::max(0.0, opt.stall_timeout_s - idle));
      net::sleep_for_seconds(delay);
    }
  }

  // Keeps the probe's paused transfer for a long read to continue (or, when it ended, the bytes
  // it brought after the head), when it brought the whole head of an object served with ranges;
  // otherwise drops it (closing its connection), or pools the handle of a transfer that ended.
  void park(CurlEasy h, const Attempt& a, std::string spill) {
    if (!h.running() && spill.empty()) return s_->give(std::move(h));
    std::lock_guard<std::mutex> lock(s_->mu);
    if (!s_->ranges || a.meta.status != 206 || s_->head.size() != a.delivered || s_->parked) return;
    s_->parked.reset(new ParkedTransfer{std::move(h), a.meta, {}});
    s_->parked->hold(a.delivered, std::move(spill));
  }

  // Parks a continued transfer again, for the next read (the next tensor of a lazy load).
  void put_back(std::unique_ptr<ParkedTransfer> p) {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (!s_->parked) s_->parked = std::move(p);
  }

  // The parked transfer, for a read that starts within the bytes it holds (the head, while the
  // transfer follows it; then its spill) or at most kWholeGetSkip bytes after its position; once
  // the transfer has ended, only for a read within the bytes it holds.
  std::unique_ptr<ParkedTransfer> take_parked(uint64_t offset, uint64_t total) {
    std::lock_guard<std::mutex> lock(s_->mu);
    const ParkedTransfer* p = s_->parked.get();
    if (!p || offset > p->position + kWholeGetSkip) return nullptr;
    if (!p->handle.running() && offset + total > p->position) return nullptr;  // ended: held only
    const uint64_t held_from = p->spill_at == s_->head.size() ? 0 : p->spill_at;
    if (offset < held_from) return nullptr;
    return std::move(s_->parked);
  }

  // The first attempt of a read through the parked transfer: the bytes before its position come
  // from the head and the spill, the rest from the transfer, resumed (its first bytes skipped up
  // to the read's offset) until the read has all it wants; then it pauses again (t.parked).
  CURLcode continue_parked(ParkedTransfer& p, Transfer& t) {
    Attempt& a = *t.attempt;
    a.meta = p.meta;
    t.checked = t.body_ok = true;  // the probe's response, checked then
    uint64_t at = t.request_first;
    auto feed = [&](const std::string& bytes, uint64_t first) {
      if (at < first || at >= first + bytes.size() || t.error || t.stopped) return;
      on_body(const_cast<char*>(bytes.data() + (at - first)), 1, first + bytes.size() - at, &t);
      at = first + bytes.size();
    };
    feed(s_->head, 0);
    feed(p.spill, p.spill_at);
    if (t.error || t.stopped) return CURLE_OK;
    if (a.delivered == t.want) {  // all from the bytes held: the transfer stays as it is
      const uint64_t end = t.request_first + a.delivered;
      if (end > p.spill_at) p.hold(end, p.spill.substr(end - p.spill_at));
      t.parked = true;
      return CURLE_OK;
    }
    t.skip = at - p.position;  // at >= position: take_parked asks for a read that reaches it
    CURL* h = p.handle.get();
    net::setopt(h, CURLOPT_HEADERDATA, &t);
    net::setopt(h, CURLOPT_WRITEDATA, &t);
    net::setopt(h, CURLOPT_ERRORBUFFER, a.errbuf);
    const CURLcode code = p.handle.resume(&t.parked);
    net::setopt(h, CURLOPT_ERRORBUFFER, nullptr);
    // Paused after the read's end, or ended with bytes after it: they are held for the next read.
    if (t.parked || (code == CURLE_OK && a.delivered == t.want && !t.spill->empty())) {
      p.hold(t.request_first + a.delivered, std::move(*t.spill));
      t.parked = true;
    }
    return code;
  }

  // The condition every request after the first carries, so that a server whose object was
  // replaced answers 412 instead of bytes of another version: If-Match with a strong ETag, else
  // If-Unmodified-Since with the Last-Modified date; "" before the first response or without
  // either (see consistent()).
  std::string validator() const {
    std::lock_guard<std::mutex> lock(s_->mu);
    if (!s_->etag.empty() && s_->etag.rfind("W/", 0) != 0) return "If-Match: " + s_->etag;
    if (!s_->last_modified.empty()) return "If-Unmodified-Since: " + s_->last_modified;
    return "";
  }

  // A server without range support: continue one whole-object transfer (see StreamCursor),
  // retrying from the first missing byte (which means from the start of the object again).
  void fetch_streamed(uint64_t offset, std::vector<IoSlice>& slices, uint64_t total) {
    const RetryOptions& opt = s_->retry;
    std::lock_guard<std::mutex> lock(s_->stream_mu);
    if (!s_->cursor) s_->cursor = std::make_unique<StreamCursor>(*s_);
    uint64_t done = 0;
    int failures = 0;
    double failing_since = -1;
    for (;;) {
      std::string error;
      long status = 0;
      const uint64_t got = s_->cursor->read(offset + done, slices, total - done, error, status);
      done += got;
      if (done == total) return;
      if (got > 0) failures = 0, failing_since = -1;
      if (status == 404)
        fail(ErrorCode::kNotFound, "'" + uri() + "' does not exist (" + error + ")");
      if (status >= 400 && !net::retryable_status(status))
        fail(ErrorCode::kIO, where(offset, total, done) + ": " + error);
      if (error.find("changed during the load") != std::string::npos)
        fail(ErrorCode::kIO, where(offset, total, done) + ": " + error);
      ++failures;
      if (failing_since < 0) failing_since = net::now_seconds();
      const double idle = net::now_seconds() - failing_since;
      if (failures > opt.max_retries || (opt.stall_timeout_s > 0 && idle >= opt.stall_timeout_s))
        fail(ErrorCode::kIO,
             where(offset, total, done) + ": gave up at offset " + std::to_string(offset + done) +
                 " after " + std::to_string(failures) + " failed attempts (last: " + error + ")");
      double delay = net::backoff_delay(failures, opt.retry_delay_s, -1);
      if (opt.stall_timeout_s > 0)
        delay = std::min(delay, std::max(0.0, opt.stall_timeout_s - idle));
      net::sleep_for_seconds(delay);
    }
  }

  // Handles the first response, whose body landed at `body`; true when it settled the object's
  // size. Keeps the body as the object's head when it is the whole range asked for.
  bool handle_probe(const Attempt& a, const void* body, CURL* h) {
    const ResponseMeta& m = a.meta;
    std::lock_guard<std::mutex> lock(s_->mu);
    if (s_->probed) return true;
    curl_off_t waited_us = 0;
    if (net::getinfo(h, CURLINFO_STARTTRANSFER_TIME_T, &waited_us) == CURLE_OK)
      s_->first_byte_s = static_cast<double>(waited_us) / 1e6;
    if (m.status == 206 && m.range_total) {
      s_->size = *m.range_total;
    } else if (m.status == 200 && m.content_length) {
      s_->size = *m.content_length;
      s_->ranges = false;
    } else if (m.status == 416 && m.range_total && *m.range_total == 0) {
      s_->size = 0;  // an empty object
    } else {
      return false;
    }
    if (m.status == 200 && m.accept_ranges == "bytes")
      s_->ranges = true;  // full body, yet ranges work
    s_->etag = m.etag;
    s_->last_modified = m.last_modified;
    s_->cache_status = m.cache_status;
    if (m.status == 206 && a.delivered == std::min<uint64_t>(kHeadBytes, s_->size))
      s_->head.assign(static_cast<const char*>(body), a.delivered);
    s_->probed = true;
    return true;
  }

  static void advance(std::vector<IoSlice>& slices, uint64_t n) {
    size_t i = 0;
    while (n > 0 && i < slices.size()) {
      if (n >= slices[i].size) {
        n -= slices[i].size;
        ++i;
      } else {
        slices[i].data = static_cast<char*>(slices[i].data) + n;
        slices[i].size -= n;
        n = 0;
      }
    }
    slices.erase(slices.begin(), slices.begin() + static_cast<std::ptrdiff_t>(i));
  }

  std::string where(uint64_t offset, uint64_t total, uint64_t done) const {
    return "'" + uri() + "': reading " + std::to_string(total) + " bytes at offset " +
           std::to_string(offset) + " (failed at offset " + std::to_string(offset + done) + ")";
  }

  [[noreturn]] void fail_status(long status, const std::string& text, uint64_t offset,
                                uint64_t total, uint64_t done) const {
    std::string msg = where(offset, total, done) + ": " + text;
    if (status == 404) fail(ErrorCode::kNotFound, "'" + uri() + "' does not exist (" + text + ")");
    if (status == 401 || status == 403) {
      msg = "'" + uri() + "': access denied (" + text + ")";
      if (!s_->target.credential_note.empty()) msg += "; " + s_->target.credential_note;
      fail(ErrorCode::kIO, msg);
    }
    if (status == 416) fail(ErrorCode::kFormat, msg);
    fail(ErrorCode::kIO, msg);
  }

  std::shared_ptr<Shared> s_;
};

// TENSORIZER_READ_MIB: the ranged-GET size when the options leave it unset (0 if neither is).
uint64_t read_bytes_from_env() {
  const char* v = std::getenv("TENSORIZER_READ_MIB");
  if (!v || !*v) return 0;
  char* end = nullptr;
  errno = 0;
  const unsigned long long mib = std::strtoull(v, &end, 10);
  if (errno || *end || *v == '-' || mib == 0 || mib > (1ull << 20))
    throw Error(
        ErrorCode::kInvalidArgument,
        std::string("TENSORIZER_READ_MIB must be a whole number of MiB from 1 to 1048576, not '") +
            v + "'");
  return mib << 20;
}

}  // namespace

std::unique_ptr<Source> open_http_source(net::HttpTarget target, const HttpOptions& http,
                                         const RetryOptions& retry) {
  auto s = std::make_shared<Shared>();
  s->target = std::move(target);
  s->http = http;
  s->retry = retry;
  if (s->http.read_bytes == 0) s->http.read_bytes = read_bytes_from_env();
  // A request size asked for is what every request of a load is: no transfer continues the probe.
  if (s->http.read_bytes != 0) s->http.continue_probe = false;
  return std::make_unique<HttpSource>(std::move(s));
}

}  // namespace tensorizer
