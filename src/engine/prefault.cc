// Mapping destination pages ahead of the writes into them (see prefault.h).
#include "engine/prefault.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace tensorizer::engine {
namespace {

constexpr size_t kPiece = size_t{4} << 20;      // between checks of the stop flag
constexpr size_t kMinAhead = size_t{64} << 10;  // smaller writes: a few traps, not worth a call

size_t page_size() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

// The whole pages inside [data, data + size): where they start and how many bytes (0 if none).
std::pair<uint8_t*, size_t> whole_pages(void* data, size_t size) {
  const uintptr_t page = page_size(), at = reinterpret_cast<uintptr_t>(data);
  const uintptr_t begin = (at + page - 1) / page * page, end = (at + size) / page * page;
  if (data == nullptr || end <= begin) return {nullptr, 0};
  return {reinterpret_cast<uint8_t*>(begin), end - begin};
}

}  // namespace

void map_ahead_of_write(void* data, size_t size) {
  const auto [begin, bytes] = whole_pages(data, size);
  if (bytes < kMinAhead) return;
  unsigned char first = 1;
  if (mincore(begin, page_size(), &first) != 0 || (first & 1)) return;
  madvise(begin, bytes, MADV_POPULATE_WRITE);  // best effort
}

void populate_pages(uint8_t* data, size_t size, PageAccess access, const std::atomic<bool>& stop,
                    std::atomic<size_t>& done) {
  const int advice = access == PageAccess::kRead ? MADV_POPULATE_READ : MADV_POPULATE_WRITE;
  const auto [begin, bytes] = whole_pages(data, size);
  for (size_t off = 0; off < bytes; off += kPiece) {
    if (stop.load(std::memory_order_relaxed)) return;
    const size_t n = std::min(kPiece, bytes - off);
    if (madvise(begin + off, n, advice) != 0) return;  // unsupported, not ours
    done.fetch_add(n, std::memory_order_relaxed);
  }
}

BackgroundPrefault::BackgroundPrefault(const std::vector<std::pair<uint8_t*, size_t>>& given,
                                       Access access) {
  std::vector<std::pair<uint8_t*, size_t>> ranges;
  for (const auto& [data, size] : given)
    if (whole_pages(data, size).second > 0) ranges.emplace_back(data, size);
  if (ranges.empty()) {
    finished_.store(true, std::memory_order_release);
    return;
  }
  thread_ = std::thread([this, access, ranges = std::move(ranges)] {
    for (const auto& [data, size] : ranges) populate_pages(data, size, access, stop_, done_);
    finished_.store(true, std::memory_order_release);
  });
}

BackgroundPrefault::~BackgroundPrefault() {
  stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tensorizer::engine
