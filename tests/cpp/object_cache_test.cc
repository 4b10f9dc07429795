// The local cache of remote objects (src/transport/cache.cc) against real servers (nginx, moto):
// a miss fetches the object once and later opens read the local copy, a new version is fetched
// again and replaces the old, a partial or damaged entry is never used, concurrent loaders share
// one download, the size bound evicts the least recently used entries, and an unusable cache
// directory is an error naming it. Requests and bytes are counted in nginx's access log.
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <thread>

#include "remote_test_util.h"
#include "test_util.h"

namespace tensorizer {
namespace {

uint64_t read_file_size(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// Body bytes of the probe every open of an object of `size` bytes makes (it brings the first
// 512 KiB along).
uint64_t probe_bytes(uint64_t size) { return std::min<uint64_t>(size, 512 * 1024); }

struct Traffic {
  size_t requests = 0;
  uint64_t body_bytes = 0;
};

// The requests for `name` in nginx's access log ("combined" format) and the body bytes sent.
Traffic traffic_for(const std::string& log, const std::string& name) {
  std::ifstream in(log);
  Traffic t;
  for (std::string line; std::getline(in, line);) {
    const size_t at = line.find("/" + name + " ");
    if (at == std::string::npos) continue;
    std::istringstream rest(line.substr(line.find('"', at) + 1));
    int status = 0;
    uint64_t bytes = 0;
    rest >> status >> bytes;
    ++t.requests;
    t.body_bytes += bytes;
  }
  return t;
}

// The cache entries (data files) in `dir`, with their sizes.
std::map<std::string, uint64_t> entries_in(const std::string& dir) {
  std::map<std::string, uint64_t> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name.size() > 8 && name.compare(name.size() - 8, 8, ".tensors") == 0 && name[0] != '.') {
      struct stat st {};
      ::stat((dir + "/" + name).c_str(), &st);
      out[name] = static_cast<uint64_t>(st.st_size);
    }
  }
  ::closedir(d);
  return out;
}

// Writes `m` to `path` on the server's disk with modification time `mtime` (nginx's ETag is
// mtime and size, so a rewrite in the same second still gets a new ETag).
void publish(const std::string& path, const test::Model& m, time_t mtime) {
  auto w = Writer::open(path);
  w->write(m.requests);
  w->close();
  struct timespec times[2] = {{mtime, 0}, {mtime, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
}

test::Model model_with_seed(size_t big, char seed) {
  test::Model m = test::make_model(big);
  for (auto& d : m.data)
    for (auto& c : d) c = static_cast<char>(c ^ seed);
  for (size_t i = 0; i < m.data.size(); ++i) m.requests[i].data = m.data[i].data();
  return m;
}

class ObjectCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    url_ = test::env_or_empty("TZ_TEST_HTTP_URL");
    root_ = test::env_or_empty("TZ_TEST_HTTP_ROOT");
    log_ = test::env_or_empty("TZ_TEST_HTTP_ACCESS_LOG");
    if (url_.empty() || root_.empty() || log_.empty()) {
      if (test::env_or_empty("TZ_REQUIRE_SERVERS") == "1")
        FAIL() << "TZ_TEST_HTTP_* are not set although TZ_REQUIRE_SERVERS=1";
      GTEST_SKIP() << "TZ_TEST_HTTP_* are not set: run under scripts/with-servers.sh";
    }
    name_ = test::unique_name("cached") + ".tensors";
    cache_ = dir_.path("cache");
    t_.cache.dir = cache_;
  }
  void TearDown() override {
    if (!root_.empty()) ::unlink((root_ + "/" + name_).c_str());
  }
  std::string uri() const { return url_ + "/" + name_; }
  std::string object() const { return root_ + "/" + name_; }
  Traffic traffic() const { return traffic_for(log_, name_); }

  std::string url_, root_, log_, name_, cache_;
  test::TempDir dir_;
  TransportOptions t_;
};

TEST_F(ObjectCacheTest, AMissFetchesOnceAndAHitReadsTheLocalCopy) {
  const test::Model m = test::make_model(24 << 20);
  publish(object(), m, 1700000000);
  const uint64_t size = read_file_size(object());
  test::expect_model(uri(), t_, m);
  const Traffic first = traffic();
  // The probe, then the object once; the load itself read the local copy.
  EXPECT_EQ(first.body_bytes, size + probe_bytes(size));
  auto entries = entries_in(cache_);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries.begin()->second, size);

  auto source = open_source(uri(), t_);
  EXPECT_GE(source->local_fd(), 0);
  EXPECT_EQ(source->uri(), uri());  // messages name the object, not the cache file
  test::expect_model(uri(), t_, m);
  const Traffic later = traffic();
  EXPECT_EQ(later.requests - first.requests, 2u);  // one probe per open, nothing else
  EXPECT_EQ(later.body_bytes - first.body_bytes, 2 * probe_bytes(size));

