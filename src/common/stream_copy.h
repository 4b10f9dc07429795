// Copies into memory that is written once and read later (internal header): bytes arriving from a
// socket buffer into a tensor's fresh pages. They use non-temporal stores, which write whole
// cache lines to memory without first reading them in (a plain memcpy into cold memory reads every
// destination line before overwriting it) and leave the cache to the data still being worked on.
#pragma once

#include <cstddef>

namespace tensorizer {

// Destinations this large or larger are worth streaming into: their bytes will not all be read from
// the cache anyway, and a copy into them comes in pieces of whatever size the socket returned.
constexpr size_t kStreamCopyMinDestination = 256 * 1024;

// memcpy's contract (no overlap), streaming the destination's whole 64-byte lines where the CPU has
// streaming stores (x86-64); memcpy otherwise. For pieces of a large destination (above).
void copy_streaming(void* dst, const void* src, size_t n);

}  // namespace tensorizer
