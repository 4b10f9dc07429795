// Engine calls that Ctrl-C can interrupt (and that a deadline can end), for the bindings.
//
// Python runs signal handlers only on the main thread, between bytecodes, so a long engine call
// made with the GIL released would sit through Ctrl-C until it finished. interruptible() runs the
// call on a helper thread instead, while the calling thread waits in 50 ms steps and, holding the
// GIL only for that moment, runs Python's signal handlers. When one raises (KeyboardInterrupt),
// the call's CancelToken fires, the engine stops its workers, closes its connections and removes
// partial outputs (tensorizer/cancel.h), and then the Python exception is raised here.
#pragma once

#include <nanobind/nanobind.h>

#include <chrono>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>

#include "tensorizer/cancel.h"

namespace tzpy {

// When a whole operation must end, and what to call it in the error.
struct Deadline {
  tensorizer::CancelToken::Clock::time_point at;
  double seconds = 0;
  std::string what;
};

// Runs `work()` without the GIL on a helper thread and returns its result; see above. Must be
// called with the GIL held. `work` may take the GIL itself (file-object sources do).
// `quick`: the call is known to take microseconds (a small read of a local file, as a lazy load
// of one tensor): it runs right here, without the GIL, since a helper thread would cost more than
// the work (about 60 us a call: 100,000 lazily loaded tensors spent 6 s starting threads).
template <typename F>
auto interruptible(F&& work, const std::optional<Deadline>& deadline = std::nullopt,
                   bool quick = false) {
  namespace nb = nanobind;
  using R = decltype(work());
  using Slot = std::conditional_t<std::is_void_v<R>, bool, std::optional<R>>;
  tensorizer::CancelToken token;
  if (deadline) token.set_deadline(deadline->at, deadline->seconds, deadline->what);
  if (quick) {
    nb::gil_scoped_release release;
    tensorizer::CancelScope scope(&token);
    return work();
  }
  Slot result{};
  std::exception_ptr error;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::unique_ptr<nb::python_error> raised;
  {
    nb::gil_scoped_release release;
    std::thread helper([&] {
      tensorizer::CancelScope scope(&token);
      try {
        if constexpr (std::is_void_v<R>) {
          work();
        } else {
          result.emplace(work());
        }
      } catch (...) {
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      cv.notify_all();
    });
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mu);
        if (cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return done; })) break;
      }
      if (raised) continue;  // cancelled: waiting for the work to stop
      nb::gil_scoped_acquire acquire;
      if (PyErr_CheckSignals() != 0) {
        raised = std::make_unique<nb::python_error>();  // takes the pending exception
        token.cancel();
      }
    }
    helper.join();
  }
  if (raised) throw nb::python_error(*raised);
  if (error) std::rethrow_exception(error);
  if constexpr (!std::is_void_v<R>) return std::move(*result);
}

}  // namespace tzpy
