// S3 credential and endpoint resolution (docs/reference-api.md §5.4), without a server: precedence
// of every source, scheme rules (force_http, use_https, plain HTTP only from the environment),
// region, addressing, anonymous access, and that the reported credential source never holds a
// secret.
#include <filesystem>

#include "remote_test_util.h"
#include "transport/s3_config.h"

namespace tensorizer {
namespace {

class S3ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v :
         {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
          "AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SHARED_CREDENTIALS_FILE", "AWS_CONFIG_FILE",
          "AWS_REGION", "AWS_DEFAULT_REGION"})
      env_.set(v, std::nullopt);
    env_.set("HOME", home_.path(""));
    std::filesystem::create_directories(home_.path(".aws"));
  }
  void write(const std::string& rel, const std::string& text) {
    test::write_file(home_.path(rel), text);
  }

  test::ScopedEnv env_;
  test::TempDir home_;
};

TEST_F(S3ConfigTest, DefaultsAreTheReferenceEndpointsAndAnonymous) {
  s3::ResolvedS3 r = s3::resolve({}, false);
  EXPECT_EQ(r.endpoint, "https://accel-object.ord1.coreweave.com");
  EXPECT_EQ(s3::resolve({}, true).endpoint, "https://object.ord1.coreweave.com");
  EXPECT_TRUE(r.anonymous);
  EXPECT_EQ(r.region, "us-east-1");
  EXPECT_FALSE(r.virtual_hosted);
  EXPECT_NE(r.credential_source.find("no credentials found"), std::string::npos);
}

TEST_F(S3ConfigTest, EndpointSchemeRules) {
  S3Options t;
  t.endpoint = "minio.local:9000";
  EXPECT_EQ(s3::resolve(t, false).endpoint, "https://minio.local:9000");
  t.force_http = true;
  EXPECT_EQ(s3::resolve(t, false).endpoint, "http://minio.local:9000");
  t.endpoint = "https://minio.local:9000/";
  EXPECT_EQ(s3::resolve(t, false).endpoint, "http://minio.local:9000");
  t.force_http.reset();
  t.endpoint = "http://minio.local:9000";
  try {
    s3::resolve(t, false);
    FAIL() << "plain HTTP accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("Non-HTTPS endpoint URLs are not allowed"),
              std::string::npos);
  }
  // From the environment, plain HTTP is allowed.
  env_.set("AWS_ENDPOINT_URL", std::string("http://env.local:1"));
  EXPECT_EQ(s3::resolve({}, false).endpoint, "http://env.local:1");
}

TEST_F(S3ConfigTest, EndpointPrecedence) {
  write(".aws/config",
        "[default]\nendpoint_url = https://profile-generic\ns3 =\n  endpoint_url = "
        "https://profile-s3\n");
  EXPECT_EQ(s3::resolve({}, false).endpoint, "https://profile-s3");
  write(".aws/config", "[default]\nendpoint_url = https://profile-generic\n");
  EXPECT_EQ(s3::resolve({}, false).endpoint, "https://profile-generic");
  env_.set("AWS_ENDPOINT_URL", std::string("https://env-generic"));
  EXPECT_EQ(s3::resolve({}, false).endpoint, "https://env-generic");
  env_.set("AWS_ENDPOINT_URL_S3", std::string("https://env-s3"));
  EXPECT_EQ(s3::resolve({}, false).endpoint, "https://env-s3");
  write(".s3cfg", "[default]\naccess_key = AK\nsecret_key = SK\nhost_base = s3cfg-host\n");
  EXPECT_EQ(s3::resolve({}, false).endpoint, "https://s3cfg-host");
  S3Options t;
  t.endpoint = "argument-host";
  EXPECT_EQ(s3::resolve(t, false).endpoint, "https://argument-host");
}

TEST_F(S3ConfigTest, S3cfgUseHttpsFalseMeansPlainHttpUnlessForced) {
  write(".s3cfg",
        "[default]\naccess_key = AK\nsecret_key = SK\nhost_base = h:1\nuse_https = False\n");
  EXPECT_EQ(s3::resolve({}, false).endpoint, "http://h:1");
  S3Options t;
  t.force_http = false;
  EXPECT_EQ(s3::resolve(t, false).endpoint, "https://h:1");
}

