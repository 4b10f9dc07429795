// The staged load pipeline (see tensorizer/staged_load.h): readers fill a ring of staging slots,
// decrypt and hash there, and hand the data pieces to a CopyBackend's streams.
#include "tensorizer/staged_load.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>

#include "common/worker_pool.h"
#include "crypto/tensor_crypto.h"
#include "engine/destinations.h"
#include "engine/direct_io.h"
#include "engine/read_planner.h"
#include "engine/verify_tensor.h"
#include "tensorizer/cancel.h"
#include "tensorizer/error.h"

namespace tensorizer {
namespace {

constexpr double kDirectIfResidentBelow = 0.5;  // O_DIRECT when less than this is cached
constexpr uint64_t kSlotAlignment = 4096;
constexpr int kMinDirectReads = 8;  // direct reads in flight, even on few cores
constexpr int kMaxDirectReads = 16;

uint64_t align_down(uint64_t v, uint64_t a) { return v / a * a; }
uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// One staging buffer; `event` follows the copies still reading from it.
struct Slot {
  uint8_t* data = nullptr;
  std::unique_ptr<CopyEvent> event;
  bool copies_pending = false;
};

// The staging buffers. Each slot's memory is allocated by the first worker that takes it (so a
// small load pins little, and pinning a large ring overlaps the first reads) and freed, after
// every stream drained, on destruction.
class StagingRing {
 public:
  StagingRing(CopyBackend& backend, size_t count, uint64_t slot_bytes)
      : backend_(backend), slot_bytes_(slot_bytes), slots_(count) {
    for (Slot& s : slots_) s.event = backend_.make_event();
  }
  ~StagingRing() {
    try {
      backend_.synchronize();  // no copy may still read a buffer being freed
    } catch (...) {
    }
    for (Slot& s : slots_)
      if (s.data) backend_.free_staging(s.data, slot_bytes_);
  }
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;
  std::vector<Slot>& slots() { return slots_; }
  // Gives `slot` its memory if it has none yet (on the worker that first takes it).
  void ready(Slot& slot) {
    if (!slot.data) slot.data = static_cast<uint8_t*>(backend_.alloc_staging(slot_bytes_));
  }

 private:
  CopyBackend& backend_;
  uint64_t slot_bytes_;
  std::vector<Slot> slots_;
};

// Binds a thread to the backend (CUDA: its device) for a scope.
class ThreadBinding {
 public:
  explicit ThreadBinding(CopyBackend& backend)
      : backend_(backend), previous_(backend.bind_thread()) {}
  ~ThreadBinding() { backend_.unbind_thread(previous_); }
  ThreadBinding(const ThreadBinding&) = delete;
  ThreadBinding& operator=(const ThreadBinding&) = delete;

 private:
  CopyBackend& backend_;
  int previous_;
};

// Thrown inside a worker that stops because another one failed.
struct Stopped {};

class StagedJob {
 public:
  StagedJob(Reader& r, const std::vector<TensorDestination>& dests, CopyBackend& backend,
            const LoadOptions& opt, const StagingOptions& staging)
      : r_(r),
        backend_(backend),
        opt_(opt),
        staging_(staging),
        dests_(dests),
        state_(dests.size()) {
    // An unversioned source: CRC32s checked, headers read again at the end (verify_tensor.h).
    if (!r_.source().versioned()) {
      recheck_headers_ = true;
      if (!opt_.verify_hash && !r_.encrypted()) opt_.verify_hash = crc_only_ = true;
    }
  }

