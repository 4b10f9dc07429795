// tensorizer/cancel.h — stopping engine work early: Ctrl-C, a deadline, a server shutting down.
//
// A CancelToken is a flag (and an optional deadline) that another thread may set at any time.
// While a CancelScope holds it, the engine calls made on that thread, and the worker threads they
// start, check it between work items (a few MiB each), in hash loops, in network waits (polled
// every 100 ms) and in retry backoffs. Once it fires they stop, close what they opened, remove
// partial outputs and throw Error(kCancelled, "interrupted") or, past the deadline,
// Error(kDeadline, ...). Argon2id key derivation cannot be interrupted: the caller stops waiting
// for it, and it runs to its end (bounded by KdfLimits) on a thread of its own, then wipes itself.
#pragma once

#include <atomic>
#include <chrono>
#include <string>

namespace tensorizer {

class CancelToken {
 public:
  CancelToken() = default;
  CancelToken(const CancelToken&) = delete;
  CancelToken& operator=(const CancelToken&) = delete;

  void cancel() noexcept { cancelled_.store(true, std::memory_order_relaxed); }
  using Clock = std::chrono::steady_clock;
  // Work past `at` fails with kDeadline; the message names `what` (the operation) and `seconds`
  // (the deadline as the caller gave it).
  void set_deadline(Clock::time_point at, double seconds, std::string what);
  // Throws Error(kCancelled) once cancelled, Error(kDeadline) once past the deadline.
  void check() const;
  bool fired() const noexcept;

 private:
  std::atomic<bool> cancelled_{false};
  bool has_deadline_ = false;
  Clock::time_point deadline_{};
  double seconds_ = 0;
  std::string what_;
};

// Makes `token` the one this thread's engine calls check, for the scope's lifetime (scopes nest;
// the innermost wins). The engine's worker threads inherit the token of the thread that starts
// them.
class CancelScope {
 public:
  explicit CancelScope(const CancelToken* token);
  ~CancelScope();
  CancelScope(const CancelScope&) = delete;
  CancelScope& operator=(const CancelScope&) = delete;

 private:
  const CancelToken* previous_;
};

// The token this thread's engine calls check (null: none).
const CancelToken* current_cancel_token() noexcept;
// Throws as CancelToken::check for this thread's token; does nothing without one.
void check_cancelled();
// Whether this thread's token has fired (no throw).
bool cancel_requested() noexcept;

}  // namespace tensorizer
