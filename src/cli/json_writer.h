// A tiny streaming JSON writer for the CLI's --json output (no dependency needed for this).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "codec/utf8.h"

namespace tensorizer::cli {

// Escapes bytes as a JSON string: quotes, backslashes and control bytes (a dtype's NUL too) are
// escaped and UTF-8 passes through unchanged. A byte that is not part of well-formed UTF-8 (a file
// name may hold any) becomes \udcXX, the lone surrogate Python's os.fsdecode makes of it, so the
// output stays JSON and json.loads gives back the str that names the same file.
inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    char b[8];
    if (c >= 0x80) {
      const size_t n = codec::utf8_sequence(s, i);
      if (n > 0) {
        out.append(s.substr(i, n));
        i += n;
      } else {
        std::snprintf(b, sizeof b, "\\udc%02x", c);
        out += b;
        ++i;
      }
      continue;
    }
    if (c == '"') {
      out += "\\\"";
    } else if (c == '\\') {
      out += "\\\\";
    } else if (c >= 0x20 && c != 0x7f) {
      out += static_cast<char>(c);
    } else {
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    }
    ++i;
  }
  return out + "\"";
}

}  // namespace tensorizer::cli
