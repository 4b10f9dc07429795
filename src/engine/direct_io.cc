// Page-cache residency and O_DIRECT reads (see direct_io.h).
#include "engine/direct_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "tensorizer/error.h"

namespace tensorizer::engine {
namespace {

uint64_t page_size() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

}  // namespace

Residency::Residency(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) return;
  size_ = static_cast<uint64_t>(st.st_size);
  void* p = mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);  // never touched: only asked about
  if (p != MAP_FAILED) map_ = static_cast<uint8_t*>(p);
}

Residency::~Residency() {
  if (map_) munmap(map_, size_);
}

double Residency::fraction(uint64_t offset, uint64_t length) const {
  if (!map_ || length == 0 || offset >= size_) return 1.0;
  length = std::min(length, size_ - offset);
  const uint64_t page = page_size();
  const uint64_t first = offset / page, last = (offset + length - 1) / page;
  const uint64_t pages = last - first + 1;
  // One sample per 2 MiB (a page-cache folio at most), at least one and at most kSamples.
  const uint64_t samples = std::clamp<uint64_t>(pages / 512, 1, kSamples);
  size_t resident = 0;
  for (uint64_t k = 0; k < samples; ++k) {
    const uint64_t at = first + (2 * k + 1) * pages / (2 * samples);  // the middles of equal parts
    unsigned char v = 0;
    if (mincore(map_ + at * page, page, &v) != 0) return 1.0;
    resident += v & 1;
  }
  return static_cast<double>(resident) / static_cast<double>(samples);
}

double Residency::fraction(const std::vector<std::pair<uint64_t, uint64_t>>& ranges,
                           uint64_t samples) const {
  uint64_t total = 0;
  for (const auto& [offset, length] : ranges) total += length;
  if (!map_ || total == 0 || samples == 0) return 1.0;
  const uint64_t page = page_size();
  samples = std::min(samples, std::max<uint64_t>(1, total / page));  // a page asked about once
  size_t range = 0, resident = 0;
  uint64_t before = 0;  // bytes of the ranges before ranges[range]
  for (uint64_t k = 0; k < samples; ++k) {
    const uint64_t at = (2 * k + 1) * total / (2 * samples);  // the middles of equal parts
    while (at >= before + ranges[range].second) before += ranges[range++].second;
    const uint64_t offset = ranges[range].first + (at - before);
    if (offset >= size_) return 1.0;
    unsigned char v = 0;
    if (mincore(map_ + offset / page * page, page, &v) != 0) return 1.0;
    resident += v & 1;
  }
  return static_cast<double>(resident) / static_cast<double>(samples);
}

DirectFile::DirectFile(int fd) : fd_(fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) return;
#ifdef STATX_DIOALIGN
  struct statx sx;
  if (statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == 0 && (sx.stx_mask & STATX_DIOALIGN)) {
    if (sx.stx_dio_offset_align == 0) return;  // the file system says: no direct I/O
    align_ = std::max<uint64_t>({align_, sx.stx_dio_offset_align, sx.stx_dio_mem_align});
  }
#endif
  // Re-open the same file (even if it was deleted or renamed over) through /proc.
  dfd_ = ::open(("/proc/self/fd/" + std::to_string(fd)).c_str(), O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (dfd_ < 0) return;
  struct stat dst;
  if (fstat(dfd_, &dst) != 0 || dst.st_ino != st.st_ino || dst.st_dev != st.st_dev) {
    ::close(dfd_);
    dfd_ = -1;
  }
}

DirectFile::~DirectFile() {
  if (dfd_ >= 0) ::close(dfd_);
}

void DirectFile::read(uint8_t* dst, uint64_t offset, uint64_t length, uint64_t required,
                      const std::string& what) const {
  int fd = dfd_;
  const uint64_t needed_end = offset + required;
  while (length > 0) {
    const ssize_t n = ::pread(fd, dst, length, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EINVAL && fd == dfd_) {  // refused after all: finish with buffered reads
        fd = fd_;
        continue;
      }
      fail(ErrorCode::kIO, "cannot read " + what + " at offset " + std::to_string(offset) + ": " +
                               std::strerror(errno));
    }
    if (n == 0) {
      if (offset >= needed_end) return;  // only the alignment padding lay past the end of the file
      fail(ErrorCode::kIO, what +
                               " ends early: the file is shorter than its index says (truncated "
                               "while loading?) at offset " +
                               std::to_string(offset));
    }
    dst += n;
    offset += static_cast<uint64_t>(n);
    length -= static_cast<uint64_t>(n);
    if (offset % align_ != 0) fd = fd_;  // a short read left us unaligned: buffered from here
  }
}

}  // namespace tensorizer::engine
