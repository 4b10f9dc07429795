// Writer -> reader round trips: every dtype and shape class comes back bit-exact, the writer picks
// the lowest data version that fits and aligns data, rejects bad requests without damaging the
// file, and never leaves a file at the final path unless it was closed (errors, aborts, crashes).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <random>

#include "codec/bytes.h"
#include "tensorizer/dtype.h"
#include "tensorizer/error.h"
#include "tensorizer/host_load.h"
#include "tensorizer/reader.h"
#include "tensorizer/writer.h"
#include "test_util.h"

namespace tensorizer {
namespace {

namespace fs = std::filesystem;
using test::error_code_of;

// Every serializable torch dtype name (docs/format.md §1.9).
const std::vector<std::string>& all_torch_dtypes() {
  static const std::vector<std::string> names = {"float16",
                                                 "float32",
                                                 "float64",
                                                 "int8",
                                                 "uint8",
                                                 "int16",
                                                 "int32",
                                                 "int64",
                                                 "bool",
                                                 "complex64",
                                                 "complex128",
                                                 "uint16",
                                                 "uint32",
                                                 "uint64",
                                                 "bfloat16",
                                                 "complex32",
                                                 "float8_e5m2",
                                                 "float8_e4m3fn",
                                                 "float8_e5m2fnuz",
                                                 "float8_e4m3fnuz",
                                                 "float8_e8m0fnu",
                                                 "bits8",
                                                 "bits16",
                                                 "bits1x8",
                                                 "bits2x4",
                                                 "bits4x2",
                                                 "uint1",
                                                 "uint2",
                                                 "uint3",
                                                 "uint4",
                                                 "uint5",
                                                 "uint6",
                                                 "uint7",
                                                 "int1",
                                                 "int2",
                                                 "int3",
                                                 "int4",
                                                 "int5",
                                                 "int6",
                                                 "int7"};
  return names;
}

// Tensors to write, owning their bytes.
class Batch {
 public:
  WriteRequest& add(TensorPath path, const std::string& dtype, std::vector<uint64_t> shape,
                    bool meta = false) {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    const uint64_t size = meta ? 0 : n * parse_dtype(dtype).itemsize;
    std::string& bytes = data_.emplace_back(size, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng_());
    WriteRequest r;
    r.path = std::move(path);
    r.dtype = dtype;
    r.shape = std::move(shape);
    r.data = size ? bytes.data() : nullptr;
    r.meta = meta;
    reqs_.push_back(std::move(r));
    return reqs_.back();
  }
  WriteRequest& add_torch(const std::string& name, const std::string& torch,
                          std::vector<uint64_t> shape, bool meta = false) {
    return add(TensorPath(name), dtype_string_for_torch(torch), std::move(shape), meta);
  }
  const std::vector<WriteRequest>& requests() const { return reqs_; }
  const std::string& bytes(size_t i) const { return data_[i]; }
  size_t size() const { return reqs_.size(); }

