// Placeholder until libsodium-backed decryption lands: encrypted tensors are refused clearly.
#include "crypto/tensor_crypto.h"
#include "tensorizer/error.h"

namespace tensorizer {
namespace crypto {

Key KeyCache::get(const std::string&, const KdfParams&) {
  fail(ErrorCode::kUnsupported, "decryption is not supported by this build");
}

std::unique_ptr<TensorDecryptor> TensorDecryptor::create(std::string_view crypt_info, uint64_t,
                                                         const DecryptionParams&, KeyCache&) {
  if (crypt_info.size() >= 2 && (crypt_info[0] != 0 || crypt_info[1] != 0))
    fail(ErrorCode::kUnsupported, "decryption is not supported by this build");
  return nullptr;
}

}  // namespace crypto
}  // namespace tensorizer
