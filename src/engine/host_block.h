// Blocks of host memory that loaded tensors live in, and per-tensor owners of views into them
// (internal header).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/prefault.h"

namespace tensorizer::engine {

// One mapping, unmapped on destruction: anonymous memory in 4 KiB pages (2 MiB-aligned, so a
// system whose THP policy is "always" may still back it with huge pages; never advised
// MADV_HUGEPAGE: on a VM that backs guest memory lazily, the first touch of a fresh huge page
// costs 3-4x that of 4 KiB pages once the memory has gone back to the host, as at a cold start:
// 0.95-1.34 s against 0.30-0.33 s for 800 MB), or a whole local file mapped copy-on-write (writes
// stay private; the kernel maps the page cache's large folios with 2 MiB entries, so pre-faulting
// a cached file costs almost nothing).
class HostBlock {
 public:
  static std::shared_ptr<HostBlock> anonymous(size_t size);
  static std::shared_ptr<HostBlock> file_private(int fd, size_t size, const std::string& what);
  ~HostBlock();
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // Maps the pages of each range (data, size) inside the block (read-only: a file block's page
  // cache pages, no copy): on a thread of its own while the caller goes on, or, below
  // kInlineMapBytes in all, right here (a thread would cost more than the mapping). The block
  // stops and joins its threads before it is unmapped; a call joins those that have finished, so a
  // block mapped piece by piece (lazy loads) holds no more threads than are still mapping.
  void map_in_background(const std::vector<std::pair<uint8_t*, size_t>>& ranges);
  // Waits for map_in_background to finish (tests).
  void wait_mapped();
  static constexpr size_t kInlineMapBytes = size_t{4} << 20;

 private:
  HostBlock(uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t* data_;
  size_t size_;
  std::vector<std::unique_ptr<BackgroundPrefault>> prefaults_;
};

// An owner for [data, data+size) inside `block`: when it goes, the 2 MiB pages wholly inside the
// range are given back to the kernel at once, and `block` is unmapped with its last view.
std::shared_ptr<void> block_view(std::shared_ptr<HostBlock> block, uint8_t* data, size_t size);

}  // namespace tensorizer::engine
