// `tensorizer encrypt` / `tensorizer decrypt`: every unencrypted fixture encrypted (key file, or
// passphrase with MIN limits) and decrypted back gives the manifest's tensors; the reference's
// encrypted fixtures decrypt to them; a tensor large enough to be streamed in pieces round-trips;
// misuse fails with exit code 2 and leaves no output behind.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <random>

#include "remote_test_util.h"
#include "tensorizer/reader.h"
#include "tensorizer/writer.h"
#include "test_util.h"

namespace tensorizer {
namespace {

using nlohmann::json;
using test::run_cli;
using test::shell_quote;

Key read_key(const std::string& path) {
  const std::string b = test::read_file(path);
  Key k{};
  std::copy(b.begin(), b.end(), k.begin());
  return k;
}

// Loads every tensor of `path` (verifying hashes) and compares with the fixture's manifest.
void expect_manifest(const std::string& path, const std::string& fixture,
                     std::optional<DecryptionParams> dec, const TransportOptions& transport = {}) {
  const json& tensors = test::manifest()["files"][fixture]["tensors"];
  ReaderOptions ro;
  ro.decryption = dec;
  ro.transport = transport;
  auto r = Reader::open(path, ro);
  EXPECT_EQ(r->encrypted(), dec.has_value());
  ASSERT_EQ(r->entries().size(), tensors.size());
  LoadOptions lo;
  lo.verify_hash = true;
  auto buffers = test::load_entries(*r, lo);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const json& t = tensors[i];
    SCOPED_TRACE(t["name"].dump());
    EXPECT_EQ(r->entries()[i].path, test::path_from_json(t["name"]));
    EXPECT_EQ(r->entries()[i].is_meta(), t["meta"].get<bool>());
    EXPECT_EQ(r->loaded_info(i)->module_idx, t["module_idx"].get<uint16_t>());
    if (t["meta"].get<bool>()) continue;
    EXPECT_EQ(test::sha256_hex(buffers[i].data(), buffers[i].size()), t["sha256"]);
  }
}

class CryptCliTest : public testing::Test {
 protected:
  void SetUp() override {
    if (test::cli_path().empty()) GTEST_SKIP() << "CLI not built";
    key_file_ = dir_.path("k.key");
    std::string k(32, '\0');
    std::mt19937 g(3);
    for (auto& c : k) c = static_cast<char>(g());
    test::write_file(key_file_, k);
  }
  test::TempDir dir_;
  std::string key_file_;
};

TEST_F(CryptCliTest, EncryptAndDecryptEveryUnencryptedFixture) {
  setenv("TZ_TEST_PASSPHRASE", "a passphrase", 1);
  for (const auto& name : test::unencrypted_fixtures()) {
    SCOPED_TRACE(name);
    const std::string in = test::fixture_path(name), enc = dir_.path(name + ".enc"),
                      back = dir_.path(name + ".back"), penc = dir_.path(name + ".penc"),
                      pback = dir_.path(name + ".pback");
    std::string out;
    ASSERT_EQ(run_cli("encrypt -q " + shell_quote(in) + " " + shell_quote(enc) + " --key-file " +
                          shell_quote(key_file_),
                      &out),
              0)
        << out;
    expect_manifest(enc, name, DecryptionParams::from_key(read_key(key_file_)));
    ASSERT_EQ(run_cli("decrypt -q " + shell_quote(enc) + " " + shell_quote(back) + " --key-file " +
                          shell_quote(key_file_),
                      &out),
              0)
        << out;
    expect_manifest(back, name, std::nullopt);
    ASSERT_EQ(run_cli("encrypt -q " + shell_quote(in) + " " + shell_quote(penc) +
                          " --passphrase-env TZ_TEST_PASSPHRASE --opslimit min --memlimit min",
                      &out),
              0)
        << out;
    expect_manifest(penc, name, DecryptionParams::from_passphrase("a passphrase"));
    ASSERT_EQ(run_cli("decrypt -q " + shell_quote(penc) + " " + shell_quote(pback) +
                          " --passphrase-env TZ_TEST_PASSPHRASE",
                      &out),
              0)
        << out;
    expect_manifest(pback, name, std::nullopt);
    EXPECT_EQ(run_cli("verify " + shell_quote(penc) + " --passphrase-env TZ_TEST_PASSPHRASE", &out),
              0)
        << out;
  }
}

TEST_F(CryptCliTest, DecryptTheReferenceEncryptedFixtures) {
  std::string out;
  const std::string f = test::fixture_path("encrypted_key.tensors"),
                    plain = dir_.path("ek.tensors");
  ASSERT_EQ(run_cli("decrypt -q " + shell_quote(f) + " " + shell_quote(plain) + " --key-file " +
                        shell_quote(test::fixture_path("encrypted_key.key")),
                    &out),
            0)
      << out;
  expect_manifest(plain, "encrypted_key.tensors", std::nullopt);
  const std::string m = test::fixture_path("meta_encrypted.tensors"),
                    mplain = dir_.path("me.tensors");
  ASSERT_EQ(run_cli("decrypt -q " + shell_quote(m) + " " + shell_quote(mplain) + " --key-file " +
                        shell_quote(test::fixture_path("meta_encrypted.key")),
                    &out),
            0)
      << out;
  expect_manifest(mplain, "meta_encrypted.tensors", std::nullopt);
  setenv("TZ_TEST_FIXTURE_PASSPHRASE",
         test::manifest()["files"]["encrypted_passphrase.tensors"]["encryption"]["passphrase"]
             .get<std::string>()
             .c_str(),
         1);
  const std::string p = test::fixture_path("encrypted_passphrase.tensors"),
                    pplain = dir_.path("ep.tensors");
  ASSERT_EQ(run_cli("decrypt -q " + shell_quote(p) + " " + shell_quote(pplain) +
                        " --passphrase-env TZ_TEST_FIXTURE_PASSPHRASE",
                    &out),
            0)
      << out;
  expect_manifest(pplain, "encrypted_passphrase.tensors", std::nullopt);
}

TEST_F(CryptCliTest, LargeTensorsAreStreamedInPieces) {
  // 40 MiB + 3 bytes (streamed: above the 16 MiB batch limit) between two small tensors.
  std::string big(40 * (1 << 20) + 3, '\0'), small(1000, '\0');
  std::mt19937 g(5);
  for (auto& c : big) c = static_cast<char>(g());
  for (auto& c : small) c = static_cast<char>(g());
  const std::string in = dir_.path("big.tensors");
  {
    auto w = Writer::open(in);
    WriteRequest a, b, c;
    a.path = TensorPath("a");
    a.dtype = "|u1";
    a.shape = {small.size()};
    a.data = small.data();
    b = a;
    b.path = TensorPath("big");
    b.shape = {big.size()};
    b.data = big.data();
    b.module_idx = 7;
    c = a;
    c.path = TensorPath("z");
    w->write({a, b, c});
    w->close();
  }
  std::string out;
  const std::string enc = dir_.path("big.enc"), back = dir_.path("big.back");
  ASSERT_EQ(run_cli("encrypt -q " + shell_quote(in) + " " + shell_quote(enc) + " --key-file " +
                        shell_quote(key_file_) + " --workers 2",
                    &out),
            0)
      << out;
  ASSERT_EQ(run_cli("decrypt -q " + shell_quote(enc) + " " + shell_quote(back) + " --key-file " +
                        shell_quote(key_file_),
                    &out),
            0)
      << out;
  for (const auto& [path, dec] :
       {std::pair{enc, std::optional(DecryptionParams::from_key(read_key(key_file_)))},
        std::pair{back, std::optional<DecryptionParams>()}}) {
    ReaderOptions ro;
    ro.decryption = dec;
    auto r = Reader::open(path, ro);
    LoadOptions lo;
    lo.verify_hash = true;
    auto buffers = test::load_entries(*r, lo);
    ASSERT_EQ(buffers.size(), 3u);
    EXPECT_TRUE(buffers[0] == small);
    EXPECT_TRUE(buffers[1] == big);
    EXPECT_TRUE(buffers[2] == small);
    EXPECT_EQ(r->loaded_info(1)->module_idx, 7);
  }
}

TEST_F(CryptCliTest, RemoteSourcesAndSinks) {
  // HTTP -> S3 (encrypt), S3 -> Redis (decrypt), through the generic sources and sinks.
  TZ_SERVER_ENV(http, "TZ_TEST_HTTP_URL");
  TZ_SERVER_ENV(endpoint, "TZ_TEST_S3_ENDPOINT");
  TZ_SERVER_ENV(bucket, "TZ_TEST_S3_BUCKET");
  TZ_SERVER_ENV(redis, "TZ_TEST_REDIS_URL");
  const std::string cfg = dir_.path("s3cfg");
  test::write_file(cfg, "[default]\naccess_key = testing\nsecret_key = testing\n");
  const std::string s3 =
      " --s3-endpoint " + shell_quote(endpoint) + " --force-http --s3-config " + shell_quote(cfg);
  for (const auto& name : {"dtypes.tensors", "meta.tensors"}) {
    SCOPED_TRACE(name);
    const std::string enc = "s3://" + bucket + "/" + test::unique_name("enc") + ".tensors";
    const std::string dec = redis + "/" + test::unique_name("dec");
    std::string out;
    ASSERT_EQ(run_cli("encrypt -q " + shell_quote(http + "/fixtures/" + name) + " " +
                          shell_quote(enc) + " --key-file " + shell_quote(key_file_) + s3,
                      &out),
              0)
        << out;
    TransportOptions t;
    t.s3.endpoint = endpoint;
    t.s3.force_http = true;
    t.s3.access_key_id = "testing";
    t.s3.secret_access_key = "testing";
    expect_manifest(enc, name, DecryptionParams::from_key(read_key(key_file_)), t);
    ASSERT_EQ(run_cli("decrypt -q " + shell_quote(enc) + " " + shell_quote(dec) + " --key-file " +
                          shell_quote(key_file_) + s3,
                      &out),
              0)
        << out;
    expect_manifest(dec, name, std::nullopt);
  }
}

TEST_F(CryptCliTest, MisuseFailsAndLeavesNoOutput) {
  std::string out;
  const std::string enc_fixture = test::fixture_path("encrypted_key.tensors");
  const std::string o1 = dir_.path("o1"), o2 = dir_.path("o2"), o3 = dir_.path("o3"),
                    o4 = dir_.path("o4");
  // Wrong key.
  EXPECT_EQ(run_cli("decrypt " + shell_quote(enc_fixture) + " " + shell_quote(o1) + " --key-file " +
                        shell_quote(key_file_),
                    &out),
            2)
      << out;
  EXPECT_NE(out.find("Tensor decryption failed"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(o1));
  // Already encrypted.
  EXPECT_EQ(run_cli("encrypt " + shell_quote(enc_fixture) + " " + shell_quote(o2) + " --key-file " +
                        shell_quote(key_file_),
                    &out),
            2)
      << out;
  EXPECT_NE(out.find("already encrypted"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(o2));
  // Not encrypted.
  EXPECT_EQ(run_cli("decrypt " + shell_quote(test::fixture_path("module.tensors")) + " " +
                        shell_quote(o3) + " --key-file " + shell_quote(key_file_),
                    &out),
            2)
      << out;
  EXPECT_FALSE(std::filesystem::exists(o3));
  // No key, both keys, unset variable, bad preset.
  const std::string in = shell_quote(test::fixture_path("module.tensors"));
  EXPECT_EQ(run_cli("encrypt " + in + " " + shell_quote(o4), &out), 2) << out;
  unsetenv("TZ_TEST_UNSET");
  EXPECT_EQ(
      run_cli("encrypt " + in + " " + shell_quote(o4) + " --passphrase-env TZ_TEST_UNSET", &out), 2)
      << out;
  setenv("TZ_TEST_SET", "x", 1);
  EXPECT_EQ(run_cli("encrypt " + in + " " + shell_quote(o4) +
                        " --passphrase-env TZ_TEST_SET --key-file " + shell_quote(key_file_),
                    &out),
            2)
      << out;
  EXPECT_EQ(run_cli("encrypt " + in + " " + shell_quote(o4) +
                        " --passphrase-env TZ_TEST_SET --opslimit lots",
                    &out),
            2)
      << out;
  EXPECT_FALSE(std::filesystem::exists(o4));
}

}  // namespace
}  // namespace tensorizer
