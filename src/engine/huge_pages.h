// Transparent huge pages for load destinations, on request (LoadOptions::advise_huge_pages;
// internal header).
//
// A load's destinations are usually fresh memory, and the kernel zeroes and maps it one 4 KiB page
// fault at a time. Marking a destination MADV_HUGEPAGE first lets each fault map 2 MiB at once:
// 10x faster where the host's memory stays backed (two fresh processes back to back on the
// benchmark VM), but 3-4x slower where it backs guest memory lazily and the memory went back to
// it (a cold start there), hence opt-in. Only the 2 MiB-aligned interior of a range is advised, so
// neighbouring allocations are left as they were.
#pragma once

#include <cstddef>

namespace tensorizer::engine {

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Best effort: does nothing where the range holds no aligned 2 MiB page or the kernel refuses
// (THP disabled, memory that is not anonymous).
void advise_huge_pages(void* data, size_t size);

}  // namespace tensorizer::engine
