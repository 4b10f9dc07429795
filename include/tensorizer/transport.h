// tensorizer/transport.h — the one interface every byte source and sink implements.
//
// A Source is a random-access, read-only view of one .tensors object (local file, memory, HTTP,
// S3, Redis). A Sink is where a writer puts one; it becomes visible at its final location only
// on commit(), so a crash or error never leaves something that looks complete. Transports know
// nothing of tensors. Thread-safety: read_scatter() on one Source may be called from several
// threads at once; clone() gives another worker its own connection where that matters.
// write_at() on one Sink may be called concurrently for disjoint ranges.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensorizer/named_range.h"

namespace tensorizer {

// One destination (or origin) buffer of a scatter/gather transfer.
struct IoSlice {
  void* data;
  size_t size;
};

// Steers one long read (Source::read_stream) while it runs, from the reading thread: how far it
// may go, and what has landed. Lets a caller process a long read piece by piece as it streams and
// hand its tail to another reader (the engine's work stealing) without the two touching the same
// bytes.
class StreamBudget {
 public:
  virtual ~StreamBudget() = default;
  // Before bytes [at, at+want) of the read are written: how many of them may be written now
  // (the rest is no longer wanted); 0 ends the read early, successfully.
  virtual uint64_t reserve(uint64_t at, uint64_t want) = 0;
  // Bytes [0, n) of the read have landed in the slices. An exception thrown here ends the read
  // and is rethrown by read_stream().
  virtual void landed(uint64_t n) = 0;
};

class Source {
 public:
  virtual ~Source() = default;
  // Total size of the object in bytes.
  virtual uint64_t size() = 0;
  // The object's size from a request that brings no bytes of it (HTTP, S3: HEAD), for a caller
  // that wants it while size()'s first request waits for a slow server; nullopt where the
  // transport has no such request or it failed (errors are size()'s to report). Safe to call
  // concurrently with size() and reads; makes no request once size() has returned.
  virtual std::optional<uint64_t> size_without_body() { return std::nullopt; }
  // Reads the contiguous byte range starting at `offset` into the slices in order (their sizes
  // add up to the range length). Reads fully or throws Error (kIO, kNotFound, or kFormat when the
  // range runs past the end of the object). Retries transient failures internally.
  virtual void read_scatter(uint64_t offset, const IoSlice* slices, size_t count) = 0;
  // Reads the contiguous range at `offset` into the slices as read_scatter() does, as one long
  // transfer where the transport has one (HTTP, S3: one ranged GET, resumed from the first
  // missing byte on failure), asking `budget` before each write and telling it as bytes land.
  // Returns the bytes delivered: the whole range, or fewer when the budget stopped the read.
  // Default: read_scatter() in pieces of preferred_read_bytes() (else 16 MiB).
  virtual uint64_t read_stream(uint64_t offset, const IoSlice* slices, size_t count,
                               StreamBudget& budget);
  // Whether one long read per reader beats many short ones: true where each request costs a
  // round trip and, on some servers, a pass over the whole object (HTTP and S3 with ranges).
  virtual bool prefers_long_reads() const { return false; }
  // A handle for another concurrent reader of the same object (may share the underlying file).
  virtual std::unique_ptr<Source> clone() = 0;
  // The URI or path, for messages. Never contains credentials.
  virtual const std::string& uri() const = 0;
  // Bytes delivered so far by this handle and its clones.
  virtual uint64_t bytes_read() const = 0;
  // How many concurrent readers this source serves best; 0 = one per CPU core.
  virtual int preferred_readers() const { return 0; }
  // The most concurrent readers that can help, whatever a caller asks for; 0 = no bound. A server
  // that ignores Range sends the whole object for every request, so its reads must come in order
  // from one reader: a read behind the transfer starts the object again (HTTP without ranges: 1).
  virtual int max_readers() const { return 0; }
  // How many bytes one read request of a load should cover (the planner's item size); 0 = the
  // engine's default (16 MiB).
  virtual uint64_t preferred_read_bytes() const { return 0; }
  // The descriptor of a local regular file behind this source (for memory mapping), else -1.
  virtual int local_fd() const { return -1; }
  // Whether every read is known to come from one version of the object: a local file (pinned by
  // its open descriptor), an HTTP(S)/S3 object with an ETag or Last-Modified (each later request
  // carries it as a precondition). False: a load checks the stored CRC32s instead, so a change
  // mid-load is an error, never a mix. Meaningful once size() was called.
  virtual bool versioned() const { return true; }
  // HTTP(S): the X-Cache-Status header of the first response (a caching proxy's HIT/MISS); else
  // none.
  virtual std::optional<std::string> cache_status() const { return std::nullopt; }
  // How long the first request waited for its first byte: what any request costs before its bytes
  // flow (a round trip, and whatever the server does first). 0 when unknown (local sources).
  // Meaningful once size() was called.
  virtual double first_byte_seconds() const { return 0; }
  // The object's version as its server names it (HTTP(S)/S3: the ETag, else the Last-Modified
  // date), for caches; "" when it has none. Meaningful once size() was called.
  virtual std::string version() const { return ""; }

