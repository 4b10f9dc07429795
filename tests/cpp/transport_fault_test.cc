// Resilience of the remote transports, through our fault-injecting proxy (tests/tools/
// fault_proxy.py) in front of the real servers: connections dropped at random offsets 20 times,
// resets, stalls and 503 bursts during one load still give bit-exact tensors; a server that is
// gone gives an error within the configured timeout naming the URI and the offset; Redis key
// listing at open is retried the same way.
#include <chrono>
#include <thread>

#include "remote_test_util.h"

namespace tensorizer {
namespace {

// A ~40 MB model in the HTTP root, written once per test process.
struct ServedModel {
  test::Model model = test::make_model(36 << 20);
  std::string name;
};

const ServedModel& served_model(const std::string& root) {
  static ServedModel m = [&] {
    ServedModel s;
    s.name = test::unique_name("faults") + ".tensors";
    auto w = Writer::open(root + "/" + s.name);
    w->write(s.model.requests);
    w->close();
    return s;
  }();
  return m;
}

TransportOptions fast_retries() {
  TransportOptions t;
  t.retry.retry_delay_s = 0.02;
  t.retry.stall_timeout_s = 2;
  t.retry.connect_timeout_s = 2;
  return t;
}

TEST(TransportFaultTest, HttpLoadSurvivesTwentyDropsAtRandomOffsets) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_URL");
  TZ_SERVER_ENV(root, "TZ_TEST_HTTP_ROOT");
  const ServedModel& m = served_model(root);
  for (int workers : {1, 4}) {
    SCOPED_TRACE(workers);
    // More drops are planned than needed: connections still idle when the load ends never fire.
    test::FaultProxy proxy(test::host_port(url), "drop:1000-500000x40", 7 + workers);
    test::expect_model("http://" + proxy.address() + "/" + m.name, fast_retries(), m.model);
    EXPECT_GE(proxy.faulted("drop"), 20) << proxy.log_text();
  }
}

TEST(TransportFaultTest, HttpLoadSurvivesResetsStallsAnd503Bursts) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_URL");
  TZ_SERVER_ENV(root, "TZ_TEST_HTTP_ROOT");
  const ServedModel& m = served_model(root);
  test::FaultProxy proxy(test::host_port(url),
                         "reset:5000-1000000x5,503x4,stall:20000x1,429x2,reset:100x2");
  TransportOptions t = fast_retries();
  t.retry.stall_timeout_s =
      1;  // the stalled connection is given up after 1 s, then resumed elsewhere
  test::expect_model("http://" + proxy.address() + "/" + m.name, t, m.model);
  for (const char* kind : {"reset", "503", "429", "stall"})
    EXPECT_GE(proxy.faulted(kind), 1) << kind << proxy.log_text();
  EXPECT_GE(proxy.faulted(), 11) << proxy.log_text();
}

TEST(TransportFaultTest, AStallAfterTheProbesHeadResumesWithARangedGet) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_URL");
  TZ_SERVER_ENV(root, "TZ_TEST_HTTP_ROOT");
  const ServedModel& m = served_model(root);
  // The open's transfer brings its 512 KiB head and is paused; the load continues it, and the
  // server goes silent at 900 kB with the connection open. The stall timeout ends that attempt and
  // the rest comes from a ranged GET on a new connection, bit-exact, in bounded time.
  test::FaultProxy proxy(test::host_port(url), "stall:900000");
  TransportOptions t = fast_retries();
  t.retry.stall_timeout_s = 1;
  ReaderOptions ro;
  ro.transport = t;
  auto reader = Reader::open("http://" + proxy.address() + "/" + m.name, ro);
  LoadOptions lo;
  lo.num_workers = 1;
  const auto start = std::chrono::steady_clock::now();
  auto buffers = test::load_entries(*reader, lo);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (size_t i = 0; i < m.model.data.size(); ++i) EXPECT_TRUE(buffers[i] == m.model.data[i]) << i;
  EXPECT_EQ(proxy.faulted("stall"), 1) << proxy.log_text();
  EXPECT_LT(secs, 10.0) << proxy.log_text();  // 6.5-7 s: curl averages speed over 5 s
}

TEST(TransportFaultTest, HttpsLoadSurvivesDrops) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTPS_URL");
  TZ_SERVER_ENV(ca, "TZ_TEST_CA_FILE");
  TZ_SERVER_ENV(root, "TZ_TEST_HTTP_ROOT");
  const ServedModel& m = served_model(root);
  test::FaultProxy proxy(test::host_port(url), "drop:1000-500000x20", 3);
  TransportOptions t = fast_retries();
  t.http.ca_file = ca;
  // The certificate names 127.0.0.1, which the proxy address is too.
  test::expect_model("https://" + proxy.address() + "/" + m.name, t, m.model);
  EXPECT_GE(proxy.faulted("drop"), 10) << proxy.log_text();
}