  StagedLoadResult run() {
    const auto& index = r_.entries();
    std::sort(dests_.begin(), dests_.end(),
              [&](const TensorDestination& a, const TensorDestination& b) {
                return index[a.entry].header_offset < index[b.entry].header_offset;
              });
    // Every tensor may be split: pieces are hashed in order and decrypted in whole chunks.
    std::vector<engine::PlannedTensor> planned;
    for (const auto& d : dests_) {
      const IndexEntry& e = index[d.entry];
      planned.push_back({e.header_offset, e.header_size(), e.data_length, true});
    }
    engine::PlanOptions plan;
    // Items of at most a quarter of the ring: a slot holds the largest (up to twice the target),
    // so the ring keeps two or more slots within its size.
    plan.target_item_bytes =
        std::max(std::min(staging_.item_bytes, staging_.ring_bytes / 4), kSlotAlignment);
    plan.split_granularity = r_.encrypted() ? crypto::kChunkSize : kSlotAlignment;
    items_ = engine::plan_reads(planned, plan);

    open_direct_file();
    uint64_t slot_bytes = 0;
    for (const auto& item : items_) slot_bytes = std::max(slot_bytes, item.length);
    slot_bytes = align_up(slot_bytes + (direct_ ? 2 * direct_->alignment() : 0), kSlotAlignment);
    const size_t slot_count = std::min<size_t>(
        std::max<uint64_t>(2, staging_.ring_bytes / std::max<uint64_t>(slot_bytes, 1)),
        std::max<size_t>(items_.size(), 1));
    int workers = opt_.num_workers;
    if (workers <= 0 && direct_)
      workers = std::clamp(usable_cores(), kMinDirectReads, kMaxDirectReads);
    workers = readers_for(r_.source(), workers);
    workers = std::max(
        1, std::min({workers, static_cast<int>(slot_count), static_cast<int>(items_.size())}));

    StagedLoadResult result;
    result.slots = slot_count;
    result.staging_bytes = slot_count * slot_bytes;
    result.direct_io = direct_ != nullptr;
    if (items_.empty()) return result;
    const uint64_t before = r_.bytes_read();
    {
      ThreadBinding binding(backend_);
      StagingRing ring(backend_, slot_count, slot_bytes);
      for (Slot& s : ring.slots()) free_.push_back(&s);
      std::vector<std::unique_ptr<Source>> handles;  // a source per worker beyond the caller's
      if (!direct_)
        for (int i = 1; i < workers; ++i) handles.push_back(r_.source().clone());
      parallel_for_workers(static_cast<size_t>(workers), workers, [&](size_t, int w) {
        work(w == 0 || direct_ ? r_.source() : *handles[static_cast<size_t>(w) - 1], ring,
             w % backend_.streams());
      });
      if (!error_ && recheck_headers_) check_unchanged(handles);
      if (!error_) {
        try {
          backend_.synchronize();
        } catch (const Error& err) {
          error_ = std::current_exception();
        }
      }
    }  // the ring drains every stream and frees its buffers here, on success and failure alike
    if (error_) std::rethrow_exception(error_);
    result.bytes_read = r_.bytes_read() - before;
    result.mismatches = std::move(mismatches_);
    return result;
  }

 private:
  // Per requested tensor: whether its header has been adopted, and its in-order hash.
  struct TensorState {
    bool header_done = false;
    uint64_t hashed = 0;  // data bytes hashed so far
    std::unique_ptr<TensorHasher> hasher;
  };

  void check_unchanged(std::vector<std::unique_ptr<Source>>& handles) {
    try {
      parallel_for_workers(dests_.size(), 1 + static_cast<int>(handles.size()),
                           [&](size_t k, int w) {
                             Source& src = w == 0 ? r_.source() : *handles[w - 1];
                             const size_t entry = dests_[k].entry;
                             engine::check_header_unchanged(src, r_.uri(), r_.entries()[entry],
                                                            r_.loaded_info(entry)->raw_header());
                           });
    } catch (const Error&) {
      error_ = std::current_exception();
    }
  }

  void open_direct_file() {
    const int fd = r_.source().local_fd();
    if (!staging_.direct_io || fd < 0 || items_.empty()) return;
    const uint64_t begin = items_.front().offset, end = items_.back().offset + items_.back().length;
    if (engine::Residency(fd).fraction(begin, end - begin) >= kDirectIfResidentBelow) return;
    auto file = std::make_unique<engine::DirectFile>(fd);
    if (file->ok()) direct_ = std::move(file);
  }

  void work(Source& src, StagingRing& ring, int stream) {
    size_t current = 0;  // the tensor an error concerns
    try {
      ThreadBinding binding(backend_);
      for (;;) {
        size_t i;
        Slot* slot = take(i);
        if (!slot) return;
        current = items_[i].segments[0].tensor;
        check_cancelled();
        ring.ready(*slot);
        if (slot->copies_pending) slot->event->wait();
        run_item(src, items_[i], *slot, stream, current);
        slot->event->record(stream);
        slot->copies_pending = true;
        give_back(slot);
      }
    } catch (const Stopped&) {
    } catch (const Error& err) {
      record_error(err, current);
    } catch (const std::exception& err) {
      record_error(Error(ErrorCode::kIO, err.what()), current);
    }
  }

  // The oldest free slot and the next item, taken together in item order (so every earlier item
  // already holds a slot: waiting on it cannot deadlock); nullptr when done or stopped.
  Slot* take(size_t& item) {
    std::unique_lock<std::mutex> lock(mu_);
    slot_freed_.wait(lock, [&] { return cancelled_ || next_ >= items_.size() || !free_.empty(); });
    if (cancelled_ || next_ >= items_.size()) return nullptr;
    Slot* slot = free_.front();
    free_.pop_front();
    item = next_++;
    return slot;
  }

  void give_back(Slot* slot) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(slot);
    }
    slot_freed_.notify_one();
  }

