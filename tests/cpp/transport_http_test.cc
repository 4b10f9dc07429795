// HTTP(S) transport against a real nginx (scripts/with-servers.sh): every fixture loads bit-exact
// over http:// and https:// (CA file, CA dir, untrusted allowed) with 1 and 4 workers; a server
// without range support works with one reader; 404 is kNotFound; an untrusted certificate and an
// object replaced during a load are clear errors; reads land exactly in scatter slices; the ranged
// GET size follows TransportOptions::read_bytes / TENSORIZER_READ_MIB; errors hide URL secrets;
// redirects to http(s) are followed, a loop or another scheme is an error.
#include <sys/stat.h>
#include <utime.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include "remote_test_util.h"
#include "transport/curl_util.h"

namespace tensorizer {
namespace {

TEST(TransportHttpTest, FixturesLoadBitExactOverHttp) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_URL");
  for (const auto& name : test::all_fixtures())
    for (int workers : {1, 4})
      test::expect_fixture_loads(url + "/fixtures/" + name, name, {}, workers);
}

TEST(TransportHttpTest, FixturesLoadBitExactOverHttpsWithCaFile) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTPS_URL");
  TZ_SERVER_ENV(ca, "TZ_TEST_CA_FILE");
  TransportOptions t;
  t.http.ca_file = ca;
  for (const auto& name : test::all_fixtures())
    for (int workers : {1, 4})
      test::expect_fixture_loads(url + "/fixtures/" + name, name, t, workers);
}

TEST(TransportHttpTest, HttpsWithCaDirectoryAndWithUntrustedAllowed) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTPS_URL");
  TZ_SERVER_ENV(ca_dir, "TZ_TEST_CA_DIR");
  TransportOptions by_dir;
  by_dir.http.ca_path = ca_dir;
  test::expect_fixture_loads(url + "/fixtures/module.tensors", "module.tensors", by_dir, 2);
  TransportOptions insecure;
  insecure.http.allow_untrusted = true;
  test::expect_fixture_loads(url + "/fixtures/module.tensors", "module.tensors", insecure, 2);
}

TEST(TransportHttpTest, UntrustedCertificateIsAClearErrorWithoutRetries) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTPS_URL");
  TransportOptions t;
  t.http.ca_file = test::fixture_path("manifest.json");  // not a CA bundle: nothing is trusted
  const std::string uri = url + "/fixtures/module.tensors";
  try {
    Reader::open(uri, ReaderOptions{t, {}, false});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIO);
    EXPECT_NE(std::string(e.what()).find(uri), std::string::npos) << e.what();
    EXPECT_EQ(std::string(e.what()).find("attempts"), std::string::npos)
        << "not retried: " << e.what();
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

TEST(TransportHttpTest, RedirectsAreFollowedOverHttpAndHttps) {
  TZ_SERVER_ENV(redirect, "TZ_TEST_HTTP_REDIRECT_URL");
  TZ_SERVER_ENV(ca, "TZ_TEST_CA_FILE");
  TransportOptions t;
  t.http.ca_file = ca;
  for (int workers : {1, 4}) {
    // 302 to the HTTP server, 301 to the HTTPS one, asked again by every request.
    test::expect_fixture_loads(redirect + "/fixtures/dtypes.tensors", "dtypes.tensors", t, workers);
    test::expect_fixture_loads(redirect + "/https/fixtures/module.tensors", "module.tensors", t,
                               workers);
  }
  // Refused when asked: the error names the status.
  TransportOptions none;
  none.http.max_redirects = 0;
  try {
    Reader::open(redirect + "/fixtures/dtypes.tensors", ReaderOptions{none, {}, false});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("HTTP 302"), std::string::npos) << e.what();
  }
  // Messages name the URI the caller gave.
  const std::string missing = redirect + "/fixtures/no-such-file.tensors";
  try {
    Reader::open(missing);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound) << e.what();
    EXPECT_NE(std::string(e.what()).find("'" + missing + "'"), std::string::npos) << e.what();
  }
}

