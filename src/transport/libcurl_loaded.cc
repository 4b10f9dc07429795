// libcurl() in the Python extension, which does not link libcurl (see libcurl.h): the first call
// loads libtensorizer_curl.so from the extension's own directory and takes its table, so a
// process that never opens an HTTP(S) or S3 source never loads libcurl and its libraries.
#include <dlfcn.h>

#include <string>

#include "tensorizer/error.h"
#include "transport/libcurl.h"

namespace tensorizer::net {
namespace {

constexpr const char* kModuleName = "libtensorizer_curl.so";

// The directory of the binary this function is in (the extension module), with a trailing '/'.
std::string own_directory() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&own_directory), &info) == 0 || !info.dli_fname) return "";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash + 1);
}

const LibCurl* load() {
  const std::string path = own_directory() + kModuleName;
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* why = dlerror();
    fail(ErrorCode::kIO, "HTTP(S) and S3 sources need libcurl, loaded through " + path +
                             ", which failed: " + (why ? why : "unknown error") +
                             " (reinstall tensorizer)");
  }
  using TableFn = const LibCurl* (*)();
  auto table_fn = reinterpret_cast<TableFn>(dlsym(handle, "tensorizer_libcurl_table"));
  if (!table_fn)
    fail(ErrorCode::kIO, path + " has no tensorizer_libcurl_table (reinstall tensorizer)");
  return table_fn();  // the module stays loaded for the life of the process
}

}  // namespace

const LibCurl& libcurl() {
  static const LibCurl* table = load();  // a failed load throws and is tried again next time
  return *table;
}

}  // namespace tensorizer::net
