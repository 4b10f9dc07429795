// The CryptInfo codec byte for byte (docs/format.md §3.5 worked example and sizes), keys (the
// Argon2id check value of §3.2, argument checks), nonce arithmetic and bookkeeping, and the chunked
// secretbox checked against libsodium's combined API.
#include <gtest/gtest.h>
#include <sodium.h>

#include <algorithm>
#include <set>

#include "crypto/crypt_info.h"
#include "crypto/tensor_crypto.h"
#include "tensorizer/error.h"
#include "tensorizer/hash.h"
#include "test_util.h"

namespace tensorizer {
namespace {

using crypto::CryptInfo;
using crypto::Mac;
using crypto::Nonce;

std::string unhex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2)
    out += static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16));
  return out;
}

Nonce counting_nonce(uint8_t start) {
  Nonce n;
  for (size_t i = 0; i < n.size(); ++i) n[i] = static_cast<uint8_t>(start + i);
  return n;
}

template <typename F>
ErrorCode error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "no error";
  return ErrorCode::kCancelled;
}

TEST(CryptInfoTest, WorkedExampleBytes) {
  // Spec §3.5: passphrase key (ops 1, mem 8192), 12-byte tensor, one MAC: C = 118.
  crypto::KeyDerivationChunk kdf;
  kdf.opslimit = 1;
  kdf.memlimit = 8192;
  kdf.salt = "0123456789abcdef";
  crypto::ParallelChunk p;
  p.chunk_size = 2097152;
  p.nonce = counting_nonce(0xa0);
  p.macs = {Mac{}};
  std::fill(p.macs[0].begin(), p.macs[0].end(), 0xee);
  const std::string body = crypto::encode_crypt_info(&kdf, p);
  ASSERT_EQ(body.size(), 118u);
  const std::string expected = unhex(
                                   "0200"  // 2 chunks
                                   "2a00000000000000"
                                   "01000100"  // 42 bytes: type 1, method 1
                                   "0100000000000000"
                                   "0020000000000000"  // ops 1, mem 8192
                                   "02000000"
                                   "1000") +  // Argon2id13, 16-byte salt
                               "0123456789abcdef" +
                               unhex(
                                   "3a00000000000000"
                                   "0200"
                                   "0000200000000000") +  // 58 bytes: type 2, 2 MiB
                               std::string(p.nonce.begin(), p.nonce.end()) +
                               unhex("0100000000000000") + std::string(16, '\xee');
  EXPECT_EQ(test::hex(body), test::hex(expected));

  CryptInfo back = crypto::parse_crypt_info(body);
  EXPECT_EQ(back.chunk_count, 2);
  ASSERT_EQ(back.key_derivation.size(), 1u);
  EXPECT_EQ(back.key_derivation[0].opslimit, 1u);
  EXPECT_EQ(back.key_derivation[0].memlimit, 8192u);
  EXPECT_EQ(back.key_derivation[0].algorithm, 2);
  EXPECT_EQ(back.key_derivation[0].salt, "0123456789abcdef");
  ASSERT_EQ(back.parallel.size(), 1u);
  EXPECT_EQ(back.parallel[0].chunk_size, 2097152u);
  EXPECT_EQ(back.parallel[0].nonce, p.nonce);
  EXPECT_EQ(back.parallel[0].macs, p.macs);
}

TEST(CryptInfoTest, SizesAre52Or102Plus16PerMac) {
  crypto::KeyDerivationChunk kdf;
  kdf.opslimit = 2;
  kdf.memlimit = 67108864;
  kdf.salt = std::string(16, 's');
  for (uint64_t m : {1u, 2u, 3u, 17u, 513u}) {
    crypto::ParallelChunk p;
    p.chunk_size = 2097152;
    p.macs.resize(m);
    EXPECT_EQ(crypto::encode_crypt_info(nullptr, p).size(), 52 + 16 * m);
    EXPECT_EQ(crypto::encode_crypt_info(&kdf, p).size(), 102 + 16 * m);
    EXPECT_EQ(crypto::crypt_info_size(false, 0, m), 52 + 16 * m);
    EXPECT_EQ(crypto::crypt_info_size(true, 16, m), 102 + 16 * m);
  }
  // Through the encryptor's layout function: M = ceil(len / 2 MiB).
  EncryptionParams key = EncryptionParams::random();
  EncryptionParams pass = EncryptionParams::from_passphrase("p", OpsLimit::kMin, MemLimit::kMin);
  for (auto [len, m] : std::vector<std::pair<uint64_t, uint64_t>>{
           {1, 1}, {2097152, 1}, {2097153, 2}, {4194304, 2}, {10 << 20, 5}}) {
    EXPECT_EQ(crypto::TensorEncryptor::crypt_info_size(key, len), 52 + 16 * m) << len;
    EXPECT_EQ(crypto::TensorEncryptor::crypt_info_size(pass, len), 102 + 16 * m) << len;
  }
}

