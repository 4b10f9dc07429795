// Fork/join with first-error-wins and cancellation between items, and the usable core count
// (see worker_pool.h).
#include "common/worker_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <exception>
#include <fstream>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tensorizer/cancel.h"
#include "tensorizer/reader.h"

namespace tensorizer {

void parallel_for_workers(size_t count, int workers, const std::function<void(size_t, int)>& item) {
  if (count == 0) return;
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::exception_ptr error;
  const CancelToken* token = current_cancel_token();
  auto work = [&](int worker) {
    CancelScope scope(token);  // workers check the caller's token
    for (size_t i; (i = next.fetch_add(1)) < count;) {
      try {
        check_cancelled();
        item(i, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        next = count;
        return;
      }
    }
  };
  const int n =
      static_cast<int>(std::min<size_t>(count, static_cast<size_t>(std::max(workers, 1))));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(n - 1));
  for (int w = 1; w < n; ++w) threads.emplace_back(work, w);
  work(0);
  for (auto& t : threads) t.join();
  if (error) std::rethrow_exception(error);
}

void parallel_for(size_t count, int workers, const std::function<void(size_t)>& item) {
  parallel_for_workers(count, workers, [&](size_t i, int) { item(i); });
}

int usable_cores() {
  int n = static_cast<int>(std::thread::hardware_concurrency());
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
  std::ifstream f("/sys/fs/cgroup/cpu.max");
  std::string quota;
  uint64_t period = 0;
  if (f >> quota >> period && quota != "max" && period > 0) {
    uint64_t q = std::stoull(quota);
    n = std::min<int>(n, static_cast<int>((q + period - 1) / period));
  }
  return std::max(n, 1);
}

int default_workers(int requested, int source_preferred) {
  if (requested > 0) return requested;
  return source_preferred > 0 ? source_preferred : usable_cores();
}

int paying_shares(uint64_t bytes, double request_seconds) {
  constexpr double kShareBytesPerRequestSecond = 2e9;  // see worker_pool.h
  const double per_share = request_seconds * kShareBytesPerRequestSecond;
  if (per_share <= 0) return std::numeric_limits<int>::max();
  return static_cast<int>(std::clamp(static_cast<double>(bytes) / per_share, 1.0, 1e6));
}

}  // namespace tensorizer
