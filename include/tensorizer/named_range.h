// tensorizer/named_range.h — a named byte range of a stored object.
//
// Stores that keep a .tensors object as separate values (Redis: one key per part) need to know
// how the object is cut. The codec says which parts a file has (object_parts() in format.h); a
// Sink that wants them (Sink::wants_parts()) is told before commit(), so the transport itself
// parses nothing.
#pragma once

#include <cstdint>
#include <string>

namespace tensorizer {

// The first part of a safetensors file (its length and JSON header). A store of separate values
// ends a .tensors object with an implied 8-byte end marker, but not an object whose first part
// has this name.
inline constexpr char kSafetensorsPart[] = "safetensors";

struct NamedRange {
  std::string name;  // "header" for the prelude and index (kSafetensorsPart for a safetensors
                     // file's), else the tensor's on-disk name
  uint64_t offset = 0;
  uint64_t size = 0;
};

}  // namespace tensorizer
