// URI dispatch (src/transport/open.cc): which transport serves a path or URI, what it can do, and
// the errors for schemes nobody serves or sinks that do not exist. No servers needed: nothing here
// connects.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tensorizer/error.h"
#include "tensorizer/transport.h"

namespace tensorizer {
namespace {

TEST(TransportOpen, InfoDescribesEveryScheme) {
  struct Row {
    const char* uri;
    const char* scheme;
    bool local, writable, takes_bytes;
  };
  const Row rows[] = {
      {"model.tensors", "file", true, true, true},
      {"/abs/model.tensors", "file", true, true, true},
      {"FILE:///m.tensors", "file", true, true, true},
      {"http://h/m", "http", false, false, false},
      {"HTTPS://h/m", "https", false, false, false},
      {"s3://b/k", "s3", false, true, true},
      {"redis://h:6379/p", "redis", false, true, false},
  };
  for (const Row& r : rows) {
    std::optional<TransportInfo> info = transport_info(r.uri);
    ASSERT_TRUE(info) << r.uri;
    EXPECT_EQ(info->scheme, r.scheme) << r.uri;
    EXPECT_EQ(info->local, r.local) << r.uri;
    EXPECT_EQ(info->writable, r.writable) << r.uri;
    EXPECT_EQ(info->sink_takes_bytes, r.takes_bytes) << r.uri;
  }
  EXPECT_FALSE(transport_info("gs://bucket/key"));
}

TEST(TransportOpen, UnservedSchemesAndReadOnlySinksAreRefusedByName) {
  auto refused = [](auto open, const std::string& expected) {
    try {
      open();
      ADD_FAILURE() << "opened; expected: " << expected;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  refused([] { open_source("gs://bucket/key"); }, "no read transport for scheme 'gs'");
  refused([] { open_sink("gs://bucket/key"); }, "no write transport for scheme 'gs'");
  refused([] { open_sink("https://user:secret@h/m"); }, "https:// is read-only");
  try {
    open_sink("https://user:secret@h/m");
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("secret"), std::string::npos) << "credentials redacted";
  }
}

TEST(TransportOpen, ANulByteInALocalPathIsRefused) {
  // open(2) would stop at the NUL and open "/tmp" (or create a file there): another file.
  const std::string path("/tmp\0/x.tensors", 15);
  for (const auto& open :
       std::vector<std::function<void()>>{[&] { open_source(path); }, [&] { open_sink(path); },
                                          [&] { open_source("file://" + path); }}) {
    try {
      open();
      ADD_FAILURE() << "opened a path with a NUL byte";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("embedded null byte in path '/tmp\\0...'"),
                std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace tensorizer
