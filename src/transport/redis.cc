// Redis transport: the reference key layout of docs/format.md §4,
// `redis://[[user]:password@]host[:port]/prefix` (db 0; credentials sent with AUTH on every
// connection and shown as *** in messages).
//
//   <prefix>:header:0                 file bytes [0, 73+M): prelude and index
//   <prefix>:<name>:<header offset>   the tensor's header bytes
//   <prefix>:<name>:<data offset>     the tensor's data bytes (omitted when empty)
//
// Read side: SCAN `<prefix>:*` (glob characters in the prefix escaped), STRLEN each key, sort by
// the integer after the last ':'; each key is the file slice starting at that offset. size() is
// the end of the last slice plus the 8-byte end-of-tensors marker, which is not stored and reads
// as zeros, so the object is byte-identical to the file it came from (a safetensors object, whose
// first key is `<prefix>:safetensors:0`, has no marker). Reads pipeline GET (a whole key of
// at most 1 MiB) / GETRANGE (1 MiB pieces, see kReplyBytes) over a connection used raw: hiredis
// connects, then our own RESP reader lands each bulk reply's payload straight in the destination
// slices (no intermediate copy of large values). A dropped connection or timeout reconnects and
// resumes at the first missing byte, with the same retry policy as HTTP; connecting and listing
// (SCAN, STRLEN) at open are retried the same way, restarting the listing.
//
// Write side: the Writer patches offsets (data, then headers, then the index at 0), so the sink
// stages the object in a temporary file. The writer (or copy) tells the sink the object's parts
// (object_parts in the codec: the one place the format meets this key layout); the transport
// parses nothing. commit() streams every part into a staging key `<prefix>.tz-staging-<random>:<n>`
// with sendfile(2) (client memory stays bounded whatever the tensor size), then publishes in one
// MULTI/EXEC: RENAME each staging key to its final name and DEL keys of an older object under the
// prefix. abort() (or a failure) deletes the staging keys; the prefix keeps what it had.
#include "transport/redis.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>
#include <unordered_set>

#include "tensorizer/error.h"
#include "tensorizer/named_range.h"
#include "transport/curl_util.h"
#include "transport/slices.h"
#include "transport/staging.h"

namespace tensorizer {
namespace {

constexpr uint64_t kEndMarker = 8;
constexpr size_t kPipelineCommands = 256;  // most commands a connection has in flight
// Redis copies a reply's whole value into one output buffer it allocates for that reply, so a GET
// of a tensor-sized key costs the server fresh memory (kernel-zeroed, freed after) the size of
// the tensor: 19% of all CPU in a profile of a 1 GB load. Reads ask for at most kReplyBytes per
// command (GETRANGE) and keep at most kInFlightBytes of replies asked for per connection, so the
// server reuses a few buffers: 1.9-2.0 GB/s against 1.0 with whole-key GETs (redis 7.0, 1 GB,
// loopback); 512 KiB pieces or 8 in flight were slower.
constexpr uint64_t kReplyBytes = 1ull << 20;
constexpr uint64_t kInFlightBytes = 4ull << 20;

struct RedisAddress {
  std::string host;
  int port = 6379;
  std::string prefix;
  std::string user, password;  // AUTH after connecting, when a password was given
  std::string uri;             // as given, the credentials replaced by *** (for messages)
};

// %XX escapes of a URI's user information decoded (a password may hold ':' or '@').
std::string percent_decoded(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(s.substr(i + 1, 2), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(s[i]);
    }
  }
  return out;
}

// redis://[[user]:password@]host[:port]/prefix, as Redis clients write credentials: a password
// alone authenticates the default user.
RedisAddress parse_redis_uri(const std::string& uri) {
  RedisAddress a;
  std::string rest = uri.substr(8);  // after "redis://"
  size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash);
  a.prefix = slash == std::string::npos ? "" : rest.substr(slash + 1);
  a.uri = uri;
  if (const size_t at = hostport.rfind('@'); at != std::string::npos) {
    const std::string userinfo = hostport.substr(0, at);
    const size_t colon = userinfo.find(':');
    if (colon == std::string::npos)
      fail(ErrorCode::kInvalidArgument,
           "'redis://***@" + rest.substr(at + 1) +
               "' names a user without a password: write redis://user:password@host/prefix");
    a.user = percent_decoded(userinfo.substr(0, colon));
    a.password = percent_decoded(userinfo.substr(colon + 1));
    hostport = hostport.substr(at + 1);
    a.uri = "redis://***@" + rest.substr(at + 1);
  }
  size_t colon = hostport.rfind(':');
  if (colon != std::string::npos) {
    a.host = hostport.substr(0, colon);
    a.port = std::atoi(hostport.c_str() + colon + 1);
  } else {
    a.host = hostport;
  }
  if (a.host.empty()) a.host = "127.0.0.1";
  if (a.prefix.empty() || a.port <= 0 || a.port > 65535)
    fail(ErrorCode::kInvalidArgument,
         "'" + a.uri + "' is not a redis://[[user]:password@]host[:port]/prefix URI");
  return a;
}

