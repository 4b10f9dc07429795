// tensorizer/tensor_path.h — tensor names as paths (docs/format.md §2).
//
// A tensor's name is a non-empty sequence of components, each a string (mapping key) or a
// non-negative integer (list index). One string component is stored as its raw UTF-8 bytes;
// anything else as 0x1E followed by a compact, ASCII-only JSON array, byte-exact with Python's
// json.dumps(..., separators=(",", ":")) because the bytes are covered by the hashes.
// Pure functions, no I/O; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace tensorizer {

using PathComponent = std::variant<std::string, uint64_t>;

struct TensorPath {
  std::vector<PathComponent> components;

  TensorPath() = default;
  explicit TensorPath(std::string plain) { components.emplace_back(std::move(plain)); }
  explicit TensorPath(std::vector<PathComponent> c) : components(std::move(c)) {}

  // True when the path is one string component (stored as raw bytes, readable by every version).
  bool is_plain() const {
    return components.size() == 1 && std::holds_alternative<std::string>(components[0]);
  }
  bool operator==(const TensorPath&) const = default;
};

// The on-disk name bytes. Throws kInvalidArgument for an empty path, an empty plain name, or a
// plain name starting with 0x1E (those write but could never be read back, docs/format.md §2.1).
std::string encode_path(const TensorPath& path);

// Parses on-disk name bytes. Throws kFormat for an empty name or malformed structured JSON.
TensorPath decode_path(std::string_view bytes);

// Human-readable form for messages: the plain string, or the JSON array, with control and
// malformed bytes escaped (shown_bytes, uncut).
std::string display_path(const TensorPath& path);

}  // namespace tensorizer
