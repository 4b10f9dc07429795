// A source that names no version of its object (an HTTP server without ETag or Last-Modified,
// Redis) switching to another file of the same layout mid-load: every switch point gives an error
// saying the object changed, never a mix, and an unchanged object loads whole, both through the
// host load and through the staged (GPU) pipeline. The switch is a Source wrapper over two
// in-memory files, so every point can be tried.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tensorizer/host_load.h"
#include "tensorizer/reader.h"
#include "tensorizer/staged_load.h"
#include "tensorizer/transport.h"
#include "test_util.h"

namespace tensorizer {
namespace {

// Serves `first` for the first `switch_after` reads, then `second`.
class SwitchingSource final : public Source {
 public:
  SwitchingSource(std::shared_ptr<const std::string> first,
                  std::shared_ptr<const std::string> second, int switch_after,
                  std::shared_ptr<std::atomic<int>> reads = std::make_shared<std::atomic<int>>(0))
      : first_(std::move(first)),
        second_(std::move(second)),
        switch_after_(switch_after),
        reads_(std::move(reads)) {}
  uint64_t size() override { return first_->size(); }
  void read_scatter(uint64_t offset, const IoSlice* slices, size_t count) override {
    const std::string& bytes = (*reads_)++ < switch_after_ ? *first_ : *second_;
    for (size_t i = 0; i < count; ++i) {
      std::memcpy(slices[i].data, bytes.data() + offset, slices[i].size);
      offset += slices[i].size;
    }
  }
  std::unique_ptr<Source> clone() override {
    return std::make_unique<SwitchingSource>(first_, second_, switch_after_, reads_);
  }
  const std::string& uri() const override { return uri_; }
  uint64_t bytes_read() const override { return 0; }
  uint64_t preferred_read_bytes() const override { return 4096; }  // one item per tensor
  bool versioned() const override { return false; }

 private:
  std::shared_ptr<const std::string> first_, second_;
  int switch_after_;
  std::shared_ptr<std::atomic<int>> reads_;
  std::string uri_ = "switching://model";
};

std::shared_ptr<const std::string> version(test::TempDir& dir, char value) {
  std::vector<test::SampleTensor> ts;
  for (int i = 0; i < 6; ++i) ts.push_back({"t" + std::to_string(i), std::string(4096, value)});
  const std::string path = dir.path(std::string("v") + value + ".tensors");
  test::write_sample_tensors(path, ts, "<f4");
  return std::make_shared<const std::string>(test::read_file(path));
}

// Loads tensors 0..5 of `r` with one worker and returns their bytes.
using LoadAll = std::function<std::vector<std::string>(Reader& r)>;

std::vector<std::string> host_load(Reader& r) {
  LoadOptions opt;
  opt.num_workers = 1;
  std::vector<std::string> out;
  for (const auto& t : load_to_host(r, {0, 1, 2, 3, 4, 5}, opt))
    out.emplace_back(reinterpret_cast<char*>(t.data), t.size);
  return out;
}

// The staged pipeline on host memcpy streams, one read item per tensor.
std::vector<std::string> staged_load(Reader& r) {
  std::vector<std::string> out(6, std::string(4096, '\0'));
  std::vector<TensorDestination> dests;
  for (size_t i = 0; i < out.size(); ++i) dests.push_back({i, out[i].data()});
  LoadOptions opt;
  opt.num_workers = 1;
  StagingOptions staging;
  staging.item_bytes = 4096;
  staging.ring_bytes = 4 * 4096;
  auto backend = host_copy_backend();
  load_staged(r, dests, *backend, opt, staging);
  return out;
}

void expect_every_switch_is_an_error(const LoadAll& load) {
  test::TempDir dir;
  const auto one = version(dir, 'a'), two = version(dir, 'b');
  ASSERT_EQ(one->size(), two->size());
  int opens_read = 0;
  {
    auto probe = std::make_shared<std::atomic<int>>(0);
    Reader::open(std::make_unique<SwitchingSource>(one, two, 1 << 30, probe));
    opens_read = *probe;
  }
  for (int after = opens_read + 1; after < opens_read + 7; ++after) {
    auto r = Reader::open(std::make_unique<SwitchingSource>(one, two, after));
    try {
      load(*r);
      ADD_FAILURE() << "a switch after read " << after << " went unnoticed";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("the object changed during the load"), std::string::npos)
          << e.what();
    }
  }
  // The same object throughout loads whole.
  auto r = Reader::open(std::make_unique<SwitchingSource>(one, one, 0));
  for (const auto& t : load(*r)) EXPECT_EQ(t, std::string(4096, 'a'));
}

TEST(ObjectChange, AnUnversionedSourceThatSwitchesMidLoadIsAnErrorAtEveryPoint) {
  expect_every_switch_is_an_error(host_load);
}

TEST(ObjectChange, AStagedLoadFromAnUnversionedSourceThatSwitchesIsAnErrorAtEveryPoint) {
  expect_every_switch_is_an_error(staged_load);
}

}  // namespace
}  // namespace tensorizer