struct ContextDeleter {
  void operator()(redisContext* c) const { redisFree(c); }
};
using Context = std::unique_ptr<redisContext, ContextDeleter>;

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

timeval to_timeval(double s) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(s);
  tv.tv_usec = static_cast<suseconds_t>((s - static_cast<double>(tv.tv_sec)) * 1e6);
  return tv;
}

// One command's reply; null when the connection failed (c->err says why).
Reply send(redisContext* c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const auto& s : args) {
    argv.push_back(s.data());
    lens.push_back(s.size());
  }
  return Reply(static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(args.size()), argv.data(), lens.data())));
}

// Credentials the server refused: retrying cannot help, unlike a lost connection.
struct AccessDenied : Error {
  explicit AccessDenied(const std::string& message) : Error(ErrorCode::kIO, message) {}
};

Reply command(redisContext* c, const RedisAddress& a, const std::vector<std::string>& args) {
  Reply r = send(c, args);
  if (!r)
    fail(ErrorCode::kIO,
         "'" + a.uri + "': Redis " + args[0] + " failed: " + (c->err ? c->errstr : "no reply"));
  if (r->type == REDIS_REPLY_ERROR)
    fail(ErrorCode::kIO,
         "'" + a.uri + "': Redis " + args[0] + " failed: " + std::string(r->str, r->len));
  return r;
}

// Connects and authenticates when the URI holds credentials (throws kIO naming the URI on failure,
// AccessDenied when the server refuses them); reads and writes time out after stall_timeout_s.
Context connect(const RedisAddress& a, const RetryOptions& o) {
  Context c(redisConnectWithTimeout(a.host.c_str(), a.port, to_timeval(o.connect_timeout_s)));
  if (!c) fail(ErrorCode::kIO, "'" + a.uri + "': cannot allocate a Redis connection");
  if (c->err) fail(ErrorCode::kIO, "'" + a.uri + "': cannot connect to Redis: " + c->errstr);
  if (o.stall_timeout_s > 0) redisSetTimeout(c.get(), to_timeval(o.stall_timeout_s));
  int buf = 16 << 20;
  setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  if (!a.password.empty()) {
    std::vector<std::string> auth{"AUTH"};
    if (!a.user.empty()) auth.push_back(a.user);
    auth.push_back(a.password);
    Reply r = send(c.get(), auth);
    if (!r)
      fail(ErrorCode::kIO,
           "'" + a.uri + "': Redis AUTH failed: " + (c->err ? c->errstr : "no reply"));
    if (r->type == REDIS_REPLY_ERROR)
      throw AccessDenied("'" + a.uri + "': Redis refused the credentials (" +
                         std::string(r->str, r->len) + ")");
  }
  return c;
}

// Escapes glob characters so SCAN MATCH takes the prefix literally.
std::string glob_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    if (ch == '*' || ch == '?' || ch == '[' || ch == ']' || ch == '\\') out += '\\';
    out += ch;
  }
  return out;
}

// Every key matching `<prefix>:*`.
std::vector<std::string> scan_keys(redisContext* c, const RedisAddress& a,
                                   const std::string& prefix) {
  std::vector<std::string> keys;
  std::string cursor = "0";
  do {
    Reply r = command(c, a, {"SCAN", cursor, "MATCH", glob_escape(prefix) + ":*", "COUNT", "1000"});
    if (r->type != REDIS_REPLY_ARRAY || r->elements != 2)
      fail(ErrorCode::kIO, "'" + a.uri + "': unexpected reply to SCAN");
    cursor.assign(r->element[0]->str, r->element[0]->len);
    const redisReply* list = r->element[1];
    for (size_t i = 0; i < list->elements; ++i)
      keys.emplace_back(list->element[i]->str, list->element[i]->len);
  } while (cursor != "0");
  return keys;
}

