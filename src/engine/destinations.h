// Checks a load request's destinations against the index (internal header): every entry in
// range, requested once, with memory unless it holds no bytes.
#pragma once

#include <vector>

#include "tensorizer/reader.h"

namespace tensorizer::engine {

// Throws Error(kInvalidArgument) naming the first bad destination.
void check_destinations(const Reader& reader, const std::vector<TensorDestination>& destinations);

}  // namespace tensorizer::engine
