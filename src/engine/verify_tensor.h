// Checks a loaded tensor's bytes against the hashes its header stores (internal header).
#pragma once

#include <cstddef>
#include <cstdint>

#include "tensorizer/reader.h"

namespace tensorizer::engine {

// `data` holds entries()[entry].data_length bytes; the tensor's header must have been read
// (loaded_info non-null). Throws Error(kHashMismatch) naming the tensor and URI on a mismatch.
void verify_tensor(Reader& reader, size_t entry, const uint8_t* data);

}  // namespace tensorizer::engine
