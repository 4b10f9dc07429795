// The open of a remote object that will be loaded to host memory (ReaderOptions::expect_host_load,
// engine/warm_block.h) against nginx behind the fault proxy, whose first answer it holds back: the
// open asks the size with one HEAD, the wait is spent mapping the load's memory, and the load
// writes the exact bytes into it. A HEAD left unanswered holds nothing up. Without the option no
// HEAD is sent and nothing is mapped ahead.
#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "remote_test_util.h"
#include "tensorizer/host_load.h"

namespace tensorizer {
namespace {

constexpr const char* kSlowFirstAnswer = "delay:1000";  // the probe's connection; then pass

class WarmBlockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TZ_SERVER_ENV(url, "TZ_TEST_HTTP_URL");
    TZ_SERVER_ENV(root, "TZ_TEST_HTTP_ROOT");
    TZ_SERVER_ENV(log, "TZ_TEST_HTTP_ACCESS_LOG");
    url_ = url, root_ = root, log_ = log;
    name_ = test::unique_name("warm") + ".tensors";
    auto w = Writer::open(root_ + "/" + name_);
    w->write(model_.requests);
    w->close();
  }
  void TearDown() override {
    if (!root_.empty()) ::unlink((root_ + "/" + name_).c_str());
  }

  // The object's URL through a proxy in front of nginx.
  std::string through(const test::FaultProxy& proxy) const {
    const std::string authority = test::host_port(url_);
    const std::string path = url_.substr(url_.find(authority) + authority.size());
    return "http://" + proxy.address() + path + "/" + name_;
  }
  // Requests for the object in nginx's access log with `method`.
  size_t requests(const std::string& method) const {
    std::ifstream in(log_);
    size_t n = 0;
    for (std::string line; std::getline(in, line);)
      if (line.find("\"" + method + " ") != std::string::npos &&
          line.find("/" + name_ + " ") != std::string::npos)
        ++n;
    return n;
  }
  // Loads every tensor to host memory and checks its bytes; returns what the open mapped ahead.
  uint64_t load_all(const std::string& uri, bool expect_host_load) {
    ReaderOptions ro;
    ro.expect_host_load = expect_host_load;
    auto reader = Reader::open(uri, ro);
    std::vector<size_t> entries(reader->entries().size());
    for (size_t i = 0; i < entries.size(); ++i) entries[i] = i;
    const std::vector<HostTensor> got = load_to_host(*reader, entries);
    EXPECT_EQ(got.size(), model_.data.size());
    for (size_t i = 0; i < got.size() && i < model_.data.size(); ++i) {
      EXPECT_EQ(got[i].via, LoadedVia::kCopied);
      EXPECT_TRUE(std::string(reinterpret_cast<const char*>(got[i].data), got[i].size) ==
                  model_.data[i])
          << "tensor " << i;
    }
    return reader->host_bytes_premapped();
  }

  const test::Model model_ = test::make_model(8 << 20);
  std::string url_, root_, log_, name_;
};

TEST_F(WarmBlockTest, ASlowServersWaitIsSpentMappingTheMemoryTheLoadWritesInto) {
  test::FaultProxy proxy(test::host_port(url_), kSlowFirstAnswer);
  const uint64_t premapped = load_all(through(proxy), /*expect_host_load=*/true);
  // Every tensor's bytes (each at a 64-byte boundary) lay in the block mapped during the wait.
  uint64_t total = 0;
  for (const std::string& d : model_.data) total = (total + d.size() + 63) / 64 * 64;
  EXPECT_EQ(premapped, total);
  EXPECT_EQ(requests("HEAD"), 1u);
}

// A server that never answers the HEAD holds nothing up: the load goes on without the block once
// the first answer comes, and closing the reader cancels the HEAD (its poll notices within 100 ms).
TEST_F(WarmBlockTest, AHeadThatNeverAnswersHoldsNothingUp) {
  test::FaultProxy proxy(test::host_port(url_), std::string(kSlowFirstAnswer) + ",stall:0");
  EXPECT_EQ(load_all(through(proxy), /*expect_host_load=*/true), 0u);
}

TEST_F(WarmBlockTest, WithoutTheOptionNoSizeIsAskedAndNothingIsMappedAhead) {
  test::FaultProxy proxy(test::host_port(url_), kSlowFirstAnswer);
  EXPECT_EQ(load_all(through(proxy), /*expect_host_load=*/false), 0u);
  EXPECT_EQ(requests("HEAD"), 0u);
}

TEST_F(WarmBlockTest, TheSizeAskedIsTheObjectsAndNoneAfterTheFirstAnswer) {
  auto source = open_source(url_ + "/" + name_, {});
  const std::optional<uint64_t> before = source->size_without_body();
  ASSERT_TRUE(before.has_value());
  EXPECT_EQ(*before, source->size());
  EXPECT_EQ(source->size_without_body(), before);  // known now: no request
  EXPECT_EQ(requests("HEAD"), 1u);
  auto missing = open_source(url_ + "/" + name_ + ".missing", {});
  EXPECT_EQ(missing->size_without_body(), std::nullopt);  // errors are size()'s to report
  EXPECT_THROW(missing->size(), Error);
}

}  // namespace
}  // namespace tensorizer