 private:
  std::mt19937_64 rng_{1234};
  std::deque<std::string> data_;
  std::vector<WriteRequest> reqs_;
};

std::string write_all(const std::string& path, const std::vector<const Batch*>& batches,
                      WriterOptions o = {}) {
  auto w = Writer::open(path, o);
  for (const Batch* b : batches) w->write(b->requests());
  w->close();
  return path;
}

// Reads `path` back and checks it holds exactly `batches`, in order, bit-exact, hashes verified.
void expect_file_holds(const std::string& path, const std::vector<const Batch*>& batches,
                       int workers = 2) {
  auto r = Reader::open(path);
  std::vector<std::pair<const Batch*, size_t>> expected;
  for (const Batch* b : batches)
    for (size_t i = 0; i < b->size(); ++i) expected.emplace_back(b, i);
  ASSERT_EQ(r->entries().size(), expected.size());
  LoadOptions o;
  o.num_workers = workers;
  o.verify_hash = true;
  auto buffers = test::load_entries(*r, o);
  uint64_t data_total = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    const auto& [b, k] = expected[i];
    const WriteRequest& req = b->requests()[k];
    const IndexEntry& e = r->entries()[i];
    SCOPED_TRACE(display_path(req.path));
    EXPECT_EQ(e.path, req.path);
    EXPECT_EQ(e.dtype, req.dtype);
    EXPECT_EQ(e.shape, req.shape);
    EXPECT_EQ(e.type, req.type);
    EXPECT_EQ(e.is_meta(), req.meta && e.expected_bytes() > 0);
    ASSERT_NE(r->loaded_info(i), nullptr);
    EXPECT_EQ(r->loaded_info(i)->module_idx, req.module_idx);
    if (req.meta) {
      EXPECT_EQ(e.data_length, 0u);
      EXPECT_EQ(buffers[i].find_first_not_of('\0'), std::string::npos);
    } else {
      EXPECT_EQ(e.data_length, b->bytes(k).size());
      EXPECT_TRUE(buffers[i] == b->bytes(k)) << "bytes differ";
    }
    data_total += e.data_length;
  }
  EXPECT_EQ(r->header().tensor_size, data_total);
  EXPECT_TRUE(r->verify_all(workers).empty());
  // The end-of-tensors marker follows the last tensor.
  const std::string f = test::read_file(path);
  const IndexEntry& last = r->entries().back();
  EXPECT_EQ(f.size(), last.data_offset + last.data_length + 8);
  EXPECT_EQ(codec::load_le<uint64_t>(f.data() + f.size() - 8), 0u);
}

uint32_t file_version(const std::string& path) { return Reader::open(path)->header().version; }

// ---- Dtypes and shapes ------------------------------------------------------------------------

TEST(RoundTripTest, EveryDtype) {
  test::TempDir dir;
  Batch b;
  for (const auto& t : all_torch_dtypes()) b.add_torch("t." + t, t, {3, 5});
  b.add(TensorPath("u16.numpy"), "<u2", {4});
  b.add(TensorPath("u16.opaque"), std::string("<V2\0torch.uint16", 16), {4});
  const std::string p = write_all(dir.path("d.tensors"), {&b});
  expect_file_holds(p, {&b});
  auto r = Reader::open(p);
  for (size_t i = 0; i < all_torch_dtypes().size(); ++i)
    EXPECT_EQ(parse_dtype(r->entries()[i].dtype).torch_name(), "torch." + all_torch_dtypes()[i]);
  EXPECT_EQ(r->header().version, 2u);
}

TEST(RoundTripTest, TakenHeaderDetailsLeaveTheReaderAndAreReadAgainOnTheNextLoad) {
  test::TempDir dir;
  const std::string path = dir.path("t.tensors");
  test::write_sample_tensors(path, {{"a", std::string(4096, 'a')}, {"b", std::string(64, 'b')}},
                             "<f4");
  auto r = Reader::open(path);
  EXPECT_EQ(r->take_loaded_info(0), nullptr);   // nothing read yet
  EXPECT_EQ(r->take_loaded_info(99), nullptr);  // no such entry
  auto loaded = load_to_host(*r, {0, 1});
  const LoadedTensorInfo* held = r->loaded_info(0);
  ASSERT_NE(held, nullptr);
  std::unique_ptr<LoadedTensorInfo> taken = r->take_loaded_info(0);
  EXPECT_EQ(taken.get(), held);  // moved out, not copied
  EXPECT_EQ(r->loaded_info(0), nullptr);
  EXPECT_EQ(r->take_loaded_info(0), nullptr);
  EXPECT_EQ(taken->header.hashes.size(), 2u);   // CRC32 and SHA-256, still readable here
  EXPECT_NE(r->loaded_info(1), nullptr);        // the other tensor's stay
  load_to_host(*r, {0}, {}, HostRoute::kCopy);  // a later load reads the header again
  ASSERT_NE(r->loaded_info(0), nullptr);
  EXPECT_EQ(r->loaded_info(0)->compact_header, taken->compact_header);
}

// A header padded so its data starts on a 4 KiB boundary keeps its fields and data length, with the
// zeros between counted (every route), and gives back the bytes on disk; a filler that is not all
// zeros is kept whole, and the stored hashes cover it.
TEST(RoundTripTest, AHeadersZeroFillerIsCountedNotKeptAndItsRawBytesComeBack) {
  test::TempDir dir;
  const std::string path = dir.path("t.tensors");
  WriterOptions wo;
  wo.large_threshold = 4096;  // "a" gets 4 KiB-aligned data, so a filler of about 4 KiB
  test::write_sample_tensors(path, {{"a", std::string(8192, 'a')}}, "<f4", wo);
  std::string disk = test::read_file(path);
  const IndexEntry e = Reader::open(path)->entries()[0];
  ASSERT_EQ(e.data_offset % 4096, 0u);
  const std::string on_disk = disk.substr(e.header_offset, e.header_size());
  for (HostRoute route : {HostRoute::kMap, HostRoute::kDirect, HostRoute::kCopy}) {
    auto r = Reader::open(path);
    load_to_host(*r, {0}, {}, route);
    const LoadedTensorInfo* info = r->loaded_info(0);
    ASSERT_NE(info, nullptr);
    EXPECT_GT(info->zero_filler, 3000u) << static_cast<int>(route);
    EXPECT_EQ(info->compact_header.size(), info->header.fields_end + 8);
    EXPECT_EQ(info->compact_header.size() + info->zero_filler, e.header_size());
    EXPECT_EQ(info->raw_header(), on_disk);
  }
  // One filler byte set: the header is kept whole; the hashes cover it, so verify_hash fails.
  const size_t fields = Reader::open(path)->read_header(0).header.fields_end;
  disk[e.header_offset + fields + 100] = 'x';
  test::write_file(path, disk);
  auto r = Reader::open(path);
  load_to_host(*r, {0}, {}, HostRoute::kCopy);
  EXPECT_EQ(r->loaded_info(0)->zero_filler, 0u);
  EXPECT_EQ(r->loaded_info(0)->raw_header(), disk.substr(e.header_offset, e.header_size()));
  LoadOptions verify;
  verify.verify_hash = true;
  EXPECT_EQ(test::error_code_of([&] { load_to_host(*Reader::open(path), {0}, verify); }),
            ErrorCode::kHashMismatch);
}

// A local file's index is read in part first: the room a writer reserves and does not fill is not
// read; an index with more entries than that part holds is read whole.
TEST(RoundTripTest, ALocalIndexIsReadUpToItsEntriesAndWholeWhenTheyRunPastTheFirstPart) {
  test::TempDir dir;
  const std::string small = dir.path("small.tensors"), large = dir.path("large.tensors");
  test::write_sample_tensors(small, {{"a", std::string(64, 'a')}}, "|u1");
  auto r = Reader::open(small);
  EXPECT_GE(r->header().index_size, 256u * 1024);  // the reserved room (kReferenceIndexSize)
  EXPECT_LT(r->bytes_read(), 100u * 1024);
  std::vector<test::SampleTensor> many;
  for (int i = 0; i < 2500; ++i) {
    char name[64];
    std::snprintf(name, sizeof name, "model.layers.%04d.a_rather_long_module_name.weight", i);
    many.push_back({name, std::string(8, static_cast<char>('a' + i % 26))});
  }
  test::write_sample_tensors(large, many, "|u1");
  r = Reader::open(large);
  ASSERT_GT(r->header().index_size, 128u * 1024);  // entries well past the first 64 KiB
  ASSERT_EQ(r->entries().size(), many.size());
  EXPECT_EQ(r->entries().back().name, many.back().name);
  auto loaded = load_to_host(*r, {0, many.size() - 1});
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(loaded[1].data), 8), many.back().bytes);
  // A bad entry past the first part is reported as such once the whole index is read.
  std::string bytes = test::read_file(large);
  const size_t name_at = bytes.find(many.back().name);
  ASSERT_NE(name_at, std::string::npos);
  ASSERT_GT(name_at, 64u * 1024);
  bytes[name_at + many.back().name.size() + 2] =
      '\xff';  // the dtype's first byte (after type, length)
  test::write_file(large, bytes);
  try {
    Reader::open(large);
    ADD_FAILURE() << "a bad dtype opened";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFormat);
    EXPECT_NE(std::string(e.what()).find("index entry 2499 ('" + many.back().name + "')"),
              std::string::npos)
        << e.what();
  }
}

