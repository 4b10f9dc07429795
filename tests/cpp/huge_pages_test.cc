// Loads advise the kernel to back fresh destinations with transparent huge pages (2 MiB faults)
// only when asked: by default (and on every route of a default host load) fresh memory stays in
// 4 KiB pages, which fault 3-4x faster at a cold start on a VM that backs memory lazily. Checked in
// /proc/self/smaps of the destination range.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <optional>

#include "tensorizer/host_load.h"
#include "tensorizer/reader.h"
#include "tensorizer/writer.h"
#include "test_util.h"

namespace tensorizer {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// The bracketed mode of /sys/kernel/mm/transparent_hugepage/enabled ("always", "madvise", "never").
std::string thp_mode() {
  std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto open = all.find('['), close = all.find(']');
  return open == std::string::npos || close == std::string::npos
             ? ""
             : all.substr(open + 1, close - open - 1);
}

// AnonHugePages (bytes) of the mappings that lie inside [begin, end).
uint64_t anon_huge_bytes(uintptr_t begin, uintptr_t end) {
  return test::smaps_bytes("AnonHugePages",
                           [&](uintptr_t lo, uintptr_t hi) { return lo >= begin && hi <= end; });
}

// Of the mapping that holds `p`.
uint64_t anon_huge_bytes_at(const void* p) { return test::smaps_bytes_at(p, "AnonHugePages"); }

class HugePagesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    mode_ = thp_mode();
    if (mode_ != "always" && mode_ != "madvise")
      GTEST_SKIP() << "transparent huge pages are off here";
    data_.resize(12 * kMiB);
    for (size_t i = 0; i < data_.size(); ++i) data_[i] = static_cast<char>(i * 131 + (i >> 20));
    WriteRequest req;
    req.path = TensorPath("big");
    req.dtype = "<u1";
    req.shape = {data_.size()};
    req.data = data_.data();
    file_ = dir_.path("big.tensors");
    auto w = Writer::open(file_);
    w->write({req});
    w->close();
  }

  // Loads the tensor into fresh anonymous memory (advised as asked, or with default options);
  // returns the AnonHugePages of that memory.
  uint64_t load_fresh(std::optional<bool> advise) {
    const size_t len = data_.size() + 4 * kMiB;
    void* p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    auto* dst = static_cast<uint8_t*>(p) + 4096;  // not 2 MiB aligned: only the interior is advised
    auto r = Reader::open(file_);
    LoadOptions o;
    if (advise) o.advise_huge_pages = *advise;
    r->load({{0, dst}}, o);
    EXPECT_EQ(std::memcmp(dst, data_.data(), data_.size()), 0);
    const auto begin = reinterpret_cast<uintptr_t>(p);
    const uint64_t huge = anon_huge_bytes(begin, begin + len);
    munmap(p, len);
    return huge;
  }

  test::TempDir dir_;
  std::string mode_, file_, data_;
};

TEST_F(HugePagesTest, FreshDestinationGetsHugePages) {
  // 12 MiB from a 4 KiB offset holds five aligned 2 MiB pages; the kernel may still fall back to
  // small pages when it has no free huge page, so one is enough to show the advice took effect.
  const uint64_t huge = load_fresh(true);
  EXPECT_GE(huge, 2 * kMiB);
  EXPECT_LE(huge, 10 * kMiB) << "advice reaches past the destination's aligned interior";
}

TEST_F(HugePagesTest, NoAdviceLeavesSmallPages) {
  if (mode_ == "always")
    GTEST_SKIP() << "every anonymous mapping may get huge pages in 'always' mode";
  EXPECT_EQ(load_fresh(false), 0u);
}

TEST_F(HugePagesTest, DefaultLoadsLeaveSmallPagesOnEveryHostRoute) {
  if (mode_ == "always")
    GTEST_SKIP() << "every anonymous mapping may get huge pages in 'always' mode";
  EXPECT_EQ(load_fresh(std::nullopt), 0u);
  for (HostRoute route : {HostRoute::kDirect, HostRoute::kCopy}) {
    auto r = Reader::open(file_);
    auto out = load_to_host(*r, {0}, LoadOptions{}, route);
    ASSERT_EQ(out[0].size, data_.size());
    EXPECT_EQ(std::memcmp(out[0].data, data_.data(), data_.size()), 0);
    EXPECT_EQ(anon_huge_bytes_at(out[0].data), 0u) << to_string(out[0].via);
  }
}

}  // namespace
}  // namespace tensorizer
