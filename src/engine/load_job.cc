// One parallel load into caller memory (Reader::load): the read plan, N workers each with its own
// transport handle, and what happens as an item's bytes land (headers checked, chunks decrypted,
// hashes verified); streamed loads give each worker one long share and let early finishers take
// over the rest of a slow one.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <optional>

#include "common/worker_pool.h"
#include "engine/huge_pages.h"
#include "engine/prefault.h"
#include "engine/read_planner.h"
#include "engine/reader_impl.h"
#include "engine/verify_tensor.h"
#include "tensorizer/cancel.h"
#include "tensorizer/hash.h"

namespace tensorizer::engine {
namespace {

constexpr uint64_t kEncryptedItemBytes = 2 * crypto::kChunkSize;  // read item size, encrypted files
constexpr uint64_t kStreamedItemBytes = 4ull << 20;  // item size of loads streamed per worker

// One load in flight: the plan, the destinations, and what the workers share.
class LoadJob {
 public:
  LoadJob(Reader::Impl& r, const std::vector<TensorDestination>& dests, const LoadOptions& opt)
      : r_(r), opt_(opt), dests_(dests) {
    // An unversioned source: CRC32s checked, headers read again at the end (verify_tensor.h).
    if (!r_.source->versioned()) {
      recheck_headers_ = true;
      if (!opt_.verify_hash && !r_.header.has_crypt_info()) opt_.verify_hash = crc_only_ = true;
    }
  }

  LoadResult run() {
    const uint64_t before = r_.source->bytes_read();
    std::sort(dests_.begin(), dests_.end(),
              [&](const TensorDestination& a, const TensorDestination& b) {
                return r_.entries[a.entry].header_offset < r_.entries[b.entry].header_offset;
              });
    std::vector<PlannedTensor> planned;
    planned.reserve(dests_.size());
    // Encrypted tensors are split at 2 MiB chunk boundaries, into small items, so that each chunk
    // is decrypted (by the worker that read it) while other workers keep reading.
    const bool encrypted = r_.header.has_crypt_info();
    const bool splittable = encrypted || !opt_.verify_hash;
    for (const auto& d : dests_) {
      const IndexEntry& e = r_.entries[d.entry];
      planned.push_back({e.header_offset, e.header_size(), e.data_length, splittable});
      if (opt_.advise_huge_pages && d.data) advise_huge_pages(d.data, e.expected_bytes());
    }
    // Streamed: the item is what a worker finishes (hash, decrypt) as it lands and the unit
    // another worker may take over, not a request.
    const bool streamed = r_.source->prefers_long_reads() && r_.source->preferred_read_bytes() == 0;
    PlanOptions plan;
    if (streamed) plan.target_item_bytes = kStreamedItemBytes;
    if (const uint64_t b = r_.source->preferred_read_bytes()) plan.target_item_bytes = b;
    if (encrypted) {
      plan.target_item_bytes = kEncryptedItemBytes;
      plan.split_granularity = crypto::kChunkSize;
      crypt_.reset(new CryptState[dests_.size()]);
    }
    items_ = plan_reads(planned, plan);
    int workers = readers_for(*r_.source, opt_.num_workers);
    if (streamed && opt_.num_workers <= 0) workers = std::min(workers, paying_shares());
    workers = std::max(1, std::min<int>(workers, static_cast<int>(items_.size())));
    std::vector<std::unique_ptr<Source>> handles;  // one source per worker beyond the caller's
    for (int i = 1; i < workers; ++i) handles.push_back(r_.source->clone());
    // A remote load's workers first wait for the server: map the destinations meanwhile
    // (engine/prefault.h; stopped by bytes_arrived()).
    std::optional<BackgroundPrefault> prefault;
    if (r_.source->local_fd() < 0) {
      std::vector<std::pair<uint8_t*, size_t>> ranges;
      for (const auto& d : dests_)  // meta tensors write nothing: their pages stay unmapped
        if (!r_.entries[d.entry].is_meta())
          ranges.emplace_back(static_cast<uint8_t*>(d.data), r_.entries[d.entry].expected_bytes());
      prefault_ = &prefault.emplace(ranges);
    }
    // A source that prefers long reads, with no read size forced on it, streams one share per
    // worker; otherwise each worker takes the next item, one read each. Either way a worker's
    // loop keeps the first error, with context.
    if (streamed) split_shares(static_cast<size_t>(workers));
    parallel_for_workers(static_cast<size_t>(workers), workers, [&](size_t k, int w) {
      Source& src = w == 0 ? *r_.source : *handles[static_cast<size_t>(w) - 1];
      if (streamed)
        stream_work(src, k);  // share k: a thread may run more than one
      else
        work(src);
    });
    prefault.reset();
    prefault_ = nullptr;
    if (error_) std::rethrow_exception(error_);
    if (recheck_headers_) check_unchanged(handles);
    LoadResult result;
    result.bytes_read = r_.source->bytes_read() - before;
    result.mismatches = std::move(mismatches_);
    return result;
  }

