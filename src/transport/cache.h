// The local cache of remote objects (internal header; see cache.cc).
#pragma once

#include <memory>

#include "tensorizer/transport.h"

namespace tensorizer {

// A source for `remote` served from the cache in `cache.dir`: the local copy of the object's
// current version, fetched whole into the cache first when there is none. Returns `remote` itself
// when the object cannot be cached (no ETag or Last-Modified, or larger than the cache's bound).
// Throws kIO naming the cache directory when the cache cannot be written.
std::unique_ptr<Source> open_cached_source(std::unique_ptr<Source> remote,
                                           const CacheOptions& cache);

}  // namespace tensorizer
