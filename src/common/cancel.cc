// Cancel tokens and the per-thread scope the engine checks (see tensorizer/cancel.h).
#include "tensorizer/cancel.h"

#include <cstdio>

#include "tensorizer/error.h"

namespace tensorizer {
namespace {

thread_local const CancelToken* g_current = nullptr;

}  // namespace

void CancelToken::set_deadline(Clock::time_point at, double seconds, std::string what) {
  has_deadline_ = true;
  deadline_ = at;
  seconds_ = seconds;
  what_ = std::move(what);
}

bool CancelToken::fired() const noexcept {
  return cancelled_.load(std::memory_order_relaxed) || (has_deadline_ && Clock::now() >= deadline_);
}

void CancelToken::check() const {
  if (cancelled_.load(std::memory_order_relaxed)) fail(ErrorCode::kCancelled, "interrupted");
  if (has_deadline_ && Clock::now() >= deadline_) {
    char seconds[32];
    std::snprintf(seconds, sizeof seconds, "%g", seconds_);
    fail(ErrorCode::kDeadline, what_ + " did not finish within its deadline of " + seconds + " s");
  }
}

CancelScope::CancelScope(const CancelToken* token) : previous_(g_current) { g_current = token; }
CancelScope::~CancelScope() { g_current = previous_; }

const CancelToken* current_cancel_token() noexcept { return g_current; }

void check_cancelled() {
  if (g_current) g_current->check();
}

bool cancel_requested() noexcept { return g_current && g_current->fired(); }

}  // namespace tensorizer
