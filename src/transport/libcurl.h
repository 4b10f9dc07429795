// The libcurl entry points the HTTP(S) and S3 transports call, reached through one table.
//
// Why a table: libcurl brings ~30 libraries with it (TLS, Kerberos, LDAP, IDN, ...), and loading
// them cost ~4 ms of every `import tensorizer`, a quarter of it, though most loads never leave
// the local disk. So the Python extension does not link libcurl: on first use it loads a small
// module next to itself (libtensorizer_curl.so, the only file that links libcurl there) and takes
// the table from it (libcurl_loaded.cc). The C++ library and the CLI link libcurl and take the
// same table directly (libcurl_linked.cc). libcurl_table.cc builds the table in both cases.
#pragma once

#include <curl/curl.h>

#include <type_traits>

namespace tensorizer::net {

struct LibCurl {
  CURL* (*easy_init)();
  void (*easy_cleanup)(CURL*);
  void (*easy_reset)(CURL*);
  CURLcode (*easy_setopt)(CURL*, CURLoption, ...);
  CURLcode (*easy_getinfo)(CURL*, CURLINFO, ...);
  CURLcode (*easy_pause)(CURL*, int bitmask);
  const char* (*easy_strerror)(CURLcode);
  curl_slist* (*slist_append)(curl_slist*, const char*);
  void (*slist_free_all)(curl_slist*);
  CURLM* (*multi_init)();
  CURLMcode (*multi_cleanup)(CURLM*);
  CURLMcode (*multi_add_handle)(CURLM*, CURL*);
  CURLMcode (*multi_remove_handle)(CURLM*, CURL*);
  CURLMcode (*multi_perform)(CURLM*, int* running);
  CURLMsg* (*multi_info_read)(CURLM*, int* left);
  CURLMcode (*multi_poll)(CURLM*, curl_waitfd extra[], unsigned extra_count, int timeout_ms,
                          int* numfds);
};

// libcurl, globally initialised on first use (thread-safe). Throws tensorizer::Error (kIO)
// naming the file and the loader's message when libcurl cannot be loaded.
const LibCurl& libcurl();

// curl_easy_setopt through the table, keeping the core of the type check curl's own macros make
// under GCC: a variadic option takes a long (curl_off_t is one on LP64), a data pointer or a
// function pointer, never an int, bool or size_t passed by mistake.
template <typename T>
CURLcode setopt(CURL* h, CURLoption option, T value) {
  static_assert(std::is_same_v<T, long> || std::is_same_v<T, curl_off_t> || std::is_pointer_v<T> ||
                    std::is_null_pointer_v<T>,
                "libcurl options take a long, a curl_off_t or a pointer");
  return libcurl().easy_setopt(h, option, value);
}

// curl_easy_getinfo through the table: every CURLINFO is read through a pointer.
template <typename T>
CURLcode getinfo(CURL* h, CURLINFO info, T* out) {
  return libcurl().easy_getinfo(h, info, out);
}

}  // namespace tensorizer::net

// The table of the libcurl this binary or module links, initialised (libcurl_table.cc).
extern "C" __attribute__((visibility("default"))) const tensorizer::net::LibCurl*
tensorizer_libcurl_table();
