// Hash checks of loaded tensors (see verify_tensor.h).
#include "engine/verify_tensor.h"

#include <cstring>
#include <string>

#include "tensorizer/error.h"

namespace tensorizer::engine {

std::unique_ptr<TensorHasher> hasher_for(const LoadedTensorInfo& info, bool fastest_only) {
  const TensorHeader& h = info.header;
  bool crc = false, sha = false;
  for (const auto& hv : h.hashes) (hv.type == HashType::kCrc32 ? crc : sha) = true;
  if (!crc && !sha) return nullptr;
  if (fastest_only && crc) sha = false;
  const std::string raw = info.raw_header();
  return std::make_unique<TensorHasher>(
      crc, sha, hashable_header(reinterpret_cast<const uint8_t*>(raw.data()), raw.size(), h));
}

std::string hash_failures(const LoadedTensorInfo& info, TensorHasher& hasher) {
  hasher.finish();
  const uint8_t* raw = info.header_data();  // the hash values lie before any filler
  std::string failures;
  for (const auto& hv : info.header.hashes) {
    if (!(hv.type == HashType::kCrc32 ? hasher.computes_crc32() : hasher.computes_sha256()))
      continue;
    std::string stored = to_hex(raw + hv.value_offset, hv.value_size), computed;
    if (hv.type == HashType::kCrc32) {
      uint32_t c = hasher.crc32();
      uint8_t le[4];
      std::memcpy(le, &c, 4);
      computed = to_hex(le, 4);
    } else {
      computed = to_hex(hasher.sha256().data(), 32);
    }
    if (stored == computed) continue;
    failures += std::string(failures.empty() ? "" : "; ") +
                (hv.type == HashType::kCrc32 ? "CRC32" : "SHA-256") + " stored " + stored +
                ", computed " + computed;
  }
  return failures;
}

void verify_tensor(Reader& reader, size_t entry, const uint8_t* data) {
  const IndexEntry& e = reader.entries()[entry];
  const LoadedTensorInfo& info = *reader.loaded_info(entry);
  std::unique_ptr<TensorHasher> hasher = hasher_for(info);
  if (!hasher) return;
  hasher->update(data, e.data_length);
  const std::string failures = hash_failures(info, *hasher);
  if (!failures.empty())
    fail(ErrorCode::kHashMismatch, "hash mismatch for tensor '" + display_path(e.path) + "' in '" +
                                       reader.uri() + "': " + failures);
}

void check_header_unchanged(Source& src, const std::string& uri, const IndexEntry& e,
                            const std::string& loaded) {
  std::string now(e.header_size(), '\0');
  src.read_at(e.header_offset, now.data(), now.size());
  if (now != loaded)
    fail(ErrorCode::kIO, "'" + uri + "': the object changed during the load (tensor '" +
                             display_path(e.path).substr(0, 200) +
                             "' has another header now; the server names no version of the "
                             "object, no ETag or Last-Modified, so the load compares headers)");
}

}  // namespace tensorizer::engine
