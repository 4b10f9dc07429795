// Fork/join over a list of work items, for every layer (internal header): N threads (the caller is
// one of them) take items in order; the first exception stops every worker from taking new items
// and is rethrown to the caller once all have stopped. Workers inherit the caller's CancelToken
// (tensorizer/cancel.h) and check it before each item.
#pragma once

#include <cstddef>
#include <cstdint>
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
// (Source::preferred_readers(), when positive), else one per usable core. Readers of a Source go
// through readers_for() (tensorizer/transport.h), which also keeps to Source::max_readers().
int default_workers(int requested, int source_preferred = 0);

// How many long reads of `bytes` in all pay for themselves when one request costs
// `request_seconds` (a first small read's time): each should carry at least 2 GB per second of
// that wait, i.e. stream for about eight waits at 250 MB/s, one connection's pace on real object
// stores (a 1 GB object with 30-60 ms first bytes still gets 8). Loopback nginx (a wait under a
// millisecond) gets every worker; moto, whose every request copies the whole object first (about
// 0.47 s per GB) while its other transfers stall, gets one: two shares loaded 0.98 GB at
// 0.28-0.31 GB/s, one at 0.70-0.84. At least 1; a wait of 0 (not measured) puts no bound.
int paying_shares(uint64_t bytes, double request_seconds);

}  // namespace tensorizer
