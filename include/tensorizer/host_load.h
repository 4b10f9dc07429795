// tensorizer/host_load.h — load tensors into host memory the engine owns, by the fastest safe
// route for each tensor. This is what a default CPU load uses.
//
// Routes (LoadedVia), chosen per tensor under HostRoute::kAuto:
//  - kMapped: a tensor of a local, unencrypted file, stored 64-byte aligned, whose pages are
//    mostly in the page cache (or of a file whose mappable bytes are at least 90% cached) is
//    mapped copy-on-write and pre-faulted in the background (mapped_load.h): no copy, no fresh
//    memory, no second copy of the bytes in RAM; missing pages come in through the page cache.
//  - kDirect: a tensor of a local, unencrypted file whose pages are not in the page cache is read
//    with O_DIRECT, in large aligned reads with several in flight, into anonymous memory (no
//    page-cache copy either; 4 KiB pages, see engine/host_block.h for why not huge ones). Tensors
//    stored at unaligned offsets (files the reference wrote) are moved down to a 64-byte boundary
//    inside that memory after the read.
//  - kCopied: everything else (encrypted or remote sources, meta and empty tensors, warm
//    unaligned tensors, file systems without O_DIRECT) is loaded by Reader::load into anonymous
//    memory.
// Residency is asked of the kernel with mincore() on the tensor's pages just before the load.
// kMap, kDirect and kCopy force a route wherever it can serve a tensor (kCopy everywhere).
//
// Every result owns its bytes: dropping it releases its pages (and unmaps a mapped tensor); a
// block shared by several tensors is freed with the last. Mapped tensors share the caveat of any
// file mapping: truncating the file in place while they live raises SIGBUS on access; deleting
// or replacing the file by rename is safe. Thread-safety: as Reader (one caller at a time).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "tensorizer/reader.h"

namespace tensorizer {

enum class HostRoute { kAuto, kMap, kDirect, kCopy };
enum class LoadedVia { kMapped, kDirect, kCopied };
const char* to_string(LoadedVia via);

struct HostTensor {
  size_t entry;   // index into Reader::entries()
  uint8_t* data;  // expected_bytes() bytes, writable, view_alignment()-aligned (mapped_load.h)
  size_t size;
  LoadedVia via;
  std::shared_ptr<void> owner;  // releases the bytes when the last copy goes
};

// Loads `entries` (in that order in the result); options as for Reader::load (verify_hash is
// honoured on every route). Throws Error naming the tensor and URI on failure.
std::vector<HostTensor> load_to_host(Reader& reader, const std::vector<size_t>& entries,
                                     const LoadOptions& options = {},
                                     HostRoute route = HostRoute::kAuto);

}  // namespace tensorizer
