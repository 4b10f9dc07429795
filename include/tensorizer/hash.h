// tensorizer/hash.h — the two integrity hashes of the format (docs/format.md §1.6).
//
// CRC-32 is zlib's (CRC-32/ISO-HDLC), computed with ISA-L's carry-less-multiply kernels; SHA-256
// comes from OpenSSL (SHA-NI where the CPU has it). TensorHasher computes whatever a header asks
// for over "hashable header, then data", fed in pieces. Objects are not shared between threads.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tensorizer/format.h"

namespace tensorizer {

// Continues a zlib-compatible CRC-32 (start with crc = 0).
uint32_t crc32_update(uint32_t crc, const void* data, size_t size);

class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t size);
  std::array<uint8_t, 32> finish();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

std::string to_hex(const uint8_t* data, size_t size);

// Hashes "hashable header + data" for the hash kinds it is asked for.
class TensorHasher {
 public:
  TensorHasher(bool crc32, bool sha256, const std::string& hashable_header);
  void update(const void* data, size_t size);
  void finish();  // after the last update
  bool computes_crc32() const { return want_crc_; }
  bool computes_sha256() const { return want_sha_; }
  uint32_t crc32() const { return crc_; }
  const std::array<uint8_t, 32>& sha256() const { return sha_digest_; }

 private:
  bool want_crc_, want_sha_;
  uint32_t crc_ = 0;
  std::unique_ptr<Sha256> sha_;
  std::array<uint8_t, 32> sha_digest_{};
};

}  // namespace tensorizer
