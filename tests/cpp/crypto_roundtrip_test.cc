// Encrypted writes and reads end to end: files we encrypt (exact key, passphrase) have the
// layout of docs/format.md §3 (versions, flags, hash sections, CryptInfo sizes, empty CryptInfo for
// meta and zero-length tensors, fresh nonces), leave the caller's memory untouched, and load back
// with any worker count; files sealed the other ways the format allows (type 3, type 2 with one MAC
// over a large tensor, chunk sizes other than 2 MiB, nonces that wrap) load too.
#include <gtest/gtest.h>
#include <sodium.h>

#include <fstream>
#include <functional>
#include <random>
#include <set>

#include "codec/bytes.h"
#include "crypto/crypt_info.h"
#include "crypto/tensor_crypto.h"
#include "tensorizer/error.h"
#include "tensorizer/hash.h"
#include "tensorizer/reader.h"
#include "tensorizer/writer.h"
#include "test_util.h"

namespace tensorizer {
namespace {

using namespace std::string_literals;
constexpr uint64_t kMiB = 1 << 20;

std::string pattern(uint64_t n, uint32_t seed) {
  std::string s(n, '\0');
  std::mt19937 g(seed);
  for (auto& c : s) c = static_cast<char>(g());
  return s;
}

struct Tensor {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  std::string data;  // empty for meta / zero-element
  bool meta = false;
};

// Multi-chunk (with and without a short last chunk), exactly one chunk, tiny, scalar,
// zero-element and meta tensors.
std::vector<Tensor> sample_tensors() {
  return {
      {"multi", "<f4", {5 * kMiB / 4 + 3}, pattern(5 * kMiB + 12, 1)},
      {"exact", "|u1", {4 * kMiB}, pattern(4 * kMiB, 2)},
      {"one_chunk", "<i2", {kMiB}, pattern(2 * kMiB, 3)},
      {"tiny", "|u1", {5}, pattern(5, 4)},
      {"scalar", "<f8", {}, pattern(8, 5)},
      {"empty", "<f4", {0, 4}, ""},
      {"ghost", "<f4", {3, 2}, "", true},
      {"bf16", "<V2\0torch.bfloat16"s, {7}, pattern(14, 6)},
  };
}

std::vector<WriteRequest> requests(const std::vector<Tensor>& ts) {
  std::vector<WriteRequest> out;
  for (const auto& t : ts) {
    WriteRequest r;
    r.path = TensorPath(t.name);
    r.dtype = t.dtype;
    r.shape = t.shape;
    r.data = t.data.empty() ? nullptr : t.data.data();
    r.meta = t.meta;
    out.push_back(std::move(r));
  }
  return out;
}

void expect_loads(const std::string& path, const DecryptionParams& params,
                  const std::vector<Tensor>& ts) {
  ReaderOptions ro;
  ro.decryption = params;
  auto r = Reader::open(path, ro);
  ASSERT_EQ(r->entries().size(), ts.size());
  for (int workers : {1, 2, 5}) {
    for (bool verify : {true, false}) {
      SCOPED_TRACE(testing::Message() << "workers " << workers << " verify " << verify);
      LoadOptions lo;
      lo.num_workers = workers;
      lo.verify_hash = verify;
      auto buffers = test::load_entries(*r, lo);
      for (size_t i = 0; i < ts.size(); ++i) {
        if (ts[i].meta)
          EXPECT_EQ(buffers[i], std::string(r->entries()[i].expected_bytes(), '\0'));
        else
          EXPECT_TRUE(buffers[i] == ts[i].data) << ts[i].name;
      }
    }
  }
  EXPECT_TRUE(r->verify_all(2).empty());
}

std::string crypt_body(const LoadedTensorInfo& info) {
  return std::string(info.header.crypt_info(info.header_data()));
}

TEST(CryptoWriteTest, ExactKeyLayoutAndRoundTrip) {
  test::TempDir dir;
  const auto ts = sample_tensors();
  std::vector<std::string> before;
  for (const auto& t : ts) before.push_back(t.data);
  WriterOptions wo;
  wo.encryption = EncryptionParams::random();
  const std::string path = dir.path("key.tensors");
  {
    auto w = Writer::open(path, wo);
    w->write(requests(ts));
    w->close();
  }
  for (size_t i = 0; i < ts.size(); ++i)
    EXPECT_TRUE(ts[i].data == before[i]) << "source modified: " << ts[i].name;

  const std::string bytes = test::read_file(path);
  EXPECT_EQ(codec::load_le<uint32_t>(bytes.data() + 5), 4u);  // a meta tensor: version 4 + flag
  EXPECT_EQ(static_cast<uint8_t>(bytes[9]), 1u);
  ReaderOptions ro;
  ro.without_key = true;
  auto r = Reader::open(path, ro);
  EXPECT_EQ(r->header().version, 4u);
  EXPECT_EQ(r->header().flags, kFlagEncrypted);
  std::set<std::string> nonces;
  for (size_t i = 0; i < ts.size(); ++i) {
    SCOPED_TRACE(ts[i].name);
    const IndexEntry& e = r->entries()[i];
    const LoadedTensorInfo& info = r->read_header(i);
    const std::string body = crypt_body(info);
    if (e.data_length == 0) {
      // Empty CryptInfo: u64 2, then 00 00 (docs/format.md §3.5); CRC32 + SHA-256.
      EXPECT_EQ(test::hex(info.compact_header.substr(info.header.crypt_field_offset, 10)),
                "02000000000000000000");
      ASSERT_EQ(info.header.hashes.size(), 2u);
      EXPECT_EQ(info.header.hashes[0].type, HashType::kCrc32);
      continue;
    }
    const uint64_t m = (e.data_length + crypto::kChunkSize - 1) / crypto::kChunkSize;
    EXPECT_EQ(body.size(), 52 + 16 * m);
    ASSERT_EQ(info.header.hashes.size(), 1u);  // SHA-256 only
    EXPECT_EQ(info.header.hashes[0].type, HashType::kSha256);
    crypto::CryptInfo ci = crypto::parse_crypt_info(body);
    EXPECT_EQ(ci.chunk_count, 1);
    ASSERT_EQ(ci.parallel.size(), 1u);
    EXPECT_EQ(ci.parallel[0].chunk_size, crypto::kChunkSize);
    EXPECT_EQ(ci.parallel[0].macs.size(), m);
    for (uint64_t c = 0; c < m; ++c) {
      const crypto::Nonce n = crypto::nonce_at(ci.parallel[0].nonce, c);
      EXPECT_TRUE(nonces.insert(std::string(n.begin(), n.end())).second) << "nonce reused";
    }
    // The data on disk is ciphertext: no 64-byte run equals the plaintext.
    const std::string disk = bytes.substr(e.data_offset, e.data_length);
    EXPECT_NE(disk, ts[i].data);
    // The stored SHA-256 is over the header without the crypt field, then the plaintext.
    Sha256 sha;
    const std::string raw = info.raw_header();
    std::string hh =
        hashable_header(reinterpret_cast<const uint8_t*>(raw.data()), raw.size(), info.header);
    sha.update(hh.data(), hh.size());
    sha.update(ts[i].data.data(), ts[i].data.size());
    const auto digest = sha.finish();
    EXPECT_EQ(to_hex(digest.data(), 32),
              to_hex(info.header_data() + info.header.hashes[0].value_offset, 32));
  }
  expect_loads(path, DecryptionParams::from_key(wo.encryption->key), ts);
}

TEST(CryptoWriteTest, PassphraseLayoutAndRoundTrip) {
  test::TempDir dir;
  auto ts = sample_tensors();
  ts.erase(ts.begin() + 6);  // no meta tensor: version 3, flags zero
  WriterOptions wo;
  wo.encryption =
      EncryptionParams::from_passphrase("correct horse", OpsLimit::kMin, MemLimit::kMin);
  const std::string path = dir.path("pass.tensors");
  {
    auto w = Writer::open(path, wo);
    w->write(requests(ts));
    w->close();
  }
  const std::string bytes = test::read_file(path);
  EXPECT_EQ(codec::load_le<uint32_t>(bytes.data() + 5), 3u);
  EXPECT_EQ(bytes.substr(9, 32), std::string(32, '\0'));
  ReaderOptions ro;
  ro.without_key = true;
  auto r = Reader::open(path, ro);
  for (size_t i = 0; i < ts.size(); ++i) {
    const IndexEntry& e = r->entries()[i];
    if (e.data_length == 0) continue;
    const std::string body = crypt_body(r->read_header(i));
    const uint64_t m = (e.data_length + crypto::kChunkSize - 1) / crypto::kChunkSize;
    EXPECT_EQ(body.size(), 102 + 16 * m);
    crypto::CryptInfo ci = crypto::parse_crypt_info(body);
    ASSERT_EQ(ci.key_derivation.size(), 1u);
    EXPECT_EQ(ci.key_derivation[0].opslimit, 1u);
    EXPECT_EQ(ci.key_derivation[0].memlimit, 8192u);
    EXPECT_EQ(ci.key_derivation[0].algorithm, 2);
    EXPECT_EQ(ci.key_derivation[0].salt,
              std::string(wo.encryption->kdf->salt.begin(), wo.encryption->kdf->salt.end()));
  }
  expect_loads(path, DecryptionParams::from_passphrase("correct horse"), ts);
  expect_loads(path, DecryptionParams::from_key(wo.encryption->key), ts);
}

TEST(CryptoWriteTest, WorkerCountsBatchesAndStreamingAllLoad) {
  test::TempDir dir;
  const auto ts = sample_tensors();
  const EncryptionParams params = EncryptionParams::random();
  for (int workers : {1, 2, 7}) {
    SCOPED_TRACE(workers);
    WriterOptions wo;
    wo.encryption = params;
    wo.num_workers = workers;
    const std::string path = dir.path("w" + std::to_string(workers) + ".tensors");
    auto w = Writer::open(path, wo);
    auto reqs = requests(ts);
    // One tensor per call (the file is synced after each), half of them streamed in odd pieces.
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (i % 2 == 0) {
        w->write({reqs[i]});
        continue;
      }
      const std::string& data = ts[i].data;
      w->write_streamed(reqs[i], [&](const Writer::Emit& emit) {
        size_t off = 0, step = 1;
        while (off < data.size()) {
          const size_t n = std::min(step, data.size() - off);
          emit(data.data() + off, n);
          off += n;
          step = step * 7 + 12345;
        }
      });
    }
    w->close();
    expect_loads(path, DecryptionParams::from_key(params.key), ts);
  }
}

TEST(CryptoWriteTest, StreamingTheWrongByteCountFailsAndPublishesNothing) {
  test::TempDir dir;
  const std::string path = dir.path("bad.tensors");
  WriterOptions wo;
  wo.encryption = EncryptionParams::random();
  auto w = Writer::open(path, wo);
  WriteRequest r = requests(sample_tensors())[0];
  const std::string data = pattern(5 * kMiB + 12, 9);
  for (int64_t delta : {-1, +1}) {
    try {
      auto w2 = Writer::open(dir.path("bad" + std::to_string(delta) + ".tensors"), wo);
      w2->write_streamed(r, [&](const Writer::Emit& emit) {
        emit(data.data(), data.size() + delta - (delta > 0 ? 1 : 0));
        if (delta > 0) emit(data.data(), 2);
      });
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find("multi"), std::string::npos) << e.what();
    }
    EXPECT_FALSE(std::ifstream(dir.path("bad" + std::to_string(delta) + ".tensors")).good());
  }
}

