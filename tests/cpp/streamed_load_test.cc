// Streamed loads (the engine's schedule for sources that prefer long reads, such as HTTP and S3),
// on CPU through an in-memory source: each worker reads its share in one long read, a worker that
// runs out takes the untouched half of the slowest share, no byte is read twice, errors end every
// worker, and the bytes are exact with and without hash checks; the number of shares follows what a
// request costs.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

#include "common/worker_pool.h"
#include "remote_test_util.h"
#include "test_util.h"

namespace tensorizer {
namespace {

// What every handle of one StreamingSource shares.
struct StreamLog {
  std::mutex mu;
  std::vector<uint64_t> bytes_by_handle;  // data delivered by read_stream, per handle
  uint64_t long_reads = 0;
  std::atomic<int> handles{0};
  // When set, the first long read starting in the object's first quarter (the first share,
  // whichever worker runs it) sleeps after each MiB; what it delivered is `slow_read_bytes`.
  bool slow_first_share = true;
  std::atomic<bool> slow_taken{false};
  uint64_t slow_read_bytes = 0;
  uint64_t fail_after = 0;  // > 0: a read_stream fails once this many bytes were streamed
  std::atomic<uint64_t> streamed{0};
};

// An in-memory source that prefers long reads and streams them 1 MiB at a time through the
// budget, as an HTTP transfer would; the read of the first share may be slow.
class StreamingSource final : public Source {
 public:
  StreamingSource(std::shared_ptr<const std::string> bytes, std::shared_ptr<StreamLog> log)
      : bytes_(std::move(bytes)), log_(std::move(log)), handle_(log_->handles++) {
    std::lock_guard<std::mutex> lock(log_->mu);
    log_->bytes_by_handle.resize(static_cast<size_t>(handle_) + 1);
  }
  uint64_t size() override { return bytes_->size(); }
  void read_scatter(uint64_t offset, const IoSlice* slices, size_t count) override {
    for (size_t i = 0; i < count; ++i) {
      std::memcpy(slices[i].data, bytes_->data() + offset, slices[i].size);
      offset += slices[i].size;
    }
  }
  uint64_t read_stream(uint64_t offset, const IoSlice* slices, size_t count,
                       StreamBudget& budget) override {
    {
      std::lock_guard<std::mutex> lock(log_->mu);
      ++log_->long_reads;
    }
    uint64_t total = 0, done = 0;
    for (size_t i = 0; i < count; ++i) total += slices[i].size;
    const bool slow =
        log_->slow_first_share && offset < bytes_->size() / 4 && !log_->slow_taken.exchange(true);
    size_t slice = 0, within = 0;
    while (done < total) {
      uint64_t n = budget.reserve(done, std::min<uint64_t>(total - done, 1 << 20));
      if (n == 0) break;
      if (log_->fail_after && (log_->streamed += n) > log_->fail_after)
        fail(ErrorCode::kIO, "connection reset (test)");
      for (uint64_t left = n; left > 0;) {
        const uint64_t k = std::min<uint64_t>(left, slices[slice].size - within);
        std::memcpy(static_cast<char*>(slices[slice].data) + within,
                    bytes_->data() + offset + done + (n - left), k);
        left -= k;
        within += k;
        if (within == slices[slice].size) ++slice, within = 0;
      }
      done += n;
      {
        std::lock_guard<std::mutex> lock(log_->mu);
        log_->bytes_by_handle[static_cast<size_t>(handle_)] += n;
        if (slow) log_->slow_read_bytes += n;
      }
      if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(50));
      budget.landed(done);
    }
    return done;
  }
  std::unique_ptr<Source> clone() override {
    return std::make_unique<StreamingSource>(bytes_, log_);
  }
  const std::string& uri() const override { return name_; }
  uint64_t bytes_read() const override { return 0; }
  bool prefers_long_reads() const override { return true; }

