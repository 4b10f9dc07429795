// The staged pipeline (tensorizer/staged_load.h) on CPU, through the host copy backend that runs
// copies asynchronously on their own threads: exact bytes for every fixture and for files with
// more tensors than slots and tensors larger than a slot (with copies held back, so that a slot
// reused before its copies ran would show as wrong bytes), encrypted files, meta tensors, hashes
// checked across pieces, the direct-I/O choice, and a read failing mid-load: the error names the
// tensor, every staging buffer is freed and memory never exceeded the configured ring. The CUDA
// backend's own glue (loading the runtime, device scoping, errors) runs against a stand-in runtime
// over host memory (fake_cudart.cc).
#include "tensorizer/staged_load.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <random>

#include "engine/direct_io.h"
#include "tensorizer/writer.h"
#include "test_util.h"

namespace tensorizer {
namespace {

constexpr uint64_t kMiB = 1 << 20;

std::string random_bytes(size_t n, uint32_t seed) {
  std::string s(n, '\0');
  std::mt19937 g(seed);
  for (auto& c : s) c = static_cast<char>(g());
  return s;
}

using Sample = test::SampleTensor;

// Many tensors around the edges: several larger than a slot, odd sizes, tiny, empty, meta.
std::vector<Sample> samples() {
  std::vector<Sample> out;
  const size_t sizes[] = {5 * kMiB + 12, 36, 4096, 0, 3 * kMiB, 4, 700 * 1024, 9 * kMiB + 4, 64};
  for (size_t n : sizes)
    out.push_back(
        {"t" + std::to_string(out.size()), random_bytes(n, static_cast<uint32_t>(out.size()))});
  for (int i = 0; i < 40; ++i)
    out.push_back({"small" + std::to_string(i), random_bytes(100 + 8 * i, 100 + i)});
  out.push_back({"meta", std::string(4000, '\0'), true});
  return out;
}

void write_samples(const std::string& path, const std::vector<Sample>& ts,
                   std::optional<EncryptionParams> encryption = std::nullopt) {
  WriterOptions o;
  o.encryption = std::move(encryption);
  test::write_sample_tensors(path, ts, "|u1", o);
}

// A CopyBackend that counts staging memory around another one.
class CountingBackend : public CopyBackend {
 public:
  explicit CountingBackend(std::unique_ptr<CopyBackend> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  void* alloc_staging(size_t bytes) override {
    void* p = inner_->alloc_staging(bytes);
    live += bytes;
    peak = std::max<uint64_t>(peak, live);
    ++allocations;
    return p;
  }
  void free_staging(void* data, size_t bytes) noexcept override {
    inner_->free_staging(data, bytes);
    live -= bytes;
    ++frees;
  }
  int streams() const override { return inner_->streams(); }
  void copy_async(void* dst, const void* src, size_t size, int stream) override {
    ++copies;
    inner_->copy_async(dst, src, size, stream);
  }
  void zero_async(void* dst, size_t size, int stream) override {
    inner_->zero_async(dst, size, stream);
  }
  std::unique_ptr<CopyEvent> make_event() override { return inner_->make_event(); }
  void synchronize() override { inner_->synchronize(); }

  std::atomic<uint64_t> live{0}, peak{0}, allocations{0}, frees{0}, copies{0};

 private:
  std::unique_ptr<CopyBackend> inner_;
};

struct Loaded {
  std::vector<std::string> bytes;  // per entry, expected_bytes() each
  StagedLoadResult result;
};

Loaded load_all(Reader& r, CopyBackend& backend, const LoadOptions& opt,
                const StagingOptions& staging) {
  Loaded out;
  std::vector<TensorDestination> dests;
  out.bytes.resize(r.entries().size());
  for (size_t i = 0; i < r.entries().size(); ++i) {
    out.bytes[i].assign(r.entries()[i].expected_bytes(), '\x5a');  // not zero: meta must be zeroed
    dests.push_back({i, out.bytes[i].empty() ? nullptr : out.bytes[i].data()});
  }
  out.result = load_staged(r, dests, backend, opt, staging);
  return out;
}

void expect_samples(Reader& r, const Loaded& got, const std::vector<Sample>& want) {
  ASSERT_EQ(got.bytes.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(want[i].name);
    EXPECT_EQ(display_path(r.entries()[i].path), want[i].name);
    EXPECT_TRUE(got.bytes[i] == want[i].bytes) << "bytes differ";
  }
}

StagingOptions small_ring(uint64_t item = 1 * kMiB, uint64_t ring = 4 * kMiB) {
  StagingOptions s;
  s.item_bytes = item;
  s.ring_bytes = ring;
  return s;
}

TEST(StagedLoadTest, EveryUnencryptedFixtureLoadsAsReaderLoadDoes) {
  for (const auto& name : test::unencrypted_fixtures()) {
    SCOPED_TRACE(name);
    auto r = Reader::open(test::fixture_path(name));
    const auto want = test::load_entries(*r, {});
    auto backend = host_copy_backend(2, 50);
    for (uint64_t item : {uint64_t{4096}, uint64_t{8} * kMiB}) {
      const Loaded got = load_all(*r, *backend, {}, small_ring(item, 3 * item));
      EXPECT_EQ(got.bytes, want);
    }
  }
}

TEST(StagedLoadTest, MoreTensorsThanSlotsAndTensorsLargerThanASlot) {
  test::TempDir dir;
  const auto ts = samples();
  write_samples(dir.path("m.tensors"), ts);
  auto r = Reader::open(dir.path("m.tensors"));
  for (int workers : {1, 3, 8}) {
    SCOPED_TRACE(workers);
    CountingBackend backend(host_copy_backend(3, 300));  // copies held back: reuse must wait
    LoadOptions opt;
    opt.num_workers = workers;
    const Loaded got = load_all(*r, backend, opt, small_ring());
    expect_samples(*r, got, ts);
    EXPECT_LT(got.result.slots, ts.size());
    EXPECT_LE(got.result.staging_bytes, 4 * kMiB);
    EXPECT_LE(backend.peak.load(), 4 * kMiB);
    EXPECT_EQ(backend.live.load(), 0u);
    EXPECT_EQ(backend.allocations.load(), backend.frees.load());
    EXPECT_GT(backend.copies.load(), 9u + 5 + 3);  // the large tensors went in several pieces
  }
}

TEST(StagedLoadTest, RingIsAtLeastTwoSlotsOfTheLargestItem) {
  test::TempDir dir;
  const auto ts = samples();
  write_samples(dir.path("m.tensors"), ts);
  auto r = Reader::open(dir.path("m.tensors"));
  auto backend = host_copy_backend();
  const Loaded got = load_all(*r, *backend, {}, small_ring(2 * kMiB, 1));
  expect_samples(*r, got, ts);
  EXPECT_EQ(got.result.slots, 2u);
  EXPECT_LE(got.result.staging_bytes, 2 * (2 * kMiB + 64 * 1024));
}

TEST(StagedLoadTest, EncryptedFilesDecryptInStaging) {
  test::TempDir dir;
  const auto ts = samples();
  const EncryptionParams enc = EncryptionParams::random();
  write_samples(dir.path("e.tensors"), ts, enc);
  ReaderOptions ro;
  ro.decryption = DecryptionParams::from_key(enc.key);
  auto r = Reader::open(dir.path("e.tensors"), ro);
  auto backend = host_copy_backend(2, 100);
  for (bool verify : {false, true}) {
    LoadOptions opt;
    opt.verify_hash = verify;
    opt.num_workers = 4;
    const Loaded got = load_all(*r, *backend, opt, small_ring(1 * kMiB, 12 * kMiB));
    expect_samples(*r, got, ts);
  }
  Key wrong = enc.key;
  wrong[0] ^= 1;
  ro.decryption = DecryptionParams::from_key(wrong);
  auto bad = Reader::open(dir.path("e.tensors"), ro);
  EXPECT_EQ(test::error_code_of([&] { load_all(*bad, *backend, {}, {}); }), ErrorCode::kCrypto);
}

TEST(StagedLoadTest, HashesAreCheckedAcrossPiecesAndMismatchesNamed) {
  test::TempDir dir;
  const auto ts = samples();
  write_samples(dir.path("h.tensors"), ts);
  auto r = Reader::open(dir.path("h.tensors"));
  auto backend = host_copy_backend(2, 20);
  LoadOptions opt;
  opt.verify_hash = true;
  opt.num_workers = 4;
  expect_samples(*r, load_all(*r, *backend, opt, small_ring()), ts);

  // Flip one byte deep inside the 9 MiB tensor (its third piece at 1 MiB items).
  std::string bytes = test::read_file(dir.path("h.tensors"));
  const IndexEntry& e = r->entries()[7];
  bytes[e.data_offset + 5 * kMiB + 3] ^= 1;
  test::write_file(dir.path("bad.tensors"), bytes);
  auto bad = Reader::open(dir.path("bad.tensors"));
  try {
    load_all(*bad, *backend, opt, small_ring());
    ADD_FAILURE() << "no hash mismatch";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kHashMismatch);
    EXPECT_NE(std::string(err.what()).find("tensor 't7'"), std::string::npos) << err.what();
  }
  opt.collect_mismatches = true;
  const Loaded got = load_all(*bad, *backend, opt, small_ring());
  ASSERT_EQ(got.result.mismatches.size(), 1u);
  EXPECT_NE(got.result.mismatches[0].find("'t7'"), std::string::npos);
}

// Serves a file's bytes and throws on the `fail_at`-th read (counted across clones).
class FailingSource final : public Source {
 public:
  FailingSource(std::unique_ptr<Source> inner, std::shared_ptr<std::atomic<int>> reads, int fail_at)
      : inner_(std::move(inner)), reads_(std::move(reads)), fail_at_(fail_at) {}
  uint64_t size() override { return inner_->size(); }
  void read_scatter(uint64_t offset, const IoSlice* slices, size_t count) override {
    if (++*reads_ == fail_at_) fail(ErrorCode::kIO, "connection reset (injected)");
    inner_->read_scatter(offset, slices, count);
  }
  std::unique_ptr<Source> clone() override {
    return std::make_unique<FailingSource>(inner_->clone(), reads_, fail_at_);
  }
  const std::string& uri() const override { return inner_->uri(); }
  uint64_t bytes_read() const override { return inner_->bytes_read(); }