// One key = one slice of the file.
struct Slice {
  uint64_t offset;
  uint64_t length;
  std::string key;
};

struct Shared {
  RedisAddress addr;
  RetryOptions options;
  std::vector<Slice> slices;  // sorted, non-empty, non-overlapping
  uint64_t size = 0;
  std::atomic<uint64_t> bytes_read{0};
  std::mutex mu;
  std::vector<Context> idle;
};

// Buffered reader of RESP replies on a raw socket; bulk payloads go straight to their destination.
class RespReader {
 public:
  explicit RespReader(int fd) : fd_(fd) {}

  std::string line() {
    for (;;) {
      for (size_t i = pos_; i + 1 < len_; ++i) {
        if (buf_[i] == '\r' && buf_[i + 1] == '\n') {
          std::string s(buf_ + pos_, i - pos_);
          pos_ = i + 2;
          return s;
        }
      }
      fill();
    }
  }

  // Reads exactly `n` bytes into `dst`; `landed` counts the bytes already in place, so a
  // connection lost part-way still leaves a known prefix delivered.
  void exact(char* dst, uint64_t n, uint64_t& landed) {
    landed = 0;
    const size_t have = std::min<uint64_t>(len_ - pos_, n);
    if (have) {
      std::memcpy(dst, buf_ + pos_, have);
      pos_ += have;
      landed += have;
    }
    while (landed < n) {
      const uint64_t left = n - landed;
      if (left < sizeof buf_) {  // small remainder: through the buffer
        fill();
        size_t k = std::min<uint64_t>(len_ - pos_, left);
        std::memcpy(dst + landed, buf_ + pos_, k);
        pos_ += k;
        landed += k;
        continue;
      }
      ssize_t r =
          ::recv(fd_, dst + landed, static_cast<size_t>(std::min<uint64_t>(left, 1u << 30)), 0);
      check(r);
      if (r > 0) landed += static_cast<uint64_t>(r);
    }
  }

 private:
  void fill() {
    if (pos_ == len_) pos_ = len_ = 0;
    if (len_ == sizeof buf_) {
      std::memmove(buf_, buf_ + pos_, len_ - pos_);
      len_ -= pos_;
      pos_ = 0;
    }
    ssize_t r = ::recv(fd_, buf_ + len_, sizeof buf_ - len_, 0);
    check(r);
    len_ += static_cast<size_t>(r);
  }
  void check(ssize_t r) {
    if (r > 0) return;
    if (r == 0) throw std::runtime_error("connection closed by the server");
    if (errno == EINTR) return;
    if (errno == EAGAIN || errno == EWOULDBLOCK)
      throw std::runtime_error("timed out waiting for data");
    throw std::runtime_error(std::string("receive failed: ") + std::strerror(errno));
  }

  int fd_;
  char buf_[64 * 1024];
  size_t pos_ = 0, len_ = 0;
};

void send_all(int fd, const std::string& bytes) {
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t w = ::send(fd, p, left, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw std::runtime_error(std::string("send failed: ") + std::strerror(errno));
    p += w;
    left -= static_cast<size_t>(w);
  }
}

void append_command(std::string& out, const std::vector<std::string>& args) {
  out += "*" + std::to_string(args.size()) + "\r\n";
  for (const auto& a : args) out += "$" + std::to_string(a.size()) + "\r\n" + a + "\r\n";
}

// A piece of one read: bytes [begin, begin+length) of slice `slice`.
struct Piece {
  size_t slice;
  uint64_t begin, length;
};

class RedisSource final : public Source {
 public:
  explicit RedisSource(std::shared_ptr<Shared> s) : s_(std::move(s)) {}

  uint64_t size() override { return s_->size; }
  // Keys carry no version: a prefix rewritten during a load (by RENAMEs, or key by key as
  // tensorizer writes) is caught by the load's CRC32 check and its second look at the headers.
  bool versioned() const override { return false; }