TEST(CryptoWriteTest, MetaTensorInALaterWriteRaisesTheVersionToFourWithTheFlag) {
  test::TempDir dir;
  auto ts = sample_tensors();
  WriterOptions wo;
  wo.encryption = EncryptionParams::random();
  const std::string path = dir.path("later.tensors");
  auto w = Writer::open(path, wo);
  auto reqs = requests(ts);
  w->write({reqs[0], reqs[3]});
  EXPECT_EQ(w->header().version, 3u);
  w->write({reqs[6]});  // the meta tensor
  EXPECT_EQ(w->header().version, 4u);
  w->close();
  expect_loads(path, DecryptionParams::from_key(wo.encryption->key), {ts[0], ts[3], ts[6]});
}

// ---- Files sealed the other ways the format allows ---------------------------------------------

// How to seal one tensor: encrypts `data` in place and returns the CryptInfo body.
using Sealer = std::function<std::string(std::string& data)>;

struct Crafted {
  std::string name;
  std::string plain;
  Sealer seal;
};

// A version-3 file of STATE_DICT |u1 tensors, SHA-256 only, the way another writer might do it.
std::string craft_file(const std::vector<Crafted>& ts) {
  std::vector<IndexEntry> entries;
  std::string records;
  uint64_t index_size = 0;
  for (const auto& t : ts) {
    IndexEntry e;
    e.path = TensorPath(t.name);
    e.name = t.name;
    e.dtype = "|u1";
    e.shape = {t.plain.size()};
    index_size += index_entry_size(e, false);
    entries.push_back(e);
  }
  uint64_t cursor = kPreludeSize + index_size;
  std::string body_data;
  for (size_t i = 0; i < ts.size(); ++i) {
    std::string data = ts[i].plain;
    const std::string info = ts[i].seal(data);
    TensorHeaderFields f;
    f.name = entries[i].name;
    f.dtype = entries[i].dtype;
    f.shape = &entries[i].shape;
    f.crc32 = false;
    f.crypt_field = true;
    f.crypt_info_size = info.size();
    f.data_length = data.size();
    EncodedTensorHeader h = encode_tensor_header(f, cursor, 1);
    Sha256 sha;
    std::string hashable = h.bytes;
    hashable.erase(h.crypt_info_offset - 8, 8 + info.size());
    sha.update(hashable.data(), hashable.size());
    sha.update(ts[i].plain.data(), ts[i].plain.size());
    auto digest = sha.finish();
    std::memcpy(h.bytes.data() + h.sha256_offset, digest.data(), 32);
    std::memcpy(h.bytes.data() + h.crypt_info_offset, info.data(), info.size());
    entries[i].header_offset = cursor;
    entries[i].data_offset = cursor + h.bytes.size();
    entries[i].data_length = data.size();
    records += h.bytes + data;
    cursor = entries[i].data_offset + data.size();
  }
  FileHeader fh;
  fh.version = 3;
  fh.tensor_count = ts.size();
  fh.index_size = index_size;
  for (const auto& e : entries) fh.tensor_size += e.data_length;
  std::string out = encode_file_header(fh);
  for (const auto& e : entries) encode_index_entry(e, false, out);
  return out + records + std::string(8, '\0');
}