 private:
  std::unique_ptr<Source> inner_;
  std::shared_ptr<std::atomic<int>> reads_;
  int fail_at_;
};

TEST(StagedLoadTest, AReadFailingMidLoadFreesEveryStagingBuffer) {
  test::TempDir dir;
  const auto ts = samples();
  write_samples(dir.path("f.tensors"), ts);
  for (int fail_at : {3, 9}) {
    SCOPED_TRACE(fail_at);
    auto reads = std::make_shared<std::atomic<int>>(0);
    // Fail the fail_at-th read of the load (opening takes its own reads first).
    auto failing =
        std::make_unique<FailingSource>(open_source(dir.path("f.tensors")), reads, fail_at);
    auto r2 = Reader::open(std::move(failing));
    *reads = 0;
    CountingBackend backend(host_copy_backend(2, 200));
    LoadOptions opt;
    opt.num_workers = 3;
    try {
      load_all(*r2, backend, opt, small_ring());
      ADD_FAILURE() << "the load did not fail";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), ErrorCode::kIO);
      const std::string what = err.what();
      EXPECT_NE(what.find("injected"), std::string::npos) << what;
      EXPECT_NE(what.find("tensor '"), std::string::npos) << what;
      EXPECT_NE(what.find("f.tensors"), std::string::npos) << what;
    }
    EXPECT_EQ(backend.live.load(), 0u);
    EXPECT_EQ(backend.allocations.load(), backend.frees.load());
    EXPECT_LE(backend.peak.load(), 4 * kMiB);
    // The reader stays usable: the same reader loads everything once the source behaves.
    *reads = -(1 << 30);
    CountingBackend again(host_copy_backend());
    expect_samples(*r2, load_all(*r2, again, {}, small_ring()), ts);
  }
}

