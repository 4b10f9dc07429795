// Out-of-line pieces of tensorizer::Error, and how messages show untrusted bytes.
#include "tensorizer/error.h"

#include <cstdint>

#include "codec/utf8.h"

namespace tensorizer {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kFormat:
      return "format error";
    case ErrorCode::kUnsupportedVersion:
      return "unsupported version";
    case ErrorCode::kIO:
      return "I/O error";
    case ErrorCode::kNotFound:
      return "not found";
    case ErrorCode::kHashMismatch:
      return "hash mismatch";
    case ErrorCode::kCrypto:
      return "cryptography error";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kCancelled:
      return "cancelled";
    case ErrorCode::kDeadline:
      return "deadline passed";
  }
  return "error";
}

void fail(ErrorCode code, const std::string& message) { throw Error(code, message); }

std::string shown_bytes(std::string_view bytes, size_t max) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  size_t i = 0;
  while (i < bytes.size() && i < max) {
    const size_t n = codec::utf8_sequence(bytes, i);
    const auto b = static_cast<uint8_t>(bytes[i]);
    if (n == 0 || b < 0x20 || b == 0x7f || b == '\\') {
      out += "\\x";
      out += kHex[b >> 4];
      out += kHex[b & 15];
      ++i;
    } else {
      out.append(bytes.substr(i, n));
      i += n;
    }
  }
  if (i < bytes.size()) out += "...";
  return out;
}

}  // namespace tensorizer