 private:
  void check_unchanged(std::vector<std::unique_ptr<Source>>& handles) {
    parallel_for_workers(dests_.size(), 1 + static_cast<int>(handles.size()), [&](size_t k, int w) {
      Source& src = w == 0 ? *r_.source : *handles[static_cast<size_t>(w) - 1];
      const size_t entry = dests_[k].entry;
      check_header_unchanged(src, r_.source->uri(), r_.entries[entry],
                             r_.loaded[entry]->raw_header());
    });
  }

  void work(Source& src) {
    std::vector<std::string> header_scratch;
    std::vector<IoSlice> slices;
    for (;;) {
      if (cancelled_.load(std::memory_order_relaxed)) return;
      size_t i = next_.fetch_add(1);
      if (i >= items_.size()) return;
      const ReadItem& item = items_[i];
      size_t current = item.segments[0].tensor;  // the tensor an error concerns
      try {
        check_cancelled();
        read_item(src, item, header_scratch, slices, current);
      } catch (const Error& err) {
        record_error(err, current);
        return;
      } catch (const std::exception& err) {
        record_error(Error(ErrorCode::kIO, err.what()), current);
        return;
      }
    }
  }

  void read_item(Source& src, const ReadItem& item, std::vector<std::string>& scratch,
                 std::vector<IoSlice>& slices, size_t& current) {
    slices.clear();
    scratch.resize(item.segments.size());
    add_slices(item, scratch.data(), slices);
    for (const IoSlice& s : slices) map_ahead_of_write(s.data, s.size);
    src.read_scatter(item.offset, slices.data(), slices.size());
    finish_item(item, scratch.data(), current);
  }

  // Appends the destinations of `item`'s segments to `slices`; headers land in `scratch` (one
  // string per segment, sized here).
  void add_slices(const ReadItem& item, std::string* scratch, std::vector<IoSlice>& slices) {
    for (size_t k = 0; k < item.segments.size(); ++k) {
      const Segment& s = item.segments[k];
      if (s.is_header) {
        scratch[k].resize(s.length);
        slices.push_back({scratch[k].data(), s.length});
      } else {
        slices.push_back({static_cast<uint8_t*>(dests_[s.tensor].data) + s.begin, s.length});
      }
    }
  }

  // Everything after an item's bytes landed: headers parsed, chunks decrypted, hashes checked.
  void finish_item(const ReadItem& item, std::string* scratch, size_t& current) {
    for (size_t k = 0; k < item.segments.size(); ++k) {
      const Segment& s = item.segments[k];
      current = s.tensor;
      if (s.is_header) on_header(s.tensor, scratch[k]);  // copied: the buffer serves again
      if (crypt_) {
        if (s.is_header)
          on_crypt_header(s.tensor);
        else
          on_encrypted_data(s.tensor, s.begin, s.length);
      } else if (s.last_of_tensor) {
        on_tensor_complete(s.tensor);
      }
    }
  }