TEST(TransportFaultTest, S3LoadSurvivesDropsAndSlowDown) {
  TZ_SERVER_ENV(endpoint, "TZ_TEST_S3_ENDPOINT");
  TZ_SERVER_ENV(bucket, "TZ_TEST_S3_BUCKET");
  TransportOptions direct;
  direct.s3.endpoint = endpoint;
  direct.s3.force_http = true;
  direct.s3.access_key_id = "testing";
  direct.s3.secret_access_key = "testing";
  test::Model model = test::make_model(20 << 20);
  const std::string uri = "s3://" + bucket + "/" + test::unique_name("faults") + ".tensors";
  WriterOptions wo;
  wo.transport = direct;
  auto w = Writer::open(uri, wo);
  w->write(model.requests);
  w->close();
  // moto answers one request per connection: drops and 503s (as S3 SlowDown would) interleave.
  // The probe's connection drops after its 512 KiB head, while the load continues its transfer.
  test::FaultProxy proxy(test::host_port(endpoint),
                         "drop:700000-1500000,drop:2000-1500000x7,503x3,reset:3000-1000000x4", 5);
  TransportOptions t = fast_retries();
  t.s3.endpoint = "http://" + proxy.address();
  t.s3.force_http = true;
  t.s3.access_key_id = "testing";
  t.s3.secret_access_key = "testing";
  test::expect_model(uri, t, model);
  EXPECT_GE(proxy.faulted(), 10) << proxy.log_text();
}

TEST(TransportFaultTest, RedisLoadSurvivesTwentyDrops) {
  TZ_SERVER_ENV(url, "TZ_TEST_REDIS_URL");
  test::Model model = test::make_model(30 << 20);
  const std::string prefix = test::unique_name("faults");
  {
    auto w = Writer::open(url + "/" + prefix);
    w->write(model.requests);
    w->close();
  }
  test::FaultProxy proxy(test::host_port(url), "drop:2000-600000x40", 11);
  test::expect_model("redis://" + proxy.address() + "/" + prefix, fast_retries(), model);
  EXPECT_GE(proxy.faulted("drop"), 20) << proxy.log_text();
}

TEST(TransportFaultTest, RedisKeyListingIsRetried) {
  TZ_SERVER_ENV(url, "TZ_TEST_REDIS_URL");
  test::Model model = test::make_model(1 << 20);
  const std::string prefix = test::unique_name("listing");
  {
    auto w = Writer::open(url + "/" + prefix);
    w->write(model.requests);
    w->close();
  }
  {  // connections closed or reset part-way through the listing, and refused, then fine
    test::FaultProxy proxy(test::host_port(url), "drop:20,drop:200,refuse,reset:30");
    test::expect_model("redis://" + proxy.address() + "/" + prefix, fast_retries(), model);
    EXPECT_EQ(proxy.faulted(), 4) << proxy.log_text();
  }
  {  // never answers: the error names the URI and the last failure
    test::FaultProxy proxy(test::host_port(url), "drop:20x100");
    const std::string uri = "redis://" + proxy.address() + "/" + prefix;
    TransportOptions t = fast_retries();
    t.retry.max_retries = 3;
    try {
      open_source(uri, t);
      FAIL() << "no error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), ErrorCode::kIO) << what;
      EXPECT_NE(what.find(uri), std::string::npos) << what;
      EXPECT_NE(what.find("4 failed attempts"), std::string::npos) << what;
      EXPECT_NE(what.find("SCAN"), std::string::npos) << what;
    }
  }
}

TEST(TransportFaultTest, ServerWithoutRangesIsReadInOnePass) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_NORANGE_URL");
  TZ_SERVER_ENV(root, "TZ_TEST_HTTP_ROOT");
  const ServedModel& m = served_model(root);
  const uint64_t file_size = test::read_file(root + "/" + m.name).size();
  // Two connections are dropped mid-way: each costs a restart from byte 0, nothing more.
  test::FaultProxy proxy(test::host_port(url), "pass,drop:8000000x2");
  { test::expect_model("http://" + proxy.address() + "/" + m.name, fast_retries(), m.model); }
  for (int i = 0; i < 100 && proxy.bytes_forwarded() < file_size; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the last connection's log line
  EXPECT_EQ(proxy.faulted("drop"), 2) << proxy.log_text();
  // The probe (one response, cut short), two 8 MB restarts and one full pass: not one pass per
  // read (that would be well over twice the file).
  EXPECT_LT(proxy.bytes_forwarded(), file_size + 2 * 8000000 + 6000000) << proxy.log_text();
}

