// snapshot_data (see tensorizer/writer.h): the copy a background save writes from.
#include <algorithm>
#include <cstring>

#include "common/worker_pool.h"
#include "engine/host_block.h"
#include "tensorizer/dtype.h"
#include "tensorizer/error.h"
#include "tensorizer/writer.h"

namespace tensorizer {
namespace {

constexpr uint64_t kPieceBytes = 8ull << 20;  // copy work items
constexpr uint64_t kAlignment = 64;           // each copy starts on a cache line

uint64_t data_bytes(const WriteRequest& r) {
  if (r.meta || !r.data) return 0;
  uint64_t bytes = parse_dtype(r.dtype).itemsize;
  for (uint64_t d : r.shape)
    if (__builtin_mul_overflow(bytes, d, &bytes))
      fail(ErrorCode::kInvalidArgument,
           "tensor '" + display_path(r.path).substr(0, 200) + "': size overflows 64 bits");
  return bytes;
}

struct Piece {
  const uint8_t* from;
  uint8_t* to;
  uint64_t size;
};

}  // namespace

std::shared_ptr<void> snapshot_data(std::vector<WriteRequest>& requests, int workers) {
  std::vector<uint64_t> sizes, offsets;
  uint64_t total = 0;
  for (const WriteRequest& r : requests) {
    sizes.push_back(data_bytes(r));
    offsets.push_back(total);
    total += (sizes.back() + kAlignment - 1) / kAlignment * kAlignment;
  }
  if (total == 0) return nullptr;
  auto block = engine::HostBlock::anonymous(total);
  std::vector<Piece> pieces;
  for (size_t i = 0; i < requests.size(); ++i)
    for (uint64_t at = 0; at < sizes[i]; at += kPieceBytes)
      pieces.push_back({static_cast<const uint8_t*>(requests[i].data) + at,
                        block->data() + offsets[i] + at, std::min(kPieceBytes, sizes[i] - at)});
  parallel_for(pieces.size(), workers > 0 ? workers : usable_cores(),
               [&](size_t k) { std::memcpy(pieces[k].to, pieces[k].from, pieces[k].size); });
  for (size_t i = 0; i < requests.size(); ++i)
    if (sizes[i]) requests[i].data = block->data() + offsets[i];
  return block;
}

}  // namespace tensorizer
