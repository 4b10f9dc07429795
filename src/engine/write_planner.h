// The write planner: turns a batch of write requests into a file layout, beside the load planner
// (read_planner.h) that turns a load into read items.
//
// Pure (no I/O, no hashing): it validates every request (names, dtypes, shapes, sizes) before
// anything is written, picks the lowest data version and the flags the batch needs
// (docs/format.md §1.3), sizes the index on the first batch and places each tensor's header and
// data back to back, data aligned as WriterOptions asks. Hash values and CryptInfo bodies are left
// zero in the encoded headers; the writer fills them once the data has been hashed and sealed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "codec/path_rules.h"
#include "tensorizer/format.h"
#include "tensorizer/writer.h"

namespace tensorizer::engine {

// What the earlier batches of one writer left behind.
struct WrittenSoFar {
  const FileHeader& header;
  const std::vector<IndexEntry>& entries;
  const codec::PathRules& paths;
  bool started;     // the index was sized by an earlier batch
  uint64_t cursor;  // end of the last tensor's data
};

struct PlannedWrite {
  const WriteRequest* request;
  IndexEntry entry;            // name, type, dtype, shape, header and data offsets, data length
  EncodedTensorHeader header;  // to be completed with hashes (and CryptInfo) before it is written
};

struct WritePlan {
  FileHeader header;  // version, flags and index size once the batch is written (counts unchanged)
  std::vector<PlannedWrite> tensors;
  uint64_t end;  // end of the batch's last tensor data: where the next batch starts
};

// Throws Error(kInvalidArgument) naming the tensor for a request the format cannot hold, or when
// the index sized by the first batch cannot take this one. `streamed`: the data comes from a
// producer, so requests need no `data` pointer. `sink_uri` is for messages.
WritePlan plan_writes(const std::vector<WriteRequest>& requests, const WrittenSoFar& so_far,
                      const WriterOptions& options, bool streamed, const std::string& sink_uri);

}  // namespace tensorizer::engine
