// Mapping fresh destination memory before bytes are written into it (internal header).
//
// A load writes each arriving buffer into its destination, often fresh anonymous memory (a block
// the engine or torch just allocated). Writing a fresh page traps into the kernel, which maps it;
// on a VM that trap costs about 1 us more than mapping the same page in a batch (measured: 1 GB
// copied into fresh memory in 0.57-0.78 s, or 0.33-0.36 s mapped 2 MiB at a time first with
// MADV_POPULATE_WRITE). So the workers map each piece of their destinations before writing it
// (map_ahead_of_write), and a remote load, whose workers first wait for the server's first byte,
// maps its destinations during that wait (BackgroundPrefault). MADV_POPULATE_WRITE never changes
// contents, so either may run over bytes already written. A mapped load's file mapping is mapped
// the same way, read-only (MADV_POPULATE_READ), while the caller builds its tensors.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <thread>
#include <utility>
#include <vector>

namespace tensorizer::engine {

// Maps the whole pages of [data, data + size) ahead of a write into them, when the first of them
// is not mapped yet, with one MADV_POPULATE_WRITE. Memory already mapped, not this process's
// (device memory) or too small to matter is left alone.
void map_ahead_of_write(void* data, size_t size);

enum class PageAccess { kWrite, kRead };  // MADV_POPULATE_WRITE / MADV_POPULATE_READ

// Maps the whole pages of [data, data + size) in pieces of a few MiB, until all are mapped or
// `stop` is set, adding each piece's bytes to `done`; stops early where the kernel lacks
// MADV_POPULATE_* (before 5.14) or the memory is not this process's.
void populate_pages(uint8_t* data, size_t size, PageAccess access, const std::atomic<bool>& stop,
                    std::atomic<size_t>& done);

class BackgroundPrefault {
 public:
  using Access = PageAccess;
  // Starts mapping the whole pages of each range (data, size), in order; does nothing where the
  // kernel lacks MADV_POPULATE_* (before 5.14). kRead maps file pages without copying them.
  explicit BackgroundPrefault(const std::vector<std::pair<uint8_t*, size_t>>& ranges,
                              Access access = Access::kWrite);
  // Stops at the next piece and joins.
  ~BackgroundPrefault();
  BackgroundPrefault(const BackgroundPrefault&) = delete;
  BackgroundPrefault& operator=(const BackgroundPrefault&) = delete;

  // Asks the thread to stop at the next piece (bytes are arriving: the workers map ahead of
  // themselves from now on, and this thread would only compete with them for the CPU).
  void stop() { stop_.store(true, std::memory_order_relaxed); }
  // Bytes mapped so far (tests).
  size_t done() const { return done_.load(std::memory_order_relaxed); }
  // Whether the thread has ended (or none was started): wait() then returns at once.
  bool finished() const { return finished_.load(std::memory_order_acquire); }
  // Waits until every range is mapped (or the thread stopped).
  void wait() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::atomic<size_t> done_{0};
  std::atomic<bool> finished_{false};
  std::thread thread_;
};

}  // namespace tensorizer::engine
