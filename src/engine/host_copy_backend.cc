// A CopyBackend that copies with memcpy on one thread per stream (see tensorizer/staged_load.h):
// the staged pipeline runs on CPU exactly as it does with a GPU, asynchronously, so that its
// ordering and slot reuse are tested where no GPU is; it also loads into any caller memory.
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <new>
#include <thread>

#include "tensorizer/error.h"
#include "tensorizer/staged_load.h"

namespace tensorizer {
namespace {

// One in-order queue of work run by its own thread.
class HostStream {
 public:
  HostStream() : thread_([this] { run(); }) {}
  ~HostStream() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void enqueue(std::function<void()> work) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(std::move(work));
      ++enqueued_;
    }
    cv_.notify_all();
  }
  void drain() {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t target = enqueued_;
    cv_.wait(lock, [&] { return done_ >= target; });
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      std::function<void()> work = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      work();
      lock.lock();
      ++done_;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t enqueued_ = 0, done_ = 0;
  bool stopping_ = false;
  std::thread thread_;
};

class HostEvent : public CopyEvent {
 public:
  explicit HostEvent(std::deque<HostStream>& streams) : streams_(streams) {}
  void record(int stream) override {
    uint64_t target;
    {
      std::lock_guard<std::mutex> lock(mu_);
      target = ++recorded_;
    }
    streams_[static_cast<size_t>(stream)].enqueue([this, target] {
      {
        std::lock_guard<std::mutex> lock(mu_);
        passed_ = std::max(passed_, target);
      }
      cv_.notify_all();
    });
  }
  void wait() override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return passed_ >= recorded_; });
  }

 private:
  std::deque<HostStream>& streams_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t recorded_ = 0, passed_ = 0;
};

class HostCopyBackend : public CopyBackend {
 public:
  HostCopyBackend(int streams, int delay_us) : delay_us_(delay_us) {
    for (int i = 0; i < std::max(streams, 1); ++i) streams_.emplace_back();
  }
  ~HostCopyBackend() override { synchronize(); }
  std::string name() const override { return "host"; }
  void* alloc_staging(size_t bytes) override {
    void* p = std::aligned_alloc(4096, (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096);
    if (!p)
      fail(ErrorCode::kIO, "out of memory for " + std::to_string(bytes) + " bytes of staging");
    return p;
  }
  void free_staging(void* data, size_t) noexcept override { std::free(data); }
  int streams() const override { return static_cast<int>(streams_.size()); }
  void copy_async(void* dst, const void* src, size_t size, int stream) override {
    at(stream).enqueue([this, dst, src, size] {
      hold_back();
      std::memcpy(dst, src, size);
    });
  }
  void zero_async(void* dst, size_t size, int stream) override {
    at(stream).enqueue([this, dst, size] {
      hold_back();
      std::memset(dst, 0, size);
    });
  }
  std::unique_ptr<CopyEvent> make_event() override { return std::make_unique<HostEvent>(streams_); }
  void synchronize() override {
    for (HostStream& s : streams_) s.drain();
  }

 private:
  HostStream& at(int stream) {
    if (stream < 0 || stream >= streams())
      fail(ErrorCode::kInvalidArgument, "stream " + std::to_string(stream) + " out of range");
    return streams_[static_cast<size_t>(stream)];
  }
  void hold_back() const {
    if (delay_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay_us_));
  }
  int delay_us_;
  std::deque<HostStream> streams_;  // deque: streams never move
};

}  // namespace

std::unique_ptr<CopyBackend> host_copy_backend(int streams, int delay_us) {
  return std::make_unique<HostCopyBackend>(streams, delay_us);
}

}  // namespace tensorizer
