// Checks a loaded tensor's bytes against the hashes its header stores (internal header): in one
// piece (verify_tensor) or fed piece by piece in order (hasher_for + hash_failures).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tensorizer/hash.h"
#include "tensorizer/reader.h"

namespace tensorizer::engine {

// A hasher for the hashes `info`'s header stores, already fed its hashable header; null when the
// header stores none. `fastest_only`: CRC32 alone when the header stores it (memory speed).
std::unique_ptr<TensorHasher> hasher_for(const LoadedTensorInfo& info, bool fastest_only = false);

// Finishes `hasher` (fed the header, then all the data) and describes every stored hash it
// disagrees with ("CRC32 stored ..., computed ..."); empty when all match. Hashes the hasher does
// not compute are not compared.
std::string hash_failures(const LoadedTensorInfo& info, TensorHasher& hasher);

// `data` holds entries()[entry].data_length bytes; the tensor's header must have been read
// (loaded_info non-null). Throws Error(kHashMismatch) naming the tensor and URI on a mismatch.
void verify_tensor(Reader& reader, size_t entry, const uint8_t* data);

}  // namespace tensorizer::engine
