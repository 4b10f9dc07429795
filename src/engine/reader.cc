// Reader: opens a .tensors source (prelude, index, safetensors header), reads and checks tensor
// headers, and serves streamed, strided and verifying reads; parallel loads are load_job.cc's.
#include "tensorizer/reader.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "common/worker_pool.h"
#include "crypto/tensor_crypto.h"
#include "engine/destinations.h"
#include "engine/reader_impl.h"
#include "engine/verify_tensor.h"
#include "engine/warm_block.h"
#include "tensorizer/cancel.h"
#include "tensorizer/error.h"
#include "tensorizer/hash.h"
#include "tensorizer/safetensors.h"

namespace tensorizer {
namespace {

using engine::check_header_unchanged;
using engine::hash_failures;
using engine::hasher_for;
using engine::kUnversionedMismatchNote;
using engine::loaded_info_from;
using engine::rethrow_with_context;
using engine::shown_name;

// A remote first read takes the prelude and a reference-sized index in one request; a local file
// reads the prelude, then its index in small preads (nothing beyond the index is read).
constexpr uint64_t kFirstReadBytes = 512 * 1024;
// A local file's index is read up to this much first: writers may reserve room they do not fill
// (ours reserves 256 KiB), and bytes not read cost a fresh process neither a copy nor new pages.
// An index whose entries run past it is read whole and parsed again.
constexpr uint64_t kLocalIndexFirstBytes = 64 * 1024;
constexpr uint64_t kVerifyBatchBytes = 256ull << 20;  // scratch memory bound for verify_all

// Reads the safetensors header after the 8-byte length (`head` holds what was read so far).
SafetensorsHeader open_safetensors(Source& source, std::string& head, uint64_t size) {
  const uint64_t n =
      safetensors_header_length(reinterpret_cast<const uint8_t*>(head.data()), head.size(), size);
  const uint64_t end = kSafetensorsLengthSize + n;
  if (end > head.size()) {
    const size_t have = head.size();
    head.resize(end);
    source.read_at(have, head.data() + have, end - have);
  }
  return parse_safetensors_header(
      reinterpret_cast<const uint8_t*>(head.data()) + kSafetensorsLengthSize, n, size);
}

}  // namespace

namespace engine {

std::string shown_name(const IndexEntry& e) { return display_path(e.path).substr(0, 200); }

[[noreturn]] void rethrow_with_context(const Error& err, const std::string& context) {
  throw Error(err.code(), context + ": " + err.what());
}

std::unique_ptr<LoadedTensorInfo> loaded_info_from(const FileHeader& file, const IndexEntry& e,
                                                   std::string_view bytes) {
  if (bytes.size() != e.header_size())
    fail(ErrorCode::kFormat, "header of " + std::to_string(bytes.size()) +
                                 " bytes, the index says " + std::to_string(e.header_size()));
  auto info = std::make_unique<LoadedTensorInfo>();
  if (e.header_size() == 0) {
    info->header.type = e.type;
    info->header.name = e.name;
    info->header.dtype = e.dtype;
    info->header.shape = e.shape;
    info->header.data_length = static_cast<int64_t>(e.data_length);
    return info;
  }
  info->header = parse_tensor_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                     file.has_crypt_info(), e.long_shape());
  check_header_matches_entry(info->header, e);
  const size_t fields = info->header.fields_end, filler = bytes.size() - 8 - fields;
  if (filler > 0 && bytes[fields] == 0 &&
      std::memcmp(bytes.data() + fields, bytes.data() + fields + 1, filler - 1) == 0) {
    info->compact_header.reserve(fields + 8);
    info->compact_header.append(bytes.substr(0, fields)).append(bytes.substr(fields + filler));
    info->zero_filler = filler;
  } else {
    info->compact_header = bytes;
  }
  info->module_idx = info->header.module_idx;
  return info;
}

}  // namespace engine

Reader::Reader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Reader::~Reader() = default;

std::unique_ptr<Reader> Reader::open(const std::string& uri, const ReaderOptions& options) {
  return open(open_source(uri, options.transport), options);
}

