// Writer: lays out, hashes and writes tensors into a Sink (see tensorizer/writer.h).
#include "tensorizer/writer.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <numeric>
#include <thread>

#include "codec/bytes.h"
#include "codec/path_rules.h"
#include "common/worker_pool.h"
#include "crypto/tensor_crypto.h"
#include "engine/write_planner.h"
#include "tensorizer/error.h"
#include "tensorizer/hash.h"

namespace tensorizer {
namespace {

// Hash then write in blocks that stay in a core's L2 cache: the second hash and the kernel's copy
// into the page cache read the block from cache, not memory.
constexpr uint64_t kHashPieceBytes = 1ull << 20;
// Writes cover whole 2 MiB pages of the file where they can: the page cache then holds 2 MiB
// folios, which a later mapping of the file (mmap=True, safetensors-style readers) maps with one
// page-table entry each instead of 512 (60x less time to map a freshly written file here).
constexpr uint64_t kWriteAlignBytes = 2ull << 20;
// A worker that finds the file busy keeps hashing; past this many unwritten bytes it waits.
constexpr uint64_t kMaxDeferredBytes = 8ull << 20;
constexpr uint64_t kSealTaskChunks = 4;  // encrypted writes: 2 MiB chunks per task (8 MiB)

using Planned = engine::PlannedWrite;

// Re-throws a failure of a parallel write naming the tensor and the sink.
[[noreturn]] void throw_write_error(const Planned& p, const Sink& sink, const Error& err) {
  throw Error(err.code(), "writing tensor '" + display_path(p.entry.path).substr(0, 200) +
                              "' to '" + sink.uri() + "': " + err.what());
}

// The bytes a header's hashes cover before the data: hash values are still zero here; the
// crypt-info field (u64 + body) is cut out (docs/format.md §1.6 step 3).
std::string hashable_bytes(const EncodedTensorHeader& h) {
  if (h.crypt_info_offset == std::string::npos) return h.bytes;
  std::string out = h.bytes;
  const uint64_t c = codec::load_le<uint64_t>(h.bytes.data() + h.crypt_info_offset - 8);
  out.erase(h.crypt_info_offset - 8, 8 + c);
  return out;
}

std::unique_ptr<TensorHasher> make_hasher(const EncodedTensorHeader& h) {
  const bool crc = h.crc32_offset != std::string::npos, sha = h.sha256_offset != std::string::npos;
  if (!crc && !sha) return nullptr;
  return std::make_unique<TensorHasher>(crc, sha, hashable_bytes(h));
}

}  // namespace

struct Writer::Impl {
  std::unique_ptr<Sink> sink;
  WriterOptions options;
  FileHeader header;
  std::vector<IndexEntry> entries;
  codec::PathRules paths;
  uint64_t cursor = 0;  // end of the last tensor's data
  bool started = false;
  bool closed = false;
  bool failed = false;

  crypto::NonceRegistry nonces;  // no (key, nonce) pair is used twice in this file

