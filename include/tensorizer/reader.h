// tensorizer/reader.h — open a .tensors object and load tensors into caller memory.
//
// Reader::open reads the prelude and the whole index in one or two small reads and validates
// them (hostile input fails with an Error, never a crash). It also opens safetensors files
// (recognised by their first bytes, tensorizer/safetensors.h): their tensors have no per-tensor
// header and no hashes, and every load route serves them the same way. load() then fills
// caller-provided buffers: the planner cuts the requested tensors into contiguous byte ranges, N
// workers read them in parallel straight into the destinations (one copy, from the transport into
// the final memory), decrypt chunk by chunk and check hashes when asked. Meta tensors are
// zero-filled.
//
// Thread-safety: a Reader is used by one thread at a time (load() runs its own workers);
// entries() and header() may be read concurrently once open() returned.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tensorizer/crypto.h"
#include "tensorizer/format.h"
#include "tensorizer/transport.h"

namespace tensorizer {

enum class FileFormat { kTensorizer, kSafetensors };

struct ReaderOptions {
  TransportOptions transport;
  std::optional<DecryptionParams> decryption;  // required iff the file is encrypted
  bool without_key = false;  // open an encrypted file with no key, to inspect it (no loads)
  // The caller will load every tensor with load_to_host() next. A remote open whose server is slow
  // to answer then asks the object's size and maps that much fresh host memory while it waits,
  // which the load writes into (see host_bytes_premapped()).
  bool expect_host_load = false;
};

struct TensorDestination {
  size_t entry;         // index into Reader::entries()
  void* data;           // entries()[entry].expected_bytes() writable bytes
  bool zeroed = false;  // already all zeros (fresh anonymous memory): a meta tensor writes nothing,
                        // so its declared size commits no memory until it is touched
};

struct LoadOptions {
  int num_workers = 0;              // 0 = one per usable CPU core (at least 2 for remote sources)
  bool verify_hash = false;         // recompute CRC32/SHA-256 and compare
  bool collect_mismatches = false;  // with verify_hash: report mismatches instead of throwing
  // MADV_HUGEPAGE on destinations first, so fresh memory faults 2 MiB at a time. Off by default:
  // on a VM that backs guest memory lazily, a fresh huge page's first touch costs 3-4x that of
  // 4 KiB pages at a cold start (engine/host_block.h); it pays where memory is backed up front.
  bool advise_huge_pages = false;
};

// Bytes of a tensor's loaded form laid out as `runs` runs of `run_bytes`, the first `offset` bytes
// in and each next one `stride` bytes after the previous: a block of columns of a row-major
// matrix is one (offset = first column's byte, run = the block's row bytes, stride = a row's
// bytes, runs = rows). One run is a plain contiguous range.
struct StridedRange {
  uint64_t offset = 0;
  uint64_t run_bytes = 0;
  uint64_t stride = 0;
  uint64_t runs = 1;
};

struct LoadResult {
  uint64_t bytes_read = 0;              // bytes moved from the source by this load
  std::vector<std::string> mismatches;  // with collect_mismatches: one message per failed tensor
};

// What load() learned from a tensor's own header.
struct LoadedTensorInfo {
  uint16_t module_idx = 0;
  TensorHeader header;  // parsed
  // The raw header as on disk, except that a filler of zeros before its trailing data length (the
  // padding that aligns the data, up to a few KiB a tensor) is cut out and counted in
  // `zero_filler`: a load keeps tens of bytes per tensor, not pages. The offsets in `header` all
  // lie before the filler, so they index these bytes as they index the raw header.
  std::string compact_header;
  uint64_t zero_filler = 0;
  // The header exactly as on disk.
  std::string raw_header() const;
  const uint8_t* header_data() const {
    return reinterpret_cast<const uint8_t*>(compact_header.data());
  }
};

class Reader;
namespace engine {  // engine internals (engine/warm_block.h, engine/host_block.h)
class HostBlock;
std::shared_ptr<HostBlock> take_warm_block(Reader& reader, size_t size);
std::shared_ptr<HostBlock> file_mapping_for(Reader& reader, size_t file_size,
                                            const std::vector<size_t>& entries);
}  // namespace engine

class Reader {
 public:
  static std::unique_ptr<Reader> open(const std::string& uri, const ReaderOptions& options = {});
  static std::unique_ptr<Reader> open(std::unique_ptr<Source> source,
                                      const ReaderOptions& options = {});
  ~Reader();

  // For a safetensors file: version 0, tensor_count, tensor_size (data bytes) and index_size (the
  // JSON header's length); no flags.
  const FileHeader& header() const;
  FileFormat format() const;
  // The safetensors "__metadata__" strings, sorted by key (empty for .tensors files).
  const std::vector<std::pair<std::string, std::string>>& metadata() const;
  const std::vector<IndexEntry>& entries() const;
  const std::string& uri() const;
  bool encrypted() const { return header().has_crypt_info(); }
  // Index of the entry whose on-disk name is `name`, if any.
  std::optional<size_t> find(std::string_view name) const;