std::unique_ptr<Reader> Reader::open(std::unique_ptr<Source> source, const ReaderOptions& options) {
  auto impl = std::make_unique<Impl>();
  const std::string uri = source->uri();
  try {
    // The first contact (HTTP: the probe, which brings the first 512 KiB too) and the first read,
    // timed together: what one request costs.
    const auto asked = std::chrono::steady_clock::now();
    if (options.expect_host_load && source->local_fd() < 0)
      impl->warm = std::make_unique<engine::WarmBlock>(*source, engine::warm_block_limit());
    const uint64_t size = source->size();
    if (impl->warm) impl->warm->first_response_arrived();
    if (size < kMagicSize)
      fail(ErrorCode::kFormat, "not a tensorizer file (only " + std::to_string(size) + " bytes)");
    const uint64_t first = source->local_fd() >= 0 ? kPreludeSize : kFirstReadBytes;
    std::string head(std::min(size, first), '\0');
    source->read_at(0, head.data(), head.size());
    // The server's own figure when it has one: the wait for the first byte, not the transfer
    // of the 512 KiB, which a slow connection would make look like a costly request.
    impl->first_read_s =
        source->first_byte_seconds() > 0
            ? source->first_byte_seconds()
            : std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count();
    const auto* bytes = reinterpret_cast<const uint8_t*>(head.data());
    if (std::memcmp(bytes, kMagic, kMagicSize) != 0 && looks_like_safetensors(bytes, head.size())) {
      if (options.decryption)
        fail(ErrorCode::kCrypto,
             "decryption was requested, but safetensors files are not encrypted");
      SafetensorsHeader st = open_safetensors(*source, head, size);
      impl->format = FileFormat::kSafetensors;
      impl->entries = std::move(st.entries);
      impl->metadata = std::move(st.metadata);
      impl->header.version = 0;
      impl->header.tensor_count = impl->entries.size();
      impl->header.index_size = st.data_start - kSafetensorsLengthSize;
      for (const IndexEntry& e : impl->entries) impl->header.tensor_size += e.data_length;
      return finish_open(std::move(impl), std::move(source), options);
    }
    impl->header = parse_file_header(bytes, head.size());
    const FileHeader& h = impl->header;
    if (h.has_crypt_info() && !options.decryption && !options.without_key)
      fail(ErrorCode::kCrypto,
           "the file is encrypted, but no decryption key or passphrase was given");
    if (options.decryption && !h.has_crypt_info())
      fail(ErrorCode::kCrypto,
           h.version < kEncryptionVersion
               ? "decryption was requested, but the file's data version " +
                     std::to_string(h.version) + " predates encryption, so it is not encrypted"
               : std::string("decryption was requested, but the file is not flagged as encrypted"));
    if (h.index_size > size - std::min(size, kPreludeSize))
      fail(ErrorCode::kFormat, "index size " + std::to_string(h.index_size) +
                                   " runs past the end of the file (" + std::to_string(size) +
                                   " bytes)");
    const uint64_t index_end = kPreludeSize + h.index_size;
    const auto read_to = [&](uint64_t end) {  // extends `head` to the file's first `end` bytes
      const size_t have = head.size();
      head.resize(end);
      source->read_at(have, head.data() + have, end - have);
    };
    const auto parse = [&] {
      return parse_index(reinterpret_cast<const uint8_t*>(head.data()) + kPreludeSize,
                         head.size() - kPreludeSize, h, size);
    };
    // The index of a local file, or a larger one than the reference's: one more read, or two.
    if (source->local_fd() >= 0 && index_end > kPreludeSize + kLocalIndexFirstBytes) {
      read_to(kPreludeSize + kLocalIndexFirstBytes);
      try {
        impl->entries = parse();
      } catch (const Error&) {  // entries past the first part (or a corrupt index): read it all
        read_to(index_end);
        impl->entries = parse();
      }
    } else {
      if (index_end > head.size()) read_to(index_end);
      impl->entries = parse();
    }
  } catch (const Error& err) {
    if (std::string_view(err.what()).rfind("'" + uri + "'", 0) == 0)
      throw;  // transports name it already
    rethrow_with_context(err, "'" + uri + "'");
  }
  return finish_open(std::move(impl), std::move(source), options);
}