  // ---- Streamed loads: one long read per worker, idle workers steal the tail of the largest ---

  // How many long reads pay for themselves, from what the open's first read took (worker_pool.h).
  int paying_shares() const {
    uint64_t total = 0;
    for (const auto& it : items_) total += it.length;
    return tensorizer::paying_shares(total, r_.first_read_s);
  }

  // A worker's items still to read: [begin, end). `begin` moves past an item as soon as any of its
  // bytes is about to be written, so only [begin, end) may be taken by another worker. `since` and
  // `streamed`: when the current read's first byte came and how many bytes came since (its rate).
  struct Share {
    std::mutex mu;
    size_t begin = 0, end = 0;
    double since = -1;
    uint64_t streamed = 0;
  };

  static double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  uint64_t item_end(size_t i) const { return items_[i].offset + items_[i].length; }

  // Cuts the items into `n` contiguous shares of about equal bytes.
  void split_shares(size_t n) {
    shares_.reset(new Share[n]);
    share_count_ = n;
    uint64_t total = 0;
    for (const auto& it : items_) total += it.length;
    size_t i = 0;
    uint64_t acc = 0;
    for (size_t w = 0; w < n; ++w) {
      shares_[w].begin = i;
      const uint64_t goal = total / n * (w + 1);
      while (i < items_.size() && (w + 1 == n || acc + items_[i].length / 2 < goal))
        acc += items_[i++].length;
      shares_[w].end = i;
    }
  }

  void stream_work(Source& src, size_t w) {  // w: the share this call owns
    Share& own = shares_[w];
    size_t current = items_.empty() ? 0 : items_[0].segments[0].tensor;
    try {
      for (;;) {
        if (cancelled_.load(std::memory_order_relaxed)) return;
        size_t a, end;
        {
          std::lock_guard<std::mutex> lock(own.mu);
          a = own.begin, end = own.end;
        }
        if (a >= end) {
          if (!steal(w)) return;
          continue;
        }
        size_t b = a + 1;  // the run of touching items from a
        while (b < end && item_end(b - 1) == items_[b].offset) ++b;
        current = items_[a].segments[0].tensor;
        stream_run(src, own, a, b, current);
      }
    } catch (const Error& err) {
      record_error(err, current);
    } catch (const std::exception& err) {
      record_error(Error(ErrorCode::kIO, err.what()), current);
    }
  }

