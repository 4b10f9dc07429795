// Private files published whole, and the sweep of dead writers' leftovers (see temp_file.h).
#include "transport/temp_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <string_view>

#include "tensorizer/error.h"

namespace tensorizer {
namespace {

constexpr std::string_view kMarker = ".tmp-";
constexpr int kNameAttempts = 16;

[[noreturn]] void fail_errno(const std::string& what, const std::string& path, int err) {
  fail(err == ENOENT ? ErrorCode::kNotFound : ErrorCode::kIO,
       what + " '" + path + "': " + std::strerror(err));
}

// ".NAME.tmp-N" beside `destination`, N random.
std::string temp_path(const std::string& dir, const std::string& destination) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  const std::string base = std::filesystem::path(destination).filename().string();
  std::string path = dir;
  path.append("/.").append(base).append(kMarker).append(std::to_string(rng() >> 1));
  return path;
}

bool is_temp_name(std::string_view name) {
  const size_t at = name.rfind(kMarker);
  if (name.size() < 2 || name[0] != '.' || at == std::string_view::npos || at == 0) return false;
  const std::string_view digits = name.substr(at + kMarker.size());
  if (digits.empty()) return false;
  for (char c : digits)
    if (c < '0' || c > '9') return false;
  return true;
}

bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// Blocks until the lock is held. Where the file system has no flock (some FUSE mounts) the file
// stays unlocked, and the sweep, which must take the lock before removing anything, leaves it.
void lock(int fd) {
  while (::flock(fd, LOCK_EX) != 0 && errno == EINTR) {
  }
}

// Creates `path` exclusively and locks it. -1 when the name is taken, or when a sweep removed the
// file between its creation and the lock (the caller tries another name).
int create_locked(const std::string& path, const std::string& destination) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST) return -1;
    fail_errno("cannot create a temporary file for", destination, errno);
  }
  lock(fd);
  struct stat mine {
  }, named{};
  if (::fstat(fd, &mine) != 0 || ::stat(path.c_str(), &named) != 0 || !same_file(mine, named)) {
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

TempFile::TempFile(const std::string& destination, bool unnamed) : destination_(destination) {
  namespace fs = std::filesystem;
  dir_ = fs::path(destination).parent_path().string();
  if (dir_.empty()) dir_.push_back('.');  // not = ".": GCC 12 warns falsely (-Wrestrict)
  std::error_code ec;
  fs::create_directories(dir_, ec);
  remove_stale_temp_files(dir_);
  // Publishing an unnamed file links it through /proc/self/fd, so both must exist.
  if (unnamed && ::access("/proc/self/fd", X_OK) == 0) {
    fd_ = ::open(dir_.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0644);
    if (fd_ >= 0) {
      unnamed_ = true;
      lock(fd_);  // so the sweep skips it in the moment it has a name
      return;
    }
    // EOPNOTSUPP/EISDIR/EINVAL: no O_TMPFILE here. Any other error recurs below, and is reported.
  }
  for (int attempt = 0; attempt < kNameAttempts && fd_ < 0; ++attempt) {
    temp_ = temp_path(dir_, destination_);
    fd_ = create_locked(temp_, destination_);
  }
  if (fd_ < 0) {
    temp_.clear();
    fail(ErrorCode::kIO,
         "cannot create a temporary file for '" + destination_ + "': every name tried was taken");
  }
}

void TempFile::publish(bool sync) {
  if (fd_ < 0) fail(ErrorCode::kIO, "'" + destination_ + "' was already committed or aborted");
  if (sync && ::fsync(fd_) != 0) fail_errno("fsync failed for", destination_, errno);
  if (unnamed_) {
    const std::string self = "/proc/self/fd/" + std::to_string(fd_);
    for (int attempt = 0; attempt < kNameAttempts && temp_.empty(); ++attempt) {
      std::string name = temp_path(dir_, destination_);
      if (::linkat(AT_FDCWD, self.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) == 0)
        temp_ = std::move(name);
      else if (errno != EEXIST)
        fail_errno("cannot give the finished file a name beside", destination_, errno);
    }
    if (temp_.empty())
      fail(ErrorCode::kIO, "cannot give the finished file a name beside '" + destination_ + "'");
  }
  // The lock is held until the rename is done, so no sweep removes the named file before it.
  if (::rename(temp_.c_str(), destination_.c_str()) != 0) {
    const int err = errno;
    discard();
    fail_errno("cannot move the finished file into place at", destination_, err);
  }
  temp_.clear();
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail_errno("close failed for", destination_, errno);
  if (sync) {
    const int dir = ::open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir >= 0) {
      ::fsync(dir);  // best effort: the file itself is already durable
      ::close(dir);
    }
  }
}

void TempFile::discard() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
}

int remove_stale_temp_files(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) return 0;
  const int dfd = ::dirfd(d);
  int removed = 0;
  while (const dirent* entry = ::readdir(d)) {
    const char* name = entry->d_name;
    if (!is_temp_name(name)) continue;
    const int fd = ::openat(dfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat opened {
    }, now{};
    // Locked by nobody: its writer is dead. Removed only if the name still means that file.
    if (::fstat(fd, &opened) == 0 && S_ISREG(opened.st_mode) &&
        ::flock(fd, LOCK_EX | LOCK_NB) == 0 &&
        ::fstatat(dfd, name, &now, AT_SYMLINK_NOFOLLOW) == 0 && same_file(opened, now) &&
        ::unlinkat(dfd, name, 0) == 0)
      ++removed;
    ::close(fd);
  }
  ::closedir(d);
  return removed;
}

}  // namespace tensorizer
