// What every Source shares: the default long read, in pieces through read_scatter(), the first
// step of every transport's read (slices.h), and how many readers a source is read with.
#include <algorithm>
#include <vector>

#include "common/worker_pool.h"
#include "tensorizer/error.h"
#include "tensorizer/transport.h"
#include "transport/slices.h"

namespace tensorizer {

std::vector<IoSlice> slices_within(uint64_t offset, const IoSlice* slices, size_t count,
                                   uint64_t size, const std::string& uri, uint64_t& total) {
  total = 0;
  std::vector<IoSlice> rest;
  rest.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    total += slices[i].size;
    if (slices[i].size) rest.push_back(slices[i]);
  }
  if (offset > size || total > size - offset)
    fail(ErrorCode::kFormat, "read of " + std::to_string(total) + " bytes at offset " +
                                 std::to_string(offset) + " runs past the end of '" + uri + "' (" +
                                 std::to_string(size) + " bytes)");
  return rest;
}

uint64_t Source::read_stream(uint64_t offset, const IoSlice* slices, size_t count,
                             StreamBudget& budget) {
  const uint64_t piece_max = preferred_read_bytes() ? preferred_read_bytes() : 16ull << 20;
  uint64_t total = 0;
  for (size_t i = 0; i < count; ++i) total += slices[i].size;
  uint64_t done = 0;
  size_t slice = 0;     // first slice not yet filled
  uint64_t within = 0;  // bytes of it already filled
  std::vector<IoSlice> piece;
  while (done < total) {
    const uint64_t n = budget.reserve(done, std::min(piece_max, total - done));
    if (n == 0) break;
    // The slices covering [done, done + n).
    piece.clear();
    for (uint64_t left = n; left > 0;) {
      const IoSlice& s = slices[slice];
      const uint64_t k = std::min<uint64_t>(left, s.size - within);
      piece.push_back({static_cast<char*>(s.data) + within, static_cast<size_t>(k)});
      left -= k;
      within += k;
      if (within == s.size) ++slice, within = 0;
    }
    read_scatter(offset + done, piece.data(), piece.size());
    done += n;
    budget.landed(done);
  }
  return done;
}

int readers_for(const Source& source, int requested) {
  const int n = default_workers(requested, source.preferred_readers());
  const int most = source.max_readers();
  return most > 0 ? std::min(n, most) : n;
}

}  // namespace tensorizer
