// Redis transport entry points (internal header; see redis.cc).
#pragma once

#include "tensorizer/transport.h"

namespace tensorizer {

std::unique_ptr<Source> open_redis_source(const std::string& uri, const RetryOptions& options);
std::unique_ptr<Sink> open_redis_sink(const std::string& uri, const RetryOptions& options);

}  // namespace tensorizer
