// safetensors files: the codec's validation (every malformed header is a kFormat error naming
// what was wrong), Reader loads through every host route, the staged pipeline and a remote-like
// memory source giving the stored bytes exactly, and writes laid out as the safetensors library
// lays them out, published whole or not at all.
#include "tensorizer/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <random>

#include "tensorizer/dtype.h"
#include "tensorizer/host_load.h"
#include "tensorizer/mapped_load.h"
#include "tensorizer/safetensors_writer.h"
#include "tensorizer/staged_load.h"
#include "test_util.h"

namespace tensorizer {
namespace {

std::string u64le(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(v >> (8 * i));
  return out;
}

// A file: the 8-byte length, `header` padded with spaces to `pad_to`, then `data`.
std::string file_of(std::string header, const std::string& data, size_t pad_to = 8) {
  while (header.size() % pad_to) header += ' ';
  return u64le(header.size()) + header + data;
}

SafetensorsHeader parse(const std::string& file) {
  const auto* p = reinterpret_cast<const uint8_t*>(file.data());
  const uint64_t n = safetensors_header_length(p, file.size(), file.size());
  return parse_safetensors_header(p + 8, n, file.size());
}

std::string format_error(const std::string& file) {
  try {
    parse(file);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFormat) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(SafetensorsCodec, ParsesEntriesMetadataAndDtypes) {
  const std::string data(4 * 2 + 2 * 3 + 1, 'x');
  const std::string f = file_of(R"({"b":{"dtype":"BF16","shape":[3],"data_offsets":[8,14]},)"
                                R"("a":{"dtype":"F32","shape":[2,1],"data_offsets":[0,8]},)"
                                R"("c":{"dtype":"BOOL","shape":[1],"data_offsets":[14,15]},)"
                                R"("e":{"dtype":"I64","shape":[0,4],"data_offsets":[15,15]},)"
                                R"("__metadata__":{"format":"pt","z":"1"}})",
                                data);
  const SafetensorsHeader h = parse(f);
  ASSERT_EQ(h.entries.size(), 4u);
  EXPECT_EQ(h.entries[0].name, "a");
  EXPECT_EQ(h.entries[0].dtype, "<f4");
  EXPECT_EQ(h.entries[0].shape, (std::vector<uint64_t>{2, 1}));
  EXPECT_EQ(h.entries[0].data_offset, h.data_start);
  EXPECT_EQ(h.entries[0].header_size(), 0u);
  EXPECT_EQ(h.entries[1].name, "b");
  EXPECT_EQ(parse_dtype(h.entries[1].dtype).torch_name(), "torch.bfloat16");
  EXPECT_EQ(h.entries[1].data_offset, h.data_start + 8);
  EXPECT_EQ(h.entries[1].data_length, 6u);
  EXPECT_EQ(h.entries[2].dtype, "|b1");
  EXPECT_EQ(h.entries[3].data_length, 0u);
  EXPECT_FALSE(h.entries[3].is_meta());
  EXPECT_EQ(h.metadata,
            (std::vector<std::pair<std::string, std::string>>{{"format", "pt"}, {"z", "1"}}));
  EXPECT_EQ(h.data_start + data.size(), f.size());
}

TEST(SafetensorsCodec, MapsEveryDtypeOrRefusesIt) {
  EXPECT_EQ(dtype_string_for_safetensors("F16"), "<f2");
  EXPECT_EQ(dtype_string_for_safetensors("U8"), "|u1");
  EXPECT_EQ(dtype_string_for_safetensors("C64"), "<c8");
  EXPECT_EQ(parse_dtype(dtype_string_for_safetensors("F8_E4M3")).torch_name(),
            "torch.float8_e4m3fn");
  EXPECT_EQ(parse_dtype(dtype_string_for_safetensors("F8_E5M2")).torch_name(), "torch.float8_e5m2");
  EXPECT_EQ(test::error_code_of([] { dtype_string_for_safetensors("F4"); }),
            ErrorCode::kUnsupported);
  EXPECT_EQ(test::error_code_of([] { dtype_string_for_safetensors("f32"); }), ErrorCode::kFormat);
}

TEST(SafetensorsCodec, RefusesEveryMalformedHeaderNamingTheCause) {
  const std::string d8(8, 'x');
  const auto one = [&](const std::string& body) { return file_of("{\"t\":" + body + "}", d8); };
  EXPECT_NE(format_error(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,4]})"))
                .find("dtype and shape make 8 bytes, data_offsets 4"),
            std::string::npos);
  EXPECT_NE(format_error(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,12]})"))
                .find("past the data buffer"),
            std::string::npos);
  EXPECT_NE(format_error(one(R"({"dtype":"F32","shape":[2],"data_offsets":[8,0]})"))
                .find("end before they begin"),
            std::string::npos);
  EXPECT_NE(format_error(one(R"({"dtype":"F32","shape":[-2],"data_offsets":[0,8]})"))
                .find("not a non-negative integer"),
            std::string::npos);
  EXPECT_NE(format_error(one(R"({"dtype":"F32","shape":[2.0],"data_offsets":[0,8]})"))
                .find("not a non-negative integer"),
            std::string::npos);
  EXPECT_NE(format_error(one(R"({"dtype":"F32","shape":[2]})")).find("lacks one of"),
            std::string::npos);
  EXPECT_NE(format_error(one(R"({"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1})"))
                .find("unknown field 'x'"),
            std::string::npos);
  EXPECT_NE(format_error(one(R"({"dtype":"F32","shape":[[2]],"data_offsets":[0,8]})"))
                .find("nested deeper"),
            std::string::npos);
  EXPECT_NE(format_error(one(R"({"dtype":"F32","shape":[4294967296,4294967296,4294967296],)"
                             R"("data_offsets":[0,8]})"))
                .find("overflows"),
            std::string::npos);
  EXPECT_NE(format_error(one(R"({"dtype":"Q4","shape":[2],"data_offsets":[0,8]})"))
                .find("unknown safetensors dtype 'Q4'"),
            std::string::npos);
  // Overlaps, gaps, uncovered bytes and duplicate names.
  EXPECT_NE(format_error(file_of(R"({"a":{"dtype":"U8","shape":[6],"data_offsets":[0,6]},)"
                                 R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                                 d8))
                .find("overlaps"),
            std::string::npos);
  EXPECT_NE(format_error(file_of(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                                 R"("b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                                 d8))
                .find("a gap before it"),
            std::string::npos);
  EXPECT_NE(format_error(file_of(R"({"a":{"dtype":"U8","shape":[6],"data_offsets":[0,6]}})", d8))
                .find("cover 6 bytes of a 8-byte data buffer"),
            std::string::npos);
  EXPECT_NE(format_error(file_of(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                                 R"("a":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
                                 d8))
                .find("'a' appears twice"),
            std::string::npos);
  EXPECT_NE(format_error(file_of(R"({"__metadata__":{"k":1}})", "")).find("is not a string"),
            std::string::npos);
  EXPECT_NE(format_error(file_of(R"({"a":)", "")).find("not valid JSON"), std::string::npos);
  EXPECT_NE(format_error(file_of(R"(["a"])", "")).find("not a JSON object"), std::string::npos);
  EXPECT_NE(format_error(file_of("{\"\xff\":{}}", "")).find("not valid JSON"), std::string::npos);
  // A length past the end of the file.
  std::string lying = file_of("{}", "");
  lying.replace(0, 8, u64le(1ull << 40));
  EXPECT_NE(format_error(lying).find("runs past the end of the file"), std::string::npos);
}

