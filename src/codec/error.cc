// Out-of-line pieces of tensorizer::Error.
#include "tensorizer/error.h"

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
  }
  return "error";
}

void fail(ErrorCode code, const std::string& message) { throw Error(code, message); }

}  // namespace tensorizer
