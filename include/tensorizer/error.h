// tensorizer/error.h — the one exception type the library throws.
//
// Every failure (bad format, I/O, hash mismatch, crypto, bad argument) is reported as a
// tensorizer::Error carrying an ErrorCode, so callers (the CLI, the Python layer) can map it
// to their own error kinds. Messages name the file/URI, the tensor and the byte offset where
// they are known. Thread-safety: plain value type.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tensorizer {

enum class ErrorCode {
  kInvalidArgument,     // caller passed something unusable
  kFormat,              // the bytes are not a valid .tensors file (corrupt, truncated, hostile)
  kUnsupportedVersion,  // a data version or feature flag this build cannot read
  kIO,                  // the transport failed (open, read, write, network)
  kNotFound,            // a file, object or key does not exist
  kHashMismatch,        // stored CRC32/SHA-256 disagrees with the bytes
  kCrypto,              // encryption/decryption problem (wrong key, MAC failure, mismatch)
  kUnsupported,         // valid input this build does not handle (e.g. unknown dtype)
  kCancelled,           // another worker failed first, or the caller cancelled (cancel.h)
  kDeadline,            // a deadline the caller set passed (cancel.h)
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// Throws Error(code, message). Kept out of line so hot paths stay small.
[[noreturn]] void fail(ErrorCode code, const std::string& message);

// Untrusted bytes (a name or dtype read from a file) as a message shows them: well-formed UTF-8
// stays as it is, except that NUL and other control bytes, backslashes and malformed bytes become
// \xNN escapes, so nothing is hidden and nothing cuts the message short; longer than `max` bytes
// are cut, with "..." after them.
std::string shown_bytes(std::string_view bytes, size_t max = 200);

}  // namespace tensorizer
