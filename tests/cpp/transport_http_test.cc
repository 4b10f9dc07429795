// HTTP(S) transport against a real nginx (scripts/with-servers.sh): every fixture loads bit-exact
// over http:// and https:// (CA file, CA dir, untrusted allowed) with 1 and 4 workers; a server
// without range support works with one reader; 404 is kNotFound; an untrusted certificate and an
// object replaced during a load are clear errors; reads land exactly in scatter slices.
#include <sys/stat.h>
#include <utime.h>

#include "remote_test_util.h"

namespace tensorizer {
namespace {

TEST(TransportHttpTest, FixturesLoadBitExactOverHttp) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_URL");
  for (const auto& name : test::all_fixtures())
    for (int workers : {1, 4}) test::expect_fixture_loads(url + "/fixtures/" + name, name, {}, workers);
}

TEST(TransportHttpTest, FixturesLoadBitExactOverHttpsWithCaFile) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTPS_URL");
  TZ_SERVER_ENV(ca, "TZ_TEST_CA_FILE");
  TransportOptions t;
  t.ca_file = ca;
  for (const auto& name : test::all_fixtures())
    for (int workers : {1, 4}) test::expect_fixture_loads(url + "/fixtures/" + name, name, t, workers);
}

TEST(TransportHttpTest, HttpsWithCaDirectoryAndWithUntrustedAllowed) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTPS_URL");
  TZ_SERVER_ENV(ca_dir, "TZ_TEST_CA_DIR");
  TransportOptions by_dir;
  by_dir.ca_path = ca_dir;
  test::expect_fixture_loads(url + "/fixtures/module.tensors", "module.tensors", by_dir, 2);
  TransportOptions insecure;
  insecure.allow_untrusted = true;
  test::expect_fixture_loads(url + "/fixtures/module.tensors", "module.tensors", insecure, 2);
}

TEST(TransportHttpTest, UntrustedCertificateIsAClearErrorWithoutRetries) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTPS_URL");
  TransportOptions t;
  t.ca_file = test::fixture_path("manifest.json");  // not a CA bundle: nothing is trusted
  const std::string uri = url + "/fixtures/module.tensors";
  try {
    Reader::open(uri, ReaderOptions{t, {}, false});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIO);
    EXPECT_NE(std::string(e.what()).find(uri), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("attempts"), std::string::npos) << "not retried: " << e.what();
  }
}

TEST(TransportHttpTest, MissingObjectIsNotFound) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_URL");
  const std::string uri = url + "/fixtures/no-such-file.tensors";
  try {
    Reader::open(uri);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound) << e.what();
    EXPECT_NE(std::string(e.what()).find(uri), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("404"), std::string::npos) << e.what();
  }
}

TEST(TransportHttpTest, ServerWithoutRangeSupportUsesOneReaderAndLoadsBitExact) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_NORANGE_URL");
  auto src = open_source(url + "/fixtures/dtypes.tensors");
  EXPECT_EQ(src->size(), test::fixture_manifest("dtypes.tensors")["size"].get<uint64_t>());
  EXPECT_EQ(src->preferred_readers(), 1);
  // A read in the middle: the server sends the whole object, the source skips to the offset.
  const std::string file = test::read_file(test::fixture_path("dtypes.tensors"));
  std::string mid(1000, '\0');
  src->read_at(300000, mid.data(), mid.size());
  EXPECT_EQ(mid, file.substr(300000, 1000));
  for (const auto& name : test::all_fixtures()) test::expect_fixture_loads(url + "/fixtures/" + name, name, {}, 0);
}

TEST(TransportHttpTest, ScatterReadsLandInEverySliceAndRangesAreChecked) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_URL");
  const std::string file = test::read_file(test::fixture_path("dtypes.tensors"));
  auto src = open_source(url + "/fixtures/dtypes.tensors");
  EXPECT_EQ(src->size(), file.size());
  EXPECT_EQ(src->preferred_readers(), 8);
  std::string a(7, '\0'), b(0, '\0'), c(100000, '\0'), d(1, '\0');
  IoSlice slices[] = {{a.data(), a.size()}, {b.data(), 0}, {c.data(), c.size()}, {d.data(), 1}};
  src->read_scatter(12345, slices, 4);
  EXPECT_EQ(a + c + d, file.substr(12345, 100008));
  auto clone = src->clone();
  std::string tail(10, '\0');
  clone->read_at(file.size() - 10, tail.data(), 10);
  EXPECT_EQ(tail, file.substr(file.size() - 10));
  EXPECT_EQ(src->bytes_read(), 100018u);
  try {
    clone->read_at(file.size() - 5, tail.data(), 10);
    FAIL() << "read past the end";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kFormat) << e.what();
  }
}

TEST(TransportHttpTest, ObjectReplacedDuringALoadIsAnError) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_URL");
  TZ_SERVER_ENV(root, "TZ_TEST_HTTP_ROOT");
  const std::string name = test::unique_name("changing") + ".tensors";
  const std::string path = root + "/" + name;
  std::string bytes = test::read_file(test::fixture_path("dtypes.tensors"));
  test::write_file(path, bytes);
  auto src = open_source(url + "/" + name);
  std::string part(1000, '\0');
  src->read_at(0, part.data(), part.size());
  bytes[400000] ^= 1;  // a new version (nginx's ETag is mtime + size)
  test::write_file(path, bytes);
  struct utimbuf times = {1000000000, 1000000000};
  ASSERT_EQ(::utime(path.c_str(), &times), 0);
  try {
    src->read_at(399000, part.data(), part.size());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("changed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("399000"), std::string::npos) << e.what();
  }
  ::unlink(path.c_str());
}

TEST(TransportHttpTest, HttpIsReadOnly) {
  try {
    open_sink("http://127.0.0.1:1/x.tensors");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
  }
}

}  // namespace
}  // namespace tensorizer