TEST(RoundTripTest, ShapeClasses) {
  test::TempDir dir;
  Batch b;
  b.add_torch("scalar", "float32", {});
  b.add_torch("scalar.c128", "complex128", {});
  b.add_torch("empty", "float32", {0, 4});
  b.add_torch("zero.middle", "int64", {3, 0, 2});
  b.add_torch("vector", "int8", {7});
  b.add_torch("multi", "float64", {2, 3, 4, 5});
  b.add_torch("ones", "float16", {1, 1, 1, 1, 1, 1, 1, 1, 1});
  b.add_torch("meta", "float32", {3, 2}, true);
  b.add_torch("meta.scalar", "int32", {}, true);
  b.add_torch("meta.empty", "float32", {0}, true);
  b.add_torch("after.meta", "uint8", {5});
  auto& p = b.add_torch("param", "float32", {2});
  p.type = TensorType::kParam;
  p.module_idx = 7;
  auto& q = b.add_torch(".buffer", "int64", {1});
  q.type = TensorType::kBuffer;
  q.module_idx = 65535;
  const std::string path = write_all(dir.path("s.tensors"), {&b});
  for (int workers : {1, 2, 3}) expect_file_holds(path, {&b}, workers);
  EXPECT_EQ(file_version(path), 4u) << "meta tensors need version 4";
}

