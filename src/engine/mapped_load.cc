// Zero-copy loads from memory-mapped local files (see tensorizer/mapped_load.h).
#include "tensorizer/mapped_load.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include "tensorizer/error.h"
#include "tensorizer/hash.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

namespace tensorizer {
namespace {

constexpr uint64_t kPopulatePiece = 64ull << 20;  // unit of work for the pre-faulting workers
constexpr uint64_t kDataAlignment = 64;

// Faults in [p, p+n) read-only from the page cache.
void populate(uint8_t* p, size_t n) {
  if (madvise(p, n, MADV_POPULATE_READ) == 0) return;
  // Kernels before 5.14: touch one byte per page instead.
  const long page = sysconf(_SC_PAGESIZE);
  volatile uint8_t sink = 0;
  for (size_t i = 0; i < n; i += static_cast<size_t>(page)) sink = sink + p[i];
  (void)sink;
}

void verify(const IndexEntry& e, const LoadedTensorInfo& info, const uint8_t* data) {
  const TensorHeader& h = info.header;
  bool crc = false, sha = false;
  for (const auto& hv : h.hashes) (hv.type == HashType::kCrc32 ? crc : sha) = true;
  if (!crc && !sha) return;
  const auto* raw = reinterpret_cast<const uint8_t*>(info.header_bytes.data());
  TensorHasher hasher(crc, sha, hashable_header(raw, info.header_bytes.size(), h));
  hasher.update(data, e.data_length);
  hasher.finish();
  const uint32_t crc32 = hasher.crc32();
  for (const auto& hv : h.hashes) {
    bool ok = hv.type == HashType::kCrc32
                  ? std::memcmp(raw + hv.value_offset, &crc32, 4) == 0
                  : std::memcmp(raw + hv.value_offset, hasher.sha256().data(), 32) == 0;
    if (!ok)
      fail(ErrorCode::kHashMismatch, std::string(hv.type == HashType::kCrc32 ? "CRC32" : "SHA-256") +
                                         " mismatch for tensor '" + display_path(e.path) + "'");
  }
}

}  // namespace

bool can_map(Reader& reader, size_t entry) {
  if (entry >= reader.entries().size() || reader.encrypted() || reader.source().local_fd() < 0)
    return false;
  const IndexEntry& e = reader.entries()[entry];
  return e.data_length > 0 && e.data_length == e.expected_bytes() && e.data_offset % kDataAlignment == 0;
}

std::vector<MappedTensor> map_tensors(Reader& reader, const std::vector<size_t>& entries,
                                      const LoadOptions& options) {
  const int fd = reader.source().local_fd();
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::vector<MappedTensor> out;
  out.reserve(entries.size());
  for (size_t entry : entries) {
    if (!can_map(reader, entry))
      fail(ErrorCode::kInvalidArgument, "tensor index " + std::to_string(entry) + " of '" + reader.uri() +
                                            "' cannot be memory-mapped");
    const IndexEntry& e = reader.entries()[entry];
    reader.read_header(entry);  // checks the header against the index; module index, hashes
    const uint64_t start = e.data_offset / page * page;
    const size_t length = static_cast<size_t>(e.data_offset - start + e.data_length);
    void* base = mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, static_cast<off_t>(start));
    if (base == MAP_FAILED)
      fail(ErrorCode::kIO, "cannot map tensor '" + display_path(e.path) + "' of '" + reader.uri() +
                               "': " + std::strerror(errno));
    std::shared_ptr<void> owner(base, [length](void* p) { munmap(p, length); });
    out.push_back({entry, static_cast<uint8_t*>(base) + (e.data_offset - start), std::move(owner)});
  }

  // Pre-fault (and verify) on N workers, in pieces so one big tensor is shared out too.
  struct Piece {
    size_t tensor;
    uint64_t begin, length;
  };
  std::vector<Piece> pieces;
  for (size_t t = 0; t < out.size(); ++t) {
    const uint64_t len = reader.entries()[out[t].entry].data_length;
    if (options.verify_hash) {
      pieces.push_back({t, 0, len});  // hashing needs the tensor whole, in order
      continue;
    }
    for (uint64_t off = 0; off < len; off += kPopulatePiece)
      pieces.push_back({t, off, std::min(kPopulatePiece, len - off)});
  }
  int workers = options.num_workers > 0 ? options.num_workers : usable_cores();
  workers = std::max(1, std::min<int>(workers, static_cast<int>(pieces.size())));
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::exception_ptr error;
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < pieces.size();) {
      const Piece& p = pieces[i];
      const MappedTensor& m = out[p.tensor];
      try {
        populate(m.data + p.begin, p.length);
        if (options.verify_hash) verify(reader.entries()[m.entry], *reader.loaded_info(m.entry), m.data);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        next = pieces.size();
      }
    }
  };
  std::vector<std::thread> threads;
  for (int i = 1; i < workers; ++i) threads.emplace_back(work);
  work();
  for (auto& t : threads) t.join();
  if (error) {
    try {
      std::rethrow_exception(error);
    } catch (const Error& err) {
      throw Error(err.code(), "'" + reader.uri() + "': " + err.what());
    }
  }
  return out;
}

}  // namespace tensorizer
