// Host memory mapped while a remote open waits for its first answer (see warm_block.h).
#include "engine/warm_block.h"

#include <optional>
#include <string>

#include "common/available_memory.h"
#include "engine/prefault.h"
#include "tensorizer/cancel.h"
#include "tensorizer/error.h"

namespace tensorizer::engine {

WarmBlock::WarmBlock(Source& source, uint64_t limit) {
  thread_ = std::thread([this, &source, limit] { run(source, limit); });
}

WarmBlock::~WarmBlock() {
  stop();
  if (thread_.joinable()) thread_.join();
}

void WarmBlock::first_response_arrived() {
  std::lock_guard<std::mutex> lock(mu_);
  answered_ = true;
  cv_.notify_all();
}

void WarmBlock::stop() {
  std::lock_guard<std::mutex> lock(mu_);
  stop_.store(true, std::memory_order_relaxed);
  asking_cancel_.cancel();  // a size request still out returns within a poll (100 ms)
  cv_.notify_all();
}

void WarmBlock::run(Source& source, uint64_t limit) {
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_for(lock, kAskAfter, [&] { return answered_ || stop_.load(); })) return;
    asking_ = true;
  }
  std::optional<uint64_t> size;
  {
    CancelScope scope(&asking_cancel_);
    size = source.size_without_body();
  }
  std::shared_ptr<HostBlock> block;
  if (size && *size > 0 && *size <= limit && !stop_.load()) {
    try {
      block = HostBlock::anonymous(*size);
    } catch (const Error&) {  // no room: the load allocates (and reports) as it would have
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    asking_ = false;
    if (!block || stop_.load()) return;
    block_ = block;
    block_bytes_ = *size;
  }
  populate_pages(block->data(), *size, PageAccess::kWrite, stop_, mapped_);
}

std::shared_ptr<HostBlock> WarmBlock::take(size_t size) {
  stop();
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Still waiting for the size: the load goes on without it (the destructor joins).
    if (asking_) return nullptr;
  }
  if (thread_.joinable()) thread_.join();  // stops at its next piece (a few MiB)
  if (block_ && size <= block_bytes_) return std::move(block_);
  block_.reset();
  return nullptr;
}

uint64_t warm_block_limit() { return available_memory_bytes() / 2; }

}  // namespace tensorizer::engine