// A safetensors file of `n` random tensors with the given dtype sizes; returns their bytes.
struct Sample {
  std::string file;
  std::vector<std::string> tensors;
};
Sample sample_file(size_t header_pad) {
  std::mt19937_64 rng(11);
  const std::vector<std::pair<const char*, size_t>> specs = {
      {"F32", (5u << 20) + 12}, {"BF16", 3}, {"F16", 4096}, {"U8", 7}, {"I64", 9}, {"F32", 0}};
  std::string header = "{", data;
  Sample s;
  for (size_t i = 0; i < specs.size(); ++i) {
    const auto& [dtype, count] = specs[i];
    const size_t itemsize = parse_dtype(dtype_string_for_safetensors(dtype)).itemsize;
    std::string bytes(count * itemsize, '\0');
    for (auto& c : bytes) c = static_cast<char>(rng());
    if (i) header += ',';
    header += "\"t" + std::to_string(i) + "\":{\"dtype\":\"";
    header += dtype;
    header += "\",\"shape\":[" + std::to_string(count) + "],\"data_offsets\":[";
    header += std::to_string(data.size()) + "," + std::to_string(data.size() + bytes.size()) + "]}";
    data += bytes;
    s.tensors.push_back(std::move(bytes));
  }
  header += "}";
  s.file = file_of(header, data, header_pad);
  return s;
}