  // Loads the given tensors. Throws Error naming the tensor, URI and offset on failure; then the
  // content of every destination is unspecified.
  LoadResult load(const std::vector<TensorDestination>& destinations,
                  const LoadOptions& options = {});
  // Streams one tensor's stored bytes in order without holding it whole (re-encoding a file with
  // bounded memory): `consume(offset, data, size)` gets consecutive pieces of about
  // `piece_bytes` (whole encryption chunks), decrypted in encrypted files on
  // `options.num_workers` threads; with `options.verify_hash` the hashes are checked after the
  // last piece (kHashMismatch). Meta tensors store no bytes: nothing is consumed.
  using PieceConsumer = std::function<void(uint64_t offset, const uint8_t* data, size_t size)>;
  void read_streamed(size_t entry, const PieceConsumer& consume, const LoadOptions& options = {},
                     uint64_t piece_bytes = 16ull << 20);
  // Reads the bytes `range` selects of tensor `entry`'s loaded form (a block of rows or columns,
  // say) packed run after run into `dest`: only those bytes are read, plus the gaps between runs
  // where a gap is small enough that one request costs less than two (up to 128 KiB in a local
  // file, 4 MiB remotely; gap bytes land in per-worker scratch), in requests of about 8 MiB on
  // options.num_workers workers. In an encrypted file the whole chunks around the runs are read
  // and decrypted (scratch memory: their span); a meta tensor reads zeros. Stored hashes cover
  // whole tensors, so options.verify_hash is refused (kInvalidArgument): load the tensor to
  // check it.
  void read_strided(size_t entry, const StridedRange& range, void* dest,
                    const LoadOptions& options = {});
  // read_strided() of `size` contiguous bytes starting `offset` bytes into the tensor.
  void read_range(size_t entry, uint64_t offset, uint64_t size, void* dest,
                  const LoadOptions& options = {}) {
    read_strided(entry, StridedRange{offset, size, size, 1}, dest, options);
  }
  // Loads every tensor into scratch memory (bounded) and checks every stored hash; returns one
  // message per mismatch (empty when all match).
  std::vector<std::string> verify_all(int num_workers = 0);

  // Reads, checks and caches one tensor's own header (module index, stored hashes, crypt info);
  // returns the cached one when there is one. The reference (like loaded_info()'s pointer) stays
  // valid until the next load() of that tensor, which re-reads its header.
  const LoadedTensorInfo& read_header(size_t entry);
  // Parses, checks against the index and caches a tensor's header whose bytes the caller read
  // (e.g. inside a larger read; they are copied); replaces any cached one. Throws Error naming
  // tensor and URI. Not safe to call for the same entry from two threads; different entries are
  // fine.
  const LoadedTensorInfo& adopt_header(size_t entry, std::string_view header_bytes);
  // Header details of a tensor that has been loaded or had its header read (nullptr before).
  const LoadedTensorInfo* loaded_info(size_t entry) const;
  // Moves those details out (nullptr if none): the reader forgets them (loaded_info() is then
  // nullptr, a later load re-reads the header), for callers that keep them past the reader.
  std::unique_ptr<LoadedTensorInfo> take_loaded_info(size_t entry);
  // Decrypts in place `size` bytes of tensor `entry`'s data that start `offset` bytes into it (a
  // multiple of the encryption chunk size; whole chunks, the last may be the tensor's short one),
  // using the crypt info of its header (read_header or adopt_header first). Throws kCrypto on a
  // MAC failure. Does nothing in an unencrypted file. Safe for different entries concurrently.
  void decrypt_in_place(size_t entry, uint64_t offset, uint8_t* data, uint64_t size);
  Source& source();
  // Bytes this reader took from its object: through source(), plus what routes that read the file
  // themselves (mapped, direct I/O) reported with count_bytes_read().
  uint64_t bytes_read() const;
  void count_bytes_read(uint64_t n);
  // Bytes of host memory the open mapped while it waited for the server (expect_host_load) that
  // the load then wrote into; 0 before such a load, or when none was mapped.
  uint64_t host_bytes_premapped() const;

  struct Impl;  // opaque; defined in src/engine/reader_impl.h

 private:
  friend std::shared_ptr<engine::HostBlock> engine::take_warm_block(Reader&, size_t);
  friend std::shared_ptr<engine::HostBlock> engine::file_mapping_for(Reader&, size_t,
                                                                     const std::vector<size_t>&);
  explicit Reader(std::unique_ptr<Impl> impl);
  static std::unique_ptr<Reader> finish_open(std::unique_ptr<Impl> impl,
                                             std::unique_ptr<Source> source,
                                             const ReaderOptions& options);
  std::unique_ptr<Impl> impl_;
};

// Usable CPU cores of this process (affinity and cgroup quota aware), at least 1.
int usable_cores();

}  // namespace tensorizer
