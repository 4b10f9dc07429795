// Error path of ByteCursor, out of line.
#include "codec/bytes.h"

namespace tensorizer::codec {

void ByteCursor::truncated(const char* what, size_t n) const {
  fail(ErrorCode::kFormat, std::string("truncated or corrupt data: reading ") + what + " needs " +
                               std::to_string(n) + " bytes at offset " +
                               std::to_string(base_ + pos_) + " but only " +
                               std::to_string(size_ - pos_) + " remain");
}

}  // namespace tensorizer::codec
