// Encoding and decoding of tensor paths (docs/format.md §2.1). Pure: no I/O.
#include "tensorizer/tensor_path.h"

#include <cstdio>

#include "codec/utf8.h"
#include "tensorizer/error.h"

namespace tensorizer {
namespace {

constexpr char kStructuredMarker = '\x1e';

[[noreturn]] void bad_name(std::string_view bytes, const std::string& why) {
  fail(ErrorCode::kFormat, "invalid tensor name '" + shown_bytes(bytes, 80) + "': " + why);
}

// Decodes one UTF-8 code point at s[i], advancing i. Throws on invalid UTF-8.
uint32_t next_code_point(std::string_view s, size_t& i) {
  uint32_t cp = 0;
  const size_t n = codec::utf8_sequence(s, i, &cp);
  if (n == 0) fail(ErrorCode::kInvalidArgument, "tensor name is not valid UTF-8");
  i += n;
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xf0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// Python json.dumps(ensure_ascii=True) string escaping.
void append_json_string(std::string& out, std::string_view s) {
  auto hex4 = [&](uint32_t u) {
    char b[16];
    std::snprintf(b, sizeof b, "\\u%04x", u);
    out += b;
  };
  out += '"';
  for (size_t i = 0; i < s.size();) {
    uint32_t cp = next_code_point(s, i);
    switch (cp) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (cp >= 0x20 && cp < 0x7f) {
          out += static_cast<char>(cp);
        } else if (cp < 0x10000) {
          hex4(cp);
        } else {
          uint32_t v = cp - 0x10000;
          hex4(0xd800 | (v >> 10));
          hex4(0xdc00 | (v & 0x3ff));
        }
    }
  }
  out += '"';
}

// A minimal parser for the JSON arrays of str/non-negative-int that structured names use.
class PathJsonParser {
 public:
  explicit PathJsonParser(std::string_view whole, std::string_view json)
      : whole_(whole), s_(json) {}

  TensorPath parse() {
    TensorPath path;
    ws();
    expect('[');
    ws();
    if (peek() == ']') bad_name(whole_, "structured name must have at least one component");
    for (;;) {
      ws();
      char c = peek();
      if (c == '"') {
        path.components.emplace_back(string());
      } else if (c >= '0' && c <= '9') {
        path.components.emplace_back(integer());
      } else {
        bad_name(whole_, "structured name components must be strings or non-negative integers");
      }
      ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect(']');
      break;
    }
    ws();
    if (i_ != s_.size()) bad_name(whole_, "trailing bytes after structured name");
    return path;
  }

 private:
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void expect(char c) {
    if (peek() != c) bad_name(whole_, std::string("expected '") + c + "' in structured name");
    ++i_;
  }
  void ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r'))
      ++i_;
  }
  uint64_t integer() {
    if (peek() == '0' && i_ + 1 < s_.size() && s_[i_ + 1] >= '0' && s_[i_ + 1] <= '9')
      bad_name(whole_, "leading zero in structured name index");
    uint64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      uint64_t d = static_cast<uint64_t>(peek() - '0');
      if (v > (UINT64_MAX - d) / 10) bad_name(whole_, "index too large in structured name");
      v = v * 10 + d;
      ++i_;
    }
    char c = peek();
    if (c == '.' || c == 'e' || c == 'E') bad_name(whole_, "non-integer number in structured name");
    return v;
  }
  uint32_t hex4() {
    if (i_ + 4 > s_.size()) bad_name(whole_, "truncated \\u escape");
    uint32_t v = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= c - '0';
      else if (c >= 'a' && c <= 'f')
        v |= c - 'a' + 10;
      else if (c >= 'A' && c <= 'F')
        v |= c - 'A' + 10;
      else
        bad_name(whole_, "bad \\u escape");
    }
    return v;
  }
  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) bad_name(whole_, "unterminated string in structured name");
      unsigned char c = static_cast<unsigned char>(s_[i_++]);
      if (c == '"') break;
      if (c < 0x20) bad_name(whole_, "control character in structured name string");
      if (c != '\\') {
        out += static_cast<char>(c);
        continue;
      }
      if (i_ >= s_.size()) bad_name(whole_, "unterminated escape");
      char e = s_[i_++];
      switch (e) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          uint32_t cp = hex4();
          if (cp >= 0xd800 && cp <= 0xdbff && i_ + 1 < s_.size() && s_[i_] == '\\' &&
              s_[i_ + 1] == 'u') {
            size_t save = i_;
            i_ += 2;
            uint32_t lo = hex4();
            if (lo >= 0xdc00 && lo <= 0xdfff) {
              cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            } else {
              i_ = save;
            }
          }
          if (cp >= 0xd800 && cp <= 0xdfff) bad_name(whole_, "lone surrogate in structured name");
          append_utf8(out, cp);
          break;
        }
        default:
          bad_name(whole_, "bad escape in structured name");
      }
    }
    return out;
  }

  std::string_view whole_;
  std::string_view s_;
  size_t i_ = 0;
};

}  // namespace

std::string encode_path(const TensorPath& path) {
  if (path.components.empty()) fail(ErrorCode::kInvalidArgument, "tensor path is empty");
  if (path.is_plain()) {
    const auto& s = std::get<std::string>(path.components[0]);
    if (s.empty()) fail(ErrorCode::kInvalidArgument, "tensor name is empty");
    if (s[0] == kStructuredMarker)
      fail(ErrorCode::kInvalidArgument, "tensor name may not start with the byte 0x1E");
    return s;
  }
  std::string out(1, kStructuredMarker);
  out += '[';
  bool first = true;
  for (const auto& c : path.components) {
    if (!first) out += ',';
    first = false;
    if (const auto* s = std::get_if<std::string>(&c)) {
      append_json_string(out, *s);
    } else {
      out += std::to_string(std::get<uint64_t>(c));
    }
  }
  out += ']';
  return out;
}

TensorPath decode_path(std::string_view bytes) {
  if (bytes.empty()) fail(ErrorCode::kFormat, "invalid empty tensor path");
  if (bytes[0] != kStructuredMarker) return TensorPath(std::string(bytes));
  if (bytes.size() < 3 || bytes[1] != '[' || bytes.back() != ']')
    bad_name(bytes, "structured name must be 0x1E followed by a JSON array");
  if (bytes.find('\n') != std::string_view::npos || bytes.find('\r') != std::string_view::npos)
    bad_name(bytes, "structured name contains a line break");
  return PathJsonParser(bytes, bytes.substr(1)).parse();
}

std::string display_path(const TensorPath& path) {
  if (path.is_plain())
    return shown_bytes(std::get<std::string>(path.components[0]), std::string::npos);
  try {
    return shown_bytes(encode_path(path).substr(1), std::string::npos);
  } catch (const Error&) {
    return "<unprintable path>";
  }
}

}  // namespace tensorizer
