// UTF-8 checks on bytes read from files: tensor names must be well-formed UTF-8 (as Python decodes
// them), and messages escape whatever is not. Pure; internal.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace tensorizer::codec {

// Length of the well-formed UTF-8 sequence starting at s[i] (storing its code point when asked),
// or 0 when it is malformed: overlong forms, surrogates and code points past U+10FFFF are.
size_t utf8_sequence(std::string_view s, size_t i, uint32_t* code_point = nullptr);

// Whether all of `bytes` is well-formed UTF-8.
bool is_utf8(std::string_view bytes);

}  // namespace tensorizer::codec
