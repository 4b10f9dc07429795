// HTTP(S) range-reading Source, shared by the http(s):// and s3:// schemes (internal header).
#pragma once

#include <memory>

#include "tensorizer/transport.h"
#include "transport/curl_util.h"

namespace tensorizer {

// A Source over one object fetched with ranged GETs (signed when the target says so). Cheap: the
// first request (size, ETag, range support) is made on the first size() or read.
std::unique_ptr<Source> open_http_source(net::HttpTarget target, const HttpOptions& http,
                                         const RetryOptions& retry);

}  // namespace tensorizer
