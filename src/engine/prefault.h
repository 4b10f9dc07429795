// Faulting in fresh destination memory on a thread of its own while a remote load fills it
// (internal header).
//
// A remote load's receivers copy each arriving buffer into fresh anonymous memory, and on this
// kind of machine the page faults of that first touch cost as much as the copy; the receivers
// pay them between reads of their sockets. Where the transfer leaves the CPU idle (a server's
// first-byte wait, one connection to a slow server), a thread that maps the pages ahead of them
// takes that cost off the receiving path. Pages are mapped with MADV_POPULATE_WRITE, which never
// changes their contents, so it may run over bytes a receiver has already written.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>

namespace tensorizer::engine {

class BackgroundPrefault {
 public:
  // Starts mapping [data, data + size) in order; does nothing where the kernel lacks
  // MADV_POPULATE_WRITE (before 5.14).
  BackgroundPrefault(uint8_t* data, size_t size);
  // Stops at the next piece and joins.
  ~BackgroundPrefault();
  BackgroundPrefault(const BackgroundPrefault&) = delete;
  BackgroundPrefault& operator=(const BackgroundPrefault&) = delete;

  // Bytes mapped so far (tests).
  size_t done() const { return done_.load(std::memory_order_relaxed); }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<size_t> done_{0};
  std::thread thread_;
};

}  // namespace tensorizer::engine