  // Without the cache the same open is remote.
  EXPECT_LT(open_source(uri())->local_fd(), 0);
}

TEST_F(ObjectCacheTest, ANewVersionIsFetchedAgainAndReplacesTheOld) {
  publish(object(), model_with_seed(8 << 20, 0), 1700000000);
  test::expect_model(uri(), t_, model_with_seed(8 << 20, 0));
  const auto before = entries_in(cache_);
  ASSERT_EQ(before.size(), 1u);

  const test::Model changed = model_with_seed(8 << 20, 0x5a);
  publish(object(), changed, 1700000100);
  const Traffic was = traffic();
  test::expect_model(uri(), t_, changed);
  EXPECT_GT(traffic().body_bytes - was.body_bytes, 8u << 20);  // fetched again
  const auto after = entries_in(cache_);
  ASSERT_EQ(after.size(), 1u);  // the old version went
  EXPECT_NE(after.begin()->first, before.begin()->first);
}

TEST_F(ObjectCacheTest, APartialOrLeftoverEntryIsNeverUsed) {
  const test::Model m = test::make_model(8 << 20);
  publish(object(), m, 1700000000);
  test::expect_model(uri(), t_, m);
  const std::string entry = cache_ + "/" + entries_in(cache_).begin()->first;
  const uint64_t size = read_file_size(entry);
  // A cut-short entry under the final name (a copy by hand, a disk error): fetched again whole.
  ASSERT_EQ(::truncate(entry.c_str(), static_cast<off_t>(size / 2)), 0);
  // A dead writer's private file beside it: ignored.
  test::write_file(cache_ + "/." + entries_in(cache_).begin()->first + ".tmp-12345", "junk");
  const Traffic was = traffic();
  test::expect_model(uri(), t_, m);
  EXPECT_EQ(traffic().body_bytes - was.body_bytes, size + probe_bytes(size));
  EXPECT_EQ(read_file_size(entry), size);
}

TEST_F(ObjectCacheTest, ConcurrentLoadersShareOneDownload) {
  const test::Model m = test::make_model(32 << 20);
  publish(object(), m, 1700000000);
  const uint64_t size = read_file_size(object());
  constexpr int kLoaders = 4;
  std::vector<std::thread> loaders;
  std::vector<std::string> failures(kLoaders);
  for (int i = 0; i < kLoaders; ++i)
    loaders.emplace_back([&, i] {
      try {
        ReaderOptions ro;
        ro.transport = t_;
        auto reader = Reader::open(uri(), ro);
        auto buffers = test::load_entries(*reader, LoadOptions{});
        for (size_t k = 0; k < m.data.size(); ++k)
          if (buffers[k] != m.data[k]) failures[i] = "tensor " + std::to_string(k) + " differs";
      } catch (const std::exception& e) {
        failures[i] = e.what();
      }
    });
  for (auto& l : loaders) l.join();
  for (const auto& f : failures) EXPECT_EQ(f, "");
  EXPECT_EQ(traffic().body_bytes, size + kLoaders * probe_bytes(size));  // the object once
}