  void read_scatter(uint64_t offset, const IoSlice* slices, size_t count) override {
    uint64_t total;
    std::vector<IoSlice> rest = slices_within(offset, slices, count, s_->size, uri(), total);
    if (total == 0) return;
    const RetryOptions& o = s_->options;
    uint64_t done = 0;
    int failures = 0;
    double failing_since = -1;  // start of the current run of failures without progress
    Context c;
    for (;;) {
      uint64_t got = 0;
      try {
        if (!c) c = take();
        got = 0;
        read_pieces(c.get(), offset + done, total - done, rest, got);
        done += got;
        give(std::move(c));
        s_->bytes_read += total;
        return;
      } catch (const Error&) {
        throw;
      } catch (const std::exception& e) {
        c.reset();  // the connection's state is unknown: drop it
        done += got;
        if (got > 0) {
          failures = 0;
          failing_since = -1;
        }
        ++failures;
        if (failing_since < 0) failing_since = net::now_seconds();
        const double idle = net::now_seconds() - failing_since;
        if (failures > o.max_retries || (o.stall_timeout_s > 0 && idle >= o.stall_timeout_s))
          fail(ErrorCode::kIO, "'" + uri() + "': reading " + std::to_string(total) +
                                   " bytes at offset " + std::to_string(offset) +
                                   ": gave up at offset " + std::to_string(offset + done) +
                                   " after " + std::to_string(failures) +
                                   " failed attempts (last: " + e.what() + ")");
        double delay = net::backoff_delay(failures, o.retry_delay_s, -1);
        if (o.stall_timeout_s > 0) delay = std::min(delay, std::max(0.0, o.stall_timeout_s - idle));
        net::sleep_for_seconds(delay);
      }
    }
  }

  std::unique_ptr<Source> clone() override { return std::make_unique<RedisSource>(s_); }
  const std::string& uri() const override { return s_->addr.uri; }
  uint64_t bytes_read() const override { return s_->bytes_read.load(); }
  int preferred_readers() const override { return 4; }

 private:
  Context take() {
    {
      std::lock_guard<std::mutex> lock(s_->mu);
      if (!s_->idle.empty()) {
        Context c = std::move(s_->idle.back());
        s_->idle.pop_back();
        return c;
      }
    }
    try {
      return connect(s_->addr, s_->options);
    } catch (const AccessDenied&) {
      throw;
    } catch (const Error& e) {
      throw std::runtime_error(e.what());  // retryable here
    }
  }
  void give(Context c) {
    std::lock_guard<std::mutex> lock(s_->mu);
    s_->idle.push_back(std::move(c));
  }

  // Reads [offset, offset+total) into `dst` (advanced as bytes land; `got` counts them).
  void read_pieces(redisContext* c, uint64_t offset, uint64_t total, std::vector<IoSlice>& dst,
                   uint64_t& got) {
    const auto& sl = s_->slices;
    const uint64_t end = offset + total;
    auto it = std::upper_bound(sl.begin(), sl.end(), offset, [](uint64_t off, const Slice& s) {
      return off < s.offset + s.length;
    });
    std::vector<Piece> pieces;
    uint64_t pos = offset;
    for (size_t i = static_cast<size_t>(it - sl.begin()); i < sl.size() && pos < end; ++i) {
      if (sl[i].offset > pos) break;  // a gap
      const uint64_t b = pos - sl[i].offset,
                     e = std::min(end, sl[i].offset + sl[i].length) - sl[i].offset;
      uint64_t at = b;
      do {
        pieces.push_back({i, at, std::min(kReplyBytes, e - at)});
        at += pieces.back().length;
      } while (at < e);
      pos = sl[i].offset + e;
    }
    const uint64_t stored_end = sl.empty() ? 0 : sl.back().offset + sl.back().length;
    if (pos < end && pos < stored_end)
      fail(ErrorCode::kFormat, "'" + uri() + "': no key holds file offset " + std::to_string(pos) +
                                   " (the keys under the prefix leave a gap)");
    RespReader in(c->fd);
    size_t sent = 0;
    uint64_t asked = 0;  // bytes of the replies sent for and not yet received
    auto send_more = [&](size_t received) {
      std::string out;
      for (; sent < pieces.size() && sent - received < kPipelineCommands &&
             (sent == received || asked + pieces[sent].length <= kInFlightBytes);
           ++sent) {
        const Piece& p = pieces[sent];
        asked += p.length;
        const Slice& s = sl[p.slice];
        if (p.begin == 0 && p.length == s.length)
          append_command(out, {"GET", s.key});
        else
          append_command(out, {"GETRANGE", s.key, std::to_string(p.begin),
                               std::to_string(p.begin + p.length - 1)});
      }
      if (!out.empty()) send_all(c->fd, out);
    };
    for (size_t k = 0; k < pieces.size(); ++k) {
      send_more(k);
      receive(in, pieces[k], dst, got);
      asked -= pieces[k].length;
    }
    // The end-of-tensors marker is not stored: it reads as zeros.
    while (got < total) {
      IoSlice& d = dst.front();
      const size_t n = static_cast<size_t>(std::min<uint64_t>(d.size, total - got));
      std::memset(d.data, 0, n);
      consume(dst, n);
      got += n;
    }
  }