std::unique_ptr<Reader> Reader::finish_open(std::unique_ptr<Impl> impl,
                                            std::unique_ptr<Source> source,
                                            const ReaderOptions& options) {
  impl->source = std::move(source);
  impl->decryption = options.decryption;
  impl->loaded.resize(impl->entries.size());
  for (size_t i = 0; i < impl->entries.size(); ++i) impl->by_name.emplace(impl->entries[i].name, i);
  return std::unique_ptr<Reader>(new Reader(std::move(impl)));
}

FileFormat Reader::format() const { return impl_->format; }
const std::vector<std::pair<std::string, std::string>>& Reader::metadata() const {
  return impl_->metadata;
}

const FileHeader& Reader::header() const { return impl_->header; }
const std::vector<IndexEntry>& Reader::entries() const { return impl_->entries; }
const std::string& Reader::uri() const { return impl_->source->uri(); }
Source& Reader::source() { return *impl_->source; }
uint64_t Reader::bytes_read() const {
  return impl_->source->bytes_read() + impl_->bytes_read_elsewhere;
}
std::string LoadedTensorInfo::raw_header() const {
  if (zero_filler == 0) return compact_header;
  const size_t fields = compact_header.size() - 8;
  std::string out;
  out.reserve(compact_header.size() + zero_filler);
  out.append(compact_header, 0, fields).append(zero_filler, '\0').append(compact_header, fields);
  return out;
}

void Reader::count_bytes_read(uint64_t n) { impl_->bytes_read_elsewhere += n; }
uint64_t Reader::host_bytes_premapped() const { return impl_->premapped; }

namespace engine {
std::shared_ptr<HostBlock> take_warm_block(Reader& reader, size_t size) {
  Reader::Impl& impl = *reader.impl_;
  if (!impl.warm) return nullptr;
  std::shared_ptr<HostBlock> block = impl.warm->take(size);
  if (block) impl.premapped = std::min<uint64_t>(impl.warm->mapped_bytes(), size);
  return block;
}

std::shared_ptr<HostBlock> file_mapping_for(Reader& reader, size_t file_size,
                                            const std::vector<size_t>& entries) {
  Reader::Impl& impl = *reader.impl_;
  std::shared_ptr<HostBlock> block = impl.file_mapping.lock();
  // A tensor already handed out from this mapping gets a mapping of its own: two loads of one
  // tensor never share memory (a write to one would show in the other).
  bool again = false;
  for (size_t e : entries)
    again = again || (e < impl.mapped_entries.size() && impl.mapped_entries[e]);
  if (!block || block->size() != file_size || again) {
    block = HostBlock::file_private(impl.source->local_fd(), file_size, "'" + reader.uri() + "'");
    impl.file_mapping = block;
    impl.mapped_entries.assign(impl.entries.size(), false);
  }
  for (size_t e : entries) impl.mapped_entries[e] = true;
  return block;
}
}  // namespace engine
const LoadedTensorInfo* Reader::loaded_info(size_t entry) const {
  return entry < impl_->loaded.size() ? impl_->loaded[entry].get() : nullptr;
}
std::unique_ptr<LoadedTensorInfo> Reader::take_loaded_info(size_t entry) {
  return entry < impl_->loaded.size() ? std::move(impl_->loaded[entry]) : nullptr;
}

const LoadedTensorInfo& Reader::read_header(size_t entry) {
  if (entry >= impl_->entries.size())
    fail(ErrorCode::kInvalidArgument, "tensor index " + std::to_string(entry) + " out of range");
  if (impl_->loaded[entry]) return *impl_->loaded[entry];  // cached: references stay valid
  const IndexEntry& e = impl_->entries[entry];
  std::string bytes(e.header_size(), '\0');
  try {
    impl_->source->read_at(e.header_offset, bytes.data(), bytes.size());
  } catch (const Error& err) {
    rethrow_with_context(err, "tensor '" + shown_name(e) + "' in '" + uri() + "'");
  }
  return adopt_header(entry, bytes);
}

