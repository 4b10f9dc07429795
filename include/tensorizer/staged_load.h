// tensorizer/staged_load.h — load tensors into memory the CPU cannot write directly (GPU memory)
// through a bounded ring of staging buffers.
//
// Workers take read items in file order; each first takes a free staging slot, reads its item
// into it (O_DIRECT for a local file that is not in the page cache, else through the Source:
// page cache, HTTP, S3, Redis), decrypts and hashes it there, and enqueues asynchronous copies of
// its data pieces to the destinations on one of the backend's streams. The slot goes back to the
// ring with an event recorded after those copies, and is reused only once the event has passed.
// So reads, decryption and the bus overlap, and host memory stays at the ring size whatever the
// model size. Slots are taken in item order, which is what lets a piece wait (for its tensor's
// header, or for its turn to be hashed) without ever deadlocking.
//
// A CopyBackend moves the bytes: the CUDA runtime (loaded at run time, the library torch ships;
// builds and CPU-only machines need no CUDA), or host memcpy on worker threads, which runs the
// same pipeline on CPU (tests; loads into memory the caller owns anywhere).
//
// On any error the load stops taking items, waits for every copy in flight, frees the ring and
// throws Error naming the tensor and URI; the destinations' contents are then unspecified.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorizer/reader.h"

namespace tensorizer {

// A point in a stream's work: record() marks "everything enqueued on `stream` so far"; wait()
// blocks until that work has run. Recording again moves the mark.
class CopyEvent {
 public:
  virtual ~CopyEvent() = default;
  virtual void record(int stream) = 0;
  virtual void wait() = 0;
};

class CopyBackend {
 public:
  virtual ~CopyBackend() = default;
  virtual std::string name() const = 0;
  // Staging memory the backend copies from fastest (page-locked for CUDA), 4096-byte aligned.
  virtual void* alloc_staging(size_t bytes) = 0;
  virtual void free_staging(void* data, size_t bytes) noexcept = 0;
  // Called on a thread before it enqueues work or makes events (CUDA: makes the device current),
  // and after, to put back what the thread had (the caller's thread is one of the workers):
  // bind_thread returns what unbind_thread takes to restore it. Bindings nest.
  virtual int bind_thread() { return 0; }
  virtual void unbind_thread(int previous) noexcept { (void)previous; }
  virtual int streams() const = 0;
  // Enqueue, return at once; the work runs in order on `stream` (0 <= stream < streams()).
  virtual void copy_async(void* dst, const void* src, size_t size, int stream) = 0;
  virtual void zero_async(void* dst, size_t size, int stream) = 0;
  virtual std::unique_ptr<CopyEvent> make_event() = 0;
  // Waits for everything enqueued on every stream; throws the first error a copy met.
  virtual void synchronize() = 0;
};

// Copies with memcpy on one thread per stream, asynchronously like a GPU would; `delay_us` holds
// each copy back that long first (tests use it to make a premature slot reuse visible).
std::unique_ptr<CopyBackend> host_copy_backend(int streams = 2, int delay_us = 0);

// The CUDA runtime of this process (libcudart, found loaded or by name; TENSORIZER_CUDART names
// a path, or `library`), copying to device `device` on `streams` non-blocking streams. Throws
// Error(kUnsupported) naming what is missing when there is no usable runtime or device.
std::unique_ptr<CopyBackend> cuda_copy_backend(int device, int streams = 4,
                                               const std::string& library = "");

struct StagingOptions {
  // All staging buffers together. A slot holds the largest read item (items cover up to
  // min(item_bytes, ring_bytes / 4), a little more with neighbours or encryption chunks); the
  // ring has at least 2 slots, so a tiny ring_bytes is rounded up to two such slots.
  uint64_t ring_bytes = 256ull << 20;
  uint64_t item_bytes = 8ull << 20;
  bool direct_io = true;  // O_DIRECT for local files mostly not in the page cache
};

struct StagedLoadResult {
  uint64_t bytes_read = 0;
  std::vector<std::string> mismatches;  // with collect_mismatches
  size_t slots = 0;                     // staging buffers the ring had
  uint64_t staging_bytes = 0;           // their total size
  bool direct_io = false;               // whether reads bypassed the page cache
};

// Loads the tensors into the destinations (backend memory: device pointers for CUDA), through a
// staging ring. Meta tensors are zero-filled. Options as for Reader::load (verify_hash checks
// the bytes in staging, before they are copied out).
StagedLoadResult load_staged(Reader& reader, const std::vector<TensorDestination>& destinations,
                             CopyBackend& backend, const LoadOptions& options = {},
                             const StagingOptions& staging = {});

}  // namespace tensorizer
