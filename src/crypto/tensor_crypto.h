// Per-tensor encryption and decryption over a header's CryptInfo (docs/format.md §3.3–§3.8).
// Internal.
//
// Tensor data is sealed with libsodium's crypto_secretbox (XSalsa20-Poly1305, detached MACs) in
// chunks of 2 MiB, chunk i with nonce n0 + i (24-byte little-endian counter). The engine calls
// these chunk by chunk as bytes land, from several worker threads: a TensorDecryptor is immutable
// after creation, and a TensorEncryptor may seal different chunks concurrently (each index once).
// Keys are wiped from memory when these objects die.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "crypto/crypt_info.h"
#include "tensorizer/crypto.h"

namespace tensorizer::crypto {

inline constexpr uint64_t kChunkSize = 2097152;  // 2 MiB, as tensorizer writes

// Initialises libsodium once (thread-safe); throws kUnsupported if it cannot.
void ensure_sodium();

// `n0 + index`, the 24 bytes read as one little-endian integer (wraps at 2^192, like
// sodium_increment).
Nonce nonce_at(const Nonce& n0, uint64_t index);

// Caches passphrase-derived keys per (ops, mem, salt) for one reader's lifetime. Thread-safe;
// a key is derived once even when several workers ask for it at the same time.
class KeyCache {
 public:
  Key get(const std::string& passphrase, const KdfParams& params);
  ~KeyCache();

 private:
  std::mutex mu_;
  std::map<std::string, Key> keys_;
};

class TensorDecryptor {
 public:
  // Parses `crypt_info`; returns nullptr when the tensor is not encrypted (chunk count 0).
  // Throws kCrypto when no single known method is present, when a passphrase was given for a
  // tensor sealed with an exact key, or when key derivation fails; kFormat when the CryptInfo is
  // malformed or its MAC count does not fit `data_length`.
  static std::unique_ptr<TensorDecryptor> create(std::string_view crypt_info, uint64_t data_length,
                                                 const DecryptionParams& params, KeyCache& cache);
  ~TensorDecryptor();
  TensorDecryptor(const TensorDecryptor&) = delete;
  TensorDecryptor& operator=(const TensorDecryptor&) = delete;

  // Bytes per chunk for this tensor (the whole tensor when it is one secretbox).
  uint64_t chunk_size() const { return chunk_size_; }
  uint64_t chunk_count() const { return macs_.size(); }
  // Opens chunk `index` in place; `size` is that chunk's length. Throws kCrypto
  // ("Tensor decryption failed ...") on MAC failure, leaving the bytes undecrypted.
  void decrypt_chunk(uint64_t index, uint8_t* data, size_t size) const;
  // Opens the whole chunks starting at chunk `first` that make up `size` bytes at `data`
  // (the last may be the tensor's short last chunk), on up to `workers` threads.
  void decrypt_chunks(uint64_t first, uint8_t* data, uint64_t size, int workers) const;

 private:
  TensorDecryptor() = default;
  uint64_t data_length_ = 0;
  uint64_t chunk_size_ = 0;
  Nonce nonce_{};
  std::vector<Mac> macs_;
  Key key_{};
};

// Hands out initial nonces for the tensors of one file so that no (key, nonce) pair is ever
// used twice: each tensor gets a random 24-byte n0 whose range [n0, n0 + chunks) overlaps no
// earlier range. Thread-safe.
class NonceRegistry {
 public:
  Nonce reserve(uint64_t chunk_count);

 private:
  std::mutex mu_;
  std::map<std::string, uint64_t> ranges_;  // big-endian n0 -> chunk count
};

class TensorEncryptor {
 public:
  // A tensor of `data_length` (> 0) bytes, in 2 MiB chunks, with a fresh nonce range.
  TensorEncryptor(const EncryptionParams& params, uint64_t data_length, NonceRegistry& nonces);
  ~TensorEncryptor();
  TensorEncryptor(const TensorEncryptor&) = delete;
  TensorEncryptor& operator=(const TensorEncryptor&) = delete;

  uint64_t chunk_size() const { return kChunkSize; }
  uint64_t chunk_count() const { return chunk_.macs.size(); }
  // Seals chunk `index` of the plaintext `src` into `dst` (may be the same memory), recording its
  // MAC. `size` must be that chunk's length.
  void encrypt_chunk(uint64_t index, const uint8_t* src, uint8_t* dst, size_t size);
  // Seals the whole chunks starting at chunk `first` that make up `size` bytes, on up to
  // `workers` threads.
  void encrypt_chunks(uint64_t first, const uint8_t* src, uint8_t* dst, uint64_t size, int workers);
  // The CryptInfo body, complete once every chunk has been sealed.
  std::string crypt_info() const;
  // Its size, known before anything is sealed (for laying out the header).
  static uint64_t crypt_info_size(const EncryptionParams& params, uint64_t data_length);

 private:
  uint64_t data_length_;
  Key key_;
  std::optional<KeyDerivationChunk> kdf_;
  ParallelChunk chunk_;
};

}  // namespace tensorizer::crypto
