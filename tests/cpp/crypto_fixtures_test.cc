// Decryption of the files the reference tensorizer 2.11.1 encrypted (tests/fixtures): with
// their key or passphrase every tensor loads to the manifest's SHA-256 and verifies; every misuse
// (no key, wrong key, wrong passphrase, passphrase for a key-only file, key for a plain file)
// fails as kCrypto naming the file and, for per-tensor failures, the tensor.
#include <gtest/gtest.h>

#include "crypto/crypt_info.h"
#include "tensorizer/error.h"
#include "tensorizer/reader.h"
#include "test_util.h"

namespace tensorizer {
namespace {

using nlohmann::json;

const json& file_manifest(const std::string& name) { return test::manifest()["files"][name]; }

Key fixture_key(const std::string& file) {
  const std::string bytes =
      test::read_file(test::fixture_path(file_manifest(file)["encryption"]["key_file"]));
  Key k{};
  EXPECT_EQ(bytes.size(), k.size());
  std::copy(bytes.begin(), bytes.end(), k.begin());
  return k;
}

DecryptionParams fixture_params(const std::string& file) {
  const json& enc = file_manifest(file)["encryption"];
  if (enc.contains("key_file")) return DecryptionParams::from_key(fixture_key(file));
  return DecryptionParams::from_passphrase(enc["passphrase"].get<std::string>());
}

std::unique_ptr<Reader> open_with(const std::string& file, const DecryptionParams& p) {
  ReaderOptions o;
  o.decryption = p;
  return Reader::open(test::fixture_path(file), o);
}

const std::vector<std::string> kEncryptedFixtures = {
    "encrypted_key.tensors", "encrypted_passphrase.tensors", "meta_encrypted.tensors"};

// Expects `f` to throw kCrypto with all of `needles` in the message.
template <typename F>
void expect_crypto_error(F&& f, const std::vector<std::string>& needles) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCrypto) << e.what();
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

TEST(CryptoFixturesTest, EncryptedFixturesLoadAndVerify) {
  for (const auto& name : kEncryptedFixtures) {
    SCOPED_TRACE(name);
    const json& tensors = file_manifest(name)["tensors"];
    auto r = open_with(name, fixture_params(name));
    ASSERT_TRUE(r->encrypted());
    for (int workers : {1, 2, 3}) {
      for (bool verify : {true, false}) {
        SCOPED_TRACE(testing::Message() << "workers " << workers << " verify " << verify);
        LoadOptions o;
        o.num_workers = workers;
        o.verify_hash = verify;
        auto buffers = test::load_entries(*r, o);
        ASSERT_EQ(buffers.size(), tensors.size());
        for (size_t i = 0; i < tensors.size(); ++i) {
          SCOPED_TRACE(tensors[i]["name"].dump());
          if (tensors[i]["meta"].get<bool>()) {
            EXPECT_EQ(buffers[i].find_first_not_of('\0'), std::string::npos);
          } else {
            EXPECT_EQ(test::sha256_hex(buffers[i].data(), buffers[i].size()), tensors[i]["sha256"]);
          }
        }
      }
    }
    EXPECT_TRUE(r->verify_all(2).empty());
  }
}

TEST(CryptoFixturesTest, ReferenceCryptInfoIsWhatTheSpecSays) {
  // encrypted_key: one type-2 chunk per tensor, 2 MiB chunk size, M = ceil(len / 2 MiB).
  for (const auto& name : {"encrypted_key.tensors", "encrypted_passphrase.tensors"}) {
    SCOPED_TRACE(name);
    ReaderOptions o;
    o.without_key = true;
    auto r = Reader::open(test::fixture_path(name), o);
    const bool passphrase = std::string(name) == "encrypted_passphrase.tensors";
    for (size_t i = 0; i < r->entries().size(); ++i) {
      const IndexEntry& e = r->entries()[i];
      const LoadedTensorInfo& info = r->read_header(i);
      auto body = info.header.crypt_info(info.header_data());
      const uint64_t m = (e.data_length + 2097151) / 2097152;
      EXPECT_EQ(body.size(), (passphrase ? 102u : 52u) + 16 * m);
      crypto::CryptInfo ci = crypto::parse_crypt_info(body);
      EXPECT_EQ(ci.chunk_count, passphrase ? 2 : 1);
      ASSERT_EQ(ci.parallel.size(), 1u);
      EXPECT_EQ(ci.parallel[0].chunk_size, 2097152u);
      EXPECT_EQ(ci.parallel[0].macs.size(), m);
      ASSERT_EQ(ci.key_derivation.size(), passphrase ? 1u : 0u);
      if (passphrase) {  // INTERACTIVE limits, Argon2id13, 16-byte salt
        EXPECT_EQ(ci.key_derivation[0].opslimit, 2u);
        EXPECT_EQ(ci.key_derivation[0].memlimit, 67108864u);
        EXPECT_EQ(ci.key_derivation[0].algorithm, 2);
        EXPECT_EQ(ci.key_derivation[0].salt.size(), 16u);
      }
      // Encrypted tensors: SHA-256 only (no CRC32).
      ASSERT_EQ(info.header.hashes.size(), 1u);
      EXPECT_EQ(info.header.hashes[0].type, HashType::kSha256);
    }
  }
}

TEST(CryptoFixturesTest, KeyDerivedFromThePassphraseAlsoOpensAsAnExactKey) {
  // The derived key works with from_key too (docs/reference-api.md §6.4): derive it from the file's
  // parameters.
  ReaderOptions o;
  o.without_key = true;
  auto r = Reader::open(test::fixture_path("encrypted_passphrase.tensors"), o);
  const LoadedTensorInfo& info = r->read_header(0);
  crypto::CryptInfo ci = crypto::parse_crypt_info(info.header.crypt_info(info.header_data()));
  KdfParams kdf;
  kdf.opslimit = ci.key_derivation[0].opslimit;
  kdf.memlimit = ci.key_derivation[0].memlimit;
  std::copy(ci.key_derivation[0].salt.begin(), ci.key_derivation[0].salt.end(), kdf.salt.begin());
  const std::string pass =
      file_manifest("encrypted_passphrase.tensors")["encryption"]["passphrase"];
  auto keyed =
      open_with("encrypted_passphrase.tensors", DecryptionParams::from_key(derive_key(pass, kdf)));
  LoadOptions lo;
  lo.verify_hash = true;
  auto buffers = test::load_entries(*keyed, lo);
  EXPECT_EQ(test::sha256_hex(buffers[0].data(), buffers[0].size()),
            file_manifest("encrypted_passphrase.tensors")["tensors"][0]["sha256"]);
}

TEST(CryptoFixturesTest, NoKeyForAnEncryptedFile) {
  for (const auto& name : kEncryptedFixtures) {
    expect_crypto_error([&] { Reader::open(test::fixture_path(name)); },
                        {name, "no decryption key"});
  }
}

TEST(CryptoFixturesTest, KeyForAnUnencryptedFile) {
  for (const auto& name : {"module.tensors", "meta.tensors"}) {
    expect_crypto_error([&] { open_with(name, DecryptionParams::from_key(Key{})); }, {name, "not"});
    expect_crypto_error([&] { open_with(name, DecryptionParams::from_passphrase("x")); }, {name});
  }
}

TEST(CryptoFixturesTest, WrongKeyFailsEveryEncryptedTensor) {
  for (const auto& name :
       {"encrypted_key.tensors", "meta_encrypted.tensors", "encrypted_passphrase.tensors"}) {
    SCOPED_TRACE(name);
    Key wrong{};
    wrong[0] = 1;
    auto r = open_with(name, DecryptionParams::from_key(wrong));
    for (size_t i = 0; i < r->entries().size(); ++i) {
      const IndexEntry& e = r->entries()[i];
      if (e.data_length == 0) continue;
      std::string buf(e.expected_bytes(), '\0');
      expect_crypto_error(
          [&] {
            r->load({{i, buf.data()}});
          },
          {"Tensor decryption failed", name, "tensor '" + display_path(e.path) + "'"});
    }
  }
}

TEST(CryptoFixturesTest, WrongPassphrase) {
  auto r = open_with("encrypted_passphrase.tensors",
                     DecryptionParams::from_passphrase("not-the-passphrase"));
  expect_crypto_error([&] { test::load_entries(*r, {}); },
                      {"Tensor decryption failed", "encrypted_passphrase.tensors", "tensor '"});
}

TEST(CryptoFixturesTest, PassphraseForAKeyOnlyFile) {
  auto r = open_with("encrypted_key.tensors", DecryptionParams::from_passphrase("anything"));
  expect_crypto_error([&] { test::load_entries(*r, {}); },
                      {"encrypted_key.tensors", "tensor '", "exact key"});
}

TEST(CryptoFixturesTest, MetaTensorInAnEncryptedFileNeedsNoDecryption) {
  auto r = open_with("meta_encrypted.tensors", fixture_params("meta_encrypted.tensors"));
  auto ghost = r->find(".ghost");
  ASSERT_TRUE(ghost.has_value());
  std::string buf(r->entries()[*ghost].expected_bytes(), '\x55');
  LoadOptions o;
  o.verify_hash = true;
  r->load({{*ghost, buf.data()}}, o);
  EXPECT_EQ(buf, std::string(24, '\0'));
  // Its header carries the empty CryptInfo and both hashes.
  const LoadedTensorInfo* info = r->loaded_info(*ghost);
  ASSERT_NE(info, nullptr);
  EXPECT_EQ(info->header.crypt_info_size, crypto::kEmptyCryptInfoSize);
  EXPECT_EQ(info->header.hashes.size(), 2u);
}

}  // namespace
}  // namespace tensorizer