  void run_item(Source& src, const engine::ReadItem& item, Slot& slot, int stream,
                size_t& current) {
    const uint8_t* p = slot.data;
    if (direct_) {
      const uint64_t a = direct_->alignment();
      const uint64_t begin = align_down(item.offset, a),
                     end = align_up(item.offset + item.length, a);
      direct_->read(slot.data, begin, end - begin, item.offset + item.length - begin,
                    "'" + r_.uri() + "'");
      r_.count_bytes_read(item.length);
      p += item.offset - begin;
    } else {
      src.read_at(item.offset, slot.data, item.length);
    }
    const bool wait_header = r_.encrypted() || opt_.verify_hash;
    for (const engine::Segment& s : item.segments) {
      current = s.tensor;
      const TensorDestination& d = dests_[s.tensor];
      if (s.is_header) {
        on_header(s.tensor, {reinterpret_cast<const char*>(p), s.length}, stream);
      } else {
        uint8_t* data = const_cast<uint8_t*>(p);
        if (wait_header) wait_for([&] { return state_[s.tensor].header_done; });
        r_.decrypt_in_place(d.entry, s.begin, data, s.length);
        if (opt_.verify_hash) hash_in_order(s.tensor, s.begin, data, s.length);
        backend_.copy_async(static_cast<uint8_t*>(d.data) + s.begin, data, s.length, stream);
      }
      p += s.length;
    }
  }

  void on_header(size_t t, std::string_view bytes, int stream) {
    const TensorDestination& d = dests_[t];
    const IndexEntry& e = r_.entries()[d.entry];
    const LoadedTensorInfo& info = r_.adopt_header(d.entry, bytes);
    if (e.is_meta() && e.expected_bytes() > 0)
      backend_.zero_async(d.data, e.expected_bytes(), stream);
    TensorState& st = state_[t];
    if (opt_.verify_hash) {
      st.hasher = engine::hasher_for(info, /*fastest_only=*/crc_only_);
      if (e.data_length == 0) finish_hash(t);
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      st.header_done = true;
    }
    progress_.notify_all();
  }

  // Feeds data bytes [begin, begin+size) of tensor `t` to its hasher once every earlier byte has
  // been fed (the pieces before it belong to earlier items, which already hold slots).
  void hash_in_order(size_t t, uint64_t begin, const uint8_t* data, uint64_t size) {
    TensorState& st = state_[t];
    wait_for([&] { return st.hashed == begin; });
    if (st.hasher) st.hasher->update(data, size);
    {
      std::lock_guard<std::mutex> lock(mu_);
      st.hashed += size;
    }
    progress_.notify_all();
    if (begin + size == r_.entries()[dests_[t].entry].data_length) finish_hash(t);
  }

  void finish_hash(size_t t) {
    TensorState& st = state_[t];
    if (!st.hasher) return;
    const size_t entry = dests_[t].entry;
    std::string failures = engine::hash_failures(*r_.loaded_info(entry), *st.hasher);
    st.hasher.reset();
    if (failures.empty()) return;
    if (crc_only_) failures += engine::kUnversionedMismatchNote;
    if (!opt_.collect_mismatches) fail(ErrorCode::kHashMismatch, "hash mismatch: " + failures);
    std::lock_guard<std::mutex> lock(mu_);
    mismatches_.push_back("tensor '" + display_path(r_.entries()[entry].path).substr(0, 200) +
                          "': " + failures);
  }

  template <typename Ready>
  void wait_for(Ready ready) {
    std::unique_lock<std::mutex> lock(mu_);
    progress_.wait(lock, [&] { return cancelled_ || ready(); });
    if (cancelled_) throw Stopped{};
  }

  void record_error(const Error& err, size_t tensor) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      if (!error_) {
        const IndexEntry& e = r_.entries()[dests_[tensor].entry];
        error_ = std::make_exception_ptr(
            Error(err.code(), "tensor '" + display_path(e.path).substr(0, 200) + "' in '" +
                                  r_.uri() + "' (header at offset " +
                                  std::to_string(e.header_offset) + "): " + err.what()));
      }
    }
    slot_freed_.notify_all();
    progress_.notify_all();
  }

  Reader& r_;
  CopyBackend& backend_;
  LoadOptions opt_;
  const StagingOptions& staging_;
  bool recheck_headers_ = false;  // an unversioned source: headers are read again at the end
  bool crc_only_ = false;         // verify_hash was turned on for it (CRC32 alone)
  std::vector<TensorDestination> dests_;
  std::vector<TensorState> state_;
  std::vector<engine::ReadItem> items_;
  std::unique_ptr<engine::DirectFile> direct_;
  std::mutex mu_;
  std::condition_variable slot_freed_, progress_;
  std::deque<Slot*> free_;
  size_t next_ = 0;
  bool cancelled_ = false;
  std::exception_ptr error_;
  std::vector<std::string> mismatches_;
};

}  // namespace

StagedLoadResult load_staged(Reader& reader, const std::vector<TensorDestination>& destinations,
                             CopyBackend& backend, const LoadOptions& options,
                             const StagingOptions& staging) {
  engine::check_destinations(reader, destinations);
  if (destinations.empty()) return {};
  return StagedJob(reader, destinations, backend, options, staging).run();
}

}  // namespace tensorizer
