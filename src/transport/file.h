// Local file transport (internal header; see file.cc).
#pragma once

#include "tensorizer/transport.h"

namespace tensorizer {

std::unique_ptr<Source> open_file_source(const std::string& path);
std::unique_ptr<Sink> open_file_sink(const std::string& path, const FileOptions& options);

}  // namespace tensorizer
