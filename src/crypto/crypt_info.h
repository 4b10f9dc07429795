// CryptInfo: the per-tensor encryption record carried in each header of an encrypted file
// (docs/format.md §3.5). Pure codec: bytes in, structure out, and the reverse; no I/O, no
// cryptography.
//
// Layout: u16 chunk count, then per chunk u64 length + body; each body starts with a u16 type:
// 1 = key derivation (Argon2id parameters and salt), 2 = XSalsa20 "parallel" (chunk size, initial
// nonce, one MAC per chunk), 3 = XSalsa20 "sequential" (one nonce, one MAC). Thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tensorizer::crypto {

inline constexpr size_t kNonceBytes = 24;
inline constexpr size_t kMacBytes = 16;
inline constexpr uint64_t kChunkQuantum = 64;    // chunk sizes must be multiples of this
inline constexpr uint64_t kMinChunkSize = 1024;  // and at least this
inline constexpr uint16_t kPwhashMethod = 1;     // the only key-derivation method
inline constexpr int32_t kArgon2id13 = 2;        // crypto_pwhash_ALG_ARGON2ID13

using Nonce = std::array<uint8_t, kNonceBytes>;
using Mac = std::array<uint8_t, kMacBytes>;

enum class ChunkType : uint16_t {
  kKeyDerivation = 1,
  kXSalsa20Parallel = 2,
  kXSalsa20Sequential = 3
};

struct KeyDerivationChunk {
  uint16_t method = kPwhashMethod;
  uint64_t opslimit = 0;
  uint64_t memlimit = 0;
  int32_t algorithm = kArgon2id13;
  std::string salt;  // 16 bytes as written by tensorizer; any length parses
};

struct ParallelChunk {
  uint64_t chunk_size = 0;
  Nonce nonce{};
  std::vector<Mac> macs;  // one per chunk, in chunk order
};

struct SequentialChunk {
  Nonce nonce{};
  Mac mac{};
};

// A parsed CryptInfo, chunks grouped by type (each vector in file order).
struct CryptInfo {
  uint16_t chunk_count = 0;  // 0 = the tensor is not encrypted
  std::vector<KeyDerivationChunk> key_derivation;
  std::vector<ParallelChunk> parallel;
  std::vector<SequentialChunk> sequential;
};

// Parses a CryptInfo body (the `C` bytes after the u64 length). Throws kFormat on truncation (a
// chunk running past its frame or the body), an unknown chunk type or an invalid chunk size. Like
// tensorizer, unused bytes at the end of a chunk frame or of the body are ignored.
CryptInfo parse_crypt_info(std::string_view body);

// Encodes the body tensorizer writes: [key derivation chunk] then one parallel chunk.
// `kdf` may be null (exact key). The parallel chunk holds `chunk.macs.size()` MACs.
std::string encode_crypt_info(const KeyDerivationChunk* kdf, const ParallelChunk& chunk);
// The size of that body for a salt of `salt_bytes` (when `with_kdf`) and `mac_count` MACs:
// 52 + 16 M with an exact key, 102 + 16 M with a 16-byte salt (docs/format.md §1.5).
uint64_t crypt_info_size(bool with_kdf, size_t salt_bytes, uint64_t mac_count);
// The body of a header whose tensor is not encrypted (meta and zero-length tensors): `00 00`.
inline constexpr uint64_t kEmptyCryptInfoSize = 2;

}  // namespace tensorizer::crypto
