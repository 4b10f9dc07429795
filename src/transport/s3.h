// S3 transport entry points (internal header; see s3.cc).
#pragma once

#include "tensorizer/transport.h"

namespace tensorizer {

std::unique_ptr<Source> open_s3_source(const std::string& uri, const TransportOptions& options);
std::unique_ptr<Sink> open_s3_sink(const std::string& uri, const TransportOptions& options);

}  // namespace tensorizer