Key test_key() {
  Key k;
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(i * 3 + 1);
  return k;
}

// Type 2 with the given chunk size and initial nonce; nonces advanced with sodium_increment.
Sealer parallel_sealer(uint64_t chunk_size, crypto::Nonce n0, bool one_mac = false) {
  return [=](std::string& data) {
    crypto::ParallelChunk p;
    p.chunk_size = chunk_size;
    p.nonce = n0;
    crypto::Nonce n = n0;
    const uint64_t step = one_mac ? data.size() : chunk_size;
    for (uint64_t off = 0; off < data.size(); off += step) {
      crypto::Mac mac;
      auto* d = reinterpret_cast<uint8_t*>(data.data()) + off;
      crypto_secretbox_detached(d, mac.data(), d, std::min<uint64_t>(step, data.size() - off),
                                n.data(), test_key().data());
      p.macs.push_back(mac);
      sodium_increment(n.data(), n.size());
    }
    return crypto::encode_crypt_info(nullptr, p);
  };
}

Sealer sequential_sealer() {
  return [](std::string& data) {
    crypto::Nonce n;
    randombytes_buf(n.data(), n.size());
    crypto::Mac mac;
    auto* d = reinterpret_cast<uint8_t*>(data.data());
    crypto_secretbox_detached(d, mac.data(), d, data.size(), n.data(), test_key().data());
    std::string body = {'\x01', '\0'};
    codec::ByteAppender a(body);
    a.put<uint64_t>(42);
    a.put<uint16_t>(3);
    a.bytes(std::string_view(reinterpret_cast<const char*>(n.data()), n.size()));
    a.bytes(std::string_view(reinterpret_cast<const char*>(mac.data()), mac.size()));
    return body;
  };
}