const LoadedTensorInfo& Reader::adopt_header(size_t entry, std::string_view header_bytes) {
  if (entry >= impl_->entries.size())
    fail(ErrorCode::kInvalidArgument, "tensor index " + std::to_string(entry) + " out of range");
  const IndexEntry& e = impl_->entries[entry];
  std::unique_ptr<LoadedTensorInfo> info;
  try {
    info = loaded_info_from(impl_->header, e, header_bytes);
  } catch (const Error& err) {
    rethrow_with_context(err, "tensor '" + shown_name(e) + "' in '" + uri() + "'");
  }
  impl_->loaded[entry] = std::move(info);
  return *impl_->loaded[entry];
}

void Reader::decrypt_in_place(size_t entry, uint64_t offset, uint8_t* data, uint64_t size) {
  if (!encrypted() || size == 0) return;
  if (!impl_->decryption)
    fail(ErrorCode::kCrypto,
         "'" + uri() + "' is encrypted, but no decryption key or passphrase was given");
  const IndexEntry& e = impl_->entries[entry];
  const LoadedTensorInfo* info = loaded_info(entry);
  if (!info)
    fail(ErrorCode::kInvalidArgument, "internal: decrypting a tensor whose header was not read");
  auto dec = crypto::TensorDecryptor::create(info->header.crypt_info(info->header_data()),
                                             e.data_length, *impl_->decryption, impl_->key_cache);
  if (!dec) fail(ErrorCode::kCrypto, "Tensor is not encrypted, but decryption was requested");
  if (offset % dec->chunk_size() != 0 || offset + size > e.data_length)
    fail(ErrorCode::kInvalidArgument,
         "internal: decryption range is not whole chunks of the tensor");
  dec->decrypt_chunks(offset / dec->chunk_size(), data, size, 1);
}

std::optional<size_t> Reader::find(std::string_view name) const {
  auto it = impl_->by_name.find(name);
  if (it == impl_->by_name.end()) return std::nullopt;
  return it->second;
}

LoadResult Reader::load(const std::vector<TensorDestination>& destinations,
                        const LoadOptions& options) {
  engine::check_destinations(*this, destinations);
  if (destinations.empty()) return {};
  if (encrypted() && !impl_->decryption)
    fail(ErrorCode::kCrypto,
         "'" + uri() + "' is encrypted, but no decryption key or passphrase was given");
  return engine::run_load_job(*impl_, destinations, options);
}

void Reader::read_streamed(size_t entry, const PieceConsumer& consume, const LoadOptions& options,
                           uint64_t piece_bytes) {
  if (encrypted() && !impl_->decryption)
    fail(ErrorCode::kCrypto,
         "'" + uri() + "' is encrypted, but no decryption key or passphrase was given");
  const LoadedTensorInfo& info = read_header(entry);
  const IndexEntry& e = impl_->entries[entry];
  uint64_t off = 0;
  try {
    std::unique_ptr<crypto::TensorDecryptor> dec;
    if (info.header.has_crypt_field) {
      dec = crypto::TensorDecryptor::create(info.header.crypt_info(info.header_data()),
                                            e.data_length, *impl_->decryption, impl_->key_cache);
      if (!dec && e.data_length > 0)
        fail(ErrorCode::kCrypto, "Tensor is not encrypted, but decryption was requested");
    }
    // Pieces hold whole encryption chunks (a tensor sealed as one secretbox is one piece).
    uint64_t piece = std::max<uint64_t>(piece_bytes, 1);
    if (dec && dec->chunk_size() > 0)
      piece = std::max<uint64_t>(piece / dec->chunk_size(), 1) * dec->chunk_size();
    piece = std::min(piece, e.data_length);
    std::unique_ptr<uint8_t[]> buf(new uint8_t[std::max<uint64_t>(piece, 1)]);
    std::unique_ptr<TensorHasher> hasher = options.verify_hash ? hasher_for(info) : nullptr;
    const int workers = default_workers(options.num_workers);
    for (; off < e.data_length; off += piece) {
      const uint64_t n = std::min(piece, e.data_length - off);
      impl_->source->read_at(e.data_offset + off, buf.get(), n);
      if (dec) dec->decrypt_chunks(off / dec->chunk_size(), buf.get(), n, workers);
      if (hasher) hasher->update(buf.get(), n);
      consume(off, buf.get(), n);
    }
    if (hasher) {
      const std::string failures = hash_failures(info, *hasher);
      if (!failures.empty()) fail(ErrorCode::kHashMismatch, "hash mismatch: " + failures);
    }
  } catch (const Error& err) {
    rethrow_with_context(err, "tensor '" + shown_name(e) + "' in '" + uri() + "' (data offset " +
                                  std::to_string(e.data_offset + off) + ")");
  }
}

