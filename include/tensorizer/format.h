// tensorizer/format.h — the .tensors codec: file header, index, per-tensor headers (docs/format.md
// §1).
//
// Pure functions over byte buffers: nothing here opens a file or a socket. Every parser checks
// each length and offset against the bytes it was given (and, for the index, the file size), so
// corrupt, truncated or hostile input fails with a kFormat/kUnsupportedVersion Error that says
// what was wrong and where. Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tensorizer/named_range.h"
#include "tensorizer/tensor_path.h"

namespace tensorizer {

inline constexpr char kMagic[] = "|TZR|";
inline constexpr uint64_t kMagicSize = 5;
inline constexpr uint64_t kPreludeSize = 73;  // magic + 60-byte file header + u64 index size
inline constexpr uint64_t kReferenceIndexSize = 262144;  // what tensorizer always reserves
inline constexpr uint32_t kMinVersion = 1;
inline constexpr uint32_t kMaxVersion = 5;  // 5 = long dims (tensorizer 2.12), see Appendix B
inline constexpr uint32_t kOpaqueVersion = 2;
inline constexpr uint32_t kEncryptionVersion = 3;
inline constexpr uint32_t kMetaVersion = 4;
inline constexpr uint32_t kLongDimsVersion = 5;
inline constexpr uint64_t kFlagEncrypted = 1;
inline constexpr uint64_t kFlagVersionedEntries = 2;

enum class TensorType : uint8_t { kParam = 0, kBuffer = 1, kStateDict = 2 };
enum class HashType : uint8_t { kCrc32 = 0, kSha256 = 1 };

// ---- File header (offset 0..73) ------------------------------------------------------------

struct FileHeader {
  uint32_t version = 1;
  uint64_t flags = 0;        // feature flags (the 256-bit field; higher bits are rejected)
  uint64_t tensor_size = 0;  // sum of on-disk data lengths
  uint64_t tensor_count = 0;
  uint64_t index_size = 0;  // M: bytes of the index block at offset 73

  // "Header has crypt info" (docs/format.md §1.3): every per-tensor header carries a crypt-info
  // field.
  bool has_crypt_info() const {
    return version == kEncryptionVersion || (version >= kMetaVersion && (flags & kFlagEncrypted));
  }
  // Version 5 files tag each index entry with a u32 metadata version.
  bool versioned_entries() const {
    return version >= kLongDimsVersion && (flags & kFlagVersionedEntries);
  }
};

// Parses the first 73 bytes (fewer is an error). Checks magic, version and flags.
FileHeader parse_file_header(const uint8_t* data, size_t size);
// The 73-byte prelude for `h` (flags are written only for version >= 4, as tensorizer does).
std::string encode_file_header(const FileHeader& h);

// ---- Index (metadata block) ----------------------------------------------------------------

struct IndexEntry {
  uint32_t entry_version = 1;  // 1, or 5 for entries with u64 dims (versioned files only)
  std::string name;            // on-disk name bytes
  TensorPath path;             // decoded name
  TensorType type = TensorType::kStateDict;
  std::string dtype;  // on-disk dtype string
  std::vector<uint64_t> shape;
  uint64_t header_offset = 0;
  uint64_t data_offset = 0;
  uint64_t data_length = 0;  // on-disk length; 0 for meta and zero-element tensors

  uint64_t header_size() const { return data_offset - header_offset; }
  uint64_t num_elements() const;
  uint64_t itemsize() const;
  // Size of the loaded tensor: item size x elements (meta tensors count their full size).
  uint64_t expected_bytes() const { return num_elements() * itemsize(); }
  bool is_meta() const { return data_length == 0 && expected_bytes() > 0; }
  bool long_shape() const { return entry_version >= kLongDimsVersion; }
};

// Parses `header.tensor_count` entries from the index block (`size` bytes available, which may be
// fewer than header.index_size). Validates dtype strings, sizes against the dtype and shape,
// offsets against `file_size`, and the path rules of docs/format.md §2.2 (no duplicates, no leaf
// that is also a prefix, no mixed str/int keys at one level). Empty index is an error.
std::vector<IndexEntry> parse_index(const uint8_t* data, size_t size, const FileHeader& header,
                                    uint64_t file_size);
// The parts of a file in the order a store of separate values keeps them (docs/format.md §4,
// Redis key layout): {"header", 0, 73 + index size}, then per tensor {name, header offset, header
// size} and, when it stores data, {name, data offset, data length}.
std::vector<NamedRange> object_parts(const FileHeader& header,
                                     const std::vector<IndexEntry>& entries);
// Appends one index entry (with its u32 version tag when `versioned`).
void encode_index_entry(const IndexEntry& e, bool versioned, std::string& out);
// Encoded size of one entry.
size_t index_entry_size(const IndexEntry& e, bool versioned);

// ---- Per-tensor header ---------------------------------------------------------------------

struct HashEntry {
  HashType type;
  uint32_t value_offset;  // offset of the value bytes inside the header
  uint32_t value_size;    // 4 for CRC32, 32 for SHA-256
};

struct TensorHeader {
  uint64_t header_size = 0;
  uint16_t module_idx = 0;
  TensorType type = TensorType::kStateDict;
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  std::vector<HashEntry> hashes;
  bool has_crypt_field = false;
  uint64_t crypt_field_offset = 0;  // offset of the u64 crypt-info length inside the header
  uint64_t crypt_info_size = 0;     // C, the CryptInfo body size after that u64
  int64_t data_length = 0;          // the trailing i64
  uint64_t fields_end = 0;  // where the fields end: bytes from here to the data length are filler

  std::string_view crypt_info(const uint8_t* header_bytes) const {
    return {reinterpret_cast<const char*>(header_bytes) + crypt_field_offset + 8, crypt_info_size};
  }
};

// Parses a complete header (all `size` bytes, starting with the u64 header size).
TensorHeader parse_tensor_header(const uint8_t* data, size_t size, bool has_crypt_info,
                                 bool long_shape);
// Checks the header agrees with its index entry (name, type, dtype, shape, data length).
void check_header_matches_entry(const TensorHeader& h, const IndexEntry& e);

// The bytes a tensor's hashes cover before its data (docs/format.md §1.6): the header with every
// hash value zeroed and the crypt-info field (u64 + body) cut out.
std::string hashable_header(const uint8_t* data, size_t size, const TensorHeader& h);

// Layout of a header being written: bytes with zeroed hash values plus where to patch them.
struct EncodedTensorHeader {
  std::string bytes;
  size_t crc32_offset = std::string::npos;
  size_t sha256_offset = std::string::npos;
  size_t crypt_info_offset = std::string::npos;  // start of the CryptInfo body (after its u64)
};

struct TensorHeaderFields {
  uint16_t module_idx = 0;
  TensorType type = TensorType::kStateDict;
  std::string_view name;   // encoded name bytes
  std::string_view dtype;  // dtype string
  const std::vector<uint64_t>* shape = nullptr;
  bool long_shape = false;  // u64 dims (version 5)
  bool crc32 = true;
  bool sha256 = true;
  bool crypt_field = false;      // file has crypt info: write the u64 C + body
  uint64_t crypt_info_size = 0;  // body size; filled with zeros, patched by the caller
  uint64_t data_length = 0;
};

// Encodes a header placed at absolute `header_offset`, padded (with zero filler before the data
// length) so that the data starts at a multiple of `data_alignment` (1 = no padding).
EncodedTensorHeader encode_tensor_header(const TensorHeaderFields& f, uint64_t header_offset,
                                         uint64_t data_alignment);

const char* tensor_type_name(TensorType t);

}  // namespace tensorizer
