// Redis transport against a real redis-server (scripts/with-servers.sh): fixtures stored in the
// reference key layout (docs/format.md §4, written here with hiredis, not by our sink) load
// bit-exact with 1 and 4 workers, meta tensors' empty keys included; objects written by our sink
// have exactly the reference keys and round-trip byte for byte; a rewrite replaces the old keys, an
// aborted write changes nothing, prefixes with glob characters are taken literally, a missing
// prefix is kNotFound; a safetensors object (written, or copied from a file) is keyed by its parts
// and reads back byte for byte, with no end marker; a tensor-sized key is read in 1 MiB GETRANGE
// pieces, not one GET whose reply the server would buffer whole; credentials in the URI
// authenticate (AUTH), a refused password is an error at once, and messages show them as ***.
#include "remote_test_util.h"
#include "tensorizer/safetensors_writer.h"

namespace tensorizer {
namespace {

struct RedisConn {
  explicit RedisConn(const std::string& url) : c(test::redis_connect(url)) {}
  ~RedisConn() { redisFree(c); }
  redisContext* c;
};

// The server's count of GETRANGE commands so far (INFO commandstats).
long long getrange_calls(redisContext* c) {
  auto* r = static_cast<redisReply*>(redisCommand(c, "INFO commandstats"));
  EXPECT_TRUE(r && r->type == REDIS_REPLY_STRING);
  long long calls = 0;
  if (r && r->type == REDIS_REPLY_STRING) {
    const std::string info(r->str, r->len), field = "cmdstat_getrange:calls=";
    const size_t at = info.find(field);
    if (at != std::string::npos) calls = std::atoll(info.c_str() + at + field.size());
  }
  freeReplyObject(r);
  return calls;
}

TEST(TransportRedisTest, ReferenceLayoutFixturesLoadBitExact) {
  TZ_SERVER_ENV(url, "TZ_TEST_REDIS_URL");
  RedisConn r(url);
  for (const auto& name : test::all_fixtures()) {
    const std::string prefix = test::unique_name("fx-" + name);
    test::redis_store_reference_layout(r.c, prefix, test::read_file(test::fixture_path(name)));
    const std::string uri = url + "/" + prefix;
    for (int workers : {1, 4}) test::expect_fixture_loads(uri, name, {}, workers);
    // The object reads back as the original file, end-of-tensors marker included.
    EXPECT_TRUE(test::read_all(uri, {}, 100000) == test::read_file(test::fixture_path(name)))
        << name;
  }
}

TEST(TransportRedisTest, SafetensorsObjectsAreKeyedByPartsAndReadBackExactly) {
  TZ_SERVER_ENV(url, "TZ_TEST_REDIS_URL");
  RedisConn r(url);
  test::TempDir dir;
  const std::vector<SafetensorsTensor> tensors = {
      {"w", "<f4", {3u << 20}}, {"b", "<f2", {3}}, {"e", "<f4", {0}}};
  std::string w(12u << 20, '\0'), b = "abcdef";
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<char>(i * 13 + i / 999);
  const std::vector<const void*> data = {w.data(), b.data(), nullptr};
  const std::string file_path = dir.path("m.safetensors");
  write_safetensors(*open_sink(file_path), tensors, data);
  const std::string file = test::read_file(file_path);
  const SafetensorsLayout layout = plan_safetensors(tensors, std::nullopt);

  const std::string written = test::unique_name("st-written"), copied = test::unique_name("st-cp");
  write_safetensors(*open_sink(url + "/" + written), tensors, data);
  copy_object(file_path, url + "/" + copied);
  for (const std::string& prefix : {written, copied}) {
    SCOPED_TRACE(prefix);
    EXPECT_TRUE(test::redis_get(r.c, prefix + ":safetensors:0") ==
                file.substr(0, layout.prefix.size()));
    EXPECT_TRUE(test::redis_get(r.c, prefix + ":w:" + std::to_string(layout.data_offset[0])) == w);
    EXPECT_TRUE(test::read_all(url + "/" + prefix, {}, 1 << 20) == file);  // no end marker
    auto reader = Reader::open(url + "/" + prefix);
    ASSERT_EQ(reader->format(), FileFormat::kSafetensors);
    std::string got(w.size(), '\0');
    reader->load({{*reader->find("w"), got.data()}}, {.num_workers = 4});
    EXPECT_TRUE(got == w);
  }
}

TEST(TransportRedisTest, ATensorSizedKeyIsReadInMiBPieces) {
  TZ_SERVER_ENV(url, "TZ_TEST_REDIS_URL");
  RedisConn r(url);
  const std::vector<SafetensorsTensor> tensors = {{"w", "<f4", {(12u << 20) / 4 + 5}}};
  std::string w((12u << 20) + 20, '\0');
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<char>(i * 7 + i / 4099);
  const std::vector<const void*> data = {w.data()};
  const std::string prefix = test::unique_name("pieces");
  write_safetensors(*open_sink(url + "/" + prefix), tensors, data);

  const long long before = getrange_calls(r.c);
  auto reader = Reader::open(url + "/" + prefix);
  std::string got(w.size(), '\0');
  reader->load({{*reader->find("w"), got.data()}}, {.num_workers = 1});  // one read of the key
  EXPECT_TRUE(got == w);
  EXPECT_GE(getrange_calls(r.c) - before, 13);  // 12 MiB + 20 bytes: 13 pieces, no whole GET
}

TEST(TransportRedisTest, WrittenObjectHasTheReferenceKeysAndRoundTrips) {
  TZ_SERVER_ENV(url, "TZ_TEST_REDIS_URL");
  RedisConn r(url);
  test::TempDir dir;
  test::Model m = test::make_model(24 << 20);
  const std::string prefix = test::unique_name("written");
  const std::string uri = url + "/" + prefix;
  {
    auto w = Writer::open(uri);
    w->write(m.requests);
    w->close();
  }
  auto local = Writer::open(dir.path("same.tensors"));
  local->write(m.requests);
  local->close();
  const std::string file = test::read_file(dir.path("same.tensors"));

  FileHeader h = parse_file_header(reinterpret_cast<const uint8_t*>(file.data()), file.size());
  EXPECT_TRUE(test::redis_get(r.c, prefix + ":header:0") ==
              file.substr(0, kPreludeSize + h.index_size));
  auto entries = parse_index(reinterpret_cast<const uint8_t*>(file.data()) + kPreludeSize,
                             h.index_size, h, file.size());
  for (const auto& e : entries) {
    SCOPED_TRACE(e.name);
    auto header =
        test::redis_get(r.c, prefix + ":" + e.name + ":" + std::to_string(e.header_offset));
    auto data = test::redis_get(r.c, prefix + ":" + e.name + ":" + std::to_string(e.data_offset));
    ASSERT_TRUE(header && data);
    EXPECT_TRUE(*header == file.substr(e.header_offset, e.header_size()));
    EXPECT_TRUE(*data == file.substr(e.data_offset, e.data_length));
  }
  EXPECT_TRUE(test::read_all(uri, {}) == file);
  test::expect_model(uri, {}, m);

  // Rewriting the prefix with another model replaces every old key.
  test::Model small = test::make_model(10);
  small.requests.resize(2);
  small.data.resize(2);
  {
    auto w = Writer::open(uri);
    w->write(small.requests);
    w->close();
  }
  test::expect_model(uri, {}, small);
  EXPECT_FALSE(test::redis_get(
      r.c, prefix + ":" + entries[2].name + ":" + std::to_string(entries[2].data_offset)));
}

TEST(TransportRedisTest, AbortedWriteChangesNothing) {
  TZ_SERVER_ENV(url, "TZ_TEST_REDIS_URL");
  const std::string prefix = test::unique_name("aborted");
  test::Model m = test::make_model(1000);
  {
    auto w = Writer::open(url + "/" + prefix);
    w->write(m.requests);
    w->close();
  }
  test::Model other = test::make_model(5000);
  auto w = Writer::open(url + "/" + prefix);
  w->write(other.requests);
  w->abort();
  test::expect_model(url + "/" + prefix, {}, m);
}

TEST(TransportRedisTest, CopyFromFileAndBackIsIdentical) {
  TZ_SERVER_ENV(url, "TZ_TEST_REDIS_URL");
  test::TempDir dir;
  for (const auto& name : test::all_fixtures()) {
    const std::string uri = url + "/" + test::unique_name("cp-" + name);
    copy_object(test::fixture_path(name), uri);
    copy_object(uri, dir.path(name));
    EXPECT_TRUE(test::read_file(dir.path(name)) == test::read_file(test::fixture_path(name)))
        << name;
  }
}

TEST(TransportRedisTest, PrefixWithGlobCharactersIsLiteral) {
  TZ_SERVER_ENV(url, "TZ_TEST_REDIS_URL");
  RedisConn r(url);
  const std::string base = test::unique_name("glob");
  const std::string file = test::read_file(test::fixture_path("module.tensors"));
  test::redis_store_reference_layout(r.c, base + "*x[1]", file);
  test::redis_store_reference_layout(r.c, base + "Ax11",
                                     test::read_file(test::fixture_path("dtypes.tensors")));
  EXPECT_TRUE(test::read_all(url + "/" + base + "*x[1]", {}) == file);
}

TEST(TransportRedisTest, CredentialsInTheUriAuthenticateAndNeverShowInMessages) {
  TZ_SERVER_ENV(url, "TZ_TEST_REDIS_URL");
  TZ_SERVER_ENV(user, "TZ_TEST_REDIS_USER");
  TZ_SERVER_ENV(password, "TZ_TEST_REDIS_PASSWORD");  // holds ':' and '@': escaped below
  ASSERT_EQ(password, "p:ss@word");
  const std::string host = url.substr(std::string("redis://").size());
  const std::string prefix = test::unique_name("auth");
  const std::string with_user = "redis://" + user + ":p%3Ass%40word@" + host + "/" + prefix;
  test::Model m = test::make_model(3 << 20);
  {
    auto w = Writer::open(with_user);
    w->write(m.requests);
    w->close();
  }
  test::expect_model(with_user, {}, m);
  test::expect_model(url + "/" + prefix, {}, m);  // the same keys, read by the default user

  const auto expect_refused = [&](const std::string& uri, ErrorCode code, const char* why) {
    SCOPED_TRACE(uri);
    try {
      Reader::open(uri);
      FAIL() << "no error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(e.code(), code) << what;
      EXPECT_NE(what.find(why), std::string::npos) << what;
      EXPECT_NE(what.find("redis://***@" + host), std::string::npos) << what;
      for (const char* secret : {"ss@word", "ss%40word", "wrong", "tz-user"})
        EXPECT_EQ(what.find(secret), std::string::npos) << secret << " in: " << what;
      EXPECT_EQ(what.find("attempts"), std::string::npos) << "not retried: " << what;
    }
  };
  // The server's reason (WRONGPASS), at once: a refused password is not a lost connection.
  expect_refused("redis://" + user + ":wrong@" + host + "/" + prefix, ErrorCode::kIO,
                 "refused the credentials (WRONGPASS");
  // A password alone is the default user's, which has none here.
  expect_refused("redis://:wrong@" + host + "/" + prefix, ErrorCode::kIO,
                 "refused the credentials");
  expect_refused("redis://" + user + "@" + host + "/" + prefix, ErrorCode::kInvalidArgument,
                 "without a password");
  // A writer refused changes nothing.
  auto w = Writer::open("redis://" + user + ":wrong@" + host + "/" + prefix);
  w->write(test::make_model(100).requests);
  EXPECT_THROW(w->close(), Error);
  test::expect_model(url + "/" + prefix, {}, m);
}

TEST(TransportRedisTest, MissingPrefixIsNotFound) {
  TZ_SERVER_ENV(url, "TZ_TEST_REDIS_URL");
  const std::string uri = url + "/" + test::unique_name("nothing-here");
  try {
    Reader::open(uri);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound) << e.what();
    EXPECT_NE(std::string(e.what()).find(uri), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tensorizer