TEST(RoundTripTest, StructuredNames) {
  test::TempDir dir;
  using C = std::vector<PathComponent>;
  // An int key at the top level beside str keys is rejected, as the reference does.
  Batch mixed;
  mixed.add(TensorPath(C{"model", "emb"}), "<f2", {4, 2});
  mixed.add(TensorPath(C{uint64_t{0}}), "|u1", {3});
  EXPECT_EQ(error_code_of([&] { write_all(dir.path("bad.tensors"), {&mixed}); }),
            ErrorCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(dir.path("bad.tensors")));
  Batch list;
  list.add(TensorPath(C{uint64_t{0}}), "|u1", {3});
  list.add(TensorPath(C{uint64_t{1}, "x"}), "|u1", {3});
  expect_file_holds(write_all(dir.path("list.tensors"), {&list}), {&list});
  Batch ok;
  ok.add(TensorPath(C{"model", "layers", uint64_t{0}, "w"}), "<f4", {2, 3});
  ok.add(TensorPath(C{"model", "layers", uint64_t{1}, "w"}), "<f4", {2, 3});
  ok.add(TensorPath(C{"model", "emb"}), "<f2", {4, 2});
  ok.add(TensorPath(C{"\xc3\xbc", "\xf0\x9f\x98\x80", "a\"b\\c/\n"}), "<i8", {});
  ok.add(TensorPath(C{"list", uint64_t{0}}), "|u1", {3});
  ok.add(TensorPath(C{"list", uint64_t{10}}), "|u1", {3});
  ok.add(TensorPath("plain.\xc3\xa9"), "<i4", {1});
  const std::string p = write_all(dir.path("n.tensors"), {&ok});
  expect_file_holds(p, {&ok});
  EXPECT_EQ(file_version(p), 1u) << "structured names do not raise the version";
}

TEST(RoundTripTest, LargeTensorSplitAcrossWorkers) {
  test::TempDir dir;
  Batch b;
  b.add_torch("small.before", "float32", {3});
  b.add_torch("large", "float32", {10 * 1024 * 1024 + 3});  // ~40 MiB
  b.add_torch("small.after", "bfloat16", {5});
  WriterOptions wo;
  wo.num_workers = 2;
  const std::string p = write_all(dir.path("l.tensors"), {&b}, wo);
  expect_file_holds(p, {&b}, 2);
  // Without hash checks the planner splits the large tensor into pieces read in parallel.
  auto r = Reader::open(p);
  for (int workers : {1, 2, 4}) {
    LoadOptions o;
    o.num_workers = workers;
    auto buffers = test::load_entries(*r, o);
    for (size_t i = 0; i < b.size(); ++i)
      EXPECT_TRUE(buffers[i] == b.bytes(i)) << workers << " " << i;
  }
}

