// How much memory the system can still give this process (internal header): what bounds memory
// taken ahead of need (a warm block, a pipe read whole).
#pragma once

#include <cstdint>

namespace tensorizer {

// MemAvailable from /proc/meminfo (the kernel's estimate of what can be allocated without
// swapping), else the free physical pages; 0 when neither can be read.
uint64_t available_memory_bytes();

}  // namespace tensorizer
