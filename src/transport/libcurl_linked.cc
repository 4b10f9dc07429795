// libcurl() where libcurl is linked (the C++ library, the CLI, the tests): the table of
// libcurl_table.cc, initialised once (see libcurl.h).
#include "transport/libcurl.h"

namespace tensorizer::net {

const LibCurl& libcurl() {
  static const LibCurl* table = [] {
    const LibCurl* t = tensorizer_libcurl_table();
    t->global_init(CURL_GLOBAL_DEFAULT);
    return t;
  }();
  return *table;
}

}  // namespace tensorizer::net
