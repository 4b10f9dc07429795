// Host memory mapped while a remote open waits for the server's first byte (internal header).
//
// A remote load writes into fresh anonymous memory, and the first touch of each fresh page costs
// its zeroing and, on a VM that backs memory lazily, a host fault: about 0.35 s per GB, paid by
// the thread that receives the bytes. A server slow to start its answer (moto takes ~0.5 s before
// the first byte of a 1 GB object) leaves the CPU idle meanwhile. So when the caller will load
// every tensor to host memory (ReaderOptions::expect_host_load), the open starts a WarmBlock: if
// the first response has not come within kAskAfter, it asks the object's size by a request without
// body (Source::size_without_body: HEAD), allocates a block that large and maps it (like
// BackgroundPrefault) until the load takes it (load_to_host's copied route) or the reader goes. A
// server that answers at once costs nothing: no request, no memory.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/host_block.h"
#include "tensorizer/cancel.h"
#include "tensorizer/reader.h"
#include "tensorizer/transport.h"

namespace tensorizer::engine {

class WarmBlock {
 public:
  // A first answer later than this is a slow one, worth a HEAD: small objects on moto come within
  // ~10 ms, a 1 GB one after ~500 ms (the object copied first), which leaves 450 ms to map it in.
  static constexpr std::chrono::milliseconds kAskAfter{50};

  // Starts the thread; `source` must outlive this object. `limit`: the largest block it may map
  // (a share of the memory available; a bigger object gets none).
  WarmBlock(Source& source, uint64_t limit);
  // Stops mapping at the next piece and frees the block unless it was taken.
  ~WarmBlock();
  WarmBlock(const WarmBlock&) = delete;
  WarmBlock& operator=(const WarmBlock&) = delete;

  // The first response has come: a size not asked for yet is not asked at all.
  void first_response_arrived();
  // Stops the thread and hands over the block when it holds at least `size` bytes (the rest of
  // its pages mapped by whoever writes them), else nullptr; once only.
  std::shared_ptr<HostBlock> take(size_t size);
  // Bytes mapped so far (tests, diagnostics).
  uint64_t mapped_bytes() const { return mapped_.load(std::memory_order_relaxed); }

 private:
  void run(Source& source, uint64_t limit);
  void stop();

  std::mutex mu_;
  std::condition_variable cv_;
  bool answered_ = false;  // first_response_arrived()
  bool asking_ = false;    // the size request is out
  CancelToken asking_cancel_;
  std::atomic<bool> stop_{false};
  std::atomic<size_t> mapped_{0};
  std::shared_ptr<HostBlock> block_;  // set by the thread under mu_, taken after it joined
  uint64_t block_bytes_ = 0;          // the object's size: the block's usable bytes
  std::thread thread_;
};

// The warm block of `reader` (opened with expect_host_load) when it holds at least `size` bytes,
// else nullptr: WarmBlock::take, once; host_bytes_premapped() then says how much of it was mapped.
std::shared_ptr<HostBlock> take_warm_block(Reader& reader, size_t size);

// The memory available to this process to warm: half of what the kernel counts available.
uint64_t warm_block_limit();

}  // namespace tensorizer::engine