  void sync();
  void write_tensors(std::vector<Planned>& batch);
  void write_encrypted(std::vector<Planned>& batch);
  void write_streamed_data(Planned& p, const Writer::Producer& produce);
  void finish_header(Planned& p, TensorHasher* hasher, const crypto::TensorEncryptor* enc);
  int worker_count(size_t tasks) const {
    int n = default_workers(options.num_workers);
    return std::max(1, std::min<int>(n, static_cast<int>(std::max<size_t>(tasks, 1))));
  }
};

Writer::Writer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Writer::~Writer() {
  if (!impl_->closed) {
    try {
      // Destroyed by an exception unwinding the stack: the caller never finished, publish nothing.
      if (impl_->failed || std::uncaught_exceptions() > 0)
        abort();
      else
        close();
    } catch (...) {
      // A destructor must not throw; the sink's own destructor discards what is left.
    }
  }
}

std::unique_ptr<Writer> Writer::open(const std::string& uri, const WriterOptions& options) {
  return open(open_sink(uri, options.transport), options);
}

std::unique_ptr<Writer> Writer::open(std::unique_ptr<Sink> sink, const WriterOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->sink = std::move(sink);
  impl->options = options;
  impl->header.version = 1;
  if (options.encryption) {
    // Version 3 (4 with the flag once a meta tensor needs it): a crypt-info field in every header.
    impl->header.version = kEncryptionVersion;
    impl->header.flags |= kFlagEncrypted;
  }
  return std::unique_ptr<Writer>(new Writer(std::move(impl)));
}

const FileHeader& Writer::header() const { return impl_->header; }
const std::string& Writer::uri() const { return impl_->sink->uri(); }

void Writer::write(const std::vector<WriteRequest>& tensors) { write_batch(tensors, nullptr); }

void Writer::write_streamed(const WriteRequest& tensor, const Producer& produce) {
  write_batch({tensor}, &produce);
}

void Writer::write_batch(const std::vector<WriteRequest>& tensors, const Producer* produce) {
  Impl& w = *impl_;
  if (w.closed)
    fail(ErrorCode::kInvalidArgument, "write to a closed writer ('" + w.sink->uri() + "')");
  if (w.failed) fail(ErrorCode::kIO, "an earlier write to '" + w.sink->uri() + "' failed");
  if (tensors.empty()) return;

  // Validate and lay out everything before touching the sink.
  engine::WritePlan plan =
      engine::plan_writes(tensors, {w.header, w.entries, w.paths, w.started, w.cursor}, w.options,
                          produce != nullptr, w.sink->uri());
  std::vector<Planned>& batch = plan.tensors;

  // Hash and write (parallel), then publish the new index and header.
  try {
    if (!w.started) w.sink->reserve(plan.end + 8);
    w.started = true;
    w.header = plan.header;
    if (produce)
      w.write_streamed_data(batch[0], *produce);
    else if (w.options.encryption)
      w.write_encrypted(batch);
    else
      w.write_tensors(batch);
    for (auto& p : batch) {
      w.paths.add(
          p.entry.path, [] { return std::string("tensor"); }, ErrorCode::kInvalidArgument);
      w.header.tensor_size += p.entry.data_length;
      w.entries.push_back(std::move(p.entry));
    }
    w.header.tensor_count = w.entries.size();
    w.cursor = plan.end;
    w.sync();
  } catch (...) {
    w.failed = true;
    throw;
  }
}

void Writer::Impl::write_tensors(std::vector<Planned>& batch) {
  std::mutex file_mu;  // held while a worker writes to the sink
  // Largest tensors first: the last tensors the workers take are then small, so no worker is left
  // hashing a large tensor (SHA-256 is sequential) while the others idle.
  std::vector<size_t> order(batch.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return batch[a].entry.data_length > batch[b].entry.data_length;
  });
  parallel_for(batch.size(), default_workers(options.num_workers), [&](size_t i) {
    Planned& p = batch[order[i]];
    try {
      const auto* data = static_cast<const uint8_t*>(p.request->data);
      const uint64_t len = p.entry.data_length;
      std::unique_ptr<TensorHasher> hasher = make_hasher(p.header);
      // Hash pieces end at 1 MiB file offsets; writes gather them up to 2 MiB file boundaries.
      // One worker writes at a time (the kernel's file lock would have the other spin): a
      // worker that finds the file busy hashes on and writes the longer run later.
      const uint64_t base = p.entry.data_offset;
      uint64_t written = 0;
      for (uint64_t off = 0; off < len;) {
        const uint64_t n = std::min(kHashPieceBytes - (base + off) % kHashPieceBytes, len - off);
        if (hasher) hasher->update(data + off, n);
        off += n;
        if (off < len && (base + off) % kWriteAlignBytes != 0) continue;
        std::unique_lock<std::mutex> lock(file_mu, std::defer_lock);
        if (off < len && off - written < kMaxDeferredBytes && !lock.try_lock()) continue;
        if (!lock.owns_lock()) lock.lock();
        sink->write_at(base + written, data + written, off - written);
        written = off;
      }
      std::lock_guard<std::mutex> lock(file_mu);
      finish_header(p, hasher.get(), nullptr);
    } catch (const Error& err) {
      throw_write_error(p, *sink, err);
    }
  });
}