  void read_at(uint64_t offset, void* dst, size_t size) {
    IoSlice s{dst, size};
    read_scatter(offset, &s, 1);
  }
};

// A Source that forwards every call to another one, which it shares: another handle on an open
// source (clone() gives the inner source's clones), and the base of decorators, which override
// what they change.
class ForwardingSource : public Source {
 public:
  explicit ForwardingSource(std::shared_ptr<Source> inner) : inner_(std::move(inner)) {}
  uint64_t size() override { return inner_->size(); }
  std::optional<uint64_t> size_without_body() override { return inner_->size_without_body(); }
  void read_scatter(uint64_t offset, const IoSlice* slices, size_t count) override {
    inner_->read_scatter(offset, slices, count);
  }
  uint64_t read_stream(uint64_t offset, const IoSlice* slices, size_t count,
                       StreamBudget& budget) override {
    return inner_->read_stream(offset, slices, count, budget);
  }
  bool prefers_long_reads() const override { return inner_->prefers_long_reads(); }
  std::unique_ptr<Source> clone() override { return inner_->clone(); }
  const std::string& uri() const override { return inner_->uri(); }
  uint64_t bytes_read() const override { return inner_->bytes_read(); }
  int preferred_readers() const override { return inner_->preferred_readers(); }
  int max_readers() const override { return inner_->max_readers(); }
  uint64_t preferred_read_bytes() const override { return inner_->preferred_read_bytes(); }
  int local_fd() const override { return inner_->local_fd(); }
  bool versioned() const override { return inner_->versioned(); }
  std::optional<std::string> cache_status() const override { return inner_->cache_status(); }
  std::string version() const override { return inner_->version(); }
  double first_byte_seconds() const override { return inner_->first_byte_seconds(); }

 protected:
  std::shared_ptr<Source> inner_;
};

// The one rule for how many readers a load or copy of `source` runs: `requested` when positive,
// else what the source serves best, else one per usable core; never more than max_readers().
int readers_for(const Source& source, int requested);

class Sink {
 public:
  virtual ~Sink() = default;
  // Writes `count` slices contiguously starting at `offset`.
  virtual void write_gather(uint64_t offset, const IoSlice* slices, size_t count) = 0;
  // Hint: the final object will be about `size` bytes (lets a file sink preallocate).
  virtual void reserve(uint64_t size) { (void)size; }
  // Makes the complete object visible at its final location (rename, upload). Once only.
  virtual void commit() = 0;
  // Discards everything written; the final location is left as it was. Safe to call twice.
  virtual void abort() = 0;
  virtual const std::string& uri() const = 0;
  // Whether this sink stores the object as separate parts (Redis) and must be told them, with
  // set_parts(), before commit(). Writers and copies do so (parts from object_parts()).
  virtual bool wants_parts() const { return false; }
  virtual void set_parts(std::vector<NamedRange> parts) { (void)parts; }