void drop_page_cache(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

class SafetensorsLoad : public ::testing::TestWithParam<size_t> {};  // header padding

TEST_P(SafetensorsLoad, EveryRouteGivesTheStoredBytes) {
  test::TempDir dir;
  const Sample s = sample_file(GetParam());
  const std::string path = dir.path("m.safetensors");
  test::write_file(path, s.file);
  std::vector<size_t> all(s.tensors.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  for (HostRoute route : {HostRoute::kAuto, HostRoute::kMap, HostRoute::kDirect, HostRoute::kCopy})
    for (bool cold : {false, true}) {
      if (cold) drop_page_cache(path);
      auto reader = Reader::open(path);
      ASSERT_EQ(reader->format(), FileFormat::kSafetensors);
      ASSERT_EQ(reader->entries().size(), s.tensors.size());
      LoadOptions opt;
      opt.verify_hash = true;  // nothing stored to check: loads all the same
      const auto out = load_to_host(*reader, all, opt, route);
      if (GetParam() % 8 == 0 &&
          (route == HostRoute::kMap || (route == HostRoute::kAuto && !cold))) {
        EXPECT_EQ(out[0].via, LoadedVia::kMapped);  // an aligned safetensors tensor is mapped
      }
      for (size_t i = 0; i < all.size(); ++i) {
        ASSERT_EQ(out[i].size, s.tensors[i].size());
        EXPECT_EQ(std::memcmp(out[i].data, s.tensors[i].data(), out[i].size), 0)
            << "tensor " << i << " route " << static_cast<int>(route) << " cold " << cold;
        EXPECT_EQ(reinterpret_cast<uintptr_t>(out[i].data) % reader->entries()[i].itemsize(), 0u);
      }
    }
}

TEST_P(SafetensorsLoad, StagedAndStreamedSourcesGiveTheStoredBytes) {
  const Sample s = sample_file(GetParam());
  auto bytes = std::make_shared<const std::string>(s.file);
  auto reader = Reader::open(make_memory_source(bytes, "mem://m.safetensors"));
  std::vector<std::string> got(s.tensors.size());
  std::vector<TensorDestination> dests;
  for (size_t i = 0; i < got.size(); ++i) {
    got[i].assign(s.tensors[i].size(), '\0');
    dests.push_back({i, got[i].data()});
  }
  reader->load(dests);
  EXPECT_EQ(got, s.tensors);
  auto backend = host_copy_backend(2, 0);
  for (auto& g : got) std::fill(g.begin(), g.end(), '\0');
  StagingOptions staging;
  staging.ring_bytes = 1 << 20;
  load_staged(*reader, dests, *backend, {}, staging);
  EXPECT_EQ(got, s.tensors);
}

INSTANTIATE_TEST_SUITE_P(HeaderPadding, SafetensorsLoad, ::testing::Values(8, 64, 1),
                         [](const auto& info) { return "pad" + std::to_string(info.param); });

TEST(SafetensorsOpen, EveryTruncationAndFlippedLengthIsAnError) {
  const std::string file = sample_file(8).file;
  const uint64_t header_end =  // where the data begins
      8 + safetensors_header_length(reinterpret_cast<const uint8_t*>(file.data()), 8, file.size());
  // Every cut through the length and the header, then a sample of cuts through the data.
  for (uint64_t cut = 0; cut < file.size(); cut += cut < header_end + 64 ? 1 : 4099) {
    auto bytes = std::make_shared<const std::string>(file.substr(0, cut));
    EXPECT_NE(test::error_code_of([&] {
                auto r = Reader::open(make_memory_source(bytes, "cut"));
                (void)r;
              }),
              ErrorCode::kCancelled)
        << "cut at " << cut;
  }
  // Absurd header lengths: larger than the file, and the largest u64.
  for (uint64_t n : {uint64_t{file.size()}, ~uint64_t{0}}) {
    auto bytes = std::make_shared<const std::string>(u64le(n) + file.substr(8));
    EXPECT_EQ(test::error_code_of([&] { Reader::open(make_memory_source(bytes, "len")); }),
              ErrorCode::kFormat);
  }
}

TEST(SafetensorsOpen, MetadataFormatAndErrors) {
  test::TempDir dir;
  const std::string path = dir.path("m.safetensors");
  test::write_file(path, file_of(R"({"__metadata__":{"format":"pt"},)"
                                 R"("w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                 "abcd"));
  auto reader = Reader::open(path);
  EXPECT_EQ(reader->format(), FileFormat::kSafetensors);
  EXPECT_EQ(reader->metadata().size(), 1u);
  EXPECT_EQ(reader->header().tensor_count, 1u);
  EXPECT_EQ(reader->header().tensor_size, 4u);
  EXPECT_FALSE(reader->encrypted());
  ReaderOptions with_key;
  with_key.decryption = DecryptionParams::from_passphrase("x");
  EXPECT_EQ(test::error_code_of([&] { Reader::open(path, with_key); }), ErrorCode::kCrypto);
  // A truncated file names the file and the cause.
  const std::string whole = test::read_file(path);
  test::write_file(path, whole.substr(0, whole.size() - 1));
  try {
    Reader::open(path);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFormat);
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("past the data buffer"), std::string::npos) << e.what();
  }
}

