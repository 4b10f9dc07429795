// `tensorizer cp`, `inspect` and `verify` over every URI form, against the real servers: a fixture
// travels http -> s3 -> redis -> file and arrives byte-identical; inspect and verify accept each
// URI; writing to http:// and reading a missing object fail with exit code 2 and a clear message.
#include "remote_test_util.h"

namespace tensorizer {
namespace {

TEST(TransportCpTest, CopiesBetweenEveryKindAndInspectVerifyAcceptEveryUri) {
  TZ_SERVER_ENV(http, "TZ_TEST_HTTP_URL");
  TZ_SERVER_ENV(s3_endpoint, "TZ_TEST_S3_ENDPOINT");
  TZ_SERVER_ENV(bucket, "TZ_TEST_S3_BUCKET");
  TZ_SERVER_ENV(redis, "TZ_TEST_REDIS_URL");
  const std::string cli = test::cli_path();
  if (cli.empty()) GTEST_SKIP() << "the CLI is not built";
  test::TempDir dir;
  const std::string env =
      "AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_ENDPOINT_URL=" + s3_endpoint +
      " ";
  const std::string name = "dtypes.tensors";
  const std::string s3 = "s3://" + bucket + "/" + test::unique_name("cp") + ".tensors";
  const std::string rd = redis + "/" + test::unique_name("cp");
  const std::string out = dir.path("out.tensors");
  const std::vector<std::pair<std::string, std::string>> hops = {
      {http + "/fixtures/" + name, s3}, {s3, rd}, {rd, out}};
  for (const auto& [src, dst] : hops) {
    std::string text;
    const int rc = test::run_command(env + cli + " cp " + src + " " + dst + " 2>&1", &text);
    EXPECT_EQ(rc, 0) << text;
    EXPECT_NE(text.find("copied " + src + " to " + dst), std::string::npos) << text;
    EXPECT_NE(text.find("(100%)"), std::string::npos) << "progress line: " << text;
  }
  EXPECT_TRUE(test::read_file(out) == test::read_file(test::fixture_path(name)));
  for (const std::string& uri : {http + "/fixtures/" + name, s3, rd}) {
    std::string text;
    EXPECT_EQ(test::run_command(env + cli + " verify " + uri + " 2>&1", &text), 0) << text;
    EXPECT_NE(text.find("OK " + uri + ": 18 tensors verified"), std::string::npos) << text;
    text.clear();
    EXPECT_EQ(test::run_command(env + cli + " inspect --json " + uri + " 2>&1", &text), 0) << text;
    EXPECT_NE(text.find("\"tensor_count\":18"), std::string::npos) << text;
  }
}

TEST(TransportCpTest, ErrorsExitWithTwoAndSayWhy) {
  TZ_SERVER_ENV(http, "TZ_TEST_HTTP_URL");
  const std::string cli = test::cli_path();
  if (cli.empty()) GTEST_SKIP() << "the CLI is not built";
  std::string text;
  EXPECT_EQ(test::run_command(cli + " cp " + test::fixture_path("module.tensors") + " " + http +
                                  "/x.tensors 2>&1",
                              &text),
            2);
  EXPECT_NE(text.find("read-only"), std::string::npos) << text;
  text.clear();
  EXPECT_EQ(test::run_command(
                cli + " cp " + http + "/missing.tensors /tmp/never-written.tensors 2>&1", &text),
            2);
  EXPECT_NE(text.find("not found"), std::string::npos) << text;
  EXPECT_NE(text.find(http + "/missing.tensors"), std::string::npos) << text;
}

}  // namespace
}  // namespace tensorizer
