// Hash check of a tensor loaded in one piece (see verify_tensor.h).
#include "engine/verify_tensor.h"

#include <cstring>
#include <string>

#include "tensorizer/error.h"
#include "tensorizer/hash.h"

namespace tensorizer::engine {

void verify_tensor(Reader& reader, size_t entry, const uint8_t* data) {
  const IndexEntry& e = reader.entries()[entry];
  const LoadedTensorInfo& info = *reader.loaded_info(entry);
  bool crc = false, sha = false;
  for (const auto& hv : info.header.hashes) (hv.type == HashType::kCrc32 ? crc : sha) = true;
  if (!crc && !sha) return;
  const auto* raw = reinterpret_cast<const uint8_t*>(info.header_bytes.data());
  TensorHasher hasher(crc, sha, hashable_header(raw, info.header_bytes.size(), info.header));
  hasher.update(data, e.data_length);
  hasher.finish();
  const uint32_t crc32 = hasher.crc32();
  for (const auto& hv : info.header.hashes) {
    const bool ok = hv.type == HashType::kCrc32 ? std::memcmp(raw + hv.value_offset, &crc32, 4) == 0
                                                : std::memcmp(raw + hv.value_offset, hasher.sha256().data(), 32) == 0;
    if (!ok)
      fail(ErrorCode::kHashMismatch, std::string(hv.type == HashType::kCrc32 ? "CRC32" : "SHA-256") +
                                         " mismatch for tensor '" + display_path(e.path) + "' in '" +
                                         reader.uri() + "'");
  }
}

}  // namespace tensorizer::engine
