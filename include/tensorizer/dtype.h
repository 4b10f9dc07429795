// tensorizer/dtype.h — dtype strings as stored in .tensors files (docs/format.md §1.9).
//
// A dtype string is a numpy array-interface type string ("<f4", "|u1"), or, from data version 2,
// an opaque form: numpy part with kind 'V', a NUL, and a torch dtype name ("<V2\0torch.bfloat16").
// This header maps between those strings, torch dtype names and element sizes. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tensorizer {

struct DType {
  std::string numpy;      // the numpy part, e.g. "<f4" or "<V2"
  std::string torch;      // the torch part after the NUL ("torch.bfloat16"); empty when not opaque
  char byte_order = '<';  // '<', '>', '|' or '='
  char kind = 'f';        // numpy kind: f i u b c V (others parse but map to no torch dtype)
  uint32_t itemsize = 0;  // bytes per element

  bool opaque() const { return kind == 'V'; }
  // The torch dtype this string loads as ("torch.float32", "torch.bfloat16"), or "" if none.
  std::string torch_name() const;
  // The smallest data version whose readers understand this string (1, or 2 for opaque).
  uint32_t min_version() const { return opaque() ? 2 : 1; }
};

// Parses a dtype string. Throws kFormat if malformed (bad numpy part, more than one NUL,
// an opaque numpy part without a torch name, a torch part on a non-opaque type).
DType parse_dtype(std::string_view s);

// The string tensorizer writes for a torch dtype name ("torch.bfloat16" or "bfloat16").
// Throws kUnsupported for quantized or unknown dtypes.
std::string dtype_string_for_torch(std::string_view torch_name);

// Element size in bytes of a torch dtype name; throws kUnsupported when unknown.
uint32_t torch_dtype_itemsize(std::string_view torch_name);

}  // namespace tensorizer
