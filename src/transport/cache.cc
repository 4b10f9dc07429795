// The local cache of remote objects: the second replica on a node loads from local disk.
//
// An entry is one whole version of one object, a plain file named
//   <32 hex of SHA-256(uri)>-<16 hex of SHA-256(version, size)>.tensors
// in the cache directory, so a name only ever holds the bytes of that version: a new ETag or
// Last-Modified date (or size) is another name, and an entry is valid exactly when it exists with
// the object's size. Opening a remote object asks its server for the size and version (the probe
// every load makes anyway), then, holding `<entry>.lock` (flock, exclusive):
//   hit:  the entry exists with the right size: its mtime is set to now (LRU order), and the load
//         reads the local file (page cache warm or not, the engine's mapped and direct routes);
//   miss: the object is fetched into a private file (temp_file.h), mapped and written in place by
//         the workers, one long read per share as loads stream, then published under the entry's
//         name; other versions of the same object are removed, and then the least recently used
//         entries until the cache is within its bound.
// A second loader of the same object waits on the lock, then hits: one download. A fill that fails
// or is interrupted publishes nothing, and the private file goes with its writer, so a partial
// entry is never seen. Eviction takes each victim's lock without waiting and skips those in use;
// a reader that already opened an entry keeps its bytes even if the entry is removed (the open
// descriptor pins the file).
#include "transport/cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "common/worker_pool.h"
#include "tensorizer/cancel.h"
#include "tensorizer/error.h"
#include "tensorizer/hash.h"
#include "transport/file.h"
#include "transport/temp_file.h"

namespace tensorizer {
namespace {

constexpr size_t kUriHexDigits = 32, kVersionHexDigits = 16;
constexpr const char* kSuffix = ".tensors";
constexpr uint64_t kMinShareBytes = 4ull << 20;

[[noreturn]] void fail_cache(const std::string& what, const std::string& path, int err) {
  fail(ErrorCode::kIO, "cache: " + what + " '" + path + "': " + std::strerror(err));
}

std::string sha256_hex(const std::string& text, size_t digits) {
  Sha256 h;
  h.update(text.data(), text.size());
  const auto d = h.finish();
  return to_hex(d.data(), d.size()).substr(0, digits);
}

bool is_entry_name(const std::string& name) {
  const size_t stem = kUriHexDigits + 1 + kVersionHexDigits;
  if (name.size() != stem + std::strlen(kSuffix) || name.compare(stem, std::string::npos, kSuffix))
    return false;
  for (size_t i = 0; i < stem; ++i) {
    const char c = name[i];
    if (i == kUriHexDigits ? c != '-' : !std::isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// An flock(2) on `<entry>.lock`, released (and the descriptor closed) with the object.
class EntryLock {
 public:
  explicit EntryLock(const std::string& entry) : path_(entry + ".lock") {
    fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) fail_cache("cannot create the lock", path_, errno);
  }
  ~EntryLock() { ::close(fd_); }
  EntryLock(const EntryLock&) = delete;
  EntryLock& operator=(const EntryLock&) = delete;

  // Waits for the lock, checking for Ctrl-C and deadlines meanwhile.
  void wait() {
    while (!try_lock()) {
      check_cancelled();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  bool try_lock() {
    while (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      if (errno == EWOULDBLOCK) return false;
      if (errno != EINTR) fail_cache("cannot lock", path_, errno);
    }
    return true;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
};

// Whether `path` holds a whole entry of `size` bytes.
bool entry_valid(const std::string& path, uint64_t size) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
         static_cast<uint64_t>(st.st_size) == size;
}

// Lets every byte of a long read land (the fill wants the whole share).
struct WholeRead final : StreamBudget {
  uint64_t reserve(uint64_t, uint64_t want) override { return want; }
  void landed(uint64_t) override {}
};

// Fetches `size` bytes of `remote` into `fd` (a fresh private file): the file is preallocated (so
// a full disk is an error here, not a fault later), mapped, and filled by N workers, each with one
// long read of a contiguous share, as many shares as pay for their request.
void fill(Source& remote, uint64_t size, int fd, const std::string& what) {
  if (size == 0) return;
  if (const int err = ::posix_fallocate(fd, 0, static_cast<off_t>(size)))
    fail_cache("cannot make room for " + std::to_string(size) + " bytes for", what, err);
  void* map = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED) fail_cache("cannot map the file for", what, errno);
  auto* bytes = static_cast<uint8_t*>(map);
  try {
    int shares = std::min(readers_for(remote, 0), paying_shares(size, remote.first_byte_seconds()));
    shares = static_cast<int>(std::clamp<uint64_t>(size / kMinShareBytes, 1, shares));
    std::vector<std::unique_ptr<Source>> clones;
    for (int i = 1; i < shares; ++i) clones.push_back(remote.clone());
    const uint64_t n = static_cast<uint64_t>(shares);
    parallel_for_workers(n, shares, [&](size_t i, int w) {
      Source& src = w == 0 ? remote : *clones[static_cast<size_t>(w) - 1];
      const uint64_t begin = size * i / n, end = size * (i + 1) / n;
      IoSlice slice{bytes + begin, static_cast<size_t>(end - begin)};
      WholeRead whole;
      if (src.read_stream(begin, &slice, 1, whole) != end - begin)
        fail(ErrorCode::kIO, "'" + remote.uri() + "': a read for the cache ended early");
    });
  } catch (...) {
    ::munmap(map, size);
    throw;
  }
  ::munmap(map, size);
}

// The cache's bound in bytes: `max_bytes`, or half the file system holding `dir`.
uint64_t bound_of(const CacheOptions& cache) {
  if (cache.max_bytes) return cache.max_bytes;
  struct statvfs fs {};
  if (::statvfs(cache.dir.c_str(), &fs) != 0) fail_cache("cannot inspect", cache.dir, errno);
  return static_cast<uint64_t>(fs.f_blocks) * fs.f_frsize / 2;
}

// Removes `path` unless its lock is held (an entry being filled or opened).
void remove_if_idle(const std::string& path) {
  EntryLock lock(path);
  if (!lock.try_lock()) return;
  ::unlink(path.c_str());
  ::unlink(lock.path().c_str());
}

struct Entry {
  std::string path;
  uint64_t size;
  struct timespec mtime;
};

// Removes the other versions of the object whose entries start with `uri_hex`, then the least
// recently used entries until the cache holds at most `bound` bytes. `keep` stays.
void evict(const std::string& dir, const std::string& uri_hex, const std::string& keep,
           uint64_t bound) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return;
  std::vector<Entry> entries;
  uint64_t total = 0;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (!is_entry_name(name)) continue;
    const std::string path = dir + "/" + name;
    struct stat st {};
    if (path == keep || ::stat(path.c_str(), &st) != 0) continue;
    if (name.compare(0, kUriHexDigits, uri_hex) == 0) {
      remove_if_idle(path);
      continue;
    }
    entries.push_back({path, static_cast<uint64_t>(st.st_size), st.st_mtim});
    total += static_cast<uint64_t>(st.st_size);
  }
  ::closedir(d);
  struct stat kept {};
  if (::stat(keep.c_str(), &kept) == 0) total += static_cast<uint64_t>(kept.st_size);
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.mtime.tv_sec != b.mtime.tv_sec ? a.mtime.tv_sec < b.mtime.tv_sec
                                            : a.mtime.tv_nsec < b.mtime.tv_nsec;
  });
  for (const Entry& e : entries) {
    if (total <= bound) break;
    remove_if_idle(e.path);
    if (!entry_valid(e.path, e.size)) total -= e.size;
  }
}

// The local file of an entry, named for messages after the remote object, with what a caching
// proxy in front of it said to the probe.
class CachedSource final : public ForwardingSource {
 public:
  CachedSource(std::shared_ptr<Source> local, std::string uri,
               std::optional<std::string> proxy_status)
      : ForwardingSource(std::move(local)),
        uri_(std::move(uri)),
        proxy_status_(std::move(proxy_status)) {}
  std::unique_ptr<Source> clone() override {
    return std::make_unique<CachedSource>(inner_->clone(), uri_, proxy_status_);
  }
  const std::string& uri() const override { return uri_; }
  std::optional<std::string> cache_status() const override { return proxy_status_; }

