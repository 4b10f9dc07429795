// Fork/join over a list of work items, for every layer (internal header): N threads (the caller is
// one of them) take items in order; the first exception stops every worker from taking new items
// and is rethrown to the caller once all have stopped. Workers inherit the caller's CancelToken
// (tensorizer/cancel.h) and check it before each item.
#pragma once

#include <cstddef>
#include <functional>

namespace tensorizer {

// Runs `item(i)` for every i in [0, count) on min(workers, count) threads (at least one).
void parallel_for(size_t count, int workers, const std::function<void(size_t)>& item);

// The same, telling each call which worker runs it (0 is the caller; below min(workers, count)),
// for per-worker state: a connection, a source clone, a staging buffer.
void parallel_for_workers(size_t count, int workers,
                          const std::function<void(size_t item, int worker)>& item);

// Usable CPU cores of this process (affinity and cgroup quota aware), at least 1; also declared
// in the public tensorizer/reader.h.
int usable_cores();

// The one rule for worker counts: `requested` when positive, else what the source serves best
// (Source::preferred_readers(), when positive), else one per usable core.
int default_workers(int requested, int source_preferred = 0);

}  // namespace tensorizer
