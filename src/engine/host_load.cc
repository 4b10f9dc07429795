// Route choice and the direct and copy routes of host loads (see tensorizer/host_load.h).
#include "tensorizer/host_load.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include "common/worker_pool.h"
#include "engine/direct_io.h"
#include "engine/host_block.h"
#include "engine/verify_tensor.h"
#include "engine/warm_block.h"
#include "tensorizer/error.h"
#include "tensorizer/mapped_load.h"

namespace tensorizer {
namespace {

using engine::HostBlock;

constexpr uint64_t kAlignment = 64;             // where copied results start, and direct ones moved
constexpr uint64_t kDirectPiece = 16ull << 20;  // one direct read
constexpr uint64_t kMaxRunGap = 1ull << 20;     // skip gaps larger than this between direct reads
constexpr double kMappedIfResident = 0.5;       // map a tensor when more than this is cached
// Map every mappable tensor when at least this share of their bytes is cached: the pages missing
// from a warm file (aged out by reclaim) are then read through the page cache, only those pages,
// where the direct route would read each tensor that lost some of them whole, into fresh memory
// (measured: 37 ms against 63 ms for a 0.8 GB file missing 44 MB), and the file is whole in the
// cache again for the next load.
constexpr double kMapAllIfResident = 0.9;
constexpr uint64_t kFileSamples = 64;  // pages asked about to judge the whole file at once
constexpr int kMinDirectReads = 8;     // direct reads in flight, even on few cores
constexpr int kMaxDirectReads = 16;

uint64_t align_down(uint64_t v, uint64_t a) { return v / a * a; }
uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// Whether the tensor's bytes can be handed out where they lie (view_alignment: its element size).
bool aligned_in_place(const IndexEntry& e) { return e.data_offset % view_alignment(e) == 0; }

// Whether the tensor's data can be moved down to a 64-byte boundary without touching the
// previous tensor (only its own header lies below it).
bool can_move_down(const IndexEntry& e) { return e.data_offset % kAlignment <= e.header_size(); }

// Whether the direct route can serve the tensor: its data is aligned enough where it lies, or can
// be moved to a 64-byte boundary.
bool can_direct(Reader& r, const IndexEntry& e) {
  return plain_local(r, e) && (aligned_in_place(e) || can_move_down(e));
}

// Reads runs of neighbouring tensors with O_DIRECT into one anonymous block; then, per tensor,
// parses its header from the block, moves its data to a 64-byte boundary when it lies off its
// element size, and checks hashes.
void load_direct(Reader& r, const engine::DirectFile& file, const std::vector<size_t>& entries,
                 const LoadOptions& opt, std::vector<HostTensor>& out,
                 const std::vector<size_t>& slots) {
  const auto& index = r.entries();
  const uint64_t a = file.alignment();
  std::vector<size_t> order(entries.size());
  for (size_t k = 0; k < order.size(); ++k) order[k] = k;
  std::sort(order.begin(), order.end(), [&](size_t x, size_t y) {
    return index[entries[x]].header_offset < index[entries[y]].header_offset;
  });

  struct Run {
    uint64_t begin, end, block_offset;  // file range (aligned) and where it lands in the block
    uint64_t data_end;                  // end of the last tensor's bytes: must exist in the file
  };
  std::vector<Run> runs;
  std::vector<size_t> run_of(entries.size());
  uint64_t total = 0;
  for (size_t k : order) {
    const IndexEntry& e = index[entries[k]];
    const uint64_t begin = align_down(e.header_offset, a),
                   end = align_up(e.data_offset + e.data_length, a);
    const uint64_t data_end = e.data_offset + e.data_length;
    if (runs.empty() || begin > runs.back().end + kMaxRunGap) {
      if (!runs.empty()) total += runs.back().end - runs.back().begin;
      runs.push_back({begin, end, total, data_end});
    } else {
      runs.back().end = std::max(runs.back().end, end);
      runs.back().data_end = std::max(runs.back().data_end, data_end);
    }
    run_of[k] = runs.size() - 1;
  }
  total += runs.back().end - runs.back().begin;
  auto block = HostBlock::anonymous(total);

  struct Piece {
    uint64_t offset, length, required, block_offset;
  };
  std::vector<Piece> pieces;
  for (const Run& run : runs)
    for (uint64_t off = run.begin; off < run.end; off += kDirectPiece) {
      const uint64_t length = std::min(kDirectPiece, run.end - off);
      const uint64_t required = run.data_end > off ? std::min(length, run.data_end - off) : 0;
      pieces.push_back({off, length, required, run.block_offset + (off - run.begin)});
    }
  const int readers = opt.num_workers > 0
                          ? opt.num_workers
                          : std::clamp(default_workers(0), kMinDirectReads, kMaxDirectReads);
  const std::string what = "'" + r.uri() + "'";
  parallel_for(pieces.size(), readers, [&](size_t i) {
    const Piece& p = pieces[i];
    file.read(block->data() + p.block_offset, p.offset, p.length, p.required, what);
    r.count_bytes_read(p.required);
  });

  parallel_for(entries.size(), default_workers(opt.num_workers), [&](size_t k) {
    const size_t entry = entries[k];
    const IndexEntry& e = index[entry];
    const Run& run = runs[run_of[k]];
    uint8_t* at = block->data() + run.block_offset;
    const uint8_t* header = at + (e.header_offset - run.begin);
    r.adopt_header(entry, {reinterpret_cast<const char*>(header), e.header_size()});
    uint8_t* data = at + (e.data_offset - run.begin);
    // The block holds the file's bytes at their offset modulo the direct I/O alignment, so data
    // aligned in the file is aligned in memory.
    uint8_t* dest =
        aligned_in_place(e) ? data : at + (align_down(e.data_offset, kAlignment) - run.begin);
    if (dest != data) std::memmove(dest, data, e.data_length);  // over its own header only
    if (opt.verify_hash) engine::verify_tensor(r, entry, dest);
    out[slots[k]] = {entry, dest, e.data_length, LoadedVia::kDirect,
                     engine::block_view(block, dest, e.data_length)};
  });
}

// Loads the tensors with Reader::load into one anonymous block, each at a 64-byte boundary.
void load_copied(Reader& r, const std::vector<size_t>& entries, const LoadOptions& opt,
                 std::vector<HostTensor>& out, const std::vector<size_t>& slots) {
  std::vector<uint64_t> offsets(entries.size());
  uint64_t total = 0;
  for (size_t k = 0; k < entries.size(); ++k) {
    offsets[k] = total;
    total = align_up(total + r.entries()[entries[k]].expected_bytes(), kAlignment);
  }
  std::shared_ptr<HostBlock> block =
      engine::take_warm_block(r, total);  // mapped while the server thought
  if (!block) block = HostBlock::anonymous(total);
  std::vector<TensorDestination> dests;
  dests.reserve(entries.size());
  for (size_t k = 0; k < entries.size(); ++k)
    dests.push_back({entries[k], block->data() + offsets[k], /*zeroed=*/true});
  LoadOptions copy_options = opt;
  copy_options.advise_huge_pages = false;  // see HostBlock::anonymous
  r.load(dests, copy_options);
  for (size_t k = 0; k < entries.size(); ++k) {
    const size_t n = r.entries()[entries[k]].expected_bytes();
    uint8_t* data = block->data() + offsets[k];
    out[slots[k]] = {entries[k], data, n, LoadedVia::kCopied, engine::block_view(block, data, n)};
  }
}

}  // namespace

const char* to_string(LoadedVia via) {
  switch (via) {
    case LoadedVia::kMapped:
      return "mapped";
    case LoadedVia::kDirect:
      return "direct";
    case LoadedVia::kCopied:
      return "copied";
  }
  return "?";
}

std::vector<HostTensor> load_to_host(Reader& reader, const std::vector<size_t>& entries,
                                     const LoadOptions& options, HostRoute route) {
  for (size_t entry : entries)
    if (entry >= reader.entries().size())
      fail(ErrorCode::kInvalidArgument, "tensor index " + std::to_string(entry) + " out of range");
  const int fd = reader.source().local_fd();
  const bool direct_io =
      fd >= 0 && !reader.encrypted() && (route == HostRoute::kAuto || route == HostRoute::kDirect);

  // Route of each tensor: slots[k] is where its result goes. Under kAuto the share of each tensor
  // in the page cache decides, and that of all mappable bytes together (kMapAllIfResident).
  const size_t n = entries.size();
  // judged: a tensor whose route its residency decides (kAuto, and it could be mapped or read
  // direct).
  std::vector<char> mappable(n), directable(n), judged(n);
  std::vector<double> cached(n, 1.0);
  std::vector<std::pair<uint64_t, uint64_t>> asked;  // the byte ranges whose residency decides
  for (size_t k = 0; k < n; ++k) {
    const IndexEntry& e = reader.entries()[entries[k]];
    mappable[k] =
        route != HostRoute::kCopy && route != HostRoute::kDirect && can_map(reader, entries[k]);
    directable[k] = direct_io && can_direct(reader, e);  // if the file system allows (below)
    judged[k] = route == HostRoute::kAuto && (mappable[k] || directable[k]);
    if (judged[k]) asked.push_back({e.data_offset, e.data_length});
  }
  double map_bytes = 0, map_cached = 0;
  if (!asked.empty()) {
    // The whole file first, from a few pages: wholly cached or wholly not (the usual states) ends
    // it; in between, each tensor is asked about (a thousand mincore calls for 237 tensors).
    const engine::Residency residency(fd);
    const double whole = residency.fraction(asked, kFileSamples);
    for (size_t k = 0; k < n; ++k) {
      if (!judged[k]) continue;
      const IndexEntry& e = reader.entries()[entries[k]];
      cached[k] =
          whole == 1.0 || whole == 0.0 ? whole : residency.fraction(e.data_offset, e.data_length);
      if (mappable[k]) {
        map_bytes += static_cast<double>(e.data_length);
        map_cached += cached[k] * static_cast<double>(e.data_length);
      }
    }
  }
  const bool warm_file = map_bytes > 0 && map_cached >= kMapAllIfResident * map_bytes;
  std::vector<char> dio(n);
  bool any_dio = false;
  for (size_t k = 0; k < n; ++k) {
    if (judged[k]) {
      const bool resident = cached[k] > kMappedIfResident || (warm_file && mappable[k]);
      dio[k] = directable[k] && !resident;
    } else if (route == HostRoute::kDirect) {
      dio[k] = directable[k];
    }
    any_dio = any_dio || dio[k];
  }
  // Opened only when some tensor takes the direct route: a second descriptor of the file (a
  // cached load never needs it); where the file system refuses direct I/O, those tensors are
  // mapped or copied instead.
  std::unique_ptr<engine::DirectFile> file;
  if (any_dio) {
    file = std::make_unique<engine::DirectFile>(fd);
    if (!file->ok()) file.reset();
  }
  std::vector<size_t> mapped, direct, copied, mapped_slots, direct_slots, copied_slots;
  for (size_t k = 0; k < n; ++k) {
    const bool direct_read = dio[k] && file;
    const bool map = mappable[k] && !direct_read;  // cached, or cold without direct I/O
    if (map)
      mapped.push_back(entries[k]), mapped_slots.push_back(k);
    else if (direct_read)
      direct.push_back(entries[k]), direct_slots.push_back(k);
    else
      copied.push_back(entries[k]), copied_slots.push_back(k);
  }

  std::vector<HostTensor> out(entries.size());
  if (!mapped.empty()) {
    auto maps = map_tensors(reader, mapped, options);
    for (size_t k = 0; k < maps.size(); ++k)
      out[mapped_slots[k]] = {maps[k].entry, maps[k].data,
                              reader.entries()[maps[k].entry].data_length, LoadedVia::kMapped,
                              std::move(maps[k].owner)};
  }
  if (!direct.empty()) load_direct(reader, *file, direct, options, out, direct_slots);
  if (!copied.empty()) load_copied(reader, copied, options, out, copied_slots);
  return out;
}

}  // namespace tensorizer