  void receive(RespReader& in, const Piece& p, std::vector<IoSlice>& dst, uint64_t& got) {
    const Slice& s = s_->slices[p.slice];
    const std::string head = in.line();
    if (head.empty() || head[0] != '$') {
      std::string what = head.empty() ? std::string("an empty reply") : head.substr(0, 200);
      fail(ErrorCode::kIO, "'" + uri() + "': Redis answered " + what + " for key '" + s.key + "'");
    }
    const long long n = std::atoll(head.c_str() + 1);
    if (n < 0)
      fail(ErrorCode::kNotFound,
           "'" + uri() + "': key '" + s.key + "' disappeared during the load");
    if (static_cast<uint64_t>(n) != p.length)
      fail(ErrorCode::kFormat, "'" + uri() + "': key '" + s.key +
                                   "' changed during the load (expected " +
                                   std::to_string(p.length) + " bytes at " +
                                   std::to_string(p.begin) + ", got " + std::to_string(n) + ")");
    uint64_t left = p.length;
    while (left > 0) {
      IoSlice& d = dst.front();
      const size_t k = static_cast<size_t>(std::min<uint64_t>(d.size, left));
      uint64_t landed = 0;
      try {
        in.exact(static_cast<char*>(d.data), k, landed);
      } catch (...) {
        consume(dst, static_cast<size_t>(landed));
        got += landed;
        throw;
      }
      consume(dst, k);
      left -= k;
      got += k;
    }
    char crlf[2];
    uint64_t landed = 0;
    in.exact(crlf, 2, landed);
  }

  static void consume(std::vector<IoSlice>& dst, size_t n) {
    IoSlice& d = dst.front();
    d.data = static_cast<char*>(d.data) + n;
    d.size -= n;
    if (d.size == 0) dst.erase(dst.begin());
  }

  std::shared_ptr<Shared> s_;
};

// Parses "<anything>:<digits>" into the offset; false when the key does not end in an integer.
bool key_offset(const std::string& key, uint64_t& offset) {
  size_t colon = key.rfind(':');
  if (colon == std::string::npos || colon + 1 == key.size()) return false;
  offset = 0;
  for (size_t i = colon + 1; i < key.size(); ++i) {
    if (key[i] < '0' || key[i] > '9') return false;
    offset = offset * 10 + static_cast<uint64_t>(key[i] - '0');
  }
  return true;
}

class RedisSink final : public Sink {
 public:
  RedisSink(const std::string& uri, const RetryOptions& options)
      : addr_(parse_redis_uri(uri)), options_(options), staging_("tz-redis-upload") {}
  ~RedisSink() override { abort(); }

  void write_gather(uint64_t offset, const IoSlice* slices, size_t count) override {
    staging_.write_gather(offset, slices, count, addr_.uri);
  }
  void reserve(uint64_t size) override { staging_.reserve(size); }

