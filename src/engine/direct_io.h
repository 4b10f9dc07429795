// Page-cache residency and O_DIRECT reads of local files (internal header). No knowledge of
// tensors: byte ranges of one file only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tensorizer::engine {

// Which parts of a file are in the page cache (mincore on a mapping that is never touched).
class Residency {
 public:
  explicit Residency(int fd);
  ~Residency();
  Residency(const Residency&) = delete;
  Residency& operator=(const Residency&) = delete;
  // Fraction (0..1) of [offset, offset+length) in the page cache, judged from one page per 2 MiB
  // (1 to kSamples pages, spread evenly; asking for every page of a large file costs milliseconds);
  // 1 when the kernel cannot tell (then mapping is the safe guess).
  double fraction(uint64_t offset, uint64_t length) const;
  // Fraction of the byte ranges [offset, offset+length) taken end to end, judged from `samples`
  // pages spread evenly over their total length, at most one per page of it (1 when the kernel
  // cannot tell).
  double fraction(const std::vector<std::pair<uint64_t, uint64_t>>& ranges, uint64_t samples) const;
  static constexpr uint64_t kSamples = 8;

 private:
  uint8_t* map_ = nullptr;
  uint64_t size_ = 0;
};

// A second descriptor of the same open file, with O_DIRECT. Not usable (ok() false) where the
// file system has no direct I/O (tmpfs) or refuses it.
class DirectFile {
 public:
  explicit DirectFile(int fd);
  ~DirectFile();
  DirectFile(const DirectFile&) = delete;
  DirectFile& operator=(const DirectFile&) = delete;
  bool ok() const { return dfd_ >= 0; }
  // Offsets, lengths and memory addresses of direct reads must be multiples of this.
  uint64_t alignment() const { return align_; }
  // Reads [offset, offset+length) into `dst` (offset, length, dst aligned). The first `required`
  // bytes must exist (kIO naming `what` if the file ends before them: truncated); the rest is
  // alignment padding that may lie past the end of the file and is then left as it is.
  void read(uint8_t* dst, uint64_t offset, uint64_t length, uint64_t required,
            const std::string& what) const;

 private:
  int fd_;  // the caller's buffered descriptor (for an unaligned tail)
  int dfd_ = -1;
  uint64_t align_ = 4096;
};

}  // namespace tensorizer::engine
