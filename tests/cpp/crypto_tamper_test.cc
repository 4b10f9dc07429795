// Tamper tests: a single changed byte anywhere in an encrypted tensor's ciphertext, MACs, nonce or
// CryptInfo framing makes its load fail (kCrypto "Tensor decryption failed" for ciphertext, MACs,
// nonce and salt; some Error for framing), with hash verification off so the MACs alone must
// catch it. Ciphertext: sampled offsets in every chunk of a multi-chunk tensor, and every bit of
// every byte of a small tensor. MACs and nonces: every byte. The tensor is never returned.
#include <gtest/gtest.h>

#include <random>

#include "crypto/crypt_info.h"
#include "tensorizer/error.h"
#include "tensorizer/reader.h"
#include "tensorizer/writer.h"
#include "test_util.h"

namespace tensorizer {
namespace {

constexpr uint64_t kChunk = 2 << 20;

struct TamperFile {
  std::shared_ptr<std::string> bytes;
  std::unique_ptr<Reader> reader;
  std::string secret_name = "big";
};

// A file with a 3-chunk tensor ("big", last chunk short) and a 100-byte one ("small").
TamperFile make_file(const EncryptionParams& enc, const DecryptionParams& dec) {
  test::TempDir dir;
  std::string big(2 * kChunk + 100, '\0'), small(100, '\0');
  std::mt19937 g(7);
  for (auto& c : big) c = static_cast<char>(g());
  for (auto& c : small) c = static_cast<char>(g());
  WriterOptions wo;
  wo.encryption = enc;
  auto w = Writer::open(dir.path("t.tensors"), wo);
  WriteRequest a, b;
  a.path = TensorPath("big");
  a.dtype = "|u1";
  a.shape = {big.size()};
  a.data = big.data();
  b.path = TensorPath("small");
  b.dtype = "|u1";
  b.shape = {small.size()};
  b.data = small.data();
  w->write({a, b});
  w->close();
  TamperFile f;
  f.bytes = std::make_shared<std::string>(test::read_file(dir.path("t.tensors")));
  ReaderOptions ro;
  ro.decryption = dec;
  f.reader = Reader::open(make_memory_source(f.bytes, "tampered.tensors"), ro);
  return f;
}

// Flips `mask` at `offset`, loads tensor `entry` (hashes not checked), restores the byte. Returns
// the error; when the load succeeded, fails the test unless `loaded` is given (then filled).
std::optional<Error> load_flipped(TamperFile& f, size_t entry, uint64_t offset, uint8_t mask,
                                  std::string* loaded = nullptr) {
  (*f.bytes)[offset] ^= static_cast<char>(mask);
  std::optional<Error> err;
  std::string buf(f.reader->entries()[entry].expected_bytes(), '\0');
  try {
    f.reader->load({{entry, buf.data()}}, {});
  } catch (const Error& e) {
    err = e;
  }
  (*f.bytes)[offset] ^= static_cast<char>(mask);
  if (!err && loaded)
    *loaded = std::move(buf);
  else if (!err)
    ADD_FAILURE() << "flip of 0x" << std::hex << int(mask) << " at " << std::dec << offset
                  << " not detected";
  return err;
}

void expect_decryption_failed(const std::optional<Error>& e, const std::string& tensor) {
  if (!e) return;
  EXPECT_EQ(e->code(), ErrorCode::kCrypto) << e->what();
  const std::string what = e->what();
  EXPECT_NE(what.find("Tensor decryption failed"), std::string::npos) << what;
  EXPECT_NE(what.find("tensor '" + tensor + "'"), std::string::npos) << what;
  EXPECT_NE(what.find("tampered.tensors"), std::string::npos) << what;
}

struct Layout {
  uint64_t data_offset, data_length;
  uint64_t crypt_field;  // absolute offset of the u64 crypt-info length
  uint64_t body;         // absolute offset of the CryptInfo body
  crypto::CryptInfo info;
  uint64_t parallel_body;  // absolute offset of the type-2 chunk body (its u16 type)
};

Layout layout(TamperFile& f, size_t entry) {
  const IndexEntry& e = f.reader->entries()[entry];
  const LoadedTensorInfo& info = f.reader->read_header(entry);
  Layout l;
  l.data_offset = e.data_offset;
  l.data_length = e.data_length;
  l.crypt_field = e.header_offset + info.header.crypt_field_offset;
  l.body = l.crypt_field + 8;
  l.info = crypto::parse_crypt_info(info.header.crypt_info(info.header_data()));
  // The type-2 chunk is the last one: body size minus its frame (42 + 16 M).
  l.parallel_body =
      l.body + info.header.crypt_info_size - (42 + 16 * l.info.parallel[0].macs.size());
  return l;
}

TEST(CryptoTamperTest, EveryCiphertextAndMacFlipIsDetected) {
  const EncryptionParams enc = EncryptionParams::random();
  TamperFile f = make_file(enc, DecryptionParams::from_key(enc.key));
  size_t detected = 0;

  // "big": every chunk, its first and last byte and 40 random offsets, random non-zero masks.
  const Layout big = layout(f, 0);
  ASSERT_EQ(big.info.parallel[0].macs.size(), 3u);
  std::mt19937_64 g(42);
  for (uint64_t c = 0; c < 3; ++c) {
    const uint64_t begin = c * kChunk, end = std::min(begin + kChunk, big.data_length);
    std::vector<uint64_t> offsets = {begin, end - 1};
    for (int k = 0; k < 40; ++k) offsets.push_back(begin + g() % (end - begin));
    for (uint64_t off : offsets) {
      expect_decryption_failed(
          load_flipped(f, 0, big.data_offset + off, static_cast<uint8_t>(1 + g() % 255)), "big");
      ++detected;
    }
  }
  // "small": every bit of every byte.
  const Layout small = layout(f, 1);
  for (uint64_t off = 0; off < small.data_length; ++off)
    for (int bit = 0; bit < 8; ++bit) {
      expect_decryption_failed(
          load_flipped(f, 1, small.data_offset + off, static_cast<uint8_t>(1u << bit)), "small");
      ++detected;
    }
  // Every byte of every MAC, and of the nonce, of both tensors (two masks each).
  for (const auto& [entry, l, name] :
       {std::tuple{size_t{0}, big, "big"}, std::tuple{size_t{1}, small, "small"}}) {
    const uint64_t nonce_at = l.parallel_body + 2 + 8;
    const uint64_t macs_at = nonce_at + 24 + 8;
    for (uint64_t b = 0; b < 16 * l.info.parallel[0].macs.size(); ++b)
      for (uint8_t mask : {0x01, 0x80}) {
        expect_decryption_failed(load_flipped(f, entry, macs_at + b, mask), name);
        ++detected;
      }
    for (uint64_t b = 0; b < 24; ++b) {
      expect_decryption_failed(load_flipped(f, entry, nonce_at + b, 0x10), name);
      ++detected;
    }
  }
  RecordProperty("flips_detected", static_cast<int>(detected));
  std::printf("[ tamper   ] %zu single-byte flips in ciphertext, MACs and nonces detected\n",
              detected);
  // Untouched, it still loads.
  auto buffers = test::load_entries(*f.reader, {});
  EXPECT_EQ(buffers.size(), 2u);
}

TEST(CryptoTamperTest, FlipsInTheCryptInfoFramingNeverYieldWrongData) {
  // The u64 length, chunk count, frame length, type, chunk size and MAC count: all 8 bits of each
  // byte. A flip either fails the load (bad frame, unknown type, invalid chunk size, MAC count that
  // does not fit, other chunking) or changes nothing that matters: a larger u64 length only
  // reaches into the header's zero filler, which the parser ignores as tensorizer does, and the
  // authenticated plaintext comes out intact. Never different bytes.
  const EncryptionParams enc = EncryptionParams::random();
  TamperFile f = make_file(enc, DecryptionParams::from_key(enc.key));
  const std::string plain = test::load_entries(*f.reader, {}, {0})[0];
  const Layout l = layout(f, 0);
  std::vector<uint64_t> offsets;
  for (uint64_t b = 0; b < 8 + 2 + 8 + 2 + 8; ++b)
    offsets.push_back(l.crypt_field + b);  // C .. chunk size
  for (uint64_t b = 0; b < 8; ++b)
    offsets.push_back(l.parallel_body + 2 + 8 + 24 + b);  // MAC count
  size_t failed = 0, harmless = 0;
  for (uint64_t off : offsets)
    for (int bit = 0; bit < 8; ++bit) {
      std::string loaded;
      auto e = load_flipped(f, 0, off, static_cast<uint8_t>(1u << bit), &loaded);
      if (e) {
        ++failed;
        continue;
      }
      ++harmless;
      EXPECT_TRUE(loaded == plain)
          << "flip at " << off << " bit " << bit << " returned different bytes";
      EXPECT_LT(off, l.crypt_field + 8) << "only the u64 length may change harmlessly";
    }
  EXPECT_EQ(failed + harmless, offsets.size() * 8);
  EXPECT_GT(failed, offsets.size() * 6);
  std::printf("[ tamper   ] %zu single-bit flips in CryptInfo framing rejected, %zu harmless\n",
              failed, harmless);
}

TEST(CryptoTamperTest, PassphraseFileSaltAndCiphertextFlipsAreDetected) {
  const EncryptionParams enc =
      EncryptionParams::from_passphrase("pw", OpsLimit::kMin, MemLimit::kMin);
  TamperFile f = make_file(enc, DecryptionParams::from_passphrase("pw"));
  const Layout l = layout(f, 1);
  ASSERT_EQ(l.info.key_derivation.size(), 1u);
  const uint64_t salt_at = l.body + 2 + 8 + 2 + 2 + 8 + 8 + 4 + 2;
  for (uint64_t b = 0; b < 16; ++b)
    expect_decryption_failed(load_flipped(f, 1, salt_at + b, 0x04), "small");
  for (uint64_t b = 0; b < l.data_length; b += 7)
    expect_decryption_failed(load_flipped(f, 1, l.data_offset + b, 0x01), "small");
}

TEST(CryptoTamperTest, StreamedReadsDetectFlipsToo) {
  const EncryptionParams enc = EncryptionParams::random();
  TamperFile f = make_file(enc, DecryptionParams::from_key(enc.key));
  const Layout l = layout(f, 0);
  for (uint64_t off : {uint64_t{0}, kChunk + 5, l.data_length - 1}) {
    (*f.bytes)[l.data_offset + off] ^= 0x20;
    try {
      f.reader->read_streamed(0, [](uint64_t, const uint8_t*, size_t) {});
      ADD_FAILURE() << "not detected at " << off;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCrypto);
      EXPECT_NE(std::string(e.what()).find("Tensor decryption failed"), std::string::npos)
          << e.what();
    }
    (*f.bytes)[l.data_offset + off] ^= 0x20;
  }
}

}  // namespace
}  // namespace tensorizer
