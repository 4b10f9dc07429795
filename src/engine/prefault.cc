// A thread that maps a destination's pages ahead of the receivers (see prefault.h).
#include "engine/prefault.h"

#include <sys/mman.h>

#include <algorithm>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace tensorizer::engine {
namespace {

constexpr size_t kPiece = size_t{4} << 20;  // between checks of the stop flag

}  // namespace

BackgroundPrefault::BackgroundPrefault(uint8_t* data, size_t size) {
  if (data == nullptr || size == 0) return;
  thread_ = std::thread([this, data, size] {
    for (size_t off = 0; off < size && !stop_.load(std::memory_order_relaxed); off += kPiece) {
      const size_t n = std::min(kPiece, size - off);
      if (madvise(data + off, n, MADV_POPULATE_WRITE) != 0) return;  // unsupported, or no memory
      done_.store(off + n, std::memory_order_relaxed);
    }
  });
}

BackgroundPrefault::~BackgroundPrefault() {
  stop_.store(true, std::memory_order_relaxed);
  if (thread_.joinable()) thread_.join();
}

}  // namespace tensorizer::engine
