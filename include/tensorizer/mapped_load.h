// tensorizer/mapped_load.h — zero-copy loading of tensors from a memory-mapped local file.
//
// For a local, unencrypted file, each selected tensor's data is mapped copy-on-write
// (MAP_PRIVATE, so writing to a tensor never changes the file): no bytes are copied and no fresh
// memory is zeroed. The tensors are views of one mapping of the whole file (so the kernel maps
// the page cache's large folios 2 MiB at a time), which the reader's later calls share while any
// of its tensors lives, unless they ask for a tensor it already handed out (that one gets a mapping
// of its own: two loads of a tensor never share memory). A thread of the mapping's own maps their
// pages (MADV_POPULATE_READ) while the caller goes on to build its tensors, so the mapping work
// (about 2 ms per GB) overlaps the caller's and first touches find the pages mapped; a call for
// less than 4 MiB maps them itself. Dropping a tensor gives back its pages, the last one stops the
// threads and unmaps the file.
//
// Contract: the file must not be truncated or rewritten in place while a mapping is alive
// (the kernel would raise SIGBUS on access); files written by this library are replaced by
// rename, which is safe. Tensors whose data offset is not aligned (view_alignment()), or that are
// meta, empty or encrypted, cannot be mapped (can_map() says so); load them with Reader::load.
// Thread-safety: as Reader (one caller at a time).
#pragma once

#include <memory>
#include <vector>

#include "tensorizer/reader.h"

namespace tensorizer {

struct MappedTensor {
  size_t entry;
  uint8_t* data;                // entries()[entry].data_length bytes, writable (copy-on-write)
  std::shared_ptr<void> owner;  // unmaps when the last copy is gone
};

// Whether the entry's stored bytes are exactly its plaintext, non-empty, in a local file (what
// any route reading the file itself needs).
bool plain_local(Reader& reader, const IndexEntry& entry);

// The alignment a tensor's bytes need to be handed out where they lie: its element size, all a
// torch tensor needs (safetensors aligns only its buffer, to 8 bytes, and its own loaders hand out
// such views; the reference's .tensors files align nothing, and hold by chance about half their
// 16-bit tensors at their element size, a quarter of the 32-bit ones). This library's writer puts
// every tensor at 64 bytes (4096 for large ones), so tensors of the files it writes come out
// 64-byte aligned.
uint64_t view_alignment(const IndexEntry& entry);

// Whether map_tensors() can serve this entry of this reader (plain_local and view-aligned).
bool can_map(Reader& reader, size_t entry);

// Maps the given entries (each must pass can_map), reading their headers, and starts mapping their
// pages in the background (above); with options.verify_hash every stored hash is checked on
// options.num_workers threads (kHashMismatch naming the tensor).
std::vector<MappedTensor> map_tensors(Reader& reader, const std::vector<size_t>& entries,
                                      const LoadOptions& options = {});

}  // namespace tensorizer
