// Checks a loaded tensor's bytes against the hashes its header stores (internal header): in one
// piece (verify_tensor) or fed piece by piece in order (hasher_for + hash_failures); and, for
// sources that name no version of their object, that its header is still the same at the end.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "tensorizer/hash.h"
#include "tensorizer/reader.h"
#include "tensorizer/transport.h"

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

// A source that cannot tell one version of its object from another (Source::versioned() false:
// an HTTP server without ETag or Last-Modified, Redis) may switch versions between requests. A
// load from one checks the stored CRC32s (unless it decrypts: MACs fail on a change) and, at the
// end, reads every header again (check_header_unchanged), so a change is an error, not a mix.
// This note ends the hash mismatch such a load reports.
inline constexpr const char* kUnversionedMismatchNote =
    " (the server names no version of the object, no ETag or Last-Modified, so the load checks "
    "the stored hashes: the object changed during the load)";

// Reads tensor `e`'s header again through `src`; throws Error(kIO) naming `uri` and the tensor
// when it differs from `loaded`, the header bytes the load used.
void check_header_unchanged(Source& src, const std::string& uri, const IndexEntry& e,
                            const std::string& loaded);

}  // namespace tensorizer::engine
