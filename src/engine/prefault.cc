// Mapping destination pages ahead of the writes into them (see prefault.h).
#include "engine/prefault.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace tensorizer::engine {
namespace {

constexpr size_t kPiece = size_t{4} << 20;      // between checks of the stop flag
constexpr size_t kMinAhead = size_t{64} << 10;  // smaller writes: a few traps, not worth a call

}  // namespace

void map_ahead_of_write(void* data, size_t size) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
  const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + size) / page * page;
  if (end <= begin || end - begin < kMinAhead) return;
  unsigned char first = 1;
  if (mincore(reinterpret_cast<void*>(begin), page, &first) != 0 || (first & 1)) return;
  madvise(reinterpret_cast<void*>(begin), end - begin, MADV_POPULATE_WRITE);  // best effort
}

BackgroundPrefault::BackgroundPrefault(uint8_t* data, size_t size)
    : BackgroundPrefault(std::vector<std::pair<uint8_t*, size_t>>{{data, size}}) {}

BackgroundPrefault::BackgroundPrefault(std::vector<std::pair<uint8_t*, size_t>> given) {
  static const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  std::vector<std::pair<uint8_t*, size_t>> ranges;  // the whole pages of each
  for (const auto& [data, size] : given) {
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(data) + page - 1) / page * page;
    const uintptr_t end = (reinterpret_cast<uintptr_t>(data) + size) / page * page;
    if (data != nullptr && end > begin)
      ranges.emplace_back(reinterpret_cast<uint8_t*>(begin), end - begin);
  }
  if (ranges.empty()) return;
  thread_ = std::thread([this, ranges = std::move(ranges)] {
    size_t done = 0;
    for (const auto& [data, size] : ranges)
      for (size_t off = 0; off < size; off += kPiece) {
        if (stop_.load(std::memory_order_relaxed)) return;
        const size_t n = std::min(kPiece, size - off);
        if (madvise(data + off, n, MADV_POPULATE_WRITE) != 0) break;  // unsupported, not ours
        done_.store(done += n, std::memory_order_relaxed);
      }
  });
}

BackgroundPrefault::~BackgroundPrefault() {
  stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tensorizer::engine
