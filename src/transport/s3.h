// S3 transport entry points (internal header; see s3.cc).
#pragma once

#include "tensorizer/transport.h"

namespace tensorizer {

// S3 speaks HTTP: `http` gives TLS trust and the read size, `retry` the timeouts.
std::unique_ptr<Source> open_s3_source(const std::string& uri, const S3Options& s3,
                                       const HttpOptions& http, const RetryOptions& retry);
std::unique_ptr<Sink> open_s3_sink(const std::string& uri, const S3Options& s3,
                                   const HttpOptions& http, const RetryOptions& retry);

}  // namespace tensorizer