// Patches the hash values and the CryptInfo into the header, then writes it.
void Writer::Impl::finish_header(Planned& p, TensorHasher* hasher,
                                 const crypto::TensorEncryptor* enc) {
  EncodedTensorHeader& h = p.header;
  if (hasher) {
    hasher->finish();
    if (h.crc32_offset != std::string::npos)
      codec::store_le<uint32_t>(h.bytes.data() + h.crc32_offset, hasher->crc32());
    if (h.sha256_offset != std::string::npos)
      std::memcpy(h.bytes.data() + h.sha256_offset, hasher->sha256().data(), 32);
  }
  if (enc) {
    const std::string info = enc->crypt_info();
    std::memcpy(h.bytes.data() + h.crypt_info_offset, info.data(), info.size());
  }
  sink->write_at(p.entry.header_offset, h.bytes.data(), h.bytes.size());
}

// Encrypted batch: tasks of up to kSealTaskChunks chunks run on all workers; each seals into its
// worker's staging buffer and writes from there (the caller's memory is only read). A tensor of
// several tasks has its own hashing task (the plaintext hash is sequential); the last task of a
// tensor to finish writes its header.
void Writer::Impl::write_encrypted(std::vector<Planned>& batch) {
  struct Job {
    std::unique_ptr<crypto::TensorEncryptor> enc;
    std::unique_ptr<TensorHasher> hasher;
    std::atomic<uint64_t> tasks_left{0};
  };
  struct Task {
    size_t tensor;
    bool hash;        // hash the whole plaintext (tensors with several tasks)
    uint64_t first;   // first chunk to seal
    uint64_t chunks;  // chunks to seal (0 for a pure hashing task)
  };
  const EncryptionParams& params = *options.encryption;
  std::vector<Job> jobs(batch.size());
  std::vector<Task> tasks;
  for (size_t t = 0; t < batch.size(); ++t) {
    const uint64_t len = batch[t].entry.data_length;
    jobs[t].hasher = make_hasher(batch[t].header);
    if (len == 0) {
      tasks.push_back({t, true, 0, 0});
      jobs[t].tasks_left = 1;
      continue;
    }
    jobs[t].enc = std::make_unique<crypto::TensorEncryptor>(params, len, nonces);
    const uint64_t chunks = jobs[t].enc->chunk_count();
    const bool separate_hash = chunks > kSealTaskChunks && jobs[t].hasher;
    if (separate_hash) tasks.push_back({t, true, 0, 0});
    for (uint64_t c = 0; c < chunks; c += kSealTaskChunks)
      tasks.push_back(
          {t, !separate_hash && jobs[t].hasher, c, std::min(kSealTaskChunks, chunks - c)});
    jobs[t].tasks_left = (chunks + kSealTaskChunks - 1) / kSealTaskChunks + (separate_hash ? 1 : 0);
  }

  const int workers = worker_count(tasks.size());
  std::vector<std::unique_ptr<uint8_t[]>> stagings(static_cast<size_t>(std::max(workers, 1)));
  parallel_for_workers(tasks.size(), workers, [&](size_t i, int worker) {
    std::unique_ptr<uint8_t[]>& staging = stagings[static_cast<size_t>(worker)];
    const Task& task = tasks[i];
    Planned& p = batch[task.tensor];
    Job& job = jobs[task.tensor];
    try {
      const auto* src = static_cast<const uint8_t*>(p.request->data);
      const uint64_t len = p.entry.data_length;
      if (task.hash && task.chunks == 0 && job.hasher && len > 0) job.hasher->update(src, len);
      for (uint64_t c = task.first; c < task.first + task.chunks; ++c) {
        if (!staging) staging.reset(new uint8_t[crypto::kChunkSize]);
        const uint64_t off = c * crypto::kChunkSize, n = std::min(crypto::kChunkSize, len - off);
        if (task.hash) job.hasher->update(src + off, n);  // the tensor's only task: in order
        job.enc->encrypt_chunk(c, src + off, staging.get(), n);
        sink->write_at(p.entry.data_offset + off, staging.get(), n);
      }
      if (job.tasks_left.fetch_sub(1) == 1) finish_header(p, job.hasher.get(), job.enc.get());
    } catch (const Error& err) {
      throw_write_error(p, *sink, err);
    }
  });
}

