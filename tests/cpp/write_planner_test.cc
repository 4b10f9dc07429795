// Write planner: where each tensor's header and data land, which data version and flags a batch
// needs, and which requests are refused before anything is written.
#include "engine/write_planner.h"

#include <gtest/gtest.h>

#include "tensorizer/dtype.h"
#include "tensorizer/error.h"

namespace tensorizer::engine {
namespace {

const uint8_t kBytes[8] = {};

WriteRequest request(const std::string& name, std::vector<uint64_t> shape,
                     std::string dtype = "<f4") {
  WriteRequest r;
  r.path = TensorPath(name);
  r.dtype = std::move(dtype);
  r.shape = std::move(shape);
  r.data = kBytes;
  return r;
}

// A writer that has written nothing yet.
struct Fresh {
  FileHeader header;
  std::vector<IndexEntry> entries;
  codec::PathRules paths;
  WrittenSoFar so_far() const { return {header, entries, paths, false, 0}; }
};

WritePlan plan(const std::vector<WriteRequest>& requests, const WriterOptions& options = {}) {
  Fresh fresh;
  fresh.header.version = 1;
  return plan_writes(requests, fresh.so_far(), options, false, "out.tensors");
}

TEST(WritePlanner, LaysOutHeadersAndAlignedDataBackToBack) {
  WritePlan p = plan({request("small", {3}), request("large", {1 << 18}), request("empty", {0})});
  ASSERT_EQ(p.tensors.size(), 3u);
  EXPECT_EQ(p.header.index_size, kReferenceIndexSize);  // the reference's reserve
  uint64_t at = kPreludeSize + kReferenceIndexSize;
  const uint64_t alignments[] = {64, 4096, 64};  // 1 MiB and more: 4096
  for (size_t i = 0; i < 3; ++i) {
    const IndexEntry& e = p.tensors[i].entry;
    EXPECT_EQ(e.header_offset, at) << i;
    EXPECT_EQ(e.data_offset, e.header_offset + p.tensors[i].header.bytes.size()) << i;
    EXPECT_EQ(e.data_offset % alignments[i], 0u) << i;
    at = e.data_offset + e.data_length;
  }
  EXPECT_EQ(p.tensors[0].entry.data_length, 12u);
  EXPECT_EQ(p.tensors[1].entry.data_length, 1u << 20);
  EXPECT_EQ(p.tensors[2].entry.data_length, 0u);
  EXPECT_EQ(p.end, at);
  EXPECT_EQ(p.header.version, 1u);
  EXPECT_EQ(p.header.tensor_count, 0u) << "counts change only once the batch is written";
}

TEST(WritePlanner, PicksTheLowestVersionTheBatchNeeds) {
  EXPECT_EQ(plan({request("a", {2}, dtype_string_for_torch("torch.bfloat16"))}).header.version, 2u);
  WriteRequest meta = request("m", {4});
  meta.meta = true;
  meta.data = nullptr;
  WritePlan with_meta = plan({meta});
  EXPECT_EQ(with_meta.header.version, kMetaVersion);
  EXPECT_EQ(with_meta.tensors[0].entry.data_length, 0u);
  WriteRequest huge = request("h", {uint64_t{1} << 32, 0});
  WritePlan long_dims = plan({huge});
  EXPECT_EQ(long_dims.header.version, kLongDimsVersion);
  EXPECT_TRUE(long_dims.header.flags & kFlagVersionedEntries);
  EXPECT_TRUE(long_dims.tensors[0].entry.long_shape());
}

TEST(WritePlanner, EncryptionSizesCryptInfoAndKeepsSha256Only) {
  WriterOptions options;
  options.encryption = EncryptionParams::random();
  WritePlan p = plan({request("a", {1024})}, options);
  const EncodedTensorHeader& h = p.tensors[0].header;
  EXPECT_EQ(h.crc32_offset, std::string::npos);
  EXPECT_NE(h.sha256_offset, std::string::npos);
  EXPECT_NE(h.crypt_info_offset, std::string::npos);
}

TEST(WritePlanner, ALaterBatchStartsWhereTheLastEndedAndMustFitTheIndex) {
  Fresh fresh;
  fresh.header.version = 1;
  WriterOptions options;
  options.index_reserve = 4096;
  std::vector<WriteRequest> first{request("a", {1})};
  WritePlan p1 = plan_writes(first, fresh.so_far(), options, false, "out.tensors");
  EXPECT_EQ(p1.header.index_size, 4096u);
  fresh.header = p1.header;
  fresh.entries.push_back(p1.tensors[0].entry);
  fresh.paths.add(
      first[0].path, [] { return std::string("tensor"); }, ErrorCode::kInvalidArgument);
  const WrittenSoFar later{fresh.header, fresh.entries, fresh.paths, true, p1.end};

  std::vector<WriteRequest> second{request("b", {1})};
  WritePlan p2 = plan_writes(second, later, options, false, "out.tensors");
  EXPECT_EQ(p2.tensors[0].entry.header_offset, p1.end);
  EXPECT_EQ(p2.header.index_size, 4096u);

  std::vector<WriteRequest> many;
  for (int i = 0; i < 200; ++i) many.push_back(request(std::to_string(i) + "t", {1}));
  try {
    plan_writes(many, later, options, false, "out.tensors");
    FAIL() << "an index overflow must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("metadata overflow: the index of 'out.tensors'"),
              std::string::npos)
        << e.what();
  }
  try {
    plan_writes(first, later, options, false, "out.tensors");
    FAIL() << "a name written by an earlier batch must be refused";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
  }
}

TEST(WritePlanner, RefusesWhatTheFormatCannotHold) {
  auto refused = [](std::vector<WriteRequest> requests, const std::string& expected) {
    try {
      plan(requests);
      ADD_FAILURE() << requests[0].dtype << " accepted; expected: " << expected;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  refused({request("a", {1}), request("a", {1})}, "tensor 'a'");
  refused({request("a", {1}, "bogus")}, "tensor 'a'");
  refused({request("a", {1}, "<x9")}, "tensor 'a': no torch dtype stores numpy kind 'x'");
  refused({request("a", {std::vector<uint64_t>(256, 1)})}, "more than 255 dimensions");
  refused({request("a", {uint64_t{1} << 62, 8})}, "size overflows 64 bits");
  WriteRequest no_data = request("a", {2});
  no_data.data = nullptr;
  refused({no_data}, "no data");
  // Streamed requests carry no data pointer.
  Fresh fresh;
  fresh.header.version = 1;
  EXPECT_EQ(plan_writes({no_data}, fresh.so_far(), {}, true, "x").tensors.size(), 1u);
}

}  // namespace
}  // namespace tensorizer::engine
