// Local file transport: pread/preadv for reads, a temporary file plus rename for writes.
//
// Reads use preadv(2) straight into the caller's slices (one copy, kernel to destination); a FIFO,
// which has no offsets, is read to its end into memory first.
// Writes go to a private file beside the target, published over it on commit (temp_file.h), so
// the final path never holds a partial file and a killed writer leaves nothing behind. A symbolic
// link is followed, as open(2) follows it: the link stays and the file it names is replaced. A
// device (/dev/null) is written in place, as open(2) would; a directory, FIFO or socket, which
// the writer cannot seek in, is refused before anything is written.
#include "transport/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <random>
#include <utility>

#include "common/available_memory.h"
#include "tensorizer/error.h"
#include "transport/temp_file.h"

namespace tensorizer {
namespace {

std::string errno_text(int err) { return std::strerror(err); }

[[noreturn]] void fail_errno(const std::string& what, const std::string& path, int err) {
  fail(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIO,
       what + " '" + path + "': " + errno_text(err));
}

// The system calls read a path up to its first NUL byte: one inside it would name another file.
void check_no_nul(const std::string& path) {
  if (path.find('\0') != std::string::npos)
    fail(ErrorCode::kInvalidArgument,
         "embedded null byte in path '" + path.substr(0, path.find('\0')) + "\\0...'");
}

constexpr size_t kMaxIov = 512;

// Advances a slice list by `n` bytes, for partial transfers.
void advance(std::vector<iovec>& iov, size_t& first, size_t n) {
  while (n > 0) {
    iovec& v = iov[first];
    if (n >= v.iov_len) {
      n -= v.iov_len;
      ++first;
    } else {
      v.iov_base = static_cast<char*>(v.iov_base) + n;
      v.iov_len -= n;
      n = 0;
    }
  }
}

std::vector<iovec> to_iovecs(const IoSlice* slices, size_t count, uint64_t& total) {
  std::vector<iovec> iov;
  iov.reserve(count);
  total = 0;
  for (size_t i = 0; i < count; ++i) {
    if (slices[i].size == 0) continue;
    iov.push_back({slices[i].data, slices[i].size});
    total += slices[i].size;
  }
  return iov;
}

// Runs preadv/pwritev until every byte moved (the kernel may move fewer bytes per call than asked,
// e.g. at most ~2 GiB); `op` performs one syscall.
template <typename Op>
void transfer_all(std::vector<iovec>& iov, uint64_t offset, Op op, const char* what,
                  const std::string& path, uint64_t total) {
  size_t first = 0;
  uint64_t done = 0;
  while (first < iov.size()) {
    int n = static_cast<int>(std::min(iov.size() - first, kMaxIov));
    ssize_t r = op(&iov[first], n, offset + done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0)
      fail(errno == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIO,
           std::string(what) + " '" + path + "' at offset " + std::to_string(offset + done) + ": " +
               errno_text(errno));
    if (r == 0)
      fail(ErrorCode::kFormat, std::string(what) + " '" + path +
                                   "': unexpected end of file at offset " +
                                   std::to_string(offset + done) + " (" +
                                   std::to_string(total - done) + " bytes missing)");
    advance(iov, first, static_cast<size_t>(r));
    done += static_cast<uint64_t>(r);
  }
}

// Shared open file: one descriptor serves every clone (pread needs no per-reader position).
struct SharedFd {
  int fd = -1;
  std::atomic<uint64_t> bytes_read{0};
  ~SharedFd() {
    if (fd >= 0) ::close(fd);
  }
};

// Everything a pipe delivers until its writer closes it, at most `bound` bytes (check_pipe_read).
std::string read_to_end(int fd, const std::string& path, uint64_t bound) {
  std::string bytes;
  size_t used = 0;
  for (;;) {
    if (used == bytes.size())
      bytes.resize(std::min<uint64_t>(std::max<size_t>(bytes.size() * 2, 1 << 20), bound + 1));
    const ssize_t n = ::read(fd, bytes.data() + used, bytes.size() - used);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail_errno("reading", path, errno);
    if (n == 0) break;
    used += static_cast<size_t>(n);
    check_pipe_read(used, bound, "'" + path + "'");
  }
  bytes.resize(used);
  return bytes;
}

class FileSource final : public Source {
 public:
  FileSource(std::shared_ptr<SharedFd> fd, std::string path, uint64_t size)
      : fd_(std::move(fd)), path_(std::move(path)), size_(size) {}

  uint64_t size() override { return size_; }

  void read_scatter(uint64_t offset, const IoSlice* slices, size_t count) override {
    uint64_t total = 0;
    std::vector<iovec> iov = to_iovecs(slices, count, total);
    if (offset > size_ || total > size_ - offset)
      fail(ErrorCode::kFormat, "read of " + std::to_string(total) + " bytes at offset " +
                                   std::to_string(offset) + " runs past the end of '" + path_ +
                                   "' (" + std::to_string(size_) + " bytes): file truncated?");
    int fd = fd_->fd;
    transfer_all(
        iov, offset,
        [fd](const iovec* v, int n, uint64_t off) {
          return ::preadv(fd, v, n, static_cast<off_t>(off));
        },
        "reading", path_, total);
    fd_->bytes_read += total;
  }

  std::unique_ptr<Source> clone() override {
    return std::make_unique<FileSource>(fd_, path_, size_);
  }
  const std::string& uri() const override { return path_; }
  uint64_t bytes_read() const override { return fd_->bytes_read.load(); }
  int local_fd() const override { return fd_->fd; }

