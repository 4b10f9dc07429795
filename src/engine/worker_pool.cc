// Fork/join with first-error-wins (see worker_pool.h).
#include "engine/worker_pool.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "tensorizer/reader.h"

namespace tensorizer::engine {

void parallel_for(size_t count, int workers, const std::function<void(size_t)>& item) {
  if (count == 0) return;
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::exception_ptr error;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < count;) {
      try {
        item(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        next = count;
        return;
      }
    }
  };
  const size_t n = std::min<size_t>(count, static_cast<size_t>(std::max(workers, 1)));
  std::vector<std::thread> threads;
  threads.reserve(n - 1);
  for (size_t i = 1; i < n; ++i) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

int default_workers(int requested) { return requested > 0 ? requested : usable_cores(); }

}  // namespace tensorizer::engine