 private:
  std::shared_ptr<const std::string> bytes_;
  std::shared_ptr<StreamLog> log_;
  int handle_;
  std::string name_ = "<streaming>";
};

std::shared_ptr<const std::string> model_bytes(const test::Model& m) {
  test::TempDir dir;
  auto w = Writer::open(dir.path("m.tensors"));
  w->write(m.requests);
  w->close();
  return std::make_shared<const std::string>(test::read_file(dir.path("m.tensors")));
}

// How many long reads a load makes, from what the open's first read took (worker_pool.h).
TEST(StreamedLoadTest, SharesAreAsManyAsPayForTheirRequest) {
  EXPECT_EQ(paying_shares(981'528'576, 0.46), 1);  // moto: its whole-object copy per request
  EXPECT_EQ(paying_shares(981'528'576, 0.65), 1);
  EXPECT_GE(paying_shares(1'000'000'000, 0.0005), 8);  // loopback nginx: every worker
  EXPECT_EQ(paying_shares(1'000'000'000, 0.05), 10);   // a real object store's first byte
  EXPECT_EQ(paying_shares(100'000, 0.05), 1);
  EXPECT_GT(paying_shares(1, 0), 1'000'000);  // not measured: no bound
}

TEST(StreamedLoadTest, IdleWorkersTakeOverTheSlowShareAndNoByteIsReadTwice) {
  const test::Model m = test::make_model(64 << 20);
  auto bytes = model_bytes(m);
  auto log = std::make_shared<StreamLog>();
  auto reader = Reader::open(std::make_unique<StreamingSource>(bytes, log));
  LoadOptions lo;
  lo.num_workers = 4;
  auto buffers = test::load_entries(*reader, lo);
  for (size_t i = 0; i < m.data.size(); ++i) EXPECT_TRUE(buffers[i] == m.data[i]) << i;
  uint64_t data = 0;
  for (size_t i = 0; i < m.data.size(); ++i) data += reader->entries()[i].data_length;
  std::lock_guard<std::mutex> lock(log->mu);
  uint64_t streamed = 0;
  for (uint64_t b : log->bytes_by_handle) streamed += b;
  // Every tensor byte once (plus the tensor headers), never twice.
  EXPECT_GE(streamed, data);
  EXPECT_LT(streamed, data + 64 * 1024);
  // The slow read started with the first quarter and kept well under it: the others took over.
  EXPECT_TRUE(log->slow_taken);
  EXPECT_LT(log->slow_read_bytes, 12u << 20);
  EXPECT_GT(log->long_reads, 4u);  // one per worker, and more for the shares taken over
}

TEST(StreamedLoadTest, VerifiedAndUnverifiedLoadsAreExactWithOneAndManyWorkers) {
  const test::Model m = test::make_model(9 << 20);
  auto bytes = model_bytes(m);
  for (bool verify : {false, true})
    for (int workers : {1, 3, 8}) {
      SCOPED_TRACE(std::to_string(verify) + " " + std::to_string(workers));
      auto log = std::make_shared<StreamLog>();
      log->slow_first_share = false;
      auto reader = Reader::open(std::make_unique<StreamingSource>(bytes, log));
      LoadOptions lo;
      lo.num_workers = workers;
      lo.verify_hash = verify;
      auto buffers = test::load_entries(*reader, lo);
      for (size_t i = 0; i < m.data.size(); ++i) EXPECT_TRUE(buffers[i] == m.data[i]) << i;
    }
}

TEST(StreamedLoadTest, AFlippedByteIsAHashMismatch) {
  const test::Model m = test::make_model(9 << 20);
  auto good = model_bytes(m);
  std::string bad = *good;
  const IndexEntry big = Reader::open(make_memory_source(good))->entries()[2];
  bad[big.data_offset + 5'000'000] ^= 1;
  auto log = std::make_shared<StreamLog>();
  log->slow_first_share = false;
  auto reader =
      Reader::open(std::make_unique<StreamingSource>(std::make_shared<std::string>(bad), log));
  LoadOptions lo;
  lo.num_workers = 4;
  lo.verify_hash = true;
  EXPECT_EQ(test::error_code_of([&] { test::load_entries(*reader, lo); }),
            ErrorCode::kHashMismatch);
}

TEST(StreamedLoadTest, AFailingReadEndsTheLoadWithItsErrorAndNoWorkerHangs) {
  const test::Model m = test::make_model(32 << 20);
  auto bytes = model_bytes(m);
  auto log = std::make_shared<StreamLog>();
  log->slow_first_share = false;
  log->fail_after = 10 << 20;
  auto reader = Reader::open(std::make_unique<StreamingSource>(bytes, log));
  LoadOptions lo;
  lo.num_workers = 4;
  try {
    test::load_entries(*reader, lo);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIO);
    EXPECT_NE(std::string(e.what()).find("connection reset (test)"), std::string::npos) << e.what();
  }
}

// A safetensors tensor of no elements has no bytes at all: loading it alone streams nothing and
// must still finish (once, this loop never ended), and so must a load of it with others.
TEST(StreamedLoadTest, TensorsOfNoBytesFinishWithoutARead) {
  const std::string header = R"({"empty":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
                             R"("w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})";
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  file += header + "abcd";
  auto bytes = std::make_shared<const std::string>(file);
  auto log = std::make_shared<StreamLog>();
  log->slow_first_share = false;
  auto reader = Reader::open(std::make_unique<StreamingSource>(bytes, log));
  const size_t empty = *reader->find("empty"), w = *reader->find("w");
  char sink = 0, out[4] = {};
  reader->load({{empty, &sink}});
  reader->load({{empty, &sink}, {w, out}});
  EXPECT_EQ(std::string(out, 4), "abcd");
}

}  // namespace
}  // namespace tensorizer