  void commit() override {
    if (done_) fail(ErrorCode::kIO, "'" + addr_.uri + "' was already committed or aborted");
    std::vector<std::pair<std::string, Slice>> plan = layout();  // final key -> file slice
    Context c = connect(addr_, options_);
    std::random_device rd;
    const std::string stage =
        addr_.prefix + ".tz-staging-" + std::to_string(rd()) + std::to_string(rd());
    try {
      for (size_t i = 0; i < plan.size(); ++i) {
        staged_.push_back(stage + ":" + std::to_string(i));
        upload(c.get(), staged_.back(), plan[i].second);
      }
      std::unordered_set<std::string> keep;
      for (const auto& p : plan) keep.insert(p.first);
      std::vector<std::string> stale;
      for (auto& k : scan_keys(c.get(), addr_, addr_.prefix)) {
        uint64_t off;
        if (!keep.count(k) && key_offset(k, off)) stale.push_back(std::move(k));
      }
      command(c.get(), addr_, {"MULTI"});
      for (size_t i = 0; i < plan.size(); ++i)
        command(c.get(), addr_, {"RENAME", staged_[i], plan[i].first});
      for (const auto& k : stale) command(c.get(), addr_, {"DEL", k});
      Reply r = command(c.get(), addr_, {"EXEC"});
      if (r->type != REDIS_REPLY_ARRAY)
        fail(ErrorCode::kIO, "'" + addr_.uri + "': the publishing transaction failed");
      for (size_t i = 0; i < r->elements; ++i)
        if (r->element[i]->type == REDIS_REPLY_ERROR)
          fail(ErrorCode::kIO,
               "'" + addr_.uri + "': publishing failed: " + std::string(r->element[i]->str));
      staged_.clear();
    } catch (...) {
      discard_staged();
      throw;
    }
    done_ = true;
    staging_.remove();
  }

  void abort() override {
    discard_staged();
    done_ = true;
    staging_.remove();
  }

  const std::string& uri() const override { return addr_.uri; }
  bool wants_parts() const override { return true; }
  void set_parts(std::vector<NamedRange> parts) override { parts_ = std::move(parts); }

 private:
  // The keys of the reference layout: `<prefix>:<part name>:<part offset>` for every part the
  // writer or copy described (object_parts in the codec); this transport parses nothing.
  std::vector<std::pair<std::string, Slice>> layout() {
    if (parts_.empty())
      fail(ErrorCode::kInvalidArgument,
           "'" + addr_.uri +
               "': a Redis object is written by a tensorizer writer or copy, which "
               "say how it is cut into keys; nothing did");
    const uint64_t size = staging_.size();
    std::vector<std::pair<std::string, Slice>> plan;
    for (const NamedRange& p : parts_) {
      if (p.offset + p.size > size)
        fail(ErrorCode::kFormat, "'" + addr_.uri + "': part '" + p.name + "' at offset " +
                                     std::to_string(p.offset) + " ends past the staged " +
                                     std::to_string(size) + " bytes");
      plan.push_back(
          {addr_.prefix + ":" + p.name + ":" + std::to_string(p.offset), {p.offset, p.size, ""}});
    }
    return plan;
  }

  // SET key <file bytes>, the value streamed from the staging file with sendfile(2).
  void upload(redisContext* c, const std::string& key, const Slice& s) {
    std::string head = "*3\r\n$3\r\nSET\r\n$" + std::to_string(key.size()) + "\r\n" + key +
                       "\r\n$" + std::to_string(s.length) + "\r\n";
    try {
      send_all(c->fd, head);
      off_t off = static_cast<off_t>(s.offset);
      uint64_t left = s.length;
      while (left > 0) {
        ssize_t w = ::sendfile(c->fd, staging_.fd(), &off,
                               static_cast<size_t>(std::min<uint64_t>(left, 1u << 30)));
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
          throw std::runtime_error(std::string("sendfile failed: ") + std::strerror(errno));
        left -= static_cast<uint64_t>(w);
      }
      send_all(c->fd, "\r\n");
      RespReader in(c->fd);
      std::string reply = in.line();
      if (reply != "+OK")
        fail(ErrorCode::kIO,
             "'" + addr_.uri + "': storing key '" + key + "' failed: " + reply.substr(0, 200));
    } catch (const Error&) {
      throw;
    } catch (const std::exception& e) {
      fail(ErrorCode::kIO, "'" + addr_.uri + "': storing file bytes at offset " +
                               std::to_string(s.offset) + " failed: " + e.what());
    }
  }

  void discard_staged() {
    if (staged_.empty()) return;
    try {
      Context c = connect(addr_, options_);
      for (const auto& k : staged_) command(c.get(), addr_, {"DEL", k});
    } catch (...) {
      // Best effort: staging keys never match `<prefix>:*`, so readers never see them.
    }
    staged_.clear();
  }

  RedisAddress addr_;
  RetryOptions options_;
  StagingFile staging_;
  std::vector<std::string> staged_;
  std::vector<NamedRange> parts_;
  bool done_ = false;
};