namespace {

// One request of a strided read: a contiguous range of the tensor's bytes and where each part of
// it goes (nullptr: a gap between runs, read into scratch and dropped).
struct StridedRequest {
  uint64_t at = 0;  // offset into the tensor
  std::vector<std::pair<uint8_t*, uint64_t>> parts;
  uint64_t size = 0;
};

// Cuts the runs of `r` (landing packed at `out`) into requests of about `request_bytes`, each
// spanning the gaps of at most `max_gap` bytes between its runs.
std::vector<StridedRequest> plan_strided(const StridedRange& r, uint8_t* out,
                                         uint64_t request_bytes, uint64_t max_gap) {
  std::vector<StridedRequest> requests;
  const uint64_t gap = r.runs > 1 ? r.stride - r.run_bytes : 0;
  for (uint64_t i = 0; i < r.runs; ++i) {
    uint64_t at = r.offset + i * r.stride, left = r.run_bytes;
    uint8_t* dst = out + i * r.run_bytes;
    StridedRequest* q = requests.empty() ? nullptr : &requests.back();
    if (q && gap <= max_gap && q->size + gap < request_bytes) {  // read across the gap
      if (gap) q->parts.emplace_back(nullptr, gap);
      q->size += gap;
    } else {
      q = &requests.emplace_back(StridedRequest{at, {}, 0});
    }
    while (left > 0) {
      if (q->size >= request_bytes) q = &requests.emplace_back(StridedRequest{at, {}, 0});
      const uint64_t n = std::min(left, request_bytes - q->size);
      q->parts.emplace_back(dst, n);
      q->size += n;
      at += n, dst += n, left -= n;
    }
  }
  return requests;
}

}  // namespace

