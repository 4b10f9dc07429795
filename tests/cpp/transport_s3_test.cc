// S3 transport against real moto servers (scripts/with-servers.sh): every fixture loads bit-exact
// with 1 and 4 workers; objects written through the S3 sink (single PUT and multipart) round-trip
// byte for byte; a failed upload leaves nothing visible; each credential source of
// docs/reference-api.md §5.4 works against the signature-checking server, and a wrong secret is an
// access error naming the source.
#include <filesystem>

#include "remote_test_util.h"
#include "tensorizer/writer.h"

namespace tensorizer {
namespace {

namespace fs = std::filesystem;

TransportOptions open_server_options(const std::string& endpoint) {
  TransportOptions t;
  t.s3.endpoint = endpoint;
  t.s3.force_http = true;
  t.s3.access_key_id = "testing";
  t.s3.secret_access_key = "testing";
  return t;
}

TEST(TransportS3Test, FixturesLoadBitExact) {
  TZ_SERVER_ENV(endpoint, "TZ_TEST_S3_ENDPOINT");
  TZ_SERVER_ENV(bucket, "TZ_TEST_S3_BUCKET");
  const TransportOptions t = open_server_options(endpoint);
  for (const auto& name : test::all_fixtures())
    for (int workers : {1, 4})
      test::expect_fixture_loads("s3://" + bucket + "/fixtures/" + name, name, t, workers);
}

TEST(TransportS3Test, MissingObjectIsNotFound) {
  TZ_SERVER_ENV(endpoint, "TZ_TEST_S3_ENDPOINT");
  TZ_SERVER_ENV(bucket, "TZ_TEST_S3_BUCKET");
  const std::string uri = "s3://" + bucket + "/fixtures/missing.tensors";
  try {
    open_source(uri, open_server_options(endpoint))->size();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound) << e.what();
    EXPECT_NE(std::string(e.what()).find(uri), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("NoSuchKey"), std::string::npos) << e.what();
  }
}

TEST(TransportS3Test, WrittenObjectsRoundTripByteForByte) {
  TZ_SERVER_ENV(endpoint, "TZ_TEST_S3_ENDPOINT");
  TZ_SERVER_ENV(bucket, "TZ_TEST_S3_BUCKET");
  const TransportOptions t = open_server_options(endpoint);
  test::TempDir dir;
  for (size_t big : {size_t{100000}, size_t{40} << 20}) {  // one PUT; multipart (3 parts)
    SCOPED_TRACE(big);
    test::Model m = test::make_model(big);
    const std::string uri = "s3://" + bucket + "/" + test::unique_name("written") + ".tensors";
    WriterOptions wo;
    wo.transport = t;
    {
      auto w = Writer::open(uri, wo);
      w->write(m.requests);
      w->close();
    }
    auto local = Writer::open(dir.path("same.tensors"));
    local->write(m.requests);
    local->close();
    EXPECT_TRUE(test::read_all(uri, t) == test::read_file(dir.path("same.tensors")));
    test::expect_model(uri, t, m);
  }
}

TEST(TransportS3Test, AbortedWriterLeavesNothing) {
  TZ_SERVER_ENV(endpoint, "TZ_TEST_S3_ENDPOINT");
  TZ_SERVER_ENV(bucket, "TZ_TEST_S3_BUCKET");
  const TransportOptions t = open_server_options(endpoint);
  const std::string uri = "s3://" + bucket + "/" + test::unique_name("aborted") + ".tensors";
  test::Model m = test::make_model(1000);
  WriterOptions wo;
  wo.transport = t;
  auto w = Writer::open(uri, wo);
  w->write(m.requests);
  w->abort();
  EXPECT_THROW(open_source(uri, t)->size(), Error);
}

TEST(TransportS3Test, FailedMultipartUploadIsAbortedAndNeverVisible) {
  TZ_SERVER_ENV(endpoint, "TZ_TEST_S3_ENDPOINT");
  TZ_SERVER_ENV(bucket, "TZ_TEST_S3_BUCKET");
  // moto closes every connection after one response: the first 2 requests pass, then all fail.
  test::FaultProxy proxy(test::host_port(endpoint), "passx2,refusex100000");
  TransportOptions t = open_server_options("http://" + proxy.address());
  t.retry.max_retries = 2;
  t.retry.retry_delay_s = 0.01;
  const std::string uri = "s3://" + bucket + "/" + test::unique_name("failed") + ".tensors";
  test::Model m = test::make_model(40 << 20);
  WriterOptions wo;
  wo.transport = t;
  auto w = Writer::open(uri, wo);
  w->write(m.requests);
  try {
    w->close();
    FAIL() << "the upload succeeded through a refusing proxy";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIO) << e.what();
    EXPECT_NE(std::string(e.what()).find(uri), std::string::npos) << e.what();
  }
  try {
    open_source(uri, open_server_options(endpoint))->size();
    FAIL() << "a failed upload is visible";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound) << e.what();
  }
}

