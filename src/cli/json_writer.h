// A tiny streaming JSON writer for the CLI's --json output (no dependency needed for this).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace tensorizer::cli {

// Escapes bytes as a JSON string: quotes, backslashes and control bytes (a dtype's NUL too) are
// escaped; UTF-8 passes through unchanged.
inline std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"')
      out += "\\\"";
    else if (c == '\\')
      out += "\\\\";
    else if (c >= 0x20 && c != 0x7f)
      out += static_cast<char>(c);
    else {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", c);
      out += b;
    }
  }
  return out + "\"";
}

}  // namespace tensorizer::cli