// Lists the keys under the prefix (SCAN, then STRLEN of each, pipelined) as sorted file slices.
// Throws Error; `c->err` is set when the connection itself failed (then the listing may be
// retried).
std::vector<Slice> list_slices(redisContext* c, const RedisAddress& a) {
  const std::vector<std::string> keys = scan_keys(c, a, a.prefix);
  std::vector<Slice> slices;
  for (size_t first = 0; first < keys.size(); first += 1024) {
    const size_t last = std::min(keys.size(), first + 1024);
    for (size_t i = first; i < last; ++i) {
      const char* argv[2] = {"STRLEN", keys[i].data()};
      size_t lens[2] = {6, keys[i].size()};
      redisAppendCommandArgv(c, 2, argv, lens);
    }
    for (size_t i = first; i < last; ++i) {
      void* raw = nullptr;
      if (redisGetReply(c, &raw) != REDIS_OK || !raw)
        fail(ErrorCode::kIO,
             "'" + a.uri + "': Redis STRLEN failed: " + (c->err ? c->errstr : "no reply"));
      Reply r(static_cast<redisReply*>(raw));
      uint64_t off;
      if (r->type != REDIS_REPLY_INTEGER || !key_offset(keys[i], off)) continue;
      if (r->integer > 0) slices.push_back({off, static_cast<uint64_t>(r->integer), keys[i]});
    }
  }
  if (slices.empty())
    fail(ErrorCode::kNotFound, "'" + a.uri + "': no keys under the prefix '" + a.prefix + ":'");
  std::sort(slices.begin(), slices.end(),
            [](const Slice& x, const Slice& y) { return x.offset < y.offset; });
  for (size_t i = 1; i < slices.size(); ++i)
    if (slices[i].offset < slices[i - 1].offset + slices[i - 1].length)
      fail(ErrorCode::kFormat, "'" + a.uri + "': keys '" + slices[i - 1].key + "' and '" +
                                   slices[i].key + "' overlap (" +
                                   std::to_string(slices[i - 1].length) + " bytes at " +
                                   std::to_string(slices[i - 1].offset) + ")");
  return slices;
}

}  // namespace

std::unique_ptr<Source> open_redis_source(const std::string& uri, const RetryOptions& options) {
  auto s = std::make_shared<Shared>();
  s->addr = parse_redis_uri(uri);
  s->options = options;
  // Connecting and listing are retried as reads are: a failed connection or one lost part-way
  // starts the listing again on a new connection, with backoff, until max_retries or
  // stall_timeout_s.
  int failures = 0;
  const double since = net::now_seconds();
  for (;;) {
    Context c;
    try {
      c = connect(s->addr, options);
      s->slices = list_slices(c.get(), s->addr);
      s->idle.push_back(std::move(c));
      break;
    } catch (const AccessDenied&) {
      throw;
    } catch (const Error& e) {
      if (c && !c->err) throw;  // an error reply or a bad layout, not a lost connection
      ++failures;
      const double idle = net::now_seconds() - since;
      if (failures > options.max_retries ||
          (options.stall_timeout_s > 0 && idle >= options.stall_timeout_s))
        fail(ErrorCode::kIO, "listing the keys of '" + s->addr.uri + "' gave up after " +
                                 std::to_string(failures) + " failed attempts (last: " + e.what() +
                                 ")");
      double delay = net::backoff_delay(failures, options.retry_delay_s, -1);
      if (options.stall_timeout_s > 0)
        delay = std::min(delay, std::max(0.0, options.stall_timeout_s - idle));
      net::sleep_for_seconds(delay);
    }
  }
  // A safetensors object (first key `<prefix>:safetensors:0`, safetensors_parts in the codec)
  // has no end marker; every other object is a .tensors file, whose marker is implied.
  const std::string safetensors_first = s->addr.prefix + ":" + kSafetensorsPart + ":0";
  const bool marker = s->slices.front().key != safetensors_first;
  s->size = s->slices.back().offset + s->slices.back().length + (marker ? kEndMarker : 0);
  return std::make_unique<RedisSource>(std::move(s));
}

std::unique_ptr<Sink> open_redis_sink(const std::string& uri, const RetryOptions& options) {
  return std::make_unique<RedisSink>(uri, options);
}

}  // namespace tensorizer