TEST(StagedLoadTest, ColdLocalFilesAreReadWithDirectIo) {
  test::TempDir dir;
  const auto ts = samples();
  const std::string path = dir.path("d.tensors");
  write_samples(path, ts);
  {
    const int fd = ::open(path.c_str(), O_RDONLY);
    ASSERT_GE(fd, 0);
    const bool direct_ok = engine::DirectFile(fd).ok();
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    if (!direct_ok) GTEST_SKIP() << "no O_DIRECT on this file system";
  }
  auto r = Reader::open(path);
  auto backend = host_copy_backend(2, 50);
  const Loaded cold = load_all(*r, *backend, {}, small_ring());
  expect_samples(*r, cold, ts);
  EXPECT_TRUE(cold.result.direct_io);
  (void)test::read_file(path);  // now cached: buffered reads
  const Loaded warm = load_all(*r, *backend, {}, small_ring());
  expect_samples(*r, warm, ts);
  EXPECT_FALSE(warm.result.direct_io);
}

TEST(StagedLoadTest, BadRequestsAreRefused) {
  test::TempDir dir;
  write_samples(dir.path("b.tensors"), samples());
  auto r = Reader::open(dir.path("b.tensors"));
  auto backend = host_copy_backend();
  std::string buf(64, '\0');
  EXPECT_EQ(test::error_code_of([&] {
              load_staged(*r, {{999, buf.data()}}, *backend);
            }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(test::error_code_of([&] {
              load_staged(*r, {{8, buf.data()}, {8, buf.data()}}, *backend);
            }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(test::error_code_of([&] {
              load_staged(*r, {{0, nullptr}}, *backend);
            }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(load_staged(*r, {}, *backend).slots, 0u);
}

// The stand-in runtime's test controls.
struct FakeCudart {
  void* handle = dlopen(TZ_FAKE_CUDART, RTLD_NOW);
  template <typename F>
  F* fn(const char* name) {
    return reinterpret_cast<F*>(dlsym(handle, name));
  }
  void fail_copy(int nth) { fn<void(int)>("fake_cudart_fail_copy")(nth); }
  int live(const char* what) {
    return fn<int()>((std::string("fake_cudart_live_") + what).c_str())();
  }
};

TEST(StagedLoadTest, CudaBackendLoadsThroughTheRuntimeItFinds) {
  FakeCudart fake;
  ASSERT_NE(fake.handle, nullptr) << dlerror();
  test::TempDir dir;
  const auto ts = samples();
  write_samples(dir.path("c.tensors"), ts);
  auto r = Reader::open(dir.path("c.tensors"));
  // The calling thread works on device 1 and loads to device 0: every worker (this thread among
  // them) copies with device 0 current (the stand-in refuses otherwise); this thread gets 1 back.
  auto set_device = fake.fn<int(int)>("cudaSetDevice");
  auto get_device = fake.fn<int(int*)>("cudaGetDevice");
  ASSERT_EQ(set_device(1), 0);
  {
    auto backend = cuda_copy_backend(0, 3, TZ_FAKE_CUDART);
    EXPECT_NE(backend->name().find("cuda:0"), std::string::npos);
    LoadOptions opt;
    opt.verify_hash = true;
    opt.num_workers = 3;
    expect_samples(*r, load_all(*r, *backend, opt, small_ring()), ts);
    int device = -1;
    get_device(&device);
    EXPECT_EQ(device, 1);
    EXPECT_EQ(fake.live("host_allocs"), 0);
    EXPECT_EQ(fake.live("events"), 0);

    // A copy failing mid-load: a CUDA error naming the call, the tensor and the file; nothing
    // leaks.
    fake.fail_copy(7);
    try {
      load_all(*r, *backend, opt, small_ring());
      ADD_FAILURE() << "the load did not fail";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), ErrorCode::kIO);
      const std::string what = err.what();
      EXPECT_NE(what.find("cudaMemcpyAsync failed: fake CUDA error 700"), std::string::npos)
          << what;
      EXPECT_NE(what.find("c.tensors"), std::string::npos) << what;
    }
    fake.fail_copy(0);
    EXPECT_EQ(fake.live("host_allocs"), 0);
    EXPECT_EQ(fake.live("events"), 0);
  }
  EXPECT_EQ(fake.live("streams"), 0);
  EXPECT_EQ(test::error_code_of([&] { cuda_copy_backend(2, 2, TZ_FAKE_CUDART); }),
            ErrorCode::kUnsupported);
  EXPECT_EQ(test::error_code_of([&] { cuda_copy_backend(0, 2, "/nonexistent/libcudart.so"); }),
            ErrorCode::kUnsupported);
}

TEST(StagedLoadTest, CudaBackendIsRefusedCleanlyWithoutAGpu) {
  try {
    auto backend = cuda_copy_backend(0);
    GTEST_SKIP() << "a CUDA device is present (" << backend->name()
                 << "); the Python GPU tests cover it";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kUnsupported) << err.what();
  }
}

}  // namespace
}  // namespace tensorizer
