// MADV_HUGEPAGE over the 2 MiB-aligned interior of a destination range.
#include "huge_pages.h"

#include <sys/mman.h>

#include <cstdint>

namespace tensorizer::engine {

void advise_huge_pages(void* data, size_t size) {
  const uintptr_t begin = reinterpret_cast<uintptr_t>(data);
  if (size < kHugePageBytes || begin > UINTPTR_MAX - size) return;
  const uintptr_t first = (begin + kHugePageBytes - 1) & ~uintptr_t{kHugePageBytes - 1};
  const uintptr_t last = (begin + size) & ~uintptr_t{kHugePageBytes - 1};
  if (last <= first) return;
  madvise(reinterpret_cast<void*>(first), last - first, MADV_HUGEPAGE);  // refusal changes nothing
}

}  // namespace tensorizer::engine