  // Reads items [a, b) (touching) as one long read, finishing each as its bytes land; stops early
  // at the first item another worker took from this share meanwhile.
  void stream_run(Source& src, Share& own, size_t a, size_t b, size_t& current) {
    size_t segments = 0;
    for (size_t i = a; i < b; ++i) segments += items_[i].segments.size();
    std::vector<std::string> scratch(segments);
    std::vector<IoSlice> slices;
    slices.reserve(segments);
    std::vector<size_t> first_segment;  // per item of the run, into scratch
    for (size_t i = a; i < b; ++i) {
      first_segment.push_back(slices.size());
      add_slices(items_[i], scratch.data() + slices.size(), slices);
    }

    struct Budget final : StreamBudget {
      LoadJob& job;
      Share& own;
      size_t a, b, reserved, finished;
      uint64_t base;
      double asked = now_s();  // when the read was issued, for its time to first byte
      std::vector<std::string>& scratch;
      std::vector<size_t>& first_segment;
      const std::vector<IoSlice>& slices;
      size_t& current;
      Budget(LoadJob& j, Share& o, size_t a_, size_t b_, std::vector<std::string>& s,
             std::vector<size_t>& f, const std::vector<IoSlice>& sl, size_t& c)
          : job(j),
            own(o),
            a(a_),
            b(b_),
            reserved(a_),
            finished(a_),
            base(j.items_[a_].offset),
            scratch(s),
            first_segment(f),
            slices(sl),
            current(c) {}

      uint64_t reserve(uint64_t at, uint64_t want) override {
        if (job.cancelled_.load(std::memory_order_relaxed)) return 0;
        const size_t was_reserved = reserved;
        uint64_t n;
        {
          std::lock_guard<std::mutex> lock(own.mu);
          const size_t limit = std::min(b, own.end);
          if (limit <= a) return 0;
          const uint64_t allowed = job.item_end(limit - 1) - base;
          if (at >= allowed) return 0;
          n = std::min(want, allowed - at);
          while (reserved < limit && job.items_[reserved].offset - base < at + n) ++reserved;
          own.begin = std::max(own.begin, reserved);
          if (own.since < 0) {  // the first byte of this read
            own.since = now_s();
            own.streamed = 0;
            job.note_first_byte_wait(own.since - asked);
            job.bytes_arrived();
          }
          own.streamed += n;
        }
        // The items this reservation reaches into are this worker's now: map their fresh pages
        // before the bytes are written (engine/prefault.h).
        if (reserved > was_reserved) {
          const size_t end = reserved < b ? first_segment[reserved - a] : slices.size();
          for (size_t k = first_segment[was_reserved - a]; k < end; ++k)
            map_ahead_of_write(slices[k].data, slices[k].size);
        }
        return n;
      }

      void landed(uint64_t n) override {
        check_cancelled();
        while (finished < b && job.item_end(finished) - base <= n) {
          job.finish_item(job.items_[finished], scratch.data() + first_segment[finished - a],
                          current);
          ++finished;
        }
      }
    } budget(*this, own, a, b, scratch, first_segment, slices, current);

    if (item_end(b - 1) ==
        items_[a].offset) {  // items of no bytes (empty tensors): nothing to read
      {
        std::lock_guard<std::mutex> lock(own.mu);
        budget.b = std::min(b, own.end);
        own.begin = std::max(own.begin, budget.b);
      }
      budget.reserved = budget.b;
      budget.landed(0);
      return;
    }
    src.read_stream(items_[a].offset, slices.data(), slices.size(), budget);
    {
      std::lock_guard<std::mutex> lock(own.mu);
      own.since = -1;
    }
    if (budget.finished != budget.reserved)
      fail(ErrorCode::kIO, "internal: a streamed read stopped inside an item");
  }

  // A streamed read's first bytes: its workers, busy receiving, map ahead of themselves from now
  // on, and the background prefault would only take CPU from them (measured over HTTP, 1 GB: 2.02
  // and 2.22 GB/s stopping here against 1.93 and 1.95 going on). Loads read item by item (Redis)
  // keep it to the end: there the server is the bound and leaves our CPU time between replies
  // (2.04 and 1.84 GB/s going on against 1.77 and 1.63).
  void bytes_arrived() {
    if (prefault_) prefault_->stop();
  }

  // The slowest time to first byte a read of this load has had: what taking work over costs.
  void note_first_byte_wait(double s) {
    double seen = first_byte_wait_.load();
    while (s > seen && !first_byte_wait_.compare_exchange_weak(seen, s)) {
    }
  }

  // Takes the untouched second half of the share that would take longest to finish, when it has
  // two or more items and, at the rate its read runs, would take longer than two first-byte
  // waits: a new request must pay for itself (on a server that copies the whole object for every
  // ranged GET, such as moto, that wait is long and taking over would only add copies).
  bool steal(size_t w) {
    for (;;) {
      size_t victim = share_count_;
      double longest = 2 * first_byte_wait_.load();
      const double now = now_s();
      for (size_t v = 0; v < share_count_; ++v) {
        if (v == w) continue;
        std::lock_guard<std::mutex> lock(shares_[v].mu);
        const Share& sh = shares_[v];
        if (sh.begin >= sh.end || sh.end - sh.begin < 2 || sh.since < 0 || now <= sh.since)
          continue;
        const double rate = static_cast<double>(sh.streamed) / (now - sh.since);
        const double left = static_cast<double>(item_end(sh.end - 1) - items_[sh.begin].offset);
        const double eta = rate > 0 ? left / rate : 1e30;
        if (eta > longest) victim = v, longest = eta;
      }
      if (victim == share_count_) return false;
      size_t mid, end;
      {
        Share& v = shares_[victim];
        std::lock_guard<std::mutex> lock(v.mu);
        if (v.begin >= v.end || v.end - v.begin < 2) continue;  // it moved on meanwhile
        mid = v.begin + (v.end - v.begin) / 2;
        end = v.end;
        v.end = mid;
      }
      std::lock_guard<std::mutex> lock(shares_[w].mu);
      shares_[w].begin = mid;
      shares_[w].end = end;
      return true;
    }
  }

