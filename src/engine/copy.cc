// copy_object: streams one object from any Source to any Sink (tensorizer cp, to_redis).
//
// The object is cut into chunks (16 MiB, or the source's preferred read size) handed to `workers`
// threads, each with its own clone of the source and one chunk buffer, writing at the same offsets
// into the sink (which takes concurrent writes of disjoint ranges). Memory: workers x chunk,
// whatever the object size.
// The sink is committed only when every byte arrived; on any error it is aborted.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "tensorizer/error.h"
#include "tensorizer/transport.h"

namespace tensorizer {

uint64_t copy_object(const std::string& src, const std::string& dst,
                     const TransportOptions& options, int workers,
                     const std::function<void(uint64_t, uint64_t)>& progress) {
  std::unique_ptr<Source> source = open_source(src, options);
  const uint64_t chunk =
      source->preferred_read_bytes() ? source->preferred_read_bytes() : 16ull << 20;
  const uint64_t size = source->size();
  std::unique_ptr<Sink> sink = open_sink(dst, options);
  try {
    sink->reserve(size);
    const uint64_t chunks = (size + chunk - 1) / chunk;
    if (workers <= 0)
      workers = source->preferred_readers() > 0 ? std::min(source->preferred_readers(), 8) : 4;
    workers = static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(workers, chunks)));
    std::atomic<uint64_t> next{0}, done{0};
    std::atomic<int> running{workers};
    std::mutex mu;
    std::condition_variable finished;
    std::exception_ptr error;
    auto work = [&](Source* s) {
      std::unique_ptr<char[]> buf(
          new char[static_cast<size_t>(std::min(chunk, std::max<uint64_t>(size, 1)))]);
      for (;;) {
        const uint64_t i = next.fetch_add(1);
        if (i >= chunks) break;
        {
          std::lock_guard<std::mutex> lock(mu);
          if (error) break;
        }
        try {
          const uint64_t off = i * chunk, len = std::min(chunk, size - off);
          s->read_at(off, buf.get(), static_cast<size_t>(len));
          sink->write_at(off, buf.get(), static_cast<size_t>(len));
          done += len;
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!error) error = std::current_exception();
          break;
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      if (--running == 0) finished.notify_all();
    };
    std::vector<std::unique_ptr<Source>> clones;
    std::vector<std::thread> threads;
    for (int i = 1; i < workers; ++i) clones.push_back(source->clone());
    for (auto& c : clones) threads.emplace_back(work, c.get());
    std::thread self(work, source.get());
    // Progress from the calling thread while the workers run.
    for (;;) {
      std::unique_lock<std::mutex> lock(mu);
      if (finished.wait_for(lock, std::chrono::milliseconds(250),
                            [&] { return running.load() == 0; }))
        break;
      lock.unlock();
      if (progress) progress(done.load(), size);
    }
    self.join();
    for (auto& t : threads) t.join();
    if (error) std::rethrow_exception(error);
    sink->commit();
    if (progress) progress(size, size);
  } catch (...) {
    sink->abort();
    throw;
  }
  return size;
}

}  // namespace tensorizer
