// Anonymous and file-backed host blocks, and views into them (see host_block.h).
#include "engine/host_block.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "engine/huge_pages.h"
#include "engine/prefault.h"
#include "tensorizer/error.h"

namespace tensorizer::engine {

std::shared_ptr<HostBlock> HostBlock::anonymous(size_t size) {
  // A size the file declares (a meta tensor's) may exceed any address space: refuse it before
  // the rounding below could wrap.
  constexpr size_t kMaxBytes = size_t{1} << 47;  // x86-64 and arm64 user address space
  if (size > kMaxBytes)
    fail(ErrorCode::kInvalidArgument, "cannot allocate " + std::to_string(size) +
                                          " bytes of host memory: more than a process can address");
  size_t rounded = (size + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (rounded == 0) rounded = kHugePageBytes;
  const size_t padded = rounded + kHugePageBytes;
  void* raw = mmap(nullptr, padded, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED)
    fail(ErrorCode::kIO, "cannot allocate " + std::to_string(size) +
                             " bytes of host memory: " + std::strerror(errno));
  // Keep the 2 MiB-aligned middle, so that where the system gives huge pages, every one is whole.
  const uintptr_t begin = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (begin + kHugePageBytes - 1) & ~uintptr_t{kHugePageBytes - 1};
  if (aligned > begin) munmap(raw, aligned - begin);
  const uintptr_t end = aligned + rounded;
  if (begin + padded > end) munmap(reinterpret_cast<void*>(end), begin + padded - end);
  auto* data = reinterpret_cast<uint8_t*>(aligned);
  return std::shared_ptr<HostBlock>(new HostBlock(data, rounded));
}

std::shared_ptr<HostBlock> HostBlock::file_private(int fd, size_t size, const std::string& what) {
  // From offset 0, so the kernel places the mapping 2 MiB-congruent with the file.
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) fail(ErrorCode::kIO, "cannot map " + what + ": " + std::strerror(errno));
  return std::shared_ptr<HostBlock>(new HostBlock(static_cast<uint8_t*>(p), size));
}

void HostBlock::map_in_background(const std::vector<std::pair<uint8_t*, size_t>>& ranges) {
  std::erase_if(prefaults_, [](const auto& p) { return p->finished(); });  // joins them
  size_t total = 0;
  for (const auto& range : ranges) total += range.second;
  if (total < kInlineMapBytes) {
    const std::atomic<bool> never{false};
    std::atomic<size_t> done{0};
    for (const auto& [data, size] : ranges)
      populate_pages(data, size, PageAccess::kRead, never, done);
    return;
  }
  prefaults_.push_back(
      std::make_unique<BackgroundPrefault>(ranges, BackgroundPrefault::Access::kRead));
}

void HostBlock::wait_mapped() {
  for (auto& p : prefaults_) p->wait();
}

HostBlock::~HostBlock() {
  prefaults_.clear();  // each stops at its next piece: nothing may map pages of an unmapped block
  munmap(data_, size_);
}

std::shared_ptr<void> block_view(std::shared_ptr<HostBlock> block, uint8_t* data, size_t size) {
  return std::shared_ptr<void>(data, [block = std::move(block), size](void* p) mutable {
    if (block.use_count() > 1) {  // others still use the block: give back this range's pages now
      // Whole 2 MiB pages only: releasing part of one would split a huge mapping, which costs
      // more than the memory is worth (the rest goes with the block).
      const uintptr_t b = reinterpret_cast<uintptr_t>(p);
      const uintptr_t first = (b + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
      const uintptr_t last = (b + size) / kHugePageBytes * kHugePageBytes;
      if (last > first) madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
    }
    block.reset();
  });
}

}  // namespace tensorizer::engine