TEST(TransportHttpTest, ARedirectLoopOrToAnotherSchemeIsAnErrorWithoutRetries) {
  TZ_SERVER_ENV(redirect, "TZ_TEST_HTTP_REDIRECT_URL");
  for (const std::string path : {"/loop/fixtures/dtypes.tensors", "/ftp/fixtures/dtypes.tensors"}) {
    SCOPED_TRACE(path);
    const std::string uri = redirect + path;
    try {
      Reader::open(uri);
      FAIL() << "no error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), ErrorCode::kIO) << what;
      EXPECT_NE(what.find("'" + uri + "'"), std::string::npos) << what;
      // curl's reason ("Maximum (50) redirects followed", "Protocol "ftp" not supported"), and
      // where the redirects led.
      EXPECT_NE(what.find(path[1] == 'l' ? "redirects followed" : "Protocol \"ftp\""),
                std::string::npos)
          << what;
      EXPECT_NE(what.find(path[1] == 'l' ? "(HTTP 302) to http://" : "(HTTP 302) to ftp://"),
                std::string::npos)
          << what;
      EXPECT_EQ(what.find("attempts"), std::string::npos) << "not retried: " << what;
    }
  }
}

TEST(TransportHttpTest, ServerWithoutRangeSupportUsesOneReaderAndLoadsBitExact) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_NORANGE_URL");
  auto src = open_source(url + "/fixtures/dtypes.tensors");
  EXPECT_EQ(src->size(), test::fixture_manifest("dtypes.tensors")["size"].get<uint64_t>());
  EXPECT_EQ(src->preferred_readers(), 1);
  // Asked-for readers too: each read behind its one transfer would restart the object.
  EXPECT_EQ(src->max_readers(), 1);
  EXPECT_EQ(readers_for(*src, 8), 1);
  // A read in the middle: the server sends the whole object, the source skips to the offset.
  const std::string file = test::read_file(test::fixture_path("dtypes.tensors"));
  std::string mid(1000, '\0');
  src->read_at(300000, mid.data(), mid.size());
  EXPECT_EQ(mid, file.substr(300000, 1000));
  for (const auto& name : test::all_fixtures())
    test::expect_fixture_loads(url + "/fixtures/" + name, name, {}, 0);
}

TEST(TransportHttpTest, ScatterReadsLandInEverySliceAndRangesAreChecked) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_URL");
  const std::string file = test::read_file(test::fixture_path("dtypes.tensors"));
  auto src = open_source(url + "/fixtures/dtypes.tensors");
  EXPECT_EQ(src->size(), file.size());
  EXPECT_EQ(src->preferred_readers(), 8);
  EXPECT_EQ(src->max_readers(), 0);
  EXPECT_EQ(readers_for(*src, 3), 3);
  EXPECT_EQ(readers_for(*src, 0), 8);
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
  // Past the 512 KiB the probe brings along, and past the 2 MiB its paused transfer may skip to:
  // the read below is a request of its own, which the new version fails.
  std::string bytes(8 << 20, 'x');
  test::write_file(path, bytes);
  auto src = open_source(url + "/" + name);
  std::string part(1000, '\0');
  src->read_at(0, part.data(), part.size());
  bytes[5400000] ^= 1;  // a new version (nginx's ETag is mtime + size)
  test::write_file(path, bytes);
  struct utimbuf times = {1000000000, 1000000000};
  ASSERT_EQ(::utime(path.c_str(), &times), 0);
  try {
    src->read_at(5399000, part.data(), part.size());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("changed"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("5399000"), std::string::npos) << e.what();
  }
  ::unlink(path.c_str());
}

// A Source that forwards to another and records the largest single read (short or long).
class RecordingSource final : public Source {
 public:
  explicit RecordingSource(std::unique_ptr<Source> inner) : inner_(std::move(inner)) {}
  uint64_t size() override { return inner_->size(); }
  void read_scatter(uint64_t offset, const IoSlice* slices, size_t count) override {
    record(slices, count);
    inner_->read_scatter(offset, slices, count);
  }
  uint64_t read_stream(uint64_t offset, const IoSlice* slices, size_t count,
                       StreamBudget& budget) override {
    record(slices, count);
    return inner_->read_stream(offset, slices, count, budget);
  }
  bool prefers_long_reads() const override { return inner_->prefers_long_reads(); }
  std::unique_ptr<Source> clone() override { return inner_->clone(); }  // workers > 1 not recorded
  const std::string& uri() const override { return inner_->uri(); }
  uint64_t bytes_read() const override { return inner_->bytes_read(); }
  uint64_t preferred_read_bytes() const override { return inner_->preferred_read_bytes(); }
  uint64_t largest() const { return largest_.load(); }

