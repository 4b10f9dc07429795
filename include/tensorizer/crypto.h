// tensorizer/crypto.h — keys for weight encryption (docs/format.md §3), interoperable with
// tensorizer.
//
// Tensor data is sealed with libsodium's XSalsa20-Poly1305 secretbox in 2 MiB chunks. A key is
// either 32 exact bytes or derived from a passphrase with Argon2id; in the latter case the
// derivation parameters and salt travel in each tensor's header, so decryption needs only the
// passphrase. Value types; thread-safe to share once built.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>

namespace tensorizer {

using Key = std::array<uint8_t, 32>;

// Argon2id cost presets of EncryptionParams.from_string (libsodium 1.0.18 values, docs/format.md
// §3.2).
struct OpsLimit {
  static constexpr uint64_t kMin = 1, kInteractive = 2, kModerate = 3, kSensitive = 4;
};
struct MemLimit {
  static constexpr uint64_t kMin = 8192, kInteractive = 67108864, kModerate = 268435456,
                            kSensitive = 1073741824;
};

struct KdfParams {
  uint64_t opslimit = 3;          // libsodium crypto_pwhash_OPSLIMIT_MODERATE
  uint64_t memlimit = 268435456;  // crypto_pwhash_MEMLIMIT_MODERATE
  std::array<uint8_t, 16> salt{};
};

struct EncryptionParams {
  Key key{};
  std::optional<KdfParams> kdf;  // set when the key came from a passphrase

  // A key from the system's secure random generator.
  static EncryptionParams random();
  // Exactly these 32 bytes.
  static EncryptionParams from_key(const Key& key);
  // Argon2id13 over `passphrase` (non-empty); a random salt when none is given.
  static EncryptionParams from_passphrase(const std::string& passphrase, uint64_t opslimit,
                                          uint64_t memlimit,
                                          std::optional<std::array<uint8_t, 16>> salt = {});
};

// The most Argon2id work a reader does for a passphrase. The cost a file asks for is checked
// against it before any derivation, so a hostile file cannot make a load spend minutes or all of
// RAM deriving a key. The default admits every preset (SENSITIVE: opslimit 4, memlimit 1 GiB);
// files written with larger custom costs need it raised, here or with the environment variables
// $TENSORIZER_MAX_KDF_OPSLIMIT and $TENSORIZER_MAX_KDF_MEMLIMIT (bytes), which set the default.
struct KdfLimits {
  uint64_t opslimit = OpsLimit::kSensitive;
  uint64_t memlimit = MemLimit::kSensitive;

  // The defaults above, overridden by the environment; throws kInvalidArgument on a bad value.
  static KdfLimits from_env();
};

struct DecryptionParams {
  std::optional<Key> key;                 // works for any encrypted file
  std::optional<std::string> passphrase;  // only for files encrypted from a passphrase
  KdfLimits max_kdf = KdfLimits::from_env();

  static DecryptionParams from_key(const Key& k) { return {k, std::nullopt}; }
  static DecryptionParams from_passphrase(std::string p) { return {std::nullopt, std::move(p)}; }
};

// Argon2id13 key derivation exactly as tensorizer does it.
Key derive_key(const std::string& passphrase, const KdfParams& params);

}  // namespace tensorizer