TEST(CryptInfoTest, EmptyCryptInfoAndSequentialChunk) {
  EXPECT_EQ(crypto::parse_crypt_info(std::string(2, '\0')).chunk_count, 0);
  // Type 3: nonce + MAC, 42 bytes.
  const Nonce n = counting_nonce(1);
  const std::string body = unhex(
                               "0100"
                               "2a00000000000000"
                               "0300") +
                           std::string(n.begin(), n.end()) + std::string(16, '\x07');
  CryptInfo ci = crypto::parse_crypt_info(body);
  ASSERT_EQ(ci.sequential.size(), 1u);
  EXPECT_EQ(ci.sequential[0].nonce, n);
  Mac sevens;
  sevens.fill(7);
  EXPECT_EQ(ci.sequential[0].mac, sevens);
  // Unused bytes at the end of a frame or of the body are ignored, as tensorizer does.
  const std::string padded = unhex(
                                 "0100"
                                 "2e00000000000000"
                                 "0300") +
                             std::string(n.begin(), n.end()) + std::string(16, '\x07') + "PADS" +
                             "TAIL";
  EXPECT_EQ(crypto::parse_crypt_info(padded).sequential[0].nonce, n);
}

TEST(CryptInfoTest, MalformedInputIsRejected) {
  crypto::ParallelChunk p;
  p.chunk_size = 2097152;
  p.macs.resize(3);
  const std::string good = crypto::encode_crypt_info(nullptr, p);
  // Every truncation fails cleanly.
  for (size_t n = 0; n < good.size(); ++n)
    EXPECT_EQ(error_of([&] { crypto::parse_crypt_info(good.substr(0, n)); }), ErrorCode::kFormat)
        << n;
  // Frame longer than the body.
  std::string bad = good;
  bad[2] = static_cast<char>(0xff);
  EXPECT_EQ(error_of([&] { crypto::parse_crypt_info(bad); }), ErrorCode::kFormat);
  // MAC count larger than the frame holds (no huge allocation).
  bad = good;
  std::memset(bad.data() + 2 + 8 + 2 + 8 + 24, 0xff, 8);
  EXPECT_EQ(error_of([&] { crypto::parse_crypt_info(bad); }), ErrorCode::kFormat);
  // Chunk sizes that are not a multiple of 64 or are below 1024.
  for (uint64_t cs : {0ull, 64ull, 960ull, 1025ull, 2097153ull}) {
    bad = good;
    std::memcpy(bad.data() + 12, &cs, 8);
    EXPECT_EQ(error_of([&] { crypto::parse_crypt_info(bad); }), ErrorCode::kFormat) << cs;
  }
  // Unknown chunk type.
  bad = good;
  bad[10] = 9;
  EXPECT_EQ(error_of([&] { crypto::parse_crypt_info(bad); }), ErrorCode::kFormat);
}

TEST(KeysTest, Argon2idCheckValue) {
  KdfParams kdf;
  kdf.opslimit = 1;
  kdf.memlimit = 8192;
  const std::string salt = "0123456789abcdef";
  std::copy(salt.begin(), salt.end(), kdf.salt.begin());
  const Key k = derive_key("hunter2", kdf);
  EXPECT_EQ(to_hex(k.data(), k.size()),
            "5f61a8c05708063a9a3a44fd63189f0169304a4e5cd1dbedbca1cb91c7d30494");
  std::array<uint8_t, 16> s;
  std::copy(salt.begin(), salt.end(), s.begin());
  EncryptionParams p = EncryptionParams::from_passphrase("hunter2", 1, 8192, s);
  EXPECT_EQ(p.key, k);
  ASSERT_TRUE(p.kdf.has_value());
  EXPECT_EQ(p.kdf->salt, s);
  EXPECT_EQ(p.kdf->opslimit, 1u);
  EXPECT_EQ(p.kdf->memlimit, 8192u);
}