 private:
  void record(const IoSlice* slices, size_t count) {
    uint64_t n = 0;
    for (size_t i = 0; i < count; ++i) n += slices[i].size;
    uint64_t seen = largest_.load();
    while (n > seen && !largest_.compare_exchange_weak(seen, n)) {
    }
  }

  std::unique_ptr<Source> inner_;
  std::atomic<uint64_t> largest_{0};
};

// Loads `uri` with one worker, no hash check (so tensors may be split), through a RecordingSource;
// returns the largest read the engine asked for.
uint64_t largest_read(const std::string& uri, const TransportOptions& t, const test::Model& m) {
  auto rec = std::make_unique<RecordingSource>(open_source(uri, t));
  RecordingSource* r = rec.get();
  auto reader = Reader::open(std::move(rec));
  LoadOptions lo;
  lo.num_workers = 1;
  auto buffers = test::load_entries(*reader, lo);
  for (size_t i = 0; i < m.data.size(); ++i) EXPECT_TRUE(buffers[i] == m.data[i]) << "tensor " << i;
  return r->largest();
}

TEST(TransportHttpTest, ReadSizeComesFromTheOptionOrTensorizerReadMib) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_URL");
  TZ_SERVER_ENV(root, "TZ_TEST_HTTP_ROOT");
  const test::Model m = test::make_model(40 << 20);
  const std::string name = test::unique_name("readsize") + ".tensors";
  auto w = Writer::open(root + "/" + name);
  w->write(m.requests);
  w->close();
  const std::string uri = url + "/" + name;
  test::ScopedEnv env;
  env.set("TENSORIZER_READ_MIB", std::nullopt);
  EXPECT_EQ(open_source(uri)->preferred_read_bytes(), 0u);
  const uint64_t slack = 64 << 10;  // an item may also take a small neighbour
  // By default one worker streams every tensor in one long read.
  EXPECT_GE(largest_read(uri, {}, m), 40u << 20);
  TransportOptions two_mib;
  two_mib.http.read_bytes = 2 << 20;
  const uint64_t small = 2 << 20;
  EXPECT_LE(largest_read(uri, two_mib, m), small + slack);
  env.set("TENSORIZER_READ_MIB", "64");
  EXPECT_EQ(open_source(uri)->preferred_read_bytes(), 64u << 20);
  EXPECT_GT(largest_read(uri, {}, m), 16u << 20);           // the 40 MiB tensor in one read
  EXPECT_LE(largest_read(uri, two_mib, m), small + slack);  // the option wins over the variable
  for (const char* bad : {"0", "-1", "12x", "99999999999"}) {
    env.set("TENSORIZER_READ_MIB", bad);
    try {
      open_source(uri);
      FAIL() << "no error for " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("TENSORIZER_READ_MIB"), std::string::npos) << e.what();
    }
  }
  ::unlink((root + "/" + name).c_str());
}

// Lines of nginx's access log naming `name`: one per request.
size_t requests_for(const std::string& log, const std::string& name) {
  std::ifstream in(log);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) n += line.find("/" + name + " ") != line.npos;
  return n;
}

// requests_for() once nginx has logged at least `at_least` requests and no more for 200 ms: it logs
// a request when it ends, which for a transfer the client dropped is a moment after the drop.
size_t settled_requests_for(const std::string& log, const std::string& name, size_t at_least) {
  size_t n = requests_for(log, name), stable_ms = 0;
  for (int ms = 0; ms < 5000 && (n < at_least || stable_ms < 200); ms += 20, stable_ms += 20) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const size_t now = requests_for(log, name);
    if (now != n) n = now, stable_ms = 0;
  }
  return n;
}

// The status of the last request for `name` in nginx's access log ("combined" format).
int last_status_for(const std::string& log, const std::string& name) {
  std::ifstream in(log);
  int status = 0;
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("/" + name + " ");
    if (at != line.npos) status = std::atoi(line.c_str() + line.find('"', at) + 2);
  }
  return status;
}

