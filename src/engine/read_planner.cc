// Load planner implementation (see read_planner.h). Pure: no I/O.
#include "engine/read_planner.h"

#include <algorithm>

namespace tensorizer::engine {

std::vector<ReadItem> plan_reads(const std::vector<PlannedTensor>& tensors,
                                 const PlanOptions& options) {
  std::vector<ReadItem> items;
  const uint64_t target = std::max<uint64_t>(options.target_item_bytes, 1);
  const uint64_t gran = std::max<uint64_t>(options.split_granularity, 1);
  ReadItem current{};
  auto flush = [&] {
    if (!current.segments.empty()) items.push_back(std::move(current));
    current = ReadItem{};
  };
  auto append = [&](const Segment& s, uint64_t offset) {
    if (!current.segments.empty() &&
        (current.offset + current.length != offset || current.length >= target ||
         current.segments.size() >= options.max_segments))
      flush();
    if (current.segments.empty()) current.offset = offset;
    current.segments.push_back(s);
    current.length += s.length;
  };

  for (size_t i = 0; i < tensors.size(); ++i) {
    const PlannedTensor& t = tensors[i];
    const uint64_t data_offset = t.header_offset + t.header_size;
    append({i, true, 0, t.header_size, t.data_length == 0}, t.header_offset);
    if (t.data_length == 0) continue;
    if (!t.splittable || t.data_length <= target) {
      append({i, false, 0, t.data_length, true}, data_offset);
      continue;
    }
    // Split: the first piece fills the current item up to the target, later pieces are whole
    // items; every piece boundary is a multiple of the granularity inside the tensor data.
    const uint64_t full_piece = std::max(target / gran * gran, gran);
    uint64_t pos = 0;
    while (pos < t.data_length) {
      uint64_t room = current.length < target ? target - current.length : full_piece;
      uint64_t piece = std::min(std::max(room / gran * gran, gran), t.data_length - pos);
      append({i, false, pos, piece, pos + piece == t.data_length}, data_offset + pos);
      pos += piece;
    }
  }
  flush();
  return items;
}

}  // namespace tensorizer::engine
