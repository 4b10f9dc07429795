// File header codec (docs/format.md §1.2, §1.3). Pure: no I/O.
#include <cstring>

#include "codec/bytes.h"
#include "tensorizer/format.h"

namespace tensorizer {

FileHeader parse_file_header(const uint8_t* data, size_t size) {
  if (size < kMagicSize || std::memcmp(data, kMagic, kMagicSize) != 0)
    fail(ErrorCode::kFormat, "not a tensorizer file (bad magic)");
  codec::ByteCursor c(data, size);
  c.skip(kMagicSize, "magic");
  FileHeader h;
  h.version = c.read<uint32_t>("data version");
  if (h.version < kMinVersion || h.version > kMaxVersion)
    fail(ErrorCode::kUnsupportedVersion, "unsupported data version " + std::to_string(h.version) +
                                             " (this build reads " + std::to_string(kMinVersion) +
                                             " to " + std::to_string(kMaxVersion) + ")");
  if (size < kPreludeSize)
    fail(ErrorCode::kFormat, "file too small: ran out of data before reading a full header (" +
                                 std::to_string(size) + " of " + std::to_string(kPreludeSize) +
                                 " bytes)");
  std::string_view flags = c.bytes(32, "feature flags");
  h.flags = codec::load_le<uint64_t>(flags.data());
  bool high_bits = false;
  for (size_t i = 8; i < 32; ++i) high_bits |= flags[i] != 0;
  const uint64_t known = kFlagEncrypted | kFlagVersionedEntries;
  if (high_bits || (h.flags & ~known))
    fail(ErrorCode::kUnsupportedVersion, "unsupported feature flags in file header");
  if ((h.flags & kFlagVersionedEntries) && h.version < kLongDimsVersion)
    fail(ErrorCode::kFormat, "feature flag 'versioned headers' in a data version " +
                                 std::to_string(h.version) + " file");
  h.tensor_size = c.read<uint64_t>("tensor data size");
  c.skip(8, "reserved");
  h.tensor_count = c.read<uint64_t>("tensor count");
  h.index_size = c.read<uint64_t>("index size");
  return h;
}

std::string encode_file_header(const FileHeader& h) {
  std::string out;
  out.reserve(kPreludeSize);
  codec::ByteAppender a(out);
  a.bytes(std::string_view(kMagic, kMagicSize));
  a.put<uint32_t>(h.version);
  a.put<uint64_t>(h.version >= kMetaVersion ? h.flags : 0);
  a.zeros(24);
  a.put<uint64_t>(h.tensor_size);
  a.zeros(8);
  a.put<uint64_t>(h.tensor_count);
  a.put<uint64_t>(h.index_size);
  return out;
}

const char* tensor_type_name(TensorType t) {
  switch (t) {
    case TensorType::kParam:
      return "PARAM";
    case TensorType::kBuffer:
      return "BUFFER";
    case TensorType::kStateDict:
      return "STATE_DICT";
  }
  return "UNKNOWN";
}

}  // namespace tensorizer
