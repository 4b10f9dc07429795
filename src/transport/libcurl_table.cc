// The table of libcurl entry points (see libcurl.h), from the libcurl this file is linked with,
// globally initialised on the first call: compiled into the C++ library, and alone into
// libtensorizer_curl.so for the Python extension.
#include "transport/libcurl.h"

const tensorizer::net::LibCurl* tensorizer_libcurl_table() {
  static const tensorizer::net::LibCurl table = {
      &curl_easy_init,           &curl_easy_cleanup,  &curl_easy_reset,      &curl_easy_setopt,
      &curl_easy_getinfo,        &curl_easy_pause,    &curl_easy_strerror,   &curl_slist_append,
      &curl_slist_free_all,      &curl_multi_init,    &curl_multi_cleanup,   &curl_multi_add_handle,
      &curl_multi_remove_handle, &curl_multi_perform, &curl_multi_info_read, &curl_multi_poll,
  };
  static const bool initialised = curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK;
  (void)initialised;  // a failed init shows as handles that cannot be made (make_easy fails)
  return &table;
}
