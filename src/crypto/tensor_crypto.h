// Per-tensor encryption and decryption over a header's CryptInfo (spec §3.3–§3.8). Internal.
//
// The engine calls these chunk by chunk as bytes land, from several worker threads; objects are
// immutable after creation, so one TensorDecryptor may serve several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <map>
#include <string>
#include <string_view>

#include "tensorizer/crypto.h"

namespace tensorizer::crypto {

inline constexpr uint64_t kChunkSize = 2097152;  // 2 MiB, as tensorizer writes

// Caches passphrase-derived keys per (ops, mem, salt) for one reader's lifetime. Thread-safe.
class KeyCache {
 public:
  Key get(const std::string& passphrase, const KdfParams& params);

 private:
  std::mutex mu_;
  std::map<std::string, Key> keys_;
};

class TensorDecryptor {
 public:
  // Parses `crypt_info`; returns nullptr when the tensor is not encrypted (chunk count 0).
  // Throws kCrypto / kFormat for malformed info or a key that cannot apply.
  static std::unique_ptr<TensorDecryptor> create(std::string_view crypt_info, uint64_t data_length,
                                                 const DecryptionParams& params, KeyCache& cache);
  virtual ~TensorDecryptor() = default;
  // Bytes per chunk for this tensor (the whole tensor when it is one secretbox).
  virtual uint64_t chunk_size() const = 0;
  // Opens chunk `index` in place; `size` is that chunk's length. Throws kCrypto on MAC failure.
  virtual void decrypt_chunk(uint64_t index, uint8_t* data, size_t size) const = 0;
};

}  // namespace tensorizer::crypto