  void write_at(uint64_t offset, const void* data, size_t size) {
    IoSlice s{const_cast<void*>(data), size};
    write_gather(offset, &s, 1);
  }
};

// HTTP(S) requests, S3's included (S3 speaks HTTP): TLS trust, extra headers, read size.
struct HttpOptions {
  std::string ca_file;               // custom CA bundle (curl CAINFO)
  std::string ca_path;               // custom CA directory (curl CAPATH)
  bool allow_untrusted = false;      // skip certificate verification
  std::vector<std::string> headers;  // extra request headers, "Name: value"
  // Bytes per ranged GET of a load; 0 = $TENSORIZER_READ_MIB (MiB) if set, else the engine's
  // 16 MiB. Larger suits servers whose cost is per request, not per byte.
  uint64_t read_bytes = 0;
  // The probe (first request) asks for the whole object and, once its first 512 KiB have come,
  // is paused; the first long read that starts within its reach continues it, so a load by one
  // reader costs one request and one round trip. Up to the socket buffers' worth of bytes are
  // sent for nothing when no load follows. false (and whenever read_bytes is set): the probe asks
  // for 512 KiB only.
  bool continue_probe = true;
  // Redirects one request follows (to http and https only; plain HTTP(S) URIs, never signed S3
  // requests); 0 refuses them (a 3xx answer is then an error naming its status).
  long max_redirects = 50;
};

// S3 credentials and addressing (docs/reference-api.md §5.4); unset ones are resolved from the
// environment and the config files (~/.s3cfg, ~/.aws).
struct S3Options {
  std::optional<std::string> access_key_id;
  std::optional<std::string> secret_access_key;
  std::optional<std::string> session_token;
  std::optional<std::string> endpoint;
  std::optional<std::string> config_path;
  std::optional<std::string> region;
  std::optional<std::string> profile;
  std::optional<bool> force_http;
  std::optional<bool> virtual_hosted;  // unset: path-style, except hosts that need virtual-hosted
};

// `$name` as a number of seconds (> 0) when set and not empty, else `fallback`. A malformed value
// throws Error(kInvalidArgument) naming the variable.
double seconds_from_env(const char* name, double fallback);
// `$name`, or "" when unset.
std::string string_from_env(const char* name);
// `$name` as a number of GiB (> 0) in bytes when set and not empty, else 0. A malformed value
// throws Error(kInvalidArgument) naming the variable.
uint64_t gib_from_env(const char* name);

// How a network transport (HTTP(S), S3, Redis) waits and retries. The timeouts default to
// $TENSORIZER_CONNECT_TIMEOUT and $TENSORIZER_STALL_TIMEOUT (seconds) when those are set.
struct RetryOptions {
  double connect_timeout_s = seconds_from_env("TENSORIZER_CONNECT_TIMEOUT", 10);
  // A transfer slower than kStallFloorBytesPerSecond for this long is stalled: it is abandoned
  // and retried from the first missing byte; failing (or stalling) this long ends the retries.
  double stall_timeout_s = seconds_from_env("TENSORIZER_STALL_TIMEOUT", 30);
  int max_retries = 8;         // consecutive failures without progress, per range
  double retry_delay_s = 0.1;  // first backoff delay; doubles per failure (capped at 5 s)
};

// Local files.
struct FileOptions {
  bool sync_on_commit = false;  // fsync the file before publishing it, and its directory after
  // Write through an unnamed O_TMPFILE inode where the file system has one (a killed writer
  // leaves nothing); false, or where it has none: a hidden ".NAME.tmp-N" file beside the target,
  // removed by the next write into that directory if its writer died.
  bool unnamed_temp = true;
  // A FIFO given as a path to read (/dev/stdin fed by a pipe) is read whole into memory, at most
  // this much; more is an error. 0 (default, unless $TENSORIZER_PIPE_MAX_GIB): the memory
  // available when it is opened.
  uint64_t max_pipe_bytes = gib_from_env("TENSORIZER_PIPE_MAX_GIB");
};

// The most a pipe read whole into memory (a FIFO path; a pipe handed to Python as a file object)
// may hold: options.max_pipe_bytes, else the memory available now.
uint64_t pipe_read_bound(const FileOptions& options);
// Throws kInvalidArgument, naming the bound and how to set it, once `bytes` read from the pipe
// `what` exceed `bound`.
void check_pipe_read(uint64_t bytes, uint64_t bound, const std::string& what);

// A local cache of remote objects (HTTP(S) and S3 objects that have an ETag or Last-Modified
// date): opening one fetches it whole into `dir` once, streaming, and later opens of the same
// version read the local copy (a local file: the mapped route). See src/transport/cache.cc.
struct CacheOptions {
  // Empty: no cache. Default: $TENSORIZER_CACHE_DIR.
  std::string dir = string_from_env("TENSORIZER_CACHE_DIR");
  // Bound on the cache's total size; least recently used entries go first. 0: half the size of
  // the file system holding `dir`. Default: $TENSORIZER_CACHE_MAX_GIB (GiB) when set.
  uint64_t max_bytes = gib_from_env("TENSORIZER_CACHE_MAX_GIB");
};

// Everything open_source/open_sink may need; each transport is handed only its own parts.
struct TransportOptions {
  HttpOptions http;
  S3Options s3;
  RetryOptions retry;
  FileOptions file;
  CacheOptions cache;
};

// Opens a source for a local path or a URI (file://, http://, https://, s3://, redis://).
std::unique_ptr<Source> open_source(const std::string& uri, const TransportOptions& options = {});
// Opens a sink for a local path or a URI (s3://, redis://).
std::unique_ptr<Sink> open_sink(const std::string& uri, const TransportOptions& options = {});

// What the transport behind a path or URI can do, for front ends that offer plain byte streams
// (Python's open_stream) without knowing the schemes themselves.
struct TransportInfo {
  std::string scheme;     // "file" for a plain path
  bool local;             // a local file: the front end may open it itself
  bool writable;          // open_sink() works
  bool sink_takes_bytes;  // the sink stores plain bytes (false: named parts, see wants_parts())
};
// None for a scheme no transport serves.
std::optional<TransportInfo> transport_info(const std::string& uri);

// Copies the object at `src` to `dst` (any two of file, http(s) (read only), s3, redis), streaming
// with `workers` concurrent readers and bounded memory; `progress(done, total)` is called now and
// then from the calling thread. Returns the bytes copied.
uint64_t copy_object(const std::string& src, const std::string& dst,
                     const TransportOptions& options = {}, int workers = 0,
                     const std::function<void(uint64_t, uint64_t)>& progress = {});

// A source over bytes already in memory (tests, Python file-like objects). Shares the buffer.
std::unique_ptr<Source> make_memory_source(std::shared_ptr<const std::string> bytes,
                                           std::string name = "<memory>");

}  // namespace tensorizer