// One tensor whose bytes come from `produce`: hashed as they arrive; when encrypting, gathered
// into a staging buffer of two chunks per worker, sealed in place on all workers, then written.
void Writer::Impl::write_streamed_data(Planned& p, const Writer::Producer& produce) {
  const uint64_t len = p.entry.data_length;
  std::unique_ptr<TensorHasher> hasher = make_hasher(p.header);
  std::unique_ptr<crypto::TensorEncryptor> enc;
  if (options.encryption && len > 0)
    enc = std::make_unique<crypto::TensorEncryptor>(*options.encryption, len, nonces);
  const int workers = worker_count(SIZE_MAX);
  const uint64_t cap = enc ? std::min<uint64_t>(len, 2 * crypto::kChunkSize * workers) : 0;
  std::unique_ptr<uint8_t[]> staging(cap ? new uint8_t[cap] : nullptr);
  uint64_t received = 0, written = 0, filled = 0;
  auto flush = [&] {
    enc->encrypt_chunks(written / crypto::kChunkSize, staging.get(), staging.get(), filled,
                        workers);
    sink->write_at(p.entry.data_offset + written, staging.get(), filled);
    written += filled;
    filled = 0;
  };
  const std::string label =
      "tensor '" + display_path(p.entry.path).substr(0, 200) + "' to '" + sink->uri() + "'";
  try {
    Writer::Emit emit = [&](const void* data, size_t size) {
      if (size > len - received)
        fail(ErrorCode::kInvalidArgument,
             "more bytes were produced than the tensor's " + std::to_string(len));
      const auto* bytes = static_cast<const uint8_t*>(data);
      if (hasher) hasher->update(bytes, size);
      received += size;
      if (!enc) {
        sink->write_at(p.entry.data_offset + written, bytes, size);
        written += size;
        return;
      }
      while (size > 0) {
        const uint64_t n = std::min<uint64_t>(size, cap - filled);
        std::memcpy(staging.get() + filled, bytes, n);
        filled += n;
        bytes += n;
        size -= n;
        if (filled == cap) flush();
      }
    };
    produce(emit);
    if (received != len)
      fail(
          ErrorCode::kInvalidArgument,
          std::to_string(received) + " bytes were produced, the tensor has " + std::to_string(len));
    if (filled) flush();
    finish_header(p, hasher.get(), enc.get());
  } catch (const Error& err) {
    throw Error(err.code(), "writing " + label + ": " + err.what());
  }
}

void Writer::Impl::sync() {
  // Prelude and index in one write, then the end-of-tensors marker.
  std::string head = encode_file_header(header);
  const bool versioned = header.versioned_entries();
  for (const auto& e : entries) encode_index_entry(e, versioned, head);
  sink->write_at(0, head.data(), head.size());
  const uint64_t zero = 0;
  sink->write_at(cursor, &zero, sizeof zero);
}

void Writer::close() {
  Impl& w = *impl_;
  if (w.closed) return;
  if (w.failed)
    fail(ErrorCode::kIO, "cannot close '" + w.sink->uri() + "': an earlier write failed");
  try {
    if (!w.started) {
      // Nothing written: still produce a well-formed (empty) file, as the reference does.
      w.header.index_size = w.options.index_reserve;
      w.cursor = kPreludeSize + w.header.index_size;
      std::string zeros(w.header.index_size, '\0');
      w.sink->write_at(kPreludeSize, zeros.data(), zeros.size());
      w.started = true;
    }
    w.sync();
    if (w.sink->wants_parts()) w.sink->set_parts(object_parts(w.header, w.entries));
    w.sink->commit();
    w.closed = true;
  } catch (...) {
    w.failed = true;
    throw;
  }
}

void Writer::abort() {
  impl_->closed = true;
  impl_->sink->abort();
}

}  // namespace tensorizer
