// Zero-copy loads from memory-mapped local files (see tensorizer/mapped_load.h).
#include "tensorizer/mapped_load.h"

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>
#include <vector>

#include "common/worker_pool.h"
#include "engine/host_block.h"
#include "engine/verify_tensor.h"
#include "tensorizer/cancel.h"
#include "tensorizer/error.h"

namespace tensorizer {
namespace {

constexpr uint64_t kPmdBytes = 2ull << 20;  // what one page-table entry maps for a huge folio

}  // namespace

bool plain_local(Reader& reader, const IndexEntry& e) {
  return !reader.encrypted() && reader.source().local_fd() >= 0 && !e.is_meta() &&
         e.data_length > 0 && e.data_length == e.expected_bytes();
}

uint64_t view_alignment(const IndexEntry& e) { return std::max<uint64_t>(e.itemsize(), 1); }

bool can_map(Reader& reader, size_t entry) {
  if (entry >= reader.entries().size()) return false;
  const IndexEntry& e = reader.entries()[entry];
  return plain_local(reader, e) && e.data_offset % view_alignment(e) == 0;
}

std::vector<MappedTensor> map_tensors(Reader& reader, const std::vector<size_t>& entries,
                                      const LoadOptions& options) {
  for (size_t entry : entries)
    if (!can_map(reader, entry))
      fail(ErrorCode::kInvalidArgument, "tensor index " + std::to_string(entry) + " of '" +
                                            reader.uri() + "' cannot be memory-mapped");
  const int fd = reader.source().local_fd();
  struct stat st;
  if (fstat(fd, &st) != 0)
    fail(ErrorCode::kIO, "cannot stat '" + reader.uri() + "': " + std::strerror(errno));
  // One mapping of the whole file, shared by the tensors' views, and by later calls while any of
  // them lives (lazy loads, tensor by tensor, would otherwise hold a mapping each: a process may
  // hold about 65,000): mapped from offset 0 it lines up with the page cache's large folios,
  // which the kernel then maps 2 MiB at a time.
  auto block = engine::file_mapping_for(reader, static_cast<size_t>(st.st_size), entries);
  std::vector<MappedTensor> out;
  out.reserve(entries.size());
  std::string header;  // one buffer for every header read: a fresh process pays for new pages
  for (size_t entry : entries) {
    check_cancelled();  // each tensor is a work item: a cancelled or late load stops here
    const IndexEntry& e = reader.entries()[entry];
    if (e.header_offset > e.data_offset ||
        e.data_offset + e.data_length > static_cast<uint64_t>(st.st_size))
      fail(ErrorCode::kFormat,
           "tensor '" + display_path(e.path) + "' runs past the end of '" + reader.uri() + "'");
    // The header, read (not faulted in through the mapping, which maps its pages in the
    // background): checked against the index; module index, hashes.
    header.resize(e.header_size());
    if (!header.empty()) reader.source().read_at(e.header_offset, header.data(), header.size());
    reader.adopt_header(entry, header);
    reader.count_bytes_read(e.header_size() + e.data_length);
    uint8_t* data = block->data() + e.data_offset;
    out.push_back({entry, data, engine::block_view(block, data, e.data_length)});
  }

  // Map the pages on a thread of the block's own while the caller builds its tensors, in the
  // merged tensor ranges widened to 2 MiB boundaries: a fault at the first page of a PMD-sized
  // folio maps it whole, one in its middle only one page. A small load (a lazy one's tensor) maps
  // just its own pages, here: widened, each would map 2 MiB again.
  uint64_t total = 0;
  for (const MappedTensor& m : out) total += reader.entries()[m.entry].data_length;
  const uint64_t widen = total < engine::HostBlock::kInlineMapBytes ? 1 : kPmdBytes;
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // [begin, end) in the file
  for (const MappedTensor& m : out) {
    const IndexEntry& e = reader.entries()[m.entry];
    const uint64_t b = e.data_offset / widen * widen;
    const uint64_t end =
        std::min<uint64_t>((e.data_offset + e.data_length + widen - 1) / widen * widen,
                           static_cast<uint64_t>(st.st_size));
    spans.push_back({b, end});
  }
  std::sort(spans.begin(), spans.end());
  std::vector<std::pair<uint8_t*, size_t>> ranges;
  for (size_t k = 0; k < spans.size();) {
    uint64_t b = spans[k].first, end = spans[k].second;
    for (++k; k < spans.size() && spans[k].first <= end; ++k) end = std::max(end, spans[k].second);
    ranges.push_back({block->data() + b, end - b});
  }
  block->map_in_background(ranges);
  if (options.verify_hash)
    parallel_for(out.size(), default_workers(options.num_workers),
                 [&](size_t t) { engine::verify_tensor(reader, out[t].entry, out[t].data); });
  return out;
}

}  // namespace tensorizer
