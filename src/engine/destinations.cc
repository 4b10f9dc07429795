// Validation of load destinations (see destinations.h).
#include "engine/destinations.h"

#include <string>

#include "tensorizer/error.h"

namespace tensorizer::engine {

void check_destinations(const Reader& reader, const std::vector<TensorDestination>& destinations) {
  const auto& entries = reader.entries();
  std::vector<bool> seen(entries.size(), false);
  for (const auto& d : destinations) {
    if (d.entry >= entries.size())
      fail(ErrorCode::kInvalidArgument,
           "tensor index " + std::to_string(d.entry) + " out of range");
    const std::string name = display_path(entries[d.entry].path).substr(0, 200);
    if (seen[d.entry]) fail(ErrorCode::kInvalidArgument, "tensor '" + name + "' requested twice");
    seen[d.entry] = true;
    if (!d.data && entries[d.entry].expected_bytes() > 0)
      fail(ErrorCode::kInvalidArgument, "no destination for tensor '" + name + "'");
  }
}

}  // namespace tensorizer::engine