 private:
  std::shared_ptr<SharedFd> fd_;
  std::string path_;
  uint64_t size_;
};

// The path a write to `path` lands on: symbolic links followed (relative ones from their own
// directory), the last one even when what it names does not exist yet, as open(O_CREAT) does.
std::string followed_links(const std::string& path) {
  namespace fs = std::filesystem;
  fs::path at(path);
  for (int hops = 0; hops < 40; ++hops) {  // Linux's own bound (ELOOP)
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(at, ec))) return at.string();
    const fs::path target = fs::read_symlink(at, ec);
    if (ec) return at.string();
    at = target.is_absolute() ? target : at.parent_path() / target;
  }
  fail_errno("cannot write", path, ELOOP);
}

class FileSink final : public Sink {
 public:
  FileSink(std::string path, const FileOptions& options)
      : path_(std::move(path)), sync_(options.sync_on_commit) {
    const std::string target = followed_links(path_);
    struct stat st {};
    if (::stat(target.c_str(), &st) != 0 || S_ISREG(st.st_mode)) {
      file_.emplace(target, options.unnamed_temp);
      return;
    }
    if (S_ISDIR(st.st_mode)) fail(ErrorCode::kInvalidArgument, "'" + path_ + "' is a directory");
    if (!S_ISCHR(st.st_mode) && !S_ISBLK(st.st_mode))
      fail(ErrorCode::kInvalidArgument,
           "'" + path_ + "' is a FIFO or socket: a writer needs a file it can seek in");
    device_fd_ = ::open(target.c_str(), O_WRONLY | O_CLOEXEC);
    if (device_fd_ < 0) fail_errno("cannot open", path_, errno);
  }
  ~FileSink() override { abort(); }

  void write_gather(uint64_t offset, const IoSlice* slices, size_t count) override {
    if (fd() < 0) fail(ErrorCode::kIO, "'" + path_ + "' was already committed or aborted");
    write_all_at(fd(), offset, slices, count, path_);
  }

  void reserve(uint64_t size) override {
    if (file_ && file_->fd() >= 0 && size > 0)
      (void)::posix_fallocate(file_->fd(), 0, static_cast<off_t>(size));
  }

  void commit() override {
    if (file_) return file_->publish(sync_);
    if (device_fd_ < 0) fail(ErrorCode::kIO, "'" + path_ + "' was already committed or aborted");
    const int fd = std::exchange(device_fd_, -1);
    if (sync_ && ::fsync(fd) != 0 && errno != EINVAL) {  // EINVAL: a device with nothing to sync
      const int err = errno;
      ::close(fd);
      fail_errno("fsync failed for", path_, err);
    }
    if (::close(fd) != 0) fail_errno("close failed for", path_, errno);
  }
  void abort() override {
    if (file_) file_->discard();
    if (device_fd_ >= 0) ::close(std::exchange(device_fd_, -1));
  }
  const std::string& uri() const override { return path_; }

 private:
  int fd() const { return file_ ? file_->fd() : device_fd_; }

  std::string path_;
  bool sync_;
  std::optional<TempFile> file_;  // a regular file (or none yet): written beside, published whole
  int device_fd_ = -1;            // a device: written in place
};

}  // namespace

void write_all_at(int fd, uint64_t offset, const IoSlice* slices, size_t count,
                  const std::string& what) {
  uint64_t total = 0;
  std::vector<iovec> iov = to_iovecs(slices, count, total);
  transfer_all(
      iov, offset,
      [fd](const iovec* v, int n, uint64_t off) {
        return ::pwritev(fd, v, n, static_cast<off_t>(off));
      },
      "writing", what, total);
}

std::unique_ptr<Source> open_file_source(const std::string& path, const FileOptions& options) {
  check_no_nul(path);
  auto fd = std::make_shared<SharedFd>();
  fd->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd->fd < 0) fail_errno("cannot open", path, errno);
  struct stat st {};
  if (::fstat(fd->fd, &st) != 0) fail_errno("cannot stat", path, errno);
  if (S_ISDIR(st.st_mode)) fail(ErrorCode::kInvalidArgument, "'" + path + "' is a directory");
  // A pipe (/dev/stdin fed by another process, a FIFO) has no size and no offsets: it is read to
  // its end into memory, as the Python layer reads a pipe it is handed as a file object.
  if (S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) {
    return make_memory_source(
        std::make_shared<const std::string>(read_to_end(fd->fd, path, pipe_read_bound(options))),
        path);
  }
  return std::make_unique<FileSource>(std::move(fd), path, static_cast<uint64_t>(st.st_size));
}

uint64_t pipe_read_bound(const FileOptions& options) {
  if (options.max_pipe_bytes) return options.max_pipe_bytes;
  const uint64_t available = available_memory_bytes();
  return available ? available : std::numeric_limits<uint64_t>::max() - 1;  // nothing says
}

void check_pipe_read(uint64_t bytes, uint64_t bound, const std::string& what) {
  if (bytes > bound)
    fail(ErrorCode::kInvalidArgument,
         what + " is a pipe, read whole into memory, and it delivered more than " +
             std::to_string(bound) +
             " bytes (FileOptions::max_pipe_bytes, $TENSORIZER_PIPE_MAX_GIB; default: the memory "
             "available): save it to a file first");
}

std::unique_ptr<Sink> open_file_sink(const std::string& path, const FileOptions& options) {
  check_no_nul(path);
  return std::make_unique<FileSink>(path, options);
}

}  // namespace tensorizer
