// The load planner: turns "these tensors" into byte-range work items for the reader workers.
//
// Pure and small on purpose (no I/O, no memory): given where each requested tensor's header and
// data lie in the file, it cuts the file into items of roughly `target_item_bytes`, each one
// contiguous range read with a single scatter request. Neighbouring small tensors share an item;
// a tensor larger than an item is split at multiples of `split_granularity` when it may be split
// (no hash verification or decryption needed across pieces), else kept whole.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tensorizer::engine {

struct PlannedTensor {
  uint64_t header_offset;
  uint64_t header_size;
  uint64_t data_length;  // on-disk bytes right after the header
  bool splittable;
};

struct Segment {
  size_t tensor;   // index into the planner's input
  bool is_header;  // the header bytes (whole) or a piece of the data
  uint64_t begin;  // for data: offset inside the tensor data
  uint64_t length;
  bool last_of_tensor;  // after this segment the tensor is fully read
};

struct ReadItem {
  uint64_t offset;  // absolute file offset of the first segment
  uint64_t length;
  std::vector<Segment> segments;
};

struct PlanOptions {
  uint64_t target_item_bytes = 16ull << 20;
  uint64_t split_granularity = 2ull << 20;
  size_t max_segments = 256;
};

// `tensors` must be sorted by header_offset and must not overlap.
std::vector<ReadItem> plan_reads(const std::vector<PlannedTensor>& tensors,
                                 const PlanOptions& options);

}  // namespace tensorizer::engine
