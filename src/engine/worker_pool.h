// Fork/join over a list of work items (internal header): N threads (the caller is one of them)
// take items in order; the first exception stops every worker from taking new items and is
// rethrown to the caller once all have stopped.
#pragma once

#include <cstddef>
#include <functional>

namespace tensorizer::engine {

// Runs `item(i)` for every i in [0, count) on min(workers, count) threads (at least one).
void parallel_for(size_t count, int workers, const std::function<void(size_t)>& item);

// The worker count for a request of `requested` (0: one per usable core).
int default_workers(int requested);

}  // namespace tensorizer::engine