TEST(RoundTripTest, ManySmallTensorsGrowTheIndex) {
  test::TempDir dir;
  Batch b;
  const int n = 5000;  // > 3000 overflows the reference's 256 KiB; > 512 KiB needs a second read
  for (int i = 0; i < n; ++i)
    b.add_torch(
        "model.layers." + std::to_string(i) + ".self_attention.query_key_value.weight_parameter",
        i % 3 ? "float32" : "bfloat16", {static_cast<uint64_t>(1 + i % 5)});
  const std::string p = write_all(dir.path("m.tensors"), {&b});
  auto r = Reader::open(p);
  EXPECT_GT(r->header().index_size, 512u << 10);
  EXPECT_EQ(r->entries().size(), static_cast<size_t>(n));
  expect_file_holds(p, {&b}, 2);
}

TEST(RoundTripTest, LongDims) {
  test::TempDir dir;
  Batch b;
  b.add_torch("before", "float32", {2});
  b.add_torch("long", "float32", {uint64_t{1} << 32, 0});
  b.add_torch("long.meta", "int8", {uint64_t{1} << 33, 0, 1}, true);
  b.add_torch("after", "int16", {3});
  const std::string p = write_all(dir.path("l.tensors"), {&b});
  expect_file_holds(p, {&b});
  auto r = Reader::open(p);
  EXPECT_EQ(r->header().version, 5u);
  EXPECT_EQ(r->header().flags, kFlagVersionedEntries);
  EXPECT_EQ(r->entries()[0].entry_version, 1u);
  EXPECT_EQ(r->entries()[1].entry_version, 5u);
  EXPECT_EQ(r->entries()[3].entry_version, 1u);
}

// ---- Versions and layout ----------------------------------------------------------------------

TEST(RoundTripTest, LowestVersionThatFits) {
  test::TempDir dir;
  struct Case {
    const char* what;
    std::vector<std::tuple<std::string, std::vector<uint64_t>, bool>>
        tensors;  // dtype, shape, meta
    uint32_t version;
  };
  const std::string bf16 = dtype_string_for_torch("bfloat16");
  const std::vector<Case> cases = {
      {"plain", {{"<f4", {2}, false}, {"|b1", {2}, false}}, 1},
      {"numpy uint16", {{"<u2", {2}, false}}, 1},
      {"structured", {{"<f4", {2}, false}}, 1},
      {"opaque", {{"<f4", {2}, false}, {bf16, {2}, false}}, 2},
      {"meta", {{"<f4", {2}, false}, {"<f4", {2}, true}}, 4},
      {"meta + opaque", {{bf16, {2}, false}, {"<f4", {2}, true}}, 4},
      {"zero-element meta", {{"<f4", {2}, false}, {"<f4", {0}, true}}, 1},
      {"long dims", {{"<f4", {uint64_t{1} << 32, 0}, false}}, 5},
      {"long dims + meta", {{"<f4", {uint64_t{1} << 32, 0}, false}, {"<f4", {2}, true}}, 5},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    Batch b;
    int i = 0;
    for (const auto& [dtype, shape, meta] : c.tensors)
      b.add(TensorPath("t" + std::to_string(i++)), dtype, shape, meta);
    const std::string p = write_all(dir.path(std::string(c.what) + ".tensors"), {&b});
    EXPECT_EQ(file_version(p), c.version);
    EXPECT_EQ(Reader::open(p)->header().flags, c.version == 5 ? kFlagVersionedEntries : 0u);
    expect_file_holds(p, {&b}, 1);
  }
}

