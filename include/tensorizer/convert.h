// tensorizer/convert.h — re-encode an open object into another file: .tensors (optionally
// encrypted or decrypted on the way) or safetensors, streaming with bounded memory.
//
// Any Reader is a source (a .tensors or safetensors file on any transport); the output goes to any
// sink and is published only when every tensor was read, checked and written. Small tensors move
// in batches loaded on all cores, large ones piece by piece (Reader::read_streamed), so memory
// stays near kConvertBatchBytes whatever the model's size. Every stored hash of the input is
// checked on the way, so a corrupt input never becomes a freshly hashed output.
//
// Names (docs/format.md §5.3): safetensors names are plain strings. A structured .tensors name
// (["layers", 0, "w"]) is written flattened, its components joined with "." ("layers.0.w"), and
// the original is kept in the "__metadata__" entry "tensorizer.names" (a JSON object of flattened
// name -> the name's JSON array), with parameter/buffer types in "tensorizer.types"; converting
// back restores both. Two names that flatten alike are refused. Meta tensors become zeros.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "tensorizer/reader.h"
#include "tensorizer/writer.h"

namespace tensorizer {

inline constexpr uint64_t kConvertBatchBytes = 64ull << 20;  // memory for a batch of small tensors

// (bytes done, bytes in all), called from the calling thread now and then.
using ConvertProgress = std::function<void(uint64_t done, uint64_t total)>;

// Writes every tensor of `in` as a .tensors object through `writer_options` (encryption, layout)
// at `out`. Returns the header it wrote.
FileHeader convert_to_tensors(Reader& in, const std::string& out, WriterOptions writer_options,
                              const ConvertProgress& progress = {});

// Writes every tensor of `in` as a safetensors object to `sink` and commits it. Returns its size.
uint64_t convert_to_safetensors(Reader& in, Sink& sink, int num_workers = 0,
                                const ConvertProgress& progress = {});

}  // namespace tensorizer
