// Load planner properties: every requested byte (headers and data) is covered exactly once, in
// order; each item is one contiguous range; only splittable tensors are split, on granularity
// boundaries; items respect max_segments and stay near the target size.
#include "engine/read_planner.h"

#include <gtest/gtest.h>

#include <random>

namespace tensorizer::engine {
namespace {

// Checks every property of `items` for `tensors` and `o`; returns the number of data pieces.
size_t check_plan(const std::vector<PlannedTensor>& tensors, const PlanOptions& o,
                  const std::vector<ReadItem>& items) {
  const uint64_t target = std::max<uint64_t>(o.target_item_bytes, 1);
  const uint64_t gran = std::max<uint64_t>(o.split_granularity, 1);
  std::vector<uint64_t> next_data(tensors.size(), 0);  // data bytes of each tensor covered so far
  std::vector<bool> header_seen(tensors.size(), false), done(tensors.size(), false);
  std::vector<size_t> pieces(tensors.size(), 0);
  size_t expected_tensor = 0;  // tensors are visited in order
  size_t data_pieces = 0;
  for (const ReadItem& item : items) {
    EXPECT_FALSE(item.segments.empty());
    EXPECT_LE(item.segments.size(), std::max<size_t>(o.max_segments, 1));
    uint64_t pos = item.offset, length = 0;
    for (const Segment& s : item.segments) {
      if (s.tensor >= tensors.size()) {
        ADD_FAILURE() << "segment names tensor " << s.tensor;
        return data_pieces;
      }
      const PlannedTensor& t = tensors[s.tensor];
      EXPECT_GT(s.length, 0u) << "no empty segments";
      if (s.is_header) {
        EXPECT_EQ(s.tensor, expected_tensor) << "tensors in order";
        EXPECT_FALSE(header_seen[s.tensor]);
        header_seen[s.tensor] = true;
        EXPECT_EQ(pos, t.header_offset) << "contiguous item";
        EXPECT_EQ(s.length, t.header_size);
        EXPECT_EQ(s.last_of_tensor, t.data_length == 0);
      } else {
        EXPECT_TRUE(header_seen[s.tensor]) << "header before data";
        EXPECT_EQ(s.begin, next_data[s.tensor]) << "data covered once, in order";
        EXPECT_EQ(pos, t.header_offset + t.header_size + s.begin) << "contiguous item";
        next_data[s.tensor] += s.length;
        EXPECT_LE(next_data[s.tensor], t.data_length);
        EXPECT_EQ(s.last_of_tensor, next_data[s.tensor] == t.data_length);
        EXPECT_EQ(s.begin % gran, 0u) << "split on a granularity boundary";
        if (!s.last_of_tensor) {
          EXPECT_EQ(s.length % gran, 0u);
        }
        ++pieces[s.tensor];
        ++data_pieces;
      }
      if (s.last_of_tensor) {
        EXPECT_FALSE(done[s.tensor]);
        done[s.tensor] = true;
        ++expected_tensor;
      }
      pos += s.length;
      length += s.length;
    }
    EXPECT_EQ(item.length, length);
    // An item is closed once it reaches the target: only its last segment may cross it.
    EXPECT_LT(item.length - item.segments.back().length, target);
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_TRUE(header_seen[i]);
    EXPECT_TRUE(done[i]);
    EXPECT_EQ(next_data[i], tensors[i].data_length) << "every data byte covered";
    if (!tensors[i].splittable) {
      EXPECT_LE(pieces[i], 1u) << "unsplittable tensor split";
    }
    if (tensors[i].splittable && tensors[i].data_length > 0 && tensors[i].data_length <= gran) {
      EXPECT_EQ(pieces[i], 1u);
    }
  }
  return data_pieces;
}

// Tensors back to back from `start`, skipping `gap` bytes (unrequested tensors) after some.
std::vector<PlannedTensor> layout(const std::vector<std::pair<uint64_t, bool>>& data,
                                  uint64_t header = 100, uint64_t gap_every = 0, uint64_t gap = 0) {
  std::vector<PlannedTensor> out;
  uint64_t at = 262217;
  for (size_t i = 0; i < data.size(); ++i) {
    out.push_back({at, header, data[i].first, data[i].second});
    at += header + data[i].first;
    if (gap_every && i % gap_every == 0) at += gap;
  }
  return out;
}

TEST(PlannerTest, EmptyRequest) { EXPECT_TRUE(plan_reads({}, {}).empty()); }

TEST(PlannerTest, SmallNeighboursShareOneItem) {
  auto t = layout({{10, true}, {0, true}, {20, false}, {30, true}});
  auto items = plan_reads(t, {});
  ASSERT_EQ(items.size(), 1u);
  EXPECT_EQ(items[0].offset, 262217u);
  EXPECT_EQ(items[0].length, 4 * 100 + 60u);
  EXPECT_EQ(items[0].segments.size(), 7u);
  check_plan(t, {}, items);
}

TEST(PlannerTest, GapsStartNewItems) {
  auto t = layout({{10, true}, {20, true}, {30, true}}, 100, 2, 4096);  // a gap after tensor 0
  auto items = plan_reads(t, {});
  EXPECT_EQ(items.size(), 2u);
  check_plan(t, {}, items);
}

TEST(PlannerTest, SplitsLargeSplittableTensorsOnGranularity) {
  PlanOptions o;
  o.target_item_bytes = 16ull << 20;
  o.split_granularity = 2ull << 20;
  auto t = layout({{1000, true}, {100ull << 20, true}, {40ull << 20, false}, {5, true}});
  auto items = plan_reads(t, o);
  const size_t pieces = check_plan(t, o, items);
  EXPECT_GE(pieces, 1 + 7 + 1 + 1u) << "100 MiB in 16 MiB items";
  for (const auto& item : items)
    for (const auto& s : item.segments)
      if (s.tensor == 2 && !s.is_header) {
        EXPECT_EQ(s.length, 40ull << 20);
      }
}

TEST(PlannerTest, MaxSegmentsIsRespected) {
  std::vector<std::pair<uint64_t, bool>> many(1000, {8, true});
  auto t = layout(many, 64);
  for (size_t max : {1, 2, 3, 256}) {
    PlanOptions o;
    o.max_segments = max;
    auto items = plan_reads(t, o);
    check_plan(t, o, items);
    EXPECT_EQ(items.size(), (2000 + max - 1) / max);
  }
}

TEST(PlannerTest, RandomizedProperties) {
  std::mt19937_64 rng(42);
  for (int round = 0; round < 400; ++round) {
    SCOPED_TRACE(round);
    PlanOptions o;
    o.split_granularity = uint64_t{1} << (rng() % 12);  // 1 .. 2048
    o.target_item_bytes = 1 + rng() % 20000;            // may be below the granularity
    o.max_segments = 1 + rng() % 10;
    std::vector<PlannedTensor> t;
    uint64_t at = 73 + rng() % 1000;
    const size_t n = rng() % 40;
    for (size_t i = 0; i < n; ++i) {
      const uint64_t header = 16 + rng() % 200;
      uint64_t data = 0;
      switch (rng() % 4) {
        case 0:
          data = 0;
          break;
        case 1:
          data = rng() % 100;
          break;
        case 2:
          data = rng() % 5000;
          break;
        default:
          data = rng() % 100000;
          break;
      }
      t.push_back({at, header, data, rng() % 3 != 0});
      at += header + data + (rng() % 3 == 0 ? rng() % 10000 : 0);
    }
    check_plan(t, o, plan_reads(t, o));
    if (HasFailure()) break;
  }
}

}  // namespace
}  // namespace tensorizer::engine
