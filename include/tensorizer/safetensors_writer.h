// tensorizer/safetensors_writer.h — write tensors from memory as one safetensors object.
//
// The bytes are exactly what the safetensors library writes for the same tensors and metadata
// (tensorizer/safetensors.h, plan_safetensors). Output goes to any sink (local file, S3, Redis,
// a file object): the header first, then the tensors' bytes on N workers; commit() publishes it,
// and any failure aborts the sink, so the destination holds the old object or the new one whole.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "tensorizer/safetensors.h"
#include "tensorizer/transport.h"

namespace tensorizer {

// Writes `tensors` (data[i]: C-contiguous little-endian bytes of tensors[i]) and commits the sink;
// returns the object's size. A sink that stores named parts (Redis) is told safetensors_parts().
uint64_t write_safetensors(
    Sink& sink, const std::vector<SafetensorsTensor>& tensors, const std::vector<const void*>& data,
    const std::optional<std::vector<std::pair<std::string, std::string>>>& metadata = std::nullopt,
    int num_workers = 0);

// What every safetensors write does around its tensors' bytes: writes the prefix of the layout
// `plan()` returns, runs `write_data(layout)` (which writes each tensor at layout.data_offset),
// describes the parts to a sink that wants them, commits; aborts the sink on any error. Returns
// the size.
uint64_t publish_safetensors(Sink& sink, const std::function<SafetensorsLayout()>& plan,
                             const std::function<void(const SafetensorsLayout&)>& write_data);

}  // namespace tensorizer
