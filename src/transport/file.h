// Local file transport (internal header; see file.cc).
#pragma once

#include "tensorizer/transport.h"

namespace tensorizer {

std::unique_ptr<Source> open_file_source(const std::string& path, const FileOptions& options);
std::unique_ptr<Sink> open_file_sink(const std::string& path, const FileOptions& options);

// Writes every byte of `slices` to `fd` at `offset` (pwritev until done); errors name `what`.
void write_all_at(int fd, uint64_t offset, const IoSlice* slices, size_t count,
                  const std::string& what);

}  // namespace tensorizer