void Reader::read_strided(size_t entry, const StridedRange& range, void* dest,
                          const LoadOptions& options) {
  if (entry >= impl_->entries.size())
    fail(ErrorCode::kInvalidArgument, "tensor index " + std::to_string(entry) + " out of range");
  const IndexEntry& e = impl_->entries[entry];
  if (options.verify_hash)
    fail(ErrorCode::kInvalidArgument,
         "stored hashes cover whole tensors: load tensor '" + shown_name(e) + "' to verify it");
  const uint64_t total = e.expected_bytes(), run = range.run_bytes, runs = range.runs;
  if (runs == 0 || run == 0) return;
  bool inside = range.offset <= total && run <= total - range.offset;
  if (inside && runs > 1)
    inside = range.stride >= run && runs - 1 <= (total - range.offset - run) / range.stride;
  if (!inside)
    fail(ErrorCode::kInvalidArgument, std::to_string(runs) + " runs of " + std::to_string(run) +
                                          " bytes from byte " + std::to_string(range.offset) +
                                          ", " + std::to_string(range.stride) +
                                          " apart, are not in tensor '" + shown_name(e) + "' (" +
                                          std::to_string(total) + " bytes)");
  const uint64_t span_end = range.offset + (runs - 1) * range.stride + run;
  auto* out = static_cast<uint8_t*>(dest);
  if (e.is_meta()) return void(std::memset(out, 0, runs * run));
  try {
    if (encrypted()) {  // whole chunks around the runs, decrypted, then the runs copied out
      read_header(entry);
      const LoadedTensorInfo& info = *loaded_info(entry);
      auto dec =
          crypto::TensorDecryptor::create(info.header.crypt_info(info.header_data()), e.data_length,
                                          *impl_->decryption, impl_->key_cache);
      const uint64_t chunk = dec && dec->chunk_size() > 0 ? dec->chunk_size() : e.data_length;
      const uint64_t first = range.offset / chunk * chunk,
                     last = std::min(e.data_length, (span_end + chunk - 1) / chunk * chunk);
      std::string scratch(last - first, '\0');
      auto* bytes = reinterpret_cast<uint8_t*>(scratch.data());
      impl_->source->read_at(e.data_offset + first, bytes, scratch.size());
      decrypt_in_place(entry, first, bytes, scratch.size());
      for (uint64_t i = 0; i < runs; ++i)
        std::memcpy(out + i * run, bytes + (range.offset + i * range.stride - first), run);
      return;
    }
    constexpr uint64_t kRequestBytes = 8ull << 20;
    const uint64_t max_gap = impl_->source->local_fd() >= 0 ? 128ull << 10 : 4ull << 20;
    const std::vector<StridedRequest> requests = plan_strided(range, out, kRequestBytes, max_gap);
    const int workers =
        std::max(1, std::min<int>(readers_for(*impl_->source, options.num_workers),
                                  static_cast<int>(std::min<size_t>(requests.size(), 1 << 20))));
    std::vector<std::unique_ptr<Source>> handles;
    for (int i = 1; i < workers; ++i) handles.push_back(impl_->source->clone());
    std::vector<std::unique_ptr<uint8_t[]>> gap_scratch(static_cast<size_t>(workers));
    parallel_for_workers(requests.size(), workers, [&](size_t k, int w) {
      check_cancelled();
      Source& src = w == 0 ? *impl_->source : *handles[static_cast<size_t>(w) - 1];
      std::unique_ptr<uint8_t[]>& junk = gap_scratch[static_cast<size_t>(w)];
      std::vector<IoSlice> slices;
      for (const auto& [dst, n] : requests[k].parts) {
        if (!dst && !junk) junk.reset(new uint8_t[max_gap]);
        slices.push_back({dst ? dst : junk.get(), static_cast<size_t>(n)});
      }
      src.read_scatter(e.data_offset + requests[k].at, slices.data(), slices.size());
    });
  } catch (const Error& err) {
    rethrow_with_context(err, "tensor '" + shown_name(e) + "' in '" + uri() + "' (bytes " +
                                  std::to_string(range.offset) + " to " + std::to_string(span_end) +
                                  ")");
  }
}

std::vector<std::string> Reader::verify_all(int num_workers) {
  std::vector<std::string> mismatches;
  LoadOptions opt;
  opt.num_workers = num_workers;
  opt.verify_hash = true;
  opt.collect_mismatches = true;
  size_t i = 0;
  const auto& entries = impl_->entries;
  while (i < entries.size()) {
    uint64_t batch_bytes = 0;
    size_t j = i;
    while (j < entries.size() &&
           (j == i || batch_bytes + entries[j].expected_bytes() <= kVerifyBatchBytes))
      batch_bytes += entries[j++].expected_bytes();
    std::unique_ptr<uint8_t[]> scratch(new uint8_t[std::max<uint64_t>(batch_bytes, 1)]);
    std::vector<TensorDestination> dests;
    uint64_t off = 0;
    for (size_t k = i; k < j; ++k) {
      dests.push_back({k, scratch.get() + off});
      off += entries[k].expected_bytes();
    }
    LoadResult r = load(dests, opt);
    mismatches.insert(mismatches.end(), r.mismatches.begin(), r.mismatches.end());
    i = j;
  }
  return mismatches;
}

}  // namespace tensorizer