TEST_F(S3ConfigTest, CredentialPrecedenceAndSources) {
  write(".aws/config",
        "[default]\naws_access_key_id = CONFIGKEY\naws_secret_access_key = CONFIGSECRET\n");
  s3::ResolvedS3 r = s3::resolve({}, false);
  EXPECT_EQ(r.access_key, "CONFIGKEY");
  EXPECT_EQ(r.credential_source, "credentials from ~/.aws/config (profile default)");
  write(".aws/credentials",
        "[default]\naws_access_key_id = CREDKEY\naws_secret_access_key = CREDSECRET\n"
        "aws_session_token = TOKEN\n");
  r = s3::resolve({}, false);
  EXPECT_EQ(r.access_key, "CREDKEY");
  EXPECT_EQ(r.session_token, "TOKEN");
  EXPECT_EQ(r.credential_source, "credentials from ~/.aws/credentials (profile default)");
  env_.set("AWS_ACCESS_KEY_ID", std::string("ENVKEY"));
  env_.set("AWS_SECRET_ACCESS_KEY", std::string("ENVSECRET"));
  r = s3::resolve({}, false);
  EXPECT_EQ(r.access_key, "ENVKEY");
  EXPECT_NE(r.credential_source.find("environment"), std::string::npos);
  EXPECT_EQ(r.secret_key, "ENVSECRET");
  EXPECT_EQ(r.session_token, "");  // keys from the environment never take a file's token
  env_.set("AWS_SESSION_TOKEN", std::string("ENVTOKEN"));
  EXPECT_EQ(s3::resolve({}, false).session_token, "ENVTOKEN");
  env_.set("AWS_SECRET_ACCESS_KEY", std::nullopt);  // one key alone: the files' keys are used
  EXPECT_EQ(s3::resolve({}, false).access_key, "CREDKEY");
  env_.set("AWS_SECRET_ACCESS_KEY", std::string("ENVSECRET"));
  write(".s3cfg", "[default]\naccess_key = CFGKEY\nsecret_key = CFGSECRET\n");
  r = s3::resolve({}, false);
  EXPECT_EQ(r.access_key, "CFGKEY");
  EXPECT_EQ(r.secret_key, "CFGSECRET");
  EXPECT_EQ(r.credential_source, "credentials from ~/.s3cfg");
  S3Options t;
  t.access_key_id = "ARGKEY";
  t.secret_access_key = "ARGSECRET";
  r = s3::resolve(t, false);
  EXPECT_EQ(r.access_key, "ARGKEY");
  EXPECT_EQ(r.credential_source, "credentials from explicit arguments");
  for (const char* secret : {"CONFIGSECRET", "CREDSECRET", "ENVSECRET", "CFGSECRET", "ARGSECRET"})
    EXPECT_EQ(r.credential_source.find(secret), std::string::npos);
}

TEST_F(S3ConfigTest, S3cfgFillsOnlyWhatIsMissing) {
  write(".s3cfg", "[default]\naccess_key = CFGKEY\nsecret_key = CFGSECRET\n");
  S3Options t;
  t.access_key_id = "ARGKEY";
  s3::ResolvedS3 r = s3::resolve(t, false);
  EXPECT_EQ(r.access_key, "ARGKEY");
  EXPECT_EQ(r.secret_key, "CFGSECRET");
}

TEST_F(S3ConfigTest, S3cfgWithoutDefaultSectionIsIgnored) {
  write(".s3cfg", "[other]\naccess_key = CFGKEY\nsecret_key = CFGSECRET\n");
  EXPECT_TRUE(s3::resolve({}, false).anonymous);
}

TEST_F(S3ConfigTest, EmptyExplicitCredentialsMeanAnonymous) {
  write(".s3cfg", "[default]\naccess_key = CFGKEY\nsecret_key = CFGSECRET\n");
  S3Options t;
  t.access_key_id = "";
  t.secret_access_key = "";
  EXPECT_TRUE(s3::resolve(t, false).anonymous);
}

TEST_F(S3ConfigTest, ProfilesFromOptionOrEnvironment) {
  write(".aws/credentials",
        "[default]\naws_access_key_id = D\naws_secret_access_key = d\n"
        "[a]\naws_access_key_id = A\naws_secret_access_key = a\n"
        "[b]\naws_access_key_id = B\naws_secret_access_key = b\n");
  write(".aws/config", "[profile b]\nregion = eu-west-3\n");
  EXPECT_EQ(s3::resolve({}, false).access_key, "D");
  env_.set("AWS_PROFILE", std::string("a"));
  EXPECT_EQ(s3::resolve({}, false).access_key, "A");
  S3Options t;
  t.profile = "b";
  s3::ResolvedS3 r = s3::resolve(t, false);
  EXPECT_EQ(r.access_key, "B");
  EXPECT_EQ(r.region, "eu-west-3");
}

TEST_F(S3ConfigTest, RegionPrecedence) {
  write(".aws/config", "[default]\nregion = from-profile\n");
  EXPECT_EQ(s3::resolve({}, false).region, "from-profile");
  env_.set("AWS_DEFAULT_REGION", std::string("from-default-env"));
  EXPECT_EQ(s3::resolve({}, false).region, "from-default-env");
  env_.set("AWS_REGION", std::string("from-env"));
  EXPECT_EQ(s3::resolve({}, false).region, "from-env");
  S3Options t;
  t.region = "from-argument";
  EXPECT_EQ(s3::resolve(t, false).region, "from-argument");
}

TEST_F(S3ConfigTest, VirtualHostedAddressingWhereRequired) {
  S3Options t;
  t.endpoint = "cwobject.com";
  EXPECT_TRUE(s3::resolve(t, false).virtual_hosted);
  t.endpoint = "https://cwlota.com";
  EXPECT_TRUE(s3::resolve(t, false).virtual_hosted);
  t.endpoint = "object.ord1.coreweave.com";
  EXPECT_FALSE(s3::resolve(t, false).virtual_hosted);
  t.virtual_hosted = true;
  EXPECT_TRUE(s3::resolve(t, false).virtual_hosted);
}

}  // namespace
}  // namespace tensorizer