  void on_header(size_t t, std::string_view bytes) {
    const TensorDestination& d = dests_[t];
    const IndexEntry& e = r_.entries[d.entry];
    auto info = loaded_info_from(r_.header, e, bytes);
    if (e.is_meta() && !d.zeroed) std::memset(d.data, 0, e.expected_bytes());
    // The header just read is what this load decrypts and verifies with (replacing any earlier
    // copy: references from read_header()/loaded_info() last until the next load of the tensor).
    r_.loaded[d.entry] = std::move(info);
  }

  // Runs once every byte of tensor `t` has landed (and, in an encrypted file, been decrypted).
  // Without verify_hash a tensor may be split across items, so its header may still be being read
  // by another worker: nothing here may touch it then. With verify_hash the tensor is one item.
  void on_tensor_complete(size_t t) {
    if (!opt_.verify_hash) return;
    const TensorDestination& d = dests_[t];
    const IndexEntry& e = r_.entries[d.entry];
    verify(e, *r_.loaded[d.entry], static_cast<const uint8_t*>(d.data), e.data_length);
  }

  // ---- Encrypted files: chunks are decrypted as soon as all their bytes have landed ----------

  // Per requested tensor of an encrypted file. Data pieces may land (on other workers) before
  // the header that says how to decrypt them; those wait in `early` until it is parsed.
  struct CryptState {
    std::mutex mu;
    bool header_done = false;
    std::unique_ptr<crypto::TensorDecryptor> dec;
    std::vector<std::pair<uint64_t, uint64_t>> early;  // (begin, length) of data landed first
    std::vector<uint64_t> landed;                      // bytes landed per encryption chunk
    uint64_t finished = 0;                             // data bytes landed and decrypted
  };

  void on_crypt_header(size_t t) {
    const TensorDestination& d = dests_[t];
    const IndexEntry& e = r_.entries[d.entry];
    const LoadedTensorInfo& info = *r_.loaded[d.entry];
    auto dec = crypto::TensorDecryptor::create(info.header.crypt_info(info.header_data()),
                                               e.data_length, *r_.decryption, r_.key_cache);
    if (!dec && e.data_length > 0)
      fail(ErrorCode::kCrypto, "Tensor is not encrypted, but decryption was requested");
    CryptState& st = crypt_[t];
    std::vector<std::pair<uint64_t, uint64_t>> early;
    {
      std::lock_guard<std::mutex> lock(st.mu);
      if (dec && e.data_length > 0) st.landed.assign(dec->chunk_count(), 0);
      st.dec = std::move(dec);
      st.header_done = true;
      early.swap(st.early);
    }
    if (e.data_length == 0) return on_tensor_complete(t);
    for (const auto& [begin, length] : early) land(t, begin, length);
  }

  void on_encrypted_data(size_t t, uint64_t begin, uint64_t length) {
    CryptState& st = crypt_[t];
    {
      std::lock_guard<std::mutex> lock(st.mu);
      if (!st.header_done) {
        st.early.emplace_back(begin, length);
        return;
      }
    }
    land(t, begin, length);
  }