TEST(RoundTripTest, DataIsAligned) {
  test::TempDir dir;
  Batch b;
  for (uint64_t n : {1, 3, 17, 100, 262143, 262144, 300000, 5})
    b.add_torch("t" + std::to_string(n), "float32", {n});
  const std::string p = write_all(dir.path("a.tensors"), {&b});
  auto r = Reader::open(p);
  for (const auto& e : r->entries()) {
    const uint64_t align = e.data_length >= (1u << 20) ? 4096 : 64;
    EXPECT_EQ(e.data_offset % align, 0u) << display_path(e.path) << " @" << e.data_offset;
    EXPECT_GE(e.header_offset, kPreludeSize + r->header().index_size);
  }
  // Records stay contiguous and in index order (the reference reader relies on it).
  for (size_t i = 1; i < r->entries().size(); ++i)
    EXPECT_EQ(r->entries()[i].header_offset,
              r->entries()[i - 1].data_offset + r->entries()[i - 1].data_length);
  expect_file_holds(p, {&b});
}

TEST(RoundTripTest, WrittenFilePassesCliVerify) {
  if (test::cli_path().empty()) GTEST_SKIP() << "CLI not built";
  test::TempDir dir;
  Batch b;
  b.add_torch("a", "float32", {300000});
  b.add_torch("b", "bfloat16", {3, 3});
  b.add_torch("m", "float32", {4}, true);
  const std::string p = write_all(dir.path("v.tensors"), {&b});
  std::string out;
  EXPECT_EQ(test::run_cli("verify " + test::shell_quote(p), &out), 0) << out;
  EXPECT_NE(out.find("OK"), std::string::npos) << out;
}

TEST(RoundTripTest, SeveralWriteCalls) {
  test::TempDir dir;
  Batch b1, b2, b3;
  b1.add_torch("first.a", "float32", {4});
  b1.add_torch("first.b", "int64", {2});
  b2.add_torch("second", "bfloat16", {8});  // raises the version on a later write
  b3.add_torch("third.meta", "float32", {2, 2}, true);
  b3.add_torch("third.big", "float16", {1 << 20});
  const std::string p = write_all(dir.path("w.tensors"), {&b1, &b2, &b3});
  expect_file_holds(p, {&b1, &b2, &b3});
  EXPECT_EQ(file_version(p), 4u);
}

TEST(RoundTripTest, SecondWriteThatOverflowsTheIndexIsRejected) {
  test::TempDir dir;
  Batch b1, b2;
  b1.add_torch("x", "float32", {1});
  for (int i = 0; i < 3000; ++i)
    b2.add_torch(std::string(100, 'n') + std::to_string(i), "float32", {1});
  auto w = Writer::open(dir.path("o.tensors"));
  w->write(b1.requests());
  EXPECT_EQ(error_code_of([&] { w->write(b2.requests()); }), ErrorCode::kInvalidArgument);
  w->close();
  expect_file_holds(dir.path("o.tensors"), {&b1});
}

// A snapshot (snapshot_data) is what gets written, whatever happens to the originals after it.
TEST(RoundTripTest, ASnapshotIsWrittenAsItWasTaken) {
  test::TempDir dir;
  Batch b;
  b.add_torch("big", "float32", {5u << 20});  // several copy pieces
  b.add_torch("meta", "float32", {4}, /*meta=*/true);
  b.add_torch("small", "int8", {3});
  const std::string big = b.bytes(0), small = b.bytes(2);
  std::vector<WriteRequest> snap = b.requests();
  std::shared_ptr<void> owner = snapshot_data(snap, 2);
  ASSERT_TRUE(owner);
  EXPECT_NE(snap[0].data, b.requests()[0].data);
  EXPECT_EQ(snap[1].data, nullptr);
  std::memset(const_cast<void*>(b.requests()[0].data), 0x5a, big.size());  // the caller goes on
  std::memset(const_cast<void*>(b.requests()[2].data), 0x5a, small.size());
  auto w = Writer::open(dir.path("s.tensors"));
  w->write(snap);
  w->close();
  auto r = Reader::open(dir.path("s.tensors"));
  auto out = load_to_host(*r, {0, 2});
  EXPECT_EQ(std::string(reinterpret_cast<char*>(out[0].data), out[0].size), big);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(out[1].data), out[1].size), small);
}

// ---- Validation errors leave the file intact --------------------------------------------------

