// What every transport's read does first (internal header): drop empty slices, check the range.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensorizer/transport.h"

namespace tensorizer {

// The non-empty slices of a read of [offset, offset + total) from an object of `size` bytes, where
// `total` (set here) is the slices' length; throws Error(kFormat) naming `uri` when the range runs
// past the end of the object.
std::vector<IoSlice> slices_within(uint64_t offset, const IoSlice* slices, size_t count,
                                   uint64_t size, const std::string& uri, uint64_t& total);

}  // namespace tensorizer
