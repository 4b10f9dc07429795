// Conversions (tensorizer/convert.h): .tensors -> safetensors -> .tensors gives the same tensors,
// names and types back; safetensors -> .tensors -> safetensors gives the same bytes back;
// encryption on the way; names that flatten alike, a corrupt input and a meta tensor.
#include "tensorizer/convert.h"

#include <cstring>
#include <fstream>
#include <map>
#include <tuple>

#include "tensorizer/safetensors_writer.h"
#include "test_util.h"

namespace tensorizer {
namespace {

struct Tensor {
  TensorPath path;
  TensorType type;
  std::string dtype, bytes;
  std::vector<uint64_t> shape;
  bool meta = false;
};

std::vector<Tensor> sample() {
  std::string big(20u << 20, '\0');  // streamed piece by piece (over 16 MiB)
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7 + i / 4096);
  return {
      {TensorPath("plain.weight"), TensorType::kParam, "<f4", "abcdefgh", {2}},
      {TensorPath(std::vector<PathComponent>{std::string("layers"), uint64_t{0}, std::string("w")}),
       TensorType::kStateDict,
       "<i2",
       "0123",
       {2}},
      {TensorPath("norm.running_mean"), TensorType::kBuffer, "<f2", "mm", {1}},
      {TensorPath("big"), TensorType::kStateDict, "|u1", big, {big.size()}},
      {TensorPath("ghost"), TensorType::kParam, "<f4", "", {3}, /*meta=*/true},
  };
}

void write_tensors(const std::string& path, const std::vector<Tensor>& ts,
                   const WriterOptions& options = {}) {
  auto w = Writer::open(path, options);
  std::vector<WriteRequest> reqs;
  for (const Tensor& t : ts)
    reqs.push_back(
        {t.path, t.type, 0, t.dtype, t.shape, t.meta ? nullptr : t.bytes.data(), t.meta});
  w->write(reqs);
  w->close();
}

// Every tensor of `path`, by display name: (type, dtype, bytes).
std::map<std::string, std::tuple<TensorType, std::string, std::string>> contents(
    const std::string& path, const ReaderOptions& options = {}) {
  auto r = Reader::open(path, options);
  std::map<std::string, std::tuple<TensorType, std::string, std::string>> out;
  for (size_t i = 0; i < r->entries().size(); ++i) {
    const IndexEntry& e = r->entries()[i];
    std::string bytes(e.expected_bytes(), '\x55');
    r->load({{i, bytes.data()}}, {.verify_hash = true});
    out[display_path(e.path)] = {e.type, e.dtype, bytes};
  }
  return out;
}

TEST(Convert, TensorsToSafetensorsAndBackKeepsTensorsNamesAndTypes) {
  test::TempDir dir;
  const std::string src = dir.path("m.tensors"), st = dir.path("m.safetensors"),
                    back = dir.path("back.tensors");
  write_tensors(src, sample());
  auto in = Reader::open(src);
  auto sink = open_sink(st);
  uint64_t last_done = 0, last_total = 0;
  convert_to_safetensors(*in, *sink, 2,
                         [&](uint64_t d, uint64_t t) { last_done = d, last_total = t; });
  EXPECT_EQ(last_done, last_total);
  EXPECT_EQ(last_total, 8u + 4u + 2u + (20u << 20) + 12u);

  auto st_reader = Reader::open(st);
  ASSERT_EQ(st_reader->format(), FileFormat::kSafetensors);
  EXPECT_TRUE(st_reader->find("layers.0.w").has_value());  // flattened
  const auto st_contents = contents(st);
  EXPECT_EQ(std::get<2>(st_contents.at("ghost")), std::string(12, '\0'));  // meta: zeros

  auto st_in = Reader::open(st);
  convert_to_tensors(*st_in, back, {});
  auto expected = contents(src);
  std::get<2>(expected.at("ghost")) = std::string(12, '\0');
  EXPECT_EQ(contents(back), expected);
  EXPECT_TRUE(Reader::open(back)->find(encode_path(sample()[1].path)).has_value());  // restored
}

TEST(Convert, SafetensorsToTensorsAndBackGivesTheSameBytes) {
  test::TempDir dir;
  const std::string st = dir.path("a.safetensors"), mid = dir.path("a.tensors"),
                    again = dir.path("b.safetensors");
  const std::vector<SafetensorsTensor> tensors = {{"w", "<f4", {2}}, {"b", "<f2", {3}}};
  const std::string w = "12345678", b = "abcdef";
  auto sink = open_sink(st);
  write_safetensors(*sink, tensors, {w.data(), b.data()},
                    std::vector<std::pair<std::string, std::string>>{{"format", "pt"}});
  auto in = Reader::open(st);
  convert_to_tensors(*in, mid, {});
  // The .tensors file holds no safetensors metadata, so only the tensors come back; with none:
  auto plain_sink = open_sink(dir.path("plain.safetensors"));
  write_safetensors(*plain_sink, tensors, {w.data(), b.data()});
  auto mid_reader = Reader::open(mid);
  auto out = open_sink(again);
  convert_to_safetensors(*mid_reader, *out);
  EXPECT_EQ(test::read_file(again), test::read_file(dir.path("plain.safetensors")));
  // safetensors -> safetensors keeps its metadata and bytes.
  auto st_again = Reader::open(st);
  auto copy = open_sink(dir.path("copy.safetensors"));
  convert_to_safetensors(*st_again, *copy);
  EXPECT_EQ(test::read_file(dir.path("copy.safetensors")), test::read_file(st));
}

TEST(Convert, EncryptsOnTheWay) {
  test::TempDir dir;
  const std::string st = dir.path("a.safetensors"), enc = dir.path("a.tensors");
  auto sink = open_sink(st);
  const std::string w = "12345678";
  write_safetensors(*sink, {{"w", "<f4", {2}}}, {w.data()});
  Key key{};
  key[0] = 7;
  WriterOptions wo;
  wo.encryption = EncryptionParams::from_key(key);
  auto in = Reader::open(st);
  convert_to_tensors(*in, enc, wo);
  ReaderOptions ro;
  ro.decryption = DecryptionParams::from_key(key);
  EXPECT_TRUE(Reader::open(enc, ro)->encrypted());
  EXPECT_EQ(std::get<2>(contents(enc, ro).at("w")), w);
}

TEST(Convert, RefusesCollidingNamesAndCorruptInputLeavingNothing) {
  test::TempDir dir;
  const std::string src = dir.path("c.tensors"), out = dir.path("c.safetensors");
  write_tensors(src, {{TensorPath("a.0"), TensorType::kStateDict, "|u1", "x", {1}},
                      {TensorPath(std::vector<PathComponent>{std::string("a"), uint64_t{0}}),
                       TensorType::kStateDict,
                       "|u1",
                       "y",
                       {1}}});
  auto in = Reader::open(src);
  auto sink = open_sink(out);
  EXPECT_EQ(test::error_code_of([&] { convert_to_safetensors(*in, *sink); }),
            ErrorCode::kInvalidArgument);
  EXPECT_FALSE(std::ifstream(out).good());

  // A flipped data byte: the stored hash catches it, nothing is published.
  const std::string good = dir.path("g.tensors");
  write_tensors(good, {sample()[0]});
  std::string bytes = test::read_file(good);
  auto r = Reader::open(good);
  bytes[r->entries()[0].data_offset] ^= 1;
  test::write_file(good, bytes);
  auto bad_in = Reader::open(good);
  auto bad_sink = open_sink(out);
  EXPECT_EQ(test::error_code_of([&] { convert_to_safetensors(*bad_in, *bad_sink); }),
            ErrorCode::kHashMismatch);
  EXPECT_FALSE(std::ifstream(out).good());
  auto bad_again = Reader::open(good);
  EXPECT_EQ(test::error_code_of([&] { convert_to_tensors(*bad_again, dir.path("x.tensors"), {}); }),
            ErrorCode::kHashMismatch);
  EXPECT_FALSE(std::ifstream(dir.path("x.tensors")).good());
}

}  // namespace
}  // namespace tensorizer
