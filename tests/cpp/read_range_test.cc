// Reader::read_range and read_strided: part of a tensor, read alone, equals the same bytes of the
// whole tensor, in a plain file (pieces on several workers), an encrypted one (whole chunks
// decrypted) and a meta tensor (zeros); strided runs read only their bytes when the gaps are large
// and read across small gaps in one request; bad ranges and verify_hash are refused.
#include <random>

#include "test_util.h"

namespace tensorizer {
namespace {

std::string random_bytes(size_t n) {
  std::mt19937_64 rng(3);
  std::string b(n, '\0');
  for (auto& c : b) c = static_cast<char>(rng());
  return b;
}

TEST(ReadRange, PartsOfPlainAndEncryptedTensorsEqualTheWhole) {
  test::TempDir dir;
  const std::string data = random_bytes((20u << 20) + 13);  // several pieces and chunks
  Key key{};
  key[3] = 9;
  WriterOptions encrypted;
  encrypted.encryption = EncryptionParams::from_key(key);
  for (bool enc : {false, true}) {
    const std::string path = dir.path(enc ? "e.tensors" : "p.tensors");
    test::write_sample_tensors(path, {{"t", data}, {"ghost", std::string(8, '\0'), true}}, "|u1",
                               enc ? encrypted : WriterOptions{});
    ReaderOptions ro;
    if (enc) ro.decryption = DecryptionParams::from_key(key);
    auto r = Reader::open(path, ro);
    const size_t t = *r->find("t");
    for (auto [off, n] : std::vector<std::pair<uint64_t, uint64_t>>{
             {0, 1}, {5, 4 << 20}, {(2 << 20) - 3, 7}, {data.size() - 9, 9}, {0, data.size()}}) {
      std::string got(n, '\x55');
      LoadOptions lo;
      lo.num_workers = 3;
      r->read_range(t, off, n, got.data(), lo);
      EXPECT_EQ(got, data.substr(off, n)) << "enc " << enc << " at " << off << " + " << n;
    }
    std::string zeros(4, '\x55');
    r->read_range(*r->find("ghost"), 2, 4, zeros.data());
    EXPECT_EQ(zeros, std::string(4, '\0'));
    char byte;
    EXPECT_EQ(test::error_code_of([&] { r->read_range(t, data.size(), 1, &byte); }),
              ErrorCode::kInvalidArgument);
    LoadOptions verify;
    verify.verify_hash = true;
    EXPECT_EQ(test::error_code_of([&] { r->read_range(t, 0, 1, &byte, verify); }),
              ErrorCode::kInvalidArgument);
  }
}

// The runs of `r` cut out of `data` and packed.
std::string runs_of(const std::string& data, const StridedRange& r) {
  std::string out;
  for (uint64_t i = 0; i < r.runs; ++i) out += data.substr(r.offset + i * r.stride, r.run_bytes);
  return out;
}

TEST(ReadStrided, ColumnBlocksEqualTheWholeAndReadOnlyTheirBytesAcrossLargeGaps) {
  test::TempDir dir;
  const std::string data = random_bytes(24u << 20);
  Key key{};
  key[1] = 4;
  WriterOptions encrypted;
  encrypted.encryption = EncryptionParams::from_key(key);
  for (bool enc : {false, true}) {
    const std::string path = dir.path(enc ? "e.tensors" : "p.tensors");
    test::write_sample_tensors(path, {{"t", data}, {"ghost", std::string(64, '\0'), true}}, "|u1",
                               enc ? encrypted : WriterOptions{});
    ReaderOptions ro;
    if (enc) ro.decryption = DecryptionParams::from_key(key);
    auto r = Reader::open(path, ro);
    const size_t t = *r->find("t");
    struct Case {
      StridedRange range;
      bool gaps_read;  // small gaps: read across them (plain files)
    };
    const Case cases[] = {
        {{3, 100, 1000, 500}, true},                 // a narrow column block, 900-byte gaps
        {{1 << 20, 4096, 1 << 20, 20}, false},       // 1 MiB gaps: one request per run
        {{7, (9u << 20) + 1, 12u << 20, 2}, false},  // runs longer than one request
        {{0, 1 << 16, (1 << 16) + 64, 300}, true},   // many runs coalesced into several requests
        {{data.size() - 5, 5, 5, 1}, true},          // the last bytes
    };
    for (const Case& c : cases) {
      const StridedRange& s = c.range;
      SCOPED_TRACE("enc " + std::to_string(enc) + " offset " + std::to_string(s.offset) + " runs " +
                   std::to_string(s.runs));
      std::string got(s.runs * s.run_bytes, '\x55');
      LoadOptions lo;
      lo.num_workers = 3;
      const uint64_t before = r->bytes_read();
      r->read_strided(t, s, got.data(), lo);
      EXPECT_TRUE(got == runs_of(data, s));
      const uint64_t read = r->bytes_read() - before;
      const uint64_t span = (s.runs - 1) * s.stride + s.run_bytes;
      if (enc)
        EXPECT_GE(read, span);
      else
        EXPECT_EQ(read, c.gaps_read ? span : s.runs * s.run_bytes);
    }
    std::string zeros(12, '\x55');
    r->read_strided(*r->find("ghost"), {2, 4, 10, 3}, zeros.data());
    EXPECT_EQ(zeros, std::string(12, '\0'));
    char buf[64];
    for (const StridedRange bad : {StridedRange{0, 10, 5, 2},                // runs overlap
                                   StridedRange{data.size() - 10, 6, 5, 2},  // past the end
                                   StridedRange{0, 1, ~0ull / 2, 3}})        // overflowing span
      EXPECT_EQ(test::error_code_of([&] { r->read_strided(t, bad, buf); }),
                ErrorCode::kInvalidArgument);
  }
}

}  // namespace
}  // namespace tensorizer