 private:
  std::string uri_;
  std::optional<std::string> proxy_status_;
};

}  // namespace

std::unique_ptr<Source> open_cached_source(std::unique_ptr<Source> remote,
                                           const CacheOptions& cache) {
  const uint64_t size = remote->size();
  const std::string version = remote->version();
  if (version.empty()) return remote;  // nothing to tell a stale copy by
  std::error_code ec;
  std::filesystem::create_directories(cache.dir, ec);
  if (ec) fail(ErrorCode::kIO, "cache: cannot create '" + cache.dir + "': " + ec.message());
  const uint64_t bound = bound_of(cache);
  if (size > bound) return remote;

  const std::string uri_hex = sha256_hex(remote->uri(), kUriHexDigits);
  const std::string entry = cache.dir + "/" + uri_hex + "-" +
                            sha256_hex(version + "\n" + std::to_string(size), kVersionHexDigits) +
                            kSuffix;
  const std::string shown = remote->uri() + " (cached as " + entry + ")";
  bool fetched = false;
  std::unique_ptr<Source> local;
  {
    EntryLock lock(entry);
    lock.wait();
    if (entry_valid(entry, size)) {
      ::utimensat(AT_FDCWD, entry.c_str(), nullptr, 0);  // most recently used
    } else {
      TempFile file(entry, /*unnamed=*/true);
      fill(*remote, size, file.fd(), shown);
      file.publish(/*sync=*/false);
      fetched = true;
    }
    local = open_file_source(entry, FileOptions{});
  }
  if (fetched) evict(cache.dir, uri_hex, entry, bound);
  return std::make_unique<CachedSource>(std::move(local), remote->uri(), remote->cache_status());
}

}  // namespace tensorizer