TEST_F(ObjectCacheTest, TheBoundEvictsTheLeastRecentlyUsed) {
  const test::Model m = test::make_model(8 << 20);
  std::vector<std::string> names;
  for (int i = 0; i < 3; ++i) {
    names.push_back(test::unique_name("evict" + std::to_string(i)) + ".tensors");
    publish(root_ + "/" + names.back(), m, 1700000000);
  }
  const uint64_t size = read_file_size(root_ + "/" + names[0]);
  t_.cache.max_bytes = size * 2 + size / 2;  // room for two
  for (const std::string& n : {names[0], names[1]}) test::expect_model(url_ + "/" + n, t_, m);
  ASSERT_EQ(entries_in(cache_).size(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  test::expect_model(url_ + "/" + names[0], t_, m);  // a hit: now the most recently used
  const Traffic hit = traffic_for(log_, names[0]);
  test::expect_model(url_ + "/" + names[2], t_, m);  // evicts names[1]
  EXPECT_EQ(entries_in(cache_).size(), 2u);
  test::expect_model(url_ + "/" + names[0], t_, m);
  EXPECT_EQ(traffic_for(log_, names[0]).body_bytes - hit.body_bytes, probe_bytes(size));  // hit
  const Traffic evicted = traffic_for(log_, names[1]);
  test::expect_model(url_ + "/" + names[1], t_, m);
  EXPECT_EQ(traffic_for(log_, names[1]).body_bytes - evicted.body_bytes,
            size + probe_bytes(size));  // fetched again
  // An object larger than the whole bound is read remotely, not cached.
  t_.cache.max_bytes = size / 2;
  EXPECT_LT(open_source(url_ + "/" + names[2], t_)->local_fd(), 0);
  for (const std::string& n : names) ::unlink((root_ + "/" + n).c_str());
}

// All file names in `dir`, hidden ones included (a fill's leftovers would show here).
std::vector<std::string> names_in(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = ::readdir(d))
    if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") out.push_back(e->d_name);
  ::closedir(d);
  return out;
}

TEST_F(ObjectCacheTest, AFillThroughDroppedConnectionsIsExactAndAFailedOneLeavesNoEntry) {
  const test::Model m = test::make_model(16 << 20);
  publish(object(), m, 1700000000);
  t_.retry.retry_delay_s = 0.02;
  t_.retry.stall_timeout_s = 2;
  {  // drops mid-fill: the fill resumes from the first missing byte, the entry is whole
    // Every connection is cut past the probe's 512 KiB head: the fill may go on over the probe's
    // kept-alive connection (one share, as under a slow build) or open new ones; either is cut.
    test::FaultProxy proxy(test::host_port(url_), "drop:600000-4000000x6", 5);
    test::expect_model("http://" + proxy.address() + "/" + name_, t_, m);
    EXPECT_GE(proxy.faulted("drop"), 1) << proxy.log_text();
    ASSERT_EQ(entries_in(cache_).size(), 1u);
  }
  // A server that fails every request after the probe: the open fails naming the object, and
  // the cache holds neither an entry nor a partial file for it.
  TransportOptions other = t_;
  other.cache.dir = dir_.path("cache2");
  other.retry.max_retries = 2;
  // (The first connection answers the probe, then is cut should the fill go on over it.)
  test::FaultProxy proxy(test::host_port(url_), "drop:600000-700000,503x100", 5);
  const std::string uri = "http://" + proxy.address() + "/" + name_;
  try {
    open_source(uri, other);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(name_), std::string::npos) << e.what();
  }
  const std::vector<std::string> left = names_in(other.cache.dir);
  EXPECT_EQ(left.size(), 1u);  // the entry's lock file, nothing else
  for (const std::string& n : left)
    EXPECT_TRUE(n.size() > 5 && n.compare(n.size() - 5, 5, ".lock") == 0) << n;
}

TEST_F(ObjectCacheTest, S3ObjectsAreCachedToo) {
  TZ_SERVER_ENV(endpoint, "TZ_TEST_S3_ENDPOINT");
  TZ_SERVER_ENV(bucket, "TZ_TEST_S3_BUCKET");
  const test::Model m = test::make_model(8 << 20);
  TransportOptions t = t_;
  t.s3.endpoint = endpoint;
  t.s3.access_key_id = "testing";
  t.s3.secret_access_key = "testing";
  t.s3.force_http = true;
  const std::string key = "s3://" + bucket + "/" + test::unique_name("cached") + ".tensors";
  WriterOptions wo;
  wo.transport = t;
  auto w = Writer::open(key, wo);
  w->write(m.requests);
  w->close();
  test::expect_model(key, t, m);
  EXPECT_EQ(entries_in(cache_).size(), 1u);
  EXPECT_GE(open_source(key, t)->local_fd(), 0);
}

TEST_F(ObjectCacheTest, AnUnusableCacheDirectoryIsAnErrorNamingIt) {
  publish(object(), test::make_model(1 << 20), 1700000000);
  test::write_file(dir_.path("a-file"), "x");
  t_.cache.dir = dir_.path("a-file") + "/cache";
  try {
    open_source(uri(), t_);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIO);
    EXPECT_NE(std::string(e.what()).find(t_.cache.dir), std::string::npos) << e.what();
  }
}

TEST_F(ObjectCacheTest, EnvironmentVariablesSetTheDefaults) {
  test::ScopedEnv env;
  env.set("TENSORIZER_CACHE_DIR", "/some/dir");
  env.set("TENSORIZER_CACHE_MAX_GIB", "1.5");
  EXPECT_EQ(CacheOptions{}.dir, "/some/dir");
  EXPECT_EQ(CacheOptions{}.max_bytes, 3ull << 29);
  for (const char* bad : {"0", "-2", "lots"}) {
    env.set("TENSORIZER_CACHE_MAX_GIB", bad);
    try {
      CacheOptions{};
      FAIL() << "no error for " << bad;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("TENSORIZER_CACHE_MAX_GIB"), std::string::npos);
    }
  }
}

}  // namespace
}  // namespace tensorizer