TEST(SafetensorsWrite, LaysOutAsTheLibraryDoesAndRoundTrips) {
  const std::vector<SafetensorsTensor> tensors = {{"b", "<f4", {2}},
                                                  {"a", "<f4", {1}},
                                                  {"x", dtype_string_for_torch("bfloat16"), {3}},
                                                  {"i", "<i8", {1}},
                                                  {"m", "|b1", {2}}};
  const SafetensorsLayout layout =
      plan_safetensors(tensors, std::vector<std::pair<std::string, std::string>>{{"format", "pt"}});
  // Widest dtype first (I64, then F32 by name, BF16, BOOL), back to back.
  const std::string expected_json =
      R"({"__metadata__":{"format":"pt"},"i":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]},)"
      R"("x":{"dtype":"BF16","shape":[3],"data_offsets":[20,26]},)"
      R"("m":{"dtype":"BOOL","shape":[2],"data_offsets":[26,28]}})";
  std::string padded = expected_json;
  padded.append((8 - padded.size() % 8) % 8, ' ');
  EXPECT_EQ(layout.prefix, u64le(padded.size()) + padded);
  const uint64_t start = layout.prefix.size();
  EXPECT_EQ(layout.data_offset,
            (std::vector<uint64_t>{start + 12, start + 8, start + 20, start, start + 26}));
  EXPECT_EQ(layout.file_size, start + 28);

  test::TempDir dir;
  const std::string path = dir.path("w.safetensors");
  const std::vector<std::string> bytes = {"BBBBbbbb", "AAAA", "xxXXxx", "iiiiIIII", "\1\1"};
  std::vector<const void*> data;
  for (const auto& b : bytes) data.push_back(b.data());
  auto sink = open_sink(path);
  EXPECT_EQ(write_safetensors(*sink, tensors, data), start - 32 + 28);  // no metadata: 32 fewer
  auto reader = Reader::open(path);
  ASSERT_EQ(reader->entries().size(), tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto entry = reader->find(tensors[i].name);
    ASSERT_TRUE(entry.has_value());
    std::string got(bytes[i].size(), '\0');
    reader->load({{*entry, got.data()}});
    EXPECT_EQ(got, bytes[i]) << tensors[i].name;
  }
}

TEST(SafetensorsWrite, RefusesBadInputLeavesTheDestinationAndDescribesParts) {
  EXPECT_EQ(test::error_code_of([] {
              plan_safetensors({{"a", "<f4", {1}}, {"a", "<i4", {1}}}, {});
            }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(test::error_code_of([] {
              plan_safetensors({{"__metadata__", "<f4", {1}}}, {});
            }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(test::error_code_of([] {
              plan_safetensors({{"c", "<c16", {1}}}, {});
            }),
            ErrorCode::kUnsupported);
  EXPECT_EQ(test::error_code_of([] {
              plan_safetensors({{"h", "<f8", {1ull << 62, 4}}}, {});
            }),
            ErrorCode::kInvalidArgument);
  test::TempDir dir;
  const std::string path = dir.path("keep.safetensors");
  test::write_file(path, "old");
  auto sink = open_sink(path);
  const float one = 1;
  EXPECT_EQ(test::error_code_of([&] {
              write_safetensors(*sink, {{"c", "<c16", {1}}}, {&one});
            }),
            ErrorCode::kUnsupported);
  EXPECT_EQ(test::read_file(path), "old");

  // A sink of named parts (Redis) is told the file's parts before it commits.
  struct PartsSink : Sink {
    std::vector<NamedRange> parts;
    bool committed = false;
    std::string name = "parts://x";
    void write_gather(uint64_t, const IoSlice*, size_t) override {}
    void commit() override { committed = !parts.empty(); }
    void abort() override { ADD_FAILURE() << "aborted"; }
    const std::string& uri() const override { return name; }
    bool wants_parts() const override { return true; }
    void set_parts(std::vector<NamedRange> p) override { parts = std::move(p); }
  } parts;
  const float two[2] = {1, 2};
  write_safetensors(parts, {{"b", "<f4", {2}}, {"a", "<f4", {1}}, {"z", "<f4", {0}}},
                    {two, &one, nullptr});
  ASSERT_TRUE(parts.committed);
  ASSERT_EQ(parts.parts.size(), 3u);  // the header, then a and b in file order; z stores nothing
  EXPECT_EQ(parts.parts[0].name, kSafetensorsPart);
  EXPECT_EQ(parts.parts[0].offset, 0u);
  EXPECT_EQ(parts.parts[1].name, "a");
  EXPECT_EQ(parts.parts[1].offset, parts.parts[0].size);
  EXPECT_EQ(parts.parts[1].size, 4u);
  EXPECT_EQ(parts.parts[2].name, "b");
  EXPECT_EQ(parts.parts[2].offset, parts.parts[0].size + 4);
}

}  // namespace
}  // namespace tensorizer