// ---- Credential sources (docs/reference-api.md §5.4), against the server that checks signatures
// ----------------

// An isolated credential environment: HOME is an empty temp dir, no AWS_* variables.
class S3CredentialsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    endpoint_ = test::env_or_empty("TZ_TEST_S3_AUTH_ENDPOINT");
    bucket_ = test::env_or_empty("TZ_TEST_S3_AUTH_BUCKET");
    key_ = test::env_or_empty("TZ_TEST_S3_AUTH_ACCESS_KEY");
    secret_ = test::env_or_empty("TZ_TEST_S3_AUTH_SECRET_KEY");
    if (endpoint_.empty() || key_.empty()) {
      if (test::env_or_empty("TZ_REQUIRE_SERVERS") == "1") FAIL() << "TZ_TEST_S3_AUTH_* not set";
      GTEST_SKIP() << "TZ_TEST_S3_AUTH_* not set: run under scripts/with-servers.sh";
    }
    for (const char* v :
         {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
          "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
          "AWS_REGION", "AWS_DEFAULT_REGION"})
      env_.set(v, std::nullopt);
    env_.set("HOME", home_.path(""));
    fs::create_directories(home_.path(".aws"));
  }

  std::string uri() const { return "s3://" + bucket_ + "/fixtures/module.tensors"; }
  std::string host() const { return test::host_port(endpoint_); }

  // Loads a fixture with `t`: checks every tensor against the manifest.
  void expect_works(const TransportOptions& t) {
    test::expect_fixture_loads(uri(), "module.tensors", t, 2);
  }
  // Expects an access error naming `source`, with no secret in the message.
  void expect_denied(const TransportOptions& t, const std::string& source,
                     const std::string& wrong_secret) {
    ReaderOptions options;
    options.transport = t;
    try {
      Reader::open(uri(), options);
      FAIL() << "no error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), ErrorCode::kIO) << what;
      EXPECT_NE(what.find("access denied"), std::string::npos) << what;
      EXPECT_NE(what.find(source), std::string::npos) << what;
      EXPECT_NE(what.find(uri()), std::string::npos) << what;
      if (!wrong_secret.empty()) {
        EXPECT_EQ(what.find(wrong_secret), std::string::npos) << "secret leaked: " << what;
      }
      EXPECT_EQ(what.find(secret_), std::string::npos) << "secret leaked: " << what;
    }
  }
  void write(const std::string& path, const std::string& text) { test::write_file(path, text); }
  // The test server's endpoint and credentials, given as arguments.
  TransportOptions explicit_credentials() const {
    TransportOptions t;
    t.s3.endpoint = endpoint_;
    t.s3.force_http = true;
    t.s3.access_key_id = key_;
    t.s3.secret_access_key = secret_;
    return t;
  }

  test::ScopedEnv env_;
  test::TempDir home_;
  std::string endpoint_, bucket_, key_, secret_;
};

const char* kWrong = "WRONGsecretWRONGsecretWRONGsecret0000000";

TEST_F(S3CredentialsTest, ExplicitArguments) {
  TransportOptions t = explicit_credentials();
  expect_works(t);
  t.s3.secret_access_key = kWrong;
  expect_denied(t, "explicit arguments", kWrong);
}

// The size asked without a body (a HEAD, engine/warm_block.h) is signed like every GET: moto,
// which checks signatures here, answers it with the object's size; a wrong secret gets none.
TEST_F(S3CredentialsTest, ASignedHeadGivesTheSize) {
  TransportOptions t = explicit_credentials();
  const std::optional<uint64_t> size = open_source(uri(), t)->size_without_body();
  ASSERT_TRUE(size.has_value());
  EXPECT_EQ(*size, open_source(uri(), t)->size());
  t.s3.secret_access_key = kWrong;
  EXPECT_EQ(open_source(uri(), t)->size_without_body(), std::nullopt);
}

std::string s3cfg(const std::string& key, const std::string& secret, const std::string& host) {
  return "[default]\naccess_key = " + key + "\nsecret_key = " + secret + "\nhost_base = " + host +
         "\nhost_bucket = " + host + "\nuse_https = False\n";
}

TEST_F(S3CredentialsTest, S3cmdConfigGivenAsS3ConfigPath) {
  const std::string path = home_.path("custom.s3cfg");
  write(path, s3cfg(key_, secret_, host()));
  TransportOptions t;
  t.s3.config_path = path;  // endpoint (host_base) and plain HTTP (use_https = False) from the file
  expect_works(t);
  write(path, s3cfg(key_, kWrong, host()));
  expect_denied(t, path, kWrong);
}

TEST_F(S3CredentialsTest, S3cmdConfigInHome) {
  write(home_.path(".s3cfg"), s3cfg(key_, secret_, host()));
  expect_works({});
  write(home_.path(".s3cfg"), s3cfg(key_, kWrong, host()));
  expect_denied({}, "~/.s3cfg", kWrong);
}

