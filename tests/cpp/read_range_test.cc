// Reader::read_range: part of a tensor, read alone, equals the same bytes of the whole tensor, in
// a plain file (pieces on several workers), an encrypted one (whole chunks decrypted) and a meta
// tensor (zeros); bad ranges and verify_hash are refused.
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

}  // namespace
}  // namespace tensorizer