  // Accounts data bytes [begin, begin+length) of tensor `t` as landed, decrypts every chunk this
  // completes (here, on this worker), and completes the tensor when nothing is left.
  void land(size_t t, uint64_t begin, uint64_t length) {
    CryptState& st = crypt_[t];
    const uint64_t total = r_.entries[dests_[t].entry].data_length;
    const crypto::TensorDecryptor& dec = *st.dec;
    const uint64_t cs = std::max<uint64_t>(dec.chunk_size(), 1);
    uint64_t first_ready = 0, ready = 0, ready_bytes = 0;
    {
      std::lock_guard<std::mutex> lock(st.mu);
      for (uint64_t c = begin / cs; c * cs < begin + length; ++c) {
        const uint64_t lo = std::max(begin, c * cs),
                       hi = std::min({begin + length, (c + 1) * cs, total});
        const uint64_t chunk_len = std::min(cs, total - c * cs);
        st.landed[c] += hi - lo;
        if (st.landed[c] != chunk_len) continue;
        if (ready == 0) first_ready = c;
        if (first_ready + ready == c) {  // complete chunks of one piece are consecutive
          ++ready;
          ready_bytes += chunk_len;
        } else {
          fail(ErrorCode::kInvalidArgument, "internal: non-contiguous decryption chunks");
        }
      }
    }
    if (ready == 0) return;
    auto* data = static_cast<uint8_t*>(dests_[t].data);
    for (uint64_t c = first_ready; c < first_ready + ready; ++c)
      dec.decrypt_chunk(c, data + c * cs, std::min(cs, total - c * cs));
    bool done;
    {
      std::lock_guard<std::mutex> lock(st.mu);
      st.finished += ready_bytes;
      done = st.finished == total;
    }
    if (done) on_tensor_complete(t);
  }

  void verify(const IndexEntry& e, const LoadedTensorInfo& info, const uint8_t* data,
              uint64_t size) {
    std::unique_ptr<TensorHasher> hasher = hasher_for(info, /*fastest_only=*/crc_only_);
    if (!hasher) return;
    hasher->update(data, size);
    std::string failures = hash_failures(info, *hasher);
    if (failures.empty()) return;
    if (crc_only_) failures += kUnversionedMismatchNote;
    if (!opt_.collect_mismatches) fail(ErrorCode::kHashMismatch, "hash mismatch: " + failures);
    std::lock_guard<std::mutex> lock(mu_);
    mismatches_.push_back("tensor '" + shown_name(e) + "': " + failures);
  }

  void record_error(const Error& err, size_t tensor) {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
    if (error_) return;
    const IndexEntry& e = r_.entries[dests_[tensor].entry];
    try {
      rethrow_with_context(err, "tensor '" + shown_name(e) + "' in '" + r_.source->uri() +
                                    "' (header at offset " + std::to_string(e.header_offset) + ")");
    } catch (...) {
      error_ = std::current_exception();
    }
  }

  Reader::Impl& r_;
  LoadOptions opt_;
  bool recheck_headers_ = false;  // an unversioned source: headers are read again at the end
  bool crc_only_ = false;         // verify_hash was turned on for it (CRC32 alone)
  std::vector<TensorDestination> dests_;
  std::vector<ReadItem> items_;
  std::unique_ptr<CryptState[]> crypt_;  // encrypted files only: one per destination
  std::atomic<size_t> next_{0};
  std::unique_ptr<Share[]> shares_;  // streamed loads: one per worker
  size_t share_count_ = 0;
  std::atomic<double> first_byte_wait_{0};  // seconds: the slowest first byte of a streamed read
  BackgroundPrefault* prefault_ = nullptr;  // remote loads, until their first bytes arrive
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::exception_ptr error_;
  std::vector<std::string> mismatches_;
};

}  // namespace

LoadResult run_load_job(Reader::Impl& reader, const std::vector<TensorDestination>& destinations,
                        const LoadOptions& options) {
  return LoadJob(reader, destinations, options).run();
}

}  // namespace tensorizer::engine