TEST_F(S3CredentialsTest, MissingS3ConfigPathIsAnError) {
  TransportOptions t;
  t.s3.config_path = home_.path("nope.s3cfg");
  EXPECT_THROW(open_source(uri(), t), Error);
}

TEST_F(S3CredentialsTest, EnvironmentVariables) {
  env_.set("AWS_ACCESS_KEY_ID", key_);
  env_.set("AWS_SECRET_ACCESS_KEY", secret_);
  env_.set("AWS_ENDPOINT_URL", endpoint_);  // http:// is fine when it comes from the environment
  expect_works({});
  env_.set("AWS_SECRET_ACCESS_KEY", std::string(kWrong));
  expect_denied({}, "AWS_ACCESS_KEY_ID", kWrong);
}

TEST_F(S3CredentialsTest, SharedCredentialsFileProfile) {
  write(home_.path(".aws/credentials"),
        "[default]\naws_access_key_id = nobody\naws_secret_access_key = x\n\n"
        "[tz]\naws_access_key_id = " +
            key_ + "\naws_secret_access_key = " + secret_ + "\n");
  env_.set("AWS_PROFILE", std::string("tz"));
  env_.set("AWS_ENDPOINT_URL_S3", endpoint_);
  expect_works({});
  write(home_.path(".aws/credentials"),
        "[tz]\naws_access_key_id = " + key_ + "\naws_secret_access_key = " + kWrong + "\n");
  expect_denied({}, "~/.aws/credentials (profile tz)", kWrong);
}

TEST_F(S3CredentialsTest, SharedCredentialsFileFromEnvironment) {
  const std::string path = home_.path("creds.ini");
  write(path,
        "[default]\naws_access_key_id = " + key_ + "\naws_secret_access_key = " + secret_ + "\n");
  env_.set("AWS_SHARED_CREDENTIALS_FILE", path);
  env_.set("AWS_ENDPOINT_URL", endpoint_);
  expect_works({});
  write(path,
        "[default]\naws_access_key_id = " + key_ + "\naws_secret_access_key = " + kWrong + "\n");
  expect_denied({}, path + " (profile default)", kWrong);
}

TEST_F(S3CredentialsTest, ConfigFileProfileWithEndpoint) {
  auto config = [&](const std::string& secret) {
    return "[profile work]\naws_access_key_id = " + key_ + "\naws_secret_access_key = " + secret +
           "\nregion = us-east-1\ns3 =\n  endpoint_url = " + endpoint_ + "\n";
  };
  write(home_.path(".aws/config"), config(secret_));
  TransportOptions t;
  t.s3.profile = "work";
  expect_works(t);
  write(home_.path(".aws/config"), config(kWrong));
  expect_denied(t, "~/.aws/config (profile work)", kWrong);
}

TEST_F(S3CredentialsTest, ConfigFileFromEnvironment) {
  const std::string path = home_.path("aws-config");
  auto config = [&](const std::string& secret) {
    return "[default]\naws_access_key_id = " + key_ + "\naws_secret_access_key = " + secret +
           "\nendpoint_url = " + endpoint_ + "\n";
  };
  write(path, config(secret_));
  env_.set("AWS_CONFIG_FILE", path);
  expect_works({});
  write(path, config(kWrong));
  expect_denied({}, path + " (profile default)", kWrong);
}

TEST_F(S3CredentialsTest, ExplicitArgumentsWinOverEveryFile) {
  write(home_.path(".s3cfg"), s3cfg(key_, kWrong, host()));
  write(home_.path(".aws/credentials"),
        "[default]\naws_access_key_id = " + key_ + "\naws_secret_access_key = x\n");
  env_.set("AWS_ACCESS_KEY_ID", key_);
  env_.set("AWS_SECRET_ACCESS_KEY", std::string("x"));
  TransportOptions t;
  t.s3.endpoint = endpoint_;
  t.s3.force_http = true;
  t.s3.access_key_id = key_;
  t.s3.secret_access_key = secret_;
  expect_works(t);
}

TEST_F(S3CredentialsTest, AnonymousWhenNothingIsFound) {
  // The open server's bucket is publicly readable: anonymous reads work there...
  const std::string open_endpoint = test::env_or_empty("TZ_TEST_S3_ENDPOINT");
  const std::string open_bucket = test::env_or_empty("TZ_TEST_S3_BUCKET");
  env_.set("AWS_ENDPOINT_URL", open_endpoint);
  test::expect_fixture_loads("s3://" + open_bucket + "/fixtures/module.tensors", "module.tensors",
                             {}, 2);
  // ... and the signature-checking server refuses them, saying no credentials were found.
  env_.set("AWS_ENDPOINT_URL", endpoint_);
  expect_denied({}, "no credentials found (anonymous access)", "");
}

}  // namespace
}  // namespace tensorizer
