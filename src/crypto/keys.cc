// Keys for weight encryption (docs/format.md §3.2): random and exact keys, Argon2id13 derivation
// from a passphrase with libsodium's crypto_pwhash, and the per-reader cache of derived keys.
#include <sodium.h>

#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>

#include "crypto/tensor_crypto.h"
#include "tensorizer/cancel.h"
#include "tensorizer/error.h"

namespace tensorizer {
namespace {

void check_limits(uint64_t opslimit, uint64_t memlimit, ErrorCode code) {
  if (opslimit < crypto_pwhash_argon2id_OPSLIMIT_MIN ||
      opslimit > crypto_pwhash_argon2id_OPSLIMIT_MAX)
    fail(code, "Argon2id opslimit " + std::to_string(opslimit) + " is out of range [" +
                   std::to_string(crypto_pwhash_argon2id_OPSLIMIT_MIN) + ", " +
                   std::to_string(crypto_pwhash_argon2id_OPSLIMIT_MAX) + "]");
  if (memlimit < crypto_pwhash_argon2id_MEMLIMIT_MIN ||
      memlimit > crypto_pwhash_argon2id_MEMLIMIT_MAX)
    fail(code, "Argon2id memlimit " + std::to_string(memlimit) + " is out of range [" +
                   std::to_string(crypto_pwhash_argon2id_MEMLIMIT_MIN) + ", " +
                   std::to_string(crypto_pwhash_argon2id_MEMLIMIT_MAX) + "]");
}

uint64_t count_from_env(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const unsigned long long n = std::strtoull(v, &end, 10);
  if (errno || *end || *v == '-' || n == 0)
    fail(ErrorCode::kInvalidArgument,
         std::string(name) + " must be a whole number greater than 0, not '" + v + "'");
  return n;
}

}  // namespace

KdfLimits KdfLimits::from_env() {
  KdfLimits l;
  l.opslimit = count_from_env("TENSORIZER_MAX_KDF_OPSLIMIT", l.opslimit);
  l.memlimit = count_from_env("TENSORIZER_MAX_KDF_MEMLIMIT", l.memlimit);
  return l;
}

namespace crypto {

void ensure_sodium() {
  static const int rc = sodium_init();  // thread-safe; returns 1 when already initialised
  if (rc < 0) fail(ErrorCode::kUnsupported, "libsodium failed to initialise");
}

Key KeyCache::get(const std::string& passphrase, const KdfParams& params) {
  std::string id(reinterpret_cast<const char*>(params.salt.data()), params.salt.size());
  id += std::to_string(params.opslimit) + "/" + std::to_string(params.memlimit);
  // Held while deriving, so concurrent workers wait for one derivation instead of repeating it.
  std::lock_guard<std::mutex> lock(mu_);
  auto it = keys_.find(id);
  if (it != keys_.end()) return it->second;
  Key k = derive_key(passphrase, params);
  keys_.emplace(std::move(id), k);
  return k;
}

KeyCache::~KeyCache() {
  for (auto& [_, k] : keys_) sodium_memzero(k.data(), k.size());
}

}  // namespace crypto

EncryptionParams EncryptionParams::random() {
  crypto::ensure_sodium();
  EncryptionParams p;
  randombytes_buf(p.key.data(), p.key.size());
  return p;
}

EncryptionParams EncryptionParams::from_key(const Key& key) {
  EncryptionParams p;
  p.key = key;
  return p;
}

EncryptionParams EncryptionParams::from_passphrase(const std::string& passphrase, uint64_t opslimit,
                                                   uint64_t memlimit,
                                                   std::optional<std::array<uint8_t, 16>> salt) {
  crypto::ensure_sodium();
  if (passphrase.empty()) fail(ErrorCode::kInvalidArgument, "the passphrase must not be empty");
  check_limits(opslimit, memlimit, ErrorCode::kInvalidArgument);
  KdfParams kdf;
  kdf.opslimit = opslimit;
  kdf.memlimit = memlimit;
  if (salt)
    kdf.salt = *salt;
  else
    randombytes_buf(kdf.salt.data(), kdf.salt.size());
  EncryptionParams p;
  p.key = derive_key(passphrase, kdf);
  p.kdf = kdf;
  return p;
}

namespace {

// One Argon2id derivation on a thread of its own, so that a caller with a CancelToken can stop
// waiting for it (crypto_pwhash cannot be interrupted). The thread owns this state: an abandoned
// derivation runs to its end (bounded by KdfLimits), wipes its copies and frees them.
struct Derivation {
  std::string passphrase;
  KdfParams params;
  Key key{};
  bool done = false, ok = false;
  std::mutex mu;
  std::condition_variable finished;
  ~Derivation() {
    sodium_memzero(passphrase.data(), passphrase.size());
    sodium_memzero(key.data(), key.size());
  }
  void run() {
    Key k{};
    const bool good =
        crypto_pwhash(k.data(), k.size(), passphrase.data(), passphrase.size(), params.salt.data(),
                      params.opslimit, static_cast<size_t>(params.memlimit),
                      crypto_pwhash_ALG_ARGON2ID13) == 0;
    std::lock_guard<std::mutex> lock(mu);
    key = k;
    sodium_memzero(k.data(), k.size());
    ok = good;
    done = true;
    finished.notify_all();
  }
};

}  // namespace

Key derive_key(const std::string& passphrase, const KdfParams& params) {
  crypto::ensure_sodium();
  if (passphrase.empty()) fail(ErrorCode::kInvalidArgument, "the passphrase must not be empty");
  check_limits(params.opslimit, params.memlimit, ErrorCode::kCrypto);
  static_assert(sizeof(params.salt) == crypto_pwhash_argon2id_SALTBYTES);
  auto d = std::make_shared<Derivation>();
  d->passphrase = passphrase;
  d->params = params;
  if (!current_cancel_token()) {
    d->run();
  } else {
    std::thread([d] { d->run(); }).detach();
    std::unique_lock<std::mutex> lock(d->mu);
    while (!d->finished.wait_for(lock, std::chrono::milliseconds(50), [&] { return d->done; }))
      check_cancelled();  // throws; the derivation finishes on its own thread
  }
  if (!d->ok)
    fail(ErrorCode::kCrypto, "Argon2id key derivation failed (opslimit " +
                                 std::to_string(params.opslimit) + ", memlimit " +
                                 std::to_string(params.memlimit) + " bytes): out of memory?");
  return d->key;
}

}  // namespace tensorizer