TEST(RoundTripTest, ValidationErrorsThrowWithoutDamage) {
  test::TempDir dir;
  using C = std::vector<PathComponent>;
  Batch good;
  good.add(TensorPath(C{"tree", "a"}), "<f4", {2});
  good.add(TensorPath("flat"), "<i4", {2});
  good.add(TensorPath(C{"list", uint64_t{0}}), "<i4", {1});
  struct BadCase {
    const char* what;
    std::function<void(Batch&)> fill;
  };
  const std::vector<BadCase> cases = {
      {"duplicate of an earlier write", [](Batch& b) { b.add(TensorPath("flat"), "<f4", {1}); }},
      {"duplicate inside the batch",
       [](Batch& b) {
         b.add(TensorPath("x"), "<f4", {1});
         b.add(TensorPath("x"), "<f4", {1});
       }},
      {"leaf that is a prefix",
       [](Batch& b) {
         b.add(TensorPath(C{"flat", "sub"}), "<f4", {1});
       }},
      {"prefix that is a leaf", [](Batch& b) { b.add(TensorPath("tree"), "<f4", {1}); }},
      {"mixed key kinds",
       [](Batch& b) {
         b.add(TensorPath(C{"list", "k"}), "<f4", {1});
       }},
      {"mixed key kinds at the top",
       [](Batch& b) { b.add(TensorPath(C{uint64_t{3}}), "<f4", {1}); }},
      {"empty name", [](Batch& b) { b.add(TensorPath(""), "<f4", {1}); }},
      {"no components", [](Batch& b) { b.add(TensorPath(), "<f4", {1}); }},
      {"name starting with 0x1E", [](Batch& b) { b.add(TensorPath("\x1e[0]"), "<f4", {1}); }},
      {"invalid UTF-8 in a structured name",
       [](Batch& b) {
         b.add(TensorPath(C{"u", "\xff"}), "<f4", {1});
       }},
      {"bad dtype string", [](Batch& b) { b.add(TensorPath("y"), "<f4", {1}).dtype = "f4"; }},
      {"quantized dtype",
       [](Batch& b) { b.add(TensorPath("q"), std::string("|V1\0torch.qint8", 15), {1}); }},
      {"structured name on a PARAM",
       [](Batch& b) {
         b.add(TensorPath(C{"p", "q"}), "<f4", {1}).type = TensorType::kParam;
       }},
      {"no data", [](Batch& b) { b.add(TensorPath("nodata"), "<f4", {2}).data = nullptr; }},
      {"256 dims",
       [](Batch& b) { b.add(TensorPath("dims"), "<f4", std::vector<uint64_t>(256, 1)); }},
      {"size overflow",
       [](Batch& b) {
         b.add(TensorPath("huge"), "<f4", {1}, true).shape = {uint64_t{1} << 62, 8};
       }},
      {"valid tensor before an invalid one",
       [](Batch& b) {
         b.add(TensorPath("fine"), "<f4", {1});
         b.add(TensorPath(""), "<f4", {1});
       }},
  };
  // Every bad batch is refused up front; the good tensors written around them survive.
  auto w = Writer::open(dir.path("v.tensors"));
  w->write(good.requests());
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    Batch bad;
    EXPECT_EQ(error_code_of([&] {
                c.fill(bad);
                w->write(bad.requests());
              }),
              ErrorCode::kInvalidArgument);
  }
  Batch later;
  later.add(TensorPath("later"), "<f8", {2});
  later.add(TensorPath("x"), "<f4", {1});  // names from rejected batches stay free
  w->write(later.requests());
  w->close();
  expect_file_holds(dir.path("v.tensors"), {&good, &later});
  EXPECT_EQ(error_code_of([] { dtype_string_for_torch("torch.qint8"); }), ErrorCode::kUnsupported);
}

// ---- Never a partial file at the final path ---------------------------------------------------

// Wraps a real sink; throws (or kills the process) on the Nth write.
class FaultySink final : public Sink {
 public:
  enum class Mode { kThrow, kExit };
  FaultySink(std::unique_ptr<Sink> inner, int fail_at, Mode mode)
      : inner_(std::move(inner)), fail_at_(fail_at), mode_(mode) {}
  void write_gather(uint64_t offset, const IoSlice* slices, size_t count) override {
    if (++writes_ == fail_at_) {
      if (mode_ == Mode::kExit) _exit(0);
      fail(ErrorCode::kIO, "injected write failure");
    }
    inner_->write_gather(offset, slices, count);
  }
  void reserve(uint64_t size) override { inner_->reserve(size); }
  void commit() override { inner_->commit(); }
  void abort() override { inner_->abort(); }
  const std::string& uri() const override { return inner_->uri(); }