TEST(TransportHttpTest, ALoadCostsOneLongGetPerWorkerAndTheFirstIsTheProbe) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_URL");
  TZ_SERVER_ENV(root, "TZ_TEST_HTTP_ROOT");
  TZ_SERVER_ENV(log, "TZ_TEST_HTTP_ACCESS_LOG");
  const test::Model m = test::make_model(64 << 20);
  test::ScopedEnv env;
  env.set("TENSORIZER_READ_MIB", std::nullopt);
  const std::string name = test::unique_name("requests") + ".tensors";
  auto w = Writer::open(root + "/" + name);
  w->write(m.requests);
  w->close();
  // Opening costs the probe alone (size, validator, and the first 512 KiB: the prelude with the
  // index). nginx logs a request when it ends: here when the reader drops the parked probe.
  Reader::open(url + "/" + name).reset();
  EXPECT_EQ(settled_requests_for(log, name, 1), 1u);
  for (int workers : {1, 4}) {
    SCOPED_TRACE(workers);
    const size_t before = requests_for(log, name);
    auto reader = Reader::open(url + "/" + name);
    LoadOptions lo;
    lo.num_workers = workers;
    auto buffers = test::load_entries(*reader, lo);
    for (size_t i = 0; i < m.data.size(); ++i) EXPECT_TRUE(buffers[i] == m.data[i]) << i;
    reader.reset();
    // The first share continues the probe's transfer; every other worker makes one long GET,
    // plus one per share it took over from a slower one (at most one per 4 MiB item); 16 MiB
    // requests would have needed 5.
    const size_t requests = settled_requests_for(log, name, before + workers) - before;
    if (workers == 1) {
      EXPECT_EQ(requests, 1u);  // the whole load in the probe's response
      EXPECT_EQ(last_status_for(log, name), 206);
    }
    EXPECT_GE(requests, static_cast<size_t>(workers));
    EXPECT_LE(requests, static_cast<size_t>(workers) + 17);
  }
  {
    // A lazy load by one reader, tensor by tensor in file order (small ones included): each read
    // continues the transfer the previous one paused, so the whole load is still one request.
    const size_t before = requests_for(log, name);
    auto reader = Reader::open(url + "/" + name);
    LoadOptions lo;
    lo.num_workers = 1;
    for (size_t i = 0; i < m.data.size(); ++i)
      EXPECT_TRUE(test::load_entries(*reader, lo, {i})[0] == m.data[i]) << i;
    reader.reset();
    EXPECT_EQ(settled_requests_for(log, name, before + 1) - before, 1u);
  }
  ::unlink((root + "/" + name).c_str());
}

TEST(TransportHttpTest, RedactUrlHidesUserInfoAndSecretParameters) {
  EXPECT_EQ(net::redact_url("https://user:pw@h:1/a/b?x=1#f"), "https://***@h:1/a/b?x=1#f");
  EXPECT_EQ(net::redact_url("https://tok@h/a"), "https://***@h/a");
  EXPECT_EQ(net::redact_url("http://h/a@b"), "http://h/a@b");
  EXPECT_EQ(
      net::redact_url(
          "http://h/k?X-Amz-Credential=AKIA%2F1&X-Amz-Date=20250101&X-Amz-Signature=ab12"
          "&X-Amz-Security-Token=zz&part=2"),
      "http://h/"
      "k?X-Amz-Credential=***&X-Amz-Date=20250101&X-Amz-Signature=***&X-Amz-Security-Token=***"
      "&part=2");
  EXPECT_EQ(net::redact_url("http://h/k?flag&token=x"), "http://h/k?flag&token=***");
}

TEST(TransportHttpTest, ErrorsNeverShowUrlCredentials) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_URL");
  std::string with_secrets = url;
  with_secrets.insert(with_secrets.find("://") + 3, "alice:hunter2@");
  with_secrets += "/fixtures/missing.tensors?X-Amz-Signature=deadbeef&X-Amz-Security-Token=s3cr3t";
  try {
    Reader::open(with_secrets);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kNotFound) << what;
    EXPECT_NE(what.find("missing.tensors"), std::string::npos) << what;
    for (const char* secret : {"alice", "hunter2", "deadbeef", "s3cr3t"})
      EXPECT_EQ(what.find(secret), std::string::npos) << secret << " in: " << what;
  }
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
