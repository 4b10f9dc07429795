// Chunked XSalsa20-Poly1305 over tensor data (docs/format.md §3.3, §3.7, §3.8), nonce bookkeeping
// and a small parallel loop used to seal or open many chunks at once.
#include "crypto/tensor_crypto.h"

#include <sodium.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <thread>

#include "common/worker_pool.h"
#include "tensorizer/error.h"

namespace tensorizer::crypto {
namespace {

// Adds `v` to a 24-byte little-endian number in place, carrying (and wrapping at 2^192).
void add_le(Nonce& n, uint64_t v) {
  unsigned carry = 0;
  for (size_t i = 0; i < n.size(); ++i) {
    unsigned sum = n[i] + static_cast<unsigned>(v & 0xff) + carry;
    n[i] = static_cast<uint8_t>(sum);
    carry = sum >> 8;
    v >>= 8;
    if (v == 0 && carry == 0) break;
  }
}

std::string big_endian(const Nonce& n) { return std::string(n.rbegin(), n.rend()); }

uint64_t chunks_for(uint64_t length, uint64_t chunk) {
  return length == 0 ? 0 : (length - 1) / chunk + 1;
}

// Argon2id parameters come from the file, so a hostile one could ask for hours of work or more
// memory than the machine has: they are checked against the reader's limits (and the machine's
// RAM) before anything is derived.
void check_file_kdf(uint64_t opslimit, uint64_t memlimit, const KdfLimits& limits) {
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  const uint64_t ram = pages > 0 && page > 0 ? uint64_t(pages) * uint64_t(page) : UINT64_MAX;
  if (opslimit > limits.opslimit || memlimit > limits.memlimit)
    fail(ErrorCode::kCrypto,
         "refusing the key derivation cost the file asks for (Argon2id opslimit " +
             std::to_string(opslimit) + ", memlimit " + std::to_string(memlimit) +
             " bytes): above this reader's limit (opslimit " + std::to_string(limits.opslimit) +
             ", memlimit " + std::to_string(limits.memlimit) +
             " bytes). If the file is trusted, raise the limit: DecryptionParams.from_string(..., "
             "max_opslimit=, max_memlimit=) in Python, KdfLimits in C++, or "
             "$TENSORIZER_MAX_KDF_OPSLIMIT and $TENSORIZER_MAX_KDF_MEMLIMIT");
  if (memlimit > ram)
    fail(ErrorCode::kCrypto,
         "refusing the key derivation cost the file asks for (Argon2id memlimit " +
             std::to_string(memlimit) + " bytes): more than this machine's " + std::to_string(ram) +
             " bytes of RAM");
}

}  // namespace

Nonce nonce_at(const Nonce& n0, uint64_t index) {
  Nonce n = n0;
  add_le(n, index);
  return n;
}

// ---- Decryption ------------------------------------------------------------------------------

std::unique_ptr<TensorDecryptor> TensorDecryptor::create(std::string_view crypt_info,
                                                         uint64_t data_length,
                                                         const DecryptionParams& params,
                                                         KeyCache& cache) {
  CryptInfo info = parse_crypt_info(crypt_info);
  if (info.chunk_count == 0) return nullptr;
  ensure_sodium();
  const size_t methods = info.parallel.size() + info.sequential.size();
  if (methods == 0)
    fail(ErrorCode::kCrypto, "No known encryption method found in the tensor's crypt info");
  if (methods > 1)
    fail(ErrorCode::kCrypto, "Could not interpret the encryption method: the crypt info holds " +
                                 std::to_string(methods) + " of them");

  std::unique_ptr<TensorDecryptor> d(new TensorDecryptor());
  d->data_length_ = data_length;
  if (!info.sequential.empty()) {
    d->nonce_ = info.sequential[0].nonce;
    d->macs_ = {info.sequential[0].mac};
    d->chunk_size_ = data_length;  // one secretbox over the whole data
  } else {
    ParallelChunk& p = info.parallel[0];
    d->nonce_ = p.nonce;
    d->macs_ = std::move(p.macs);
    if (d->macs_.empty())
      fail(ErrorCode::kFormat, "crypt info holds no MACs for an encrypted tensor");
    if (d->macs_.size() == 1) {
      d->chunk_size_ =
          data_length;  // chunk size is ignored: one secretbox (docs/format.md §3.7 step 5)
    } else {
      d->chunk_size_ = p.chunk_size;
      const uint64_t expected = chunks_for(data_length, p.chunk_size);
      if (expected != d->macs_.size())
        fail(ErrorCode::kFormat, "crypt info holds " + std::to_string(d->macs_.size()) +
                                     " MACs, but " + std::to_string(data_length) +
                                     " bytes in chunks of " + std::to_string(p.chunk_size) +
                                     " make " + std::to_string(expected));
    }
  }

  if (params.key) {
    d->key_ = *params.key;
  } else if (params.passphrase) {
    if (info.key_derivation.empty())
      fail(
          ErrorCode::kCrypto,
          "a passphrase was given, but the tensor was encrypted with an exact key, not one derived "
          "from a passphrase; decrypt it with its key (DecryptionParams::from_key, --key-file)");
    if (info.key_derivation.size() > 1)
      fail(ErrorCode::kCrypto,
           "Could not interpret the key derivation method: the crypt info holds " +
               std::to_string(info.key_derivation.size()) + " of them");
    const KeyDerivationChunk& k = info.key_derivation[0];
    if (k.algorithm != kArgon2id13)
      fail(ErrorCode::kCrypto, "unsupported password hashing algorithm " +
                                   std::to_string(k.algorithm) + " (only Argon2id13 = 2 is known)");
    KdfParams kdf;
    if (k.salt.size() != kdf.salt.size())
      fail(ErrorCode::kCrypto, "key derivation salt of " + std::to_string(k.salt.size()) +
                                   " bytes (Argon2id needs " + std::to_string(kdf.salt.size()) +
                                   ")");
    check_file_kdf(k.opslimit, k.memlimit, params.max_kdf);
    kdf.opslimit = k.opslimit;
    kdf.memlimit = k.memlimit;
    std::memcpy(kdf.salt.data(), k.salt.data(), kdf.salt.size());
    d->key_ = cache.get(*params.passphrase, kdf);
  } else {
    fail(ErrorCode::kCrypto, "the tensor is encrypted, but no key or passphrase was given");
  }
  return d;
}

TensorDecryptor::~TensorDecryptor() { sodium_memzero(key_.data(), key_.size()); }

void TensorDecryptor::decrypt_chunk(uint64_t index, uint8_t* data, size_t size) const {
  const uint64_t begin = index * chunk_size_;
  if (index >= macs_.size() || size != std::min(chunk_size_, data_length_ - begin))
    fail(ErrorCode::kInvalidArgument, "internal: bad decryption chunk " + std::to_string(index) +
                                          " of " + std::to_string(size) + " bytes");
  const Nonce n = nonce_at(nonce_, index);
  if (crypto_secretbox_open_detached(data, data, macs_[index].data(), size, n.data(),
                                     key_.data()) != 0)
    fail(ErrorCode::kCrypto, "Tensor decryption failed: chunk " + std::to_string(index) + " of " +
                                 std::to_string(macs_.size()) + " (data bytes " +
                                 std::to_string(begin) + ".." + std::to_string(begin + size) +
                                 ") does not authenticate: wrong key or passphrase, or the data or "
                                 "its MAC was modified");
}

void TensorDecryptor::decrypt_chunks(uint64_t first, uint8_t* data, uint64_t size,
                                     int workers) const {
  const uint64_t begin = first * chunk_size_;
  if (size == 0) return;
  if (first >= macs_.size() || size > data_length_ - begin ||
      (size % chunk_size_ != 0 && begin + size != data_length_))
    fail(ErrorCode::kInvalidArgument, "internal: decryption range is not made of whole chunks");
  const uint64_t n = chunks_for(size, chunk_size_);
  parallel_for(n, workers, [&](size_t i) {
    const uint64_t off = i * chunk_size_;
    decrypt_chunk(first + i, data + off, std::min(chunk_size_, data_length_ - begin - off));
  });
}

// ---- Nonces ----------------------------------------------------------------------------------

Nonce NonceRegistry::reserve(uint64_t chunk_count) {
  ensure_sodium();
  const uint64_t count = std::max<uint64_t>(chunk_count, 1);
  std::lock_guard<std::mutex> lock(mu_);
  for (;;) {
    Nonce n0;
    randombytes_buf(n0.data(), n0.size());
    Nonce end = nonce_at(n0, count);
    const std::string lo = big_endian(n0), hi = big_endian(end);
    if (hi <= lo) continue;  // the range would wrap around 2^192: draw again
    // Overlap with the range starting at or after n0, or with the one starting before it.
    auto after = ranges_.lower_bound(lo);
    if (after != ranges_.end() && after->first < hi) continue;
    if (after != ranges_.begin()) {
      auto before = std::prev(after);
      Nonce b;
      std::string key = before->first;
      std::copy(key.rbegin(), key.rend(), b.begin());
      if (big_endian(nonce_at(b, before->second)) > lo) continue;
    }
    ranges_.emplace(lo, count);
    return n0;
  }
}

// ---- Encryption ------------------------------------------------------------------------------

TensorEncryptor::TensorEncryptor(const EncryptionParams& params, uint64_t data_length,
                                 NonceRegistry& nonces)
    : data_length_(data_length), key_(params.key) {
  if (data_length == 0)
    fail(ErrorCode::kInvalidArgument, "internal: zero-length tensors are not encrypted");
  if (params.kdf) {
    KeyDerivationChunk k;
    k.opslimit = params.kdf->opslimit;
    k.memlimit = params.kdf->memlimit;
    k.salt.assign(params.kdf->salt.begin(), params.kdf->salt.end());
    kdf_ = std::move(k);
  }
  chunk_.chunk_size = kChunkSize;
  chunk_.macs.resize(chunks_for(data_length, kChunkSize));
  chunk_.nonce = nonces.reserve(chunk_.macs.size());
}

TensorEncryptor::~TensorEncryptor() { sodium_memzero(key_.data(), key_.size()); }

void TensorEncryptor::encrypt_chunk(uint64_t index, const uint8_t* src, uint8_t* dst, size_t size) {
  const uint64_t begin = index * kChunkSize;
  if (index >= chunk_.macs.size() || size != std::min(kChunkSize, data_length_ - begin))
    fail(ErrorCode::kInvalidArgument, "internal: bad encryption chunk " + std::to_string(index) +
                                          " of " + std::to_string(size) + " bytes");
  const Nonce n = nonce_at(chunk_.nonce, index);
  crypto_secretbox_detached(dst, chunk_.macs[index].data(), src, size, n.data(), key_.data());
}

void TensorEncryptor::encrypt_chunks(uint64_t first, const uint8_t* src, uint8_t* dst,
                                     uint64_t size, int workers) {
  const uint64_t begin = first * kChunkSize;
  if (size == 0) return;
  if (first >= chunk_.macs.size() || size > data_length_ - begin ||
      (size % kChunkSize != 0 && begin + size != data_length_))
    fail(ErrorCode::kInvalidArgument, "internal: encryption range is not made of whole chunks");
  parallel_for(chunks_for(size, kChunkSize), workers, [&](size_t i) {
    const uint64_t off = i * kChunkSize;
    encrypt_chunk(first + i, src + off, dst + off,
                  std::min(kChunkSize, data_length_ - begin - off));
  });
}

std::string TensorEncryptor::crypt_info() const {
  return encode_crypt_info(kdf_ ? &*kdf_ : nullptr, chunk_);
}

uint64_t TensorEncryptor::crypt_info_size(const EncryptionParams& params, uint64_t data_length) {
  return crypto::crypt_info_size(params.kdf.has_value(), params.kdf ? params.kdf->salt.size() : 0,
                                 chunks_for(data_length, kChunkSize));
}

}  // namespace tensorizer::crypto
