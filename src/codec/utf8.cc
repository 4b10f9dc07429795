// UTF-8 validation for names read from files (see utf8.h).
#include "codec/utf8.h"

namespace tensorizer::codec {

size_t utf8_sequence(std::string_view s, size_t i, uint32_t* code_point) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t b = byte(i);
  if (b < 0x80) {
    if (code_point) *code_point = b;
    return 1;
  }
  size_t n;
  uint32_t cp;
  if (b >= 0xc2 && b <= 0xdf) {
    n = 2, cp = b & 0x1f;
  } else if (b >= 0xe0 && b <= 0xef) {
    n = 3, cp = b & 0x0f;
  } else if (b >= 0xf0 && b <= 0xf4) {
    n = 4, cp = b & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((byte(i + k) & 0xc0) != 0x80) return 0;
    cp = cp << 6 | (byte(i + k) & 0x3f);
  }
  if ((n == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
      (n == 4 && (cp < 0x10000 || cp > 0x10ffff)))
    return 0;
  if (code_point) *code_point = cp;
  return n;
}

bool is_utf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = utf8_sequence(bytes, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

}  // namespace tensorizer::codec
