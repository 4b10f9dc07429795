// libcurl() where libcurl is linked (the C++ library, the CLI, the tests): the table of
// libcurl_table.cc (see libcurl.h).
#include "transport/libcurl.h"

namespace tensorizer::net {

const LibCurl& libcurl() { return *tensorizer_libcurl_table(); }

}  // namespace tensorizer::net
