// tensorizer/safetensors.h — the safetensors codec: the 8-byte length, the JSON header and its
// tensor table, mapped onto the engine's index entries (docs/format.md §5).
//
// A safetensors file is a little-endian u64 N, N bytes of UTF-8 JSON (an object mapping each
// tensor name to {"dtype", "shape", "data_offsets": [begin, end]} plus an optional
// "__metadata__" object of strings), then the data buffer; offsets are relative to the buffer.
// The header is validated as strictly as the safetensors library does: known dtypes, sizes equal
// to dtype x shape, offsets that tile the whole buffer with no gap or overlap. Each tensor
// becomes an IndexEntry whose header is empty (header_offset == data_offset), which is how the
// engine knows a tensor has no per-tensor header and no stored hashes. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tensorizer/format.h"
#include "tensorizer/named_range.h"

namespace tensorizer {

inline constexpr uint64_t kSafetensorsLengthSize = 8;  // the leading u64 N

// Whether the first bytes look like a safetensors file: N, then '{' (`size` >= 9 needed).
bool looks_like_safetensors(const uint8_t* data, size_t size);

// N read from the first 8 bytes, checked against the file size (kFormat when it runs past).
uint64_t safetensors_header_length(const uint8_t* data, size_t size, uint64_t file_size);

struct SafetensorsHeader {
  std::vector<IndexEntry> entries;  // in the order of their data (by data_offsets begin)
  std::vector<std::pair<std::string, std::string>> metadata;  // "__metadata__", sorted by key
  uint64_t data_start = 0;                                    // 8 + N: where the buffer begins
};

// Parses and validates the JSON header (`json`, N bytes) of a file of `file_size` bytes.
SafetensorsHeader parse_safetensors_header(const uint8_t* json, size_t size, uint64_t file_size);

// ---- Writing ---------------------------------------------------------------------------------

struct SafetensorsTensor {
  std::string name;   // UTF-8
  std::string dtype;  // .tensors dtype string (dtype_string_for_torch), as in IndexEntry
  std::vector<uint64_t> shape;
};

// Where everything of a file goes, laid out exactly as the safetensors library writes it: tensors
// ordered by dtype (widest first, in its dtype order) then by name, back to back from offset 0 of
// the buffer; the header's JSON compact, "__metadata__" first (in the given order) when given,
// padded with spaces to a multiple of 8 bytes.
struct SafetensorsLayout {
  std::string prefix;                 // the 8-byte length and the padded JSON header
  std::vector<uint64_t> data_offset;  // absolute file offset of each input tensor's bytes
  std::vector<uint64_t> data_length;  // and their number
  uint64_t file_size = 0;
  std::vector<NamedRange> parts;  // safetensors_parts() of this file
};

// Lays out `tensors` (kInvalidArgument for a duplicate or empty name, kUnsupported for a dtype
// safetensors cannot store, kInvalidArgument for a size that overflows).
SafetensorsLayout plan_safetensors(
    const std::vector<SafetensorsTensor>& tensors,
    const std::optional<std::vector<std::pair<std::string, std::string>>>& metadata);

// The parts a store of separate values (Redis, docs/format.md §4) keeps a safetensors file in:
// {kSafetensorsPart, 0, data_start} (the length and the header), then every tensor that stores
// bytes, {name, offset, length}, in file order. The first part's name (kSafetensorsPart) tells a
// reader that no .tensors end marker follows the object.
std::vector<NamedRange> safetensors_parts(uint64_t data_start, std::vector<NamedRange> tensors);

// The safetensors dtype name for a .tensors dtype string ("<f4" -> "F32"); kUnsupported when
// safetensors has none (complex128, opaque types other than bfloat16 and float8).
std::string safetensors_dtype_for(std::string_view dtype);

// The .tensors dtype string for a safetensors dtype ("F32" -> "<f4", "BF16" -> opaque bfloat16);
// kUnsupported for one the engine cannot hold (F4, F6_*), kFormat for an unknown name.
std::string dtype_string_for_safetensors(std::string_view dtype);

}  // namespace tensorizer
