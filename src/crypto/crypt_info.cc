// CryptInfo codec (docs/format.md §3.5). Pure: no I/O, no cryptography; every read is
// bounds-checked.
#include "crypto/crypt_info.h"

#include <cstring>

#include "codec/bytes.h"
#include "tensorizer/error.h"

namespace tensorizer::crypto {
namespace {

constexpr uint64_t kParallelFixedBytes = 2 + 8 + kNonceBytes + 8;  // type, size, nonce, count

KeyDerivationChunk parse_key_derivation(codec::ByteCursor& c) {
  KeyDerivationChunk k;
  k.method = c.read<uint16_t>("key derivation method");
  if (k.method != kPwhashMethod)
    fail(ErrorCode::kCrypto,
         "unknown key derivation method " + std::to_string(k.method) + " in crypt info");
  k.opslimit = c.read<uint64_t>("pwhash opslimit");
  k.memlimit = c.read<uint64_t>("pwhash memlimit");
  k.algorithm = c.read<int32_t>("pwhash algorithm");
  uint16_t salt_len = c.read<uint16_t>("salt length");
  k.salt = std::string(c.bytes(salt_len, "salt"));
  return k;
}

ParallelChunk parse_parallel(codec::ByteCursor& c) {
  ParallelChunk p;
  p.chunk_size = c.read<uint64_t>("encryption chunk size");
  if (p.chunk_size % kChunkQuantum != 0 || p.chunk_size < kMinChunkSize)
    fail(ErrorCode::kFormat, "invalid encryption chunk size " + std::to_string(p.chunk_size) +
                                 " (must be a multiple of 64 and at least 1024)");
  std::string_view nonce = c.bytes(kNonceBytes, "nonce");
  std::memcpy(p.nonce.data(), nonce.data(), kNonceBytes);
  uint64_t count = c.read<uint64_t>("MAC count");
  if (count > c.remaining() / kMacBytes)
    fail(ErrorCode::kFormat, "crypt info claims " + std::to_string(count) +
                                 " MACs but holds room for " +
                                 std::to_string(c.remaining() / kMacBytes));
  p.macs.resize(count);
  for (auto& m : p.macs) std::memcpy(m.data(), c.bytes(kMacBytes, "MAC").data(), kMacBytes);
  return p;
}

SequentialChunk parse_sequential(codec::ByteCursor& c) {
  SequentialChunk s;
  std::memcpy(s.nonce.data(), c.bytes(kNonceBytes, "nonce").data(), kNonceBytes);
  std::memcpy(s.mac.data(), c.bytes(kMacBytes, "MAC").data(), kMacBytes);
  return s;
}

}  // namespace

CryptInfo parse_crypt_info(std::string_view body) {
  codec::ByteCursor c(reinterpret_cast<const uint8_t*>(body.data()), body.size());
  CryptInfo info;
  info.chunk_count = c.read<uint16_t>("crypt info chunk count");
  for (uint16_t i = 0; i < info.chunk_count; ++i) {
    uint64_t len = c.read<uint64_t>("crypt info chunk length");
    if (len > c.remaining())
      fail(ErrorCode::kFormat, "crypt info chunk " + std::to_string(i) + " is " +
                                   std::to_string(len) + " bytes but only " +
                                   std::to_string(c.remaining()) + " remain");
    codec::ByteCursor frame(c.here(), len);
    c.skip(len, "crypt info chunk");
    uint16_t type = frame.read<uint16_t>("crypt info chunk type");
    switch (static_cast<ChunkType>(type)) {
      case ChunkType::kKeyDerivation:
        info.key_derivation.push_back(parse_key_derivation(frame));
        break;
      case ChunkType::kXSalsa20Parallel:
        info.parallel.push_back(parse_parallel(frame));
        break;
      case ChunkType::kXSalsa20Sequential:
        info.sequential.push_back(parse_sequential(frame));
        break;
      default:
        fail(ErrorCode::kFormat, "unknown crypt info chunk type " + std::to_string(type) +
                                     " (written by a newer tensorizer?)");
    }
  }
  return info;
}

uint64_t crypt_info_size(bool with_kdf, size_t salt_bytes, uint64_t mac_count) {
  uint64_t size = 2 + 8 + kParallelFixedBytes + kMacBytes * mac_count;
  if (with_kdf) size += 8 + 2 + 2 + 8 + 8 + 4 + 2 + salt_bytes;
  return size;
}

std::string encode_crypt_info(const KeyDerivationChunk* kdf, const ParallelChunk& chunk) {
  std::string out;
  out.reserve(crypt_info_size(kdf != nullptr, kdf ? kdf->salt.size() : 0, chunk.macs.size()));
  codec::ByteAppender a(out);
  a.put<uint16_t>(kdf ? 2 : 1);
  if (kdf) {
    a.put<uint64_t>(2 + 2 + 8 + 8 + 4 + 2 + kdf->salt.size());
    a.put<uint16_t>(static_cast<uint16_t>(ChunkType::kKeyDerivation));
    a.put<uint16_t>(kdf->method);
    a.put<uint64_t>(kdf->opslimit);
    a.put<uint64_t>(kdf->memlimit);
    a.put<int32_t>(kdf->algorithm);
    a.put<uint16_t>(static_cast<uint16_t>(kdf->salt.size()));
    a.bytes(kdf->salt);
  }
  a.put<uint64_t>(kParallelFixedBytes + kMacBytes * chunk.macs.size());
  a.put<uint16_t>(static_cast<uint16_t>(ChunkType::kXSalsa20Parallel));
  a.put<uint64_t>(chunk.chunk_size);
  a.bytes(std::string_view(reinterpret_cast<const char*>(chunk.nonce.data()), kNonceBytes));
  a.put<uint64_t>(chunk.macs.size());
  for (const Mac& m : chunk.macs)
    a.bytes(std::string_view(reinterpret_cast<const char*>(m.data()), kMacBytes));
  return out;
}

}  // namespace tensorizer::crypto