TEST(KeysTest, PresetsAndArgumentChecks) {
  EXPECT_EQ(OpsLimit::kInteractive, uint64_t{crypto_pwhash_OPSLIMIT_INTERACTIVE});
  EXPECT_EQ(OpsLimit::kModerate, uint64_t{crypto_pwhash_OPSLIMIT_MODERATE});
  EXPECT_EQ(OpsLimit::kSensitive, uint64_t{crypto_pwhash_OPSLIMIT_SENSITIVE});
  EXPECT_EQ(MemLimit::kInteractive, uint64_t{crypto_pwhash_MEMLIMIT_INTERACTIVE});
  EXPECT_EQ(MemLimit::kModerate, uint64_t{crypto_pwhash_MEMLIMIT_MODERATE});
  EXPECT_EQ(MemLimit::kSensitive, uint64_t{crypto_pwhash_MEMLIMIT_SENSITIVE});
  EXPECT_EQ(error_of([] { EncryptionParams::from_passphrase("", 1, 8192); }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_of([] { EncryptionParams::from_passphrase("x", 0, 8192); }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(error_of([] { EncryptionParams::from_passphrase("x", 1, 8191); }),
            ErrorCode::kInvalidArgument);
  // Random salts and keys differ each time.
  auto a = EncryptionParams::from_passphrase("x", 1, 8192),
       b = EncryptionParams::from_passphrase("x", 1, 8192);
  EXPECT_NE(a.kdf->salt, b.kdf->salt);
  EXPECT_NE(a.key, b.key);
  EXPECT_NE(EncryptionParams::random().key, EncryptionParams::random().key);
  EXPECT_EQ(EncryptionParams::from_key(a.key).key, a.key);
  EXPECT_FALSE(EncryptionParams::from_key(a.key).kdf.has_value());
}

TEST(NonceTest, LittleEndianIncrementMatchesSodium) {
  crypto::ensure_sodium();
  for (uint8_t fill : {0x00, 0xfe, 0xff}) {
    Nonce base;
    base.fill(fill);
    base[0] = 0xf0;
    for (uint64_t i : {0ull, 1ull, 15ull, 16ull, 255ull, 256ull, 65537ull, 0xffffffffffull}) {
      Nonce expected = base;
      // sodium_increment one step at a time for small i; sodium_add for the large ones.
      Nonce add{};
      for (size_t b = 0; b < 8; ++b) add[b] = static_cast<uint8_t>(i >> (8 * b));
      sodium_add(expected.data(), add.data(), expected.size());
      EXPECT_EQ(crypto::nonce_at(base, i), expected) << i;
    }
  }
  Nonce top;
  top.fill(0xff);
  Nonce inc = top;
  sodium_increment(inc.data(), inc.size());
  EXPECT_EQ(crypto::nonce_at(top, 1), inc);  // wraps to zero
  EXPECT_EQ(inc, Nonce{});
}

TEST(NonceTest, RegistryNeverHandsOutOverlappingRanges) {
  crypto::NonceRegistry reg;
  std::vector<std::pair<std::string, std::string>> ranges;  // big-endian [lo, hi)
  auto be = [](const Nonce& n) { return std::string(n.rbegin(), n.rend()); };
  for (uint64_t i = 0; i < 500; ++i) {
    const uint64_t count = 1 + (i * 7919) % 3000;
    Nonce n0 = reg.reserve(count);
    ranges.emplace_back(be(n0), be(crypto::nonce_at(n0, count)));
    EXPECT_LT(ranges.back().first, ranges.back().second);
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i) EXPECT_LE(ranges[i - 1].second, ranges[i].first);
}

// Each chunk sealed by TensorEncryptor opens with libsodium's combined API (mac || ciphertext)
// under nonce n0 + i, and TensorDecryptor opens the whole thing.
TEST(ChunkedSecretboxTest, ChunksAreIndependentSecretboxes) {
  EncryptionParams params = EncryptionParams::random();
  crypto::NonceRegistry reg;
  const uint64_t len = 2 * crypto::kChunkSize + 12345;
  std::string plain(len, '\0');
  for (uint64_t i = 0; i < len; ++i) plain[i] = static_cast<char>(i * 131 + (i >> 11));
  crypto::TensorEncryptor enc(params, len, reg);
  ASSERT_EQ(enc.chunk_count(), 3u);
  std::string sealed(len, '\0');
  enc.encrypt_chunks(0, reinterpret_cast<const uint8_t*>(plain.data()),
                     reinterpret_cast<uint8_t*>(sealed.data()), len, 2);
  const std::string info = enc.crypt_info();
  CryptInfo ci = crypto::parse_crypt_info(info);
  ASSERT_EQ(ci.parallel.size(), 1u);
  ASSERT_EQ(ci.parallel[0].macs.size(), 3u);
  for (uint64_t c = 0; c < 3; ++c) {
    const uint64_t off = c * crypto::kChunkSize, n = std::min(crypto::kChunkSize, len - off);
    std::string combined(ci.parallel[0].macs[c].begin(), ci.parallel[0].macs[c].end());
    combined += sealed.substr(off, n);
    std::string opened(n, '\0');
    const Nonce nonce = crypto::nonce_at(ci.parallel[0].nonce, c);
    ASSERT_EQ(crypto_secretbox_open_easy(reinterpret_cast<uint8_t*>(opened.data()),
                                         reinterpret_cast<const uint8_t*>(combined.data()),
                                         combined.size(), nonce.data(), params.key.data()),
              0)
        << c;
    EXPECT_TRUE(opened == plain.substr(off, n)) << c;
  }
  crypto::KeyCache cache;
  auto dec =
      crypto::TensorDecryptor::create(info, len, DecryptionParams::from_key(params.key), cache);
  ASSERT_NE(dec, nullptr);
  EXPECT_EQ(dec->chunk_size(), crypto::kChunkSize);
  dec->decrypt_chunks(0, reinterpret_cast<uint8_t*>(sealed.data()), len, 3);
  EXPECT_TRUE(sealed == plain);
}

TEST(ChunkedSecretboxTest, DecryptorRejectsInconsistentInfo) {
  crypto::KeyCache cache;
  const auto key = DecryptionParams::from_key(Key{});
  crypto::ParallelChunk p;
  p.chunk_size = 2097152;
  p.macs.resize(2);
  const std::string two_macs = crypto::encode_crypt_info(nullptr, p);
  // 2 MACs but 5 MiB make 3 chunks; 2 MACs for 1 byte.
  for (uint64_t len : {5ull << 20, 1ull}) {
    EXPECT_EQ(error_of([&] { crypto::TensorDecryptor::create(two_macs, len, key, cache); }),
              ErrorCode::kFormat);
  }
  // Only a key-derivation chunk: no method.
  crypto::KeyDerivationChunk kdf;
  kdf.opslimit = 1;
  kdf.memlimit = 8192;
  kdf.salt = std::string(16, 'x');
  std::string only_kdf = crypto::encode_crypt_info(&kdf, p);
  only_kdf[0] = 1;  // count 1: the parallel chunk is no longer read
  EXPECT_EQ(error_of([&] { crypto::TensorDecryptor::create(only_kdf, 4 << 20, key, cache); }),
            ErrorCode::kCrypto);
  // Two methods.
  std::string body = crypto::encode_crypt_info(nullptr, p);
  std::string twice = unhex("0200") + body.substr(2) + body.substr(2);
  EXPECT_EQ(error_of([&] { crypto::TensorDecryptor::create(twice, 4 << 20, key, cache); }),
            ErrorCode::kCrypto);
  // A passphrase for an exact-key tensor; an unknown password hashing algorithm.
  const auto pass = DecryptionParams::from_passphrase("pw");
  EXPECT_EQ(error_of([&] { crypto::TensorDecryptor::create(two_macs, 4 << 20, pass, cache); }),
            ErrorCode::kCrypto);
  kdf.algorithm = 1;
  const std::string argon2i = crypto::encode_crypt_info(&kdf, p);
  EXPECT_EQ(error_of([&] { crypto::TensorDecryptor::create(argon2i, 4 << 20, pass, cache); }),
            ErrorCode::kCrypto);
  // Hostile key-derivation costs from a file are refused before any work (not hours of Argon2id).
  kdf.algorithm = 2;
  for (auto [ops, mem] : std::vector<std::pair<uint64_t, uint64_t>>{{4294967295ull, 8192},
                                                                    {1, 4398046510080ull},
                                                                    {1000, 1ull << 30},
                                                                    {256, 1ull << 30},
                                                                    {4, 16ull << 30},
                                                                    {5, 8192},
                                                                    {4, (1ull << 30) + 1}}) {
    kdf.opslimit = ops;
    kdf.memlimit = mem;
    const std::string costly = crypto::encode_crypt_info(&kdf, p);
    EXPECT_EQ(error_of([&] { crypto::TensorDecryptor::create(costly, 4 << 20, pass, cache); }),
              ErrorCode::kCrypto)
        << ops << " " << mem;
  }
  // The refusal names the file's cost and the knobs; a raised limit admits the file.
  kdf.opslimit = 5;
  kdf.memlimit = 8192;
  const std::string five = crypto::encode_crypt_info(&kdf, p);
  try {
    crypto::TensorDecryptor::create(five, 4 << 20, pass, cache);
    ADD_FAILURE() << "opslimit 5 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("opslimit 5, memlimit 8192 bytes"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("TENSORIZER_MAX_KDF_OPSLIMIT"), std::string::npos);
  }
  DecryptionParams raised = pass;
  raised.max_kdf.opslimit = 5;
  EXPECT_NE(crypto::TensorDecryptor::create(five, 4 << 20, raised, cache), nullptr);
  // An empty CryptInfo means "not encrypted".
  EXPECT_EQ(crypto::TensorDecryptor::create(std::string(2, '\0'), 0, key, cache), nullptr);
}

}  // namespace
}  // namespace tensorizer
