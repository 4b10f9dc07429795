// Staging file for uploading sinks (see staging.h).
#include "transport/staging.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "tensorizer/error.h"
#include "transport/file.h"

namespace tensorizer {

StagingFile::StagingFile(const std::string& tag) {
  const char* tmp = std::getenv("TMPDIR");
  std::string path = std::string(tmp && *tmp ? tmp : "/tmp") + "/." + tag + "-XXXXXX";
  fd_ = ::mkostemp(path.data(), O_CLOEXEC);
  if (fd_ < 0)
    fail(ErrorCode::kIO, "cannot create a staging file in '" + path + "': " + std::strerror(errno));
  ::unlink(path.c_str());
}

void StagingFile::write_gather(uint64_t offset, const IoSlice* slices, size_t count,
                               const std::string& what) {
  if (fd_ < 0) fail(ErrorCode::kIO, "'" + what + "' was already committed or aborted");
  write_all_at(fd_, offset, slices, count, "the staging file of " + what);
}

void StagingFile::reserve(uint64_t size) {
  if (fd_ >= 0 && size > 0) (void)::posix_fallocate(fd_, 0, static_cast<off_t>(size));
}

uint64_t StagingFile::size() const {
  struct stat st {};
  if (fd_ < 0 || ::fstat(fd_, &st) != 0) return 0;
  return static_cast<uint64_t>(st.st_size);
}

void StagingFile::read_at(uint64_t offset, void* dst, size_t size) const {
  char* p = static_cast<char*>(dst);
  while (size > 0) {
    ssize_t r = ::pread(fd_, p, size, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0)
      fail(ErrorCode::kIO, "reading back the staging file at offset " + std::to_string(offset));
    p += r;
    size -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
}

void StagingFile::remove() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

}  // namespace tensorizer