 private:
  std::unique_ptr<Sink> inner_;
  std::atomic<int> writes_{0};
  int fail_at_;
  Mode mode_;
};

TEST(PartialFileTest, FailedWriteLeavesNothing) {
  test::TempDir dir;
  Batch b;
  for (int i = 0; i < 8; ++i) b.add_torch("t" + std::to_string(i), "float32", {1000});
  for (int fail_at : {1, 3, 9, 12}) {
    SCOPED_TRACE(fail_at);
    const std::string path = dir.path("f" + std::to_string(fail_at) + ".tensors");
    {
      WriterOptions o;
      o.num_workers = 2;
      auto w = Writer::open(
          std::make_unique<FaultySink>(open_sink(path), fail_at, FaultySink::Mode::kThrow), o);
      EXPECT_EQ(error_code_of([&] { w->write(b.requests()); }), ErrorCode::kIO);
      EXPECT_EQ(error_code_of([&] { w->write(b.requests()); }), ErrorCode::kIO)
          << "writer stays failed";
      EXPECT_EQ(error_code_of([&] { w->close(); }), ErrorCode::kIO);
    }  // destroyed after the failure
    EXPECT_FALSE(fs::exists(path));
  }
  EXPECT_TRUE(test::dir_names(dir.path("")).empty()) << "temporary files are removed";
}

TEST(PartialFileTest, AbortLeavesTheOldFile) {
  test::TempDir dir;
  Batch b;
  b.add_torch("a", "float32", {100});
  const std::string path = dir.path("a.tensors");
  {
    auto w = Writer::open(path);
    w->write(b.requests());
    w->abort();
  }
  EXPECT_FALSE(fs::exists(path));
  test::write_file(path, "previous content");
  {
    auto w = Writer::open(path);
    w->write(b.requests());
    w->abort();
  }
  EXPECT_EQ(test::read_file(path), "previous content");
  EXPECT_EQ(test::dir_names(dir.path("")), std::vector<std::string>{"a.tensors"});
}

TEST(PartialFileTest, DestroyedWriterPublishesCompletedWrites) {
  test::TempDir dir;
  Batch b;
  b.add_torch("a", "float32", {100});
  const std::string path = dir.path("d.tensors");
  { Writer::open(path)->write(b.requests()); }
  expect_file_holds(path, {&b});
}

// A child process that dies mid-write (between write() calls, or inside one) never leaves a file
// at the final path.
TEST(PartialFileTest, CrashMidWriteLeavesNoFileAtTheFinalPath) {
  test::TempDir dir;
  Batch b1, b2;
  for (int i = 0; i < 4; ++i) b1.add_torch("a" + std::to_string(i), "float32", {300000});
  for (int i = 0; i < 4; ++i) b2.add_torch("b" + std::to_string(i), "float32", {300000});
  for (int crash_at : {0, 1, 2, 5}) {  // 0: after the first write() call; N: at the Nth sink write
    SCOPED_TRACE(crash_at);
    const std::string path = dir.path("c" + std::to_string(crash_at) + ".tensors");
    fflush(nullptr);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      WriterOptions o;
      o.num_workers = 1;
      std::unique_ptr<Sink> sink = open_sink(path);
      if (crash_at > 0)
        sink = std::make_unique<FaultySink>(std::move(sink), crash_at, FaultySink::Mode::kExit);
      auto w = Writer::open(std::move(sink), o);
      w->write(b1.requests());
      _exit(0);  // the process ends without close(), as a crash would
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_FALSE(fs::exists(path));
    for (const auto& name : test::dir_names(dir.path("")))
      EXPECT_NE(name, "c" + std::to_string(crash_at) + ".tensors");
  }
}

}  // namespace
}  // namespace tensorizer
