// tensorizer/writer.h — write tensors from memory into a .tensors object.
//
// Files are readable by tensorizer 2.11+: the lowest data version that fits (docs/format.md §1.3),
// CRC32 and SHA-256 per tensor exactly as the reference hashes them. Layout choices (README "Format
// decisions"): the index is sized on the first write to fit that batch (at least the reference's
// 256 KiB, so later single-tensor writes still fit), and tensor data starts on a 64-byte boundary
// (4096 for tensors of 1 MiB or more) using the filler bytes the format allows in headers.
//
// Output goes to a Sink: a local file is written under a temporary name and renamed into place
// on close(), so a crash never leaves a partial file at the final path. write() hashes and
// writes tensors on N worker threads; after each write() returns, the object is consistent.
// Thread-safety: one thread at a time per Writer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensorizer/crypto.h"
#include "tensorizer/format.h"
#include "tensorizer/transport.h"

namespace tensorizer {

struct WriteRequest {
  TensorPath path;
  TensorType type = TensorType::kStateDict;
  uint16_t module_idx = 0;
  std::string dtype;  // stored dtype string, e.g. "<f4" or dtype_string_for_torch(...)
  std::vector<uint64_t> shape;
  const void* data = nullptr;  // C-contiguous little-endian bytes (item size x elements)
  bool meta = false;           // shape only: no data is stored, the tensor loads as zeros
};

struct WriterOptions {
  TransportOptions transport;
  // Seal tensor data (docs/format.md §3): data version 3 (4 + flag with meta tensors), 2 MiB
  // chunks, sealed on all cores into staging buffers; the caller's memory is never modified.
  std::optional<EncryptionParams> encryption;
  uint64_t index_reserve = kReferenceIndexSize;  // minimum index bytes reserved on first write
  uint64_t alignment = 64;                       // data alignment for small tensors (1 = none)
  uint64_t large_alignment = 4096;  // data alignment for tensors of large_threshold or more
  uint64_t large_threshold = 1u << 20;
  int num_workers = 0;  // 0 = one per usable core
  bool hashes = true;   // store CRC32 + SHA-256 (SHA-256 only when encrypted)
};

class Writer {
 public:
  static std::unique_ptr<Writer> open(const std::string& uri, const WriterOptions& options = {});
  static std::unique_ptr<Writer> open(std::unique_ptr<Sink> sink,
                                      const WriterOptions& options = {});
  // Closes (publishes) the object if every write succeeded and close() was not called; discards it
  // if a write failed part-way, or when the Writer is destroyed by an exception unwinding the
  // stack.
  ~Writer();

  // Appends tensors. Validates everything before writing anything: a bad request (unsupported
  // dtype, duplicate or conflicting name, ...) throws without touching the object.
  void write(const std::vector<WriteRequest>& tensors);

  // Streaming write of ONE tensor whose bytes are not in memory as a whole (re-encoding a large
  // file with bounded memory, e.g. `tensorizer encrypt`). Same validation and layout as
  // write({tensor}) but `tensor.data` is ignored: `produce(emit)` must call emit(data, size) with
  // the tensor's plaintext bytes in order, data_length bytes in all (emit copies what it keeps).
  // Memory: about cores x 4 MiB when encrypting, nothing otherwise. If `produce` throws or emits
  // the wrong number of bytes, the write fails like any other.
  using Emit = std::function<void(const void* data, size_t size)>;
  using Producer = std::function<void(const Emit& emit)>;
  void write_streamed(const WriteRequest& tensor, const Producer& produce);
  // Final sync, then publishes the object at its final location.
  void close();
  // Discards the object; the final location keeps what it had.
  void abort();

  const FileHeader& header() const;
  uint64_t tensor_bytes() const { return header().tensor_size; }
  const std::string& uri() const;

 private:
  struct Impl;
  explicit Writer(std::unique_ptr<Impl> impl);
  void write_batch(const std::vector<WriteRequest>& tensors, const Producer* produce);
  std::unique_ptr<Impl> impl_;
};

// Copies the data of `requests` into one block of fresh engine memory (2 MiB pages advised, so a
// snapshot of a model faults in a few hundred pages, not hundreds of thousands) on `workers`
// threads (0: every usable core), and points each request at its copy: a snapshot that a later
// write() reads while the caller changes the originals (Python's background saves). Returns the
// block's owner: keep it until that write has returned. Meta requests are left alone.
std::shared_ptr<void> snapshot_data(std::vector<WriteRequest>& requests, int workers = 0);

}  // namespace tensorizer