TEST(TransportFaultTest, ExhaustedRetriesNameUriOffsetAndLastStatus) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_URL");
  TZ_SERVER_ENV(root, "TZ_TEST_HTTP_ROOT");
  const ServedModel& m = served_model(root);
  // The first connection answers (and is then dropped after 300 kB); every later one gets a 503.
  test::FaultProxy proxy(test::host_port(url), "drop:300000,503x1000");
  TransportOptions t = fast_retries();
  t.retry.max_retries = 3;
  const std::string uri = "http://" + proxy.address() + "/" + m.name;
  ReaderOptions ro;
  ro.transport = t;
  try {
    auto reader = Reader::open(uri, ro);
    LoadOptions lo;
    lo.num_workers = 1;
    test::load_entries(*reader, lo);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kIO) << what;
    EXPECT_NE(what.find(uri), std::string::npos) << what;
    EXPECT_NE(what.find("gave up at offset"), std::string::npos) << what;
    EXPECT_NE(what.find("4 failed attempts"), std::string::npos) << what;
    EXPECT_NE(what.find("HTTP 503"), std::string::npos) << what;
  }
  EXPECT_GE(proxy.faulted("503"), 3) << proxy.log_text();  // the drop was failure 1 of 4
}

// Opens through a proxy, stops the proxy, then loads: the error must come within the configured
// timeout (with slack for backoff and scheduling) and name the URI and an offset.
void expect_gone_error(const std::string& uri_template, const std::string& upstream,
                       const TransportOptions& base, const test::Model& model) {
  auto proxy = std::make_unique<test::FaultProxy>(upstream, "");
  std::string uri = uri_template;
  uri.replace(uri.find("PROXY"), 5, proxy->address());
  TransportOptions t = base;
  ReaderOptions ro;
  ro.transport = t;
  auto reader = Reader::open(uri, ro);
  proxy->stop();
  std::vector<std::string> buffers(model.data.size());
  std::vector<TensorDestination> dests;
  for (size_t i = 0; i < buffers.size(); ++i) {
    buffers[i].resize(reader->entries()[i].expected_bytes());
    dests.push_back({i, buffers[i].data()});
  }
  const auto start = std::chrono::steady_clock::now();
  try {
    reader->load(dests);
    FAIL() << "no error";
  } catch (const Error& e) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string what = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kIO) << what;
    EXPECT_LT(secs, t.retry.stall_timeout_s + 3) << what;
    EXPECT_NE(what.find(uri), std::string::npos) << what;
    EXPECT_NE(what.find("offset"), std::string::npos) << what;
    EXPECT_NE(what.find("tensor '"), std::string::npos) << what;
  }
}

TEST(TransportFaultTest, ServerGoneIsAnErrorWithinTheTimeout) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_URL");
  TZ_SERVER_ENV(root, "TZ_TEST_HTTP_ROOT");
  TZ_SERVER_ENV(redis, "TZ_TEST_REDIS_URL");
  const ServedModel& m = served_model(root);
  TransportOptions t;
  t.retry.stall_timeout_s = 2;
  t.retry.connect_timeout_s = 1;
  t.retry.retry_delay_s = 0.1;
  expect_gone_error("http://PROXY/" + m.name, test::host_port(url), t, m.model);

  const std::string prefix = test::unique_name("gone");
  {
    auto w = Writer::open(redis + "/" + prefix);
    w->write(m.model.requests);
    w->close();
  }
  expect_gone_error("redis://PROXY/" + prefix, test::host_port(redis), t, m.model);
}

TEST(TransportFaultTest, StalledServerIsAnErrorWithinTheTimeout) {
  TZ_SERVER_ENV(url, "TZ_TEST_HTTP_URL");
  TZ_SERVER_ENV(root, "TZ_TEST_HTTP_ROOT");
  const ServedModel& m = served_model(root);
  // Every connection after the first stalls before its first byte and stays open.
  test::FaultProxy proxy(test::host_port(url), "pass,stall:0x1000");
  TransportOptions t;
  t.retry.stall_timeout_s = 2;
  t.retry.retry_delay_s = 0.1;
  const std::string uri = "http://" + proxy.address() + "/" + m.name;
  ReaderOptions ro;
  ro.transport = t;
  auto reader = Reader::open(uri, ro);
  std::string buf(reader->entries()[2].expected_bytes(), '\0');
  const auto start = std::chrono::steady_clock::now();
  try {
    auto fresh = open_source(uri, t);  // a new connection: stalls
    fresh->read_at(reader->entries()[2].data_offset, buf.data(), buf.size());
    FAIL() << "no error";
  } catch (const Error& e) {
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(secs, t.retry.stall_timeout_s * 2 + 3) << e.what();
    EXPECT_NE(std::string(e.what()).find("offset"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(uri), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tensorizer