TEST(CryptoReadTest, EverySealingTheFormatAllowsLoads) {
  crypto::ensure_sodium();
  crypto::Nonce random_n0, near_wrap;
  randombytes_buf(random_n0.data(), random_n0.size());
  near_wrap.fill(0xff);
  near_wrap[0] = 0xfd;  // n0 + 3 wraps around 2^192
  const std::vector<Crafted> ts = {
      {"sequential_big", pattern(5 * kMiB + 7, 11), sequential_sealer()},
      {"one_mac_big", pattern(6 * kMiB + 1, 12),
       parallel_sealer(crypto::kChunkSize, random_n0, true)},
      {"chunks_3mib", pattern(10 * kMiB + 17, 13), parallel_sealer(3 * kMiB, random_n0)},
      {"chunks_1kib", pattern(100 * 1024 + 5, 14), parallel_sealer(1024, random_n0)},
      {"chunks_1mib_wrapping", pattern(7 * kMiB - 3, 15), parallel_sealer(kMiB, near_wrap)},
      {"sequential_small", pattern(33, 16), sequential_sealer()},
  };
  test::TempDir dir;
  const std::string path = dir.path("crafted.tensors");
  test::write_file(path, craft_file(ts));
  ReaderOptions ro;
  ro.decryption = DecryptionParams::from_key(test_key());
  auto r = Reader::open(path, ro);
  for (int workers : {1, 2, 4}) {
    for (bool verify : {true, false}) {
      SCOPED_TRACE(testing::Message() << "workers " << workers << " verify " << verify);
      LoadOptions lo;
      lo.num_workers = workers;
      lo.verify_hash = verify;
      auto buffers = test::load_entries(*r, lo);
      for (size_t i = 0; i < ts.size(); ++i) EXPECT_TRUE(buffers[i] == ts[i].plain) << ts[i].name;
      // Each tensor alone too (its pieces then land on several workers).
      for (size_t i = 0; i < ts.size(); ++i) {
        auto one = test::load_entries(*r, lo, {i});
        EXPECT_TRUE(one[0] == ts[i].plain) << ts[i].name;
      }
    }
  }
  // Streamed, in pieces smaller and larger than the chunks.
  for (uint64_t piece : {uint64_t{1}, uint64_t{1500}, 4 * kMiB}) {
    for (size_t i = 0; i < ts.size(); ++i) {
      std::string got;
      LoadOptions lo;
      lo.verify_hash = true;
      r->read_streamed(
          i,
          [&](uint64_t off, const uint8_t* d, size_t n) {
            EXPECT_EQ(off, got.size());
            got.append(reinterpret_cast<const char*>(d), n);
          },
          lo, piece);
      EXPECT_TRUE(got == ts[i].plain) << ts[i].name << " piece " << piece;
    }
  }
}

TEST(CryptoReadTest, UnencryptedDataTensorInAnEncryptedFileFails) {
  // A data tensor with an empty CryptInfo in an encrypted file: refused, not returned as is.
  const std::vector<Crafted> ts = {
      {"plain_inside", pattern(100, 1), [](std::string&) { return std::string(2, '\0'); }}};
  test::TempDir dir;
  test::write_file(dir.path("x.tensors"), craft_file(ts));
  ReaderOptions ro;
  ro.decryption = DecryptionParams::from_key(test_key());
  auto r = Reader::open(dir.path("x.tensors"), ro);
  try {
    test::load_entries(*r, {});
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kCrypto);
    EXPECT_NE(std::string(e.what()).find("plain_inside"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tensorizer
