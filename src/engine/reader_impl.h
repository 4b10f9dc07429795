// Reader's state and the helpers its two halves share: reader.cc (open, index, headers, streamed,
// strided and verifying reads) and load_job.cc (parallel loads into caller memory) (internal
// header).
#pragma once

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "crypto/tensor_crypto.h"
#include "engine/warm_block.h"
#include "tensorizer/error.h"
#include "tensorizer/reader.h"

namespace tensorizer {

struct Reader::Impl {
  std::unique_ptr<Source> source;
  FileHeader header;
  std::vector<IndexEntry> entries;
  std::unordered_map<std::string_view, size_t> by_name;
  FileFormat format = FileFormat::kTensorizer;
  std::vector<std::pair<std::string, std::string>> metadata;  // safetensors' __metadata__
  std::optional<DecryptionParams> decryption;
  crypto::KeyCache key_cache;
  std::vector<std::unique_ptr<LoadedTensorInfo>> loaded;
  std::atomic<uint64_t> bytes_read_elsewhere{0};  // by mapped and direct loads
  double first_read_s = 0;  // what one request costs: its wait for a first byte, else the open's
  uint64_t premapped = 0;   // host_bytes_premapped()
  // The local file's mapping that mapped loads share while any of their tensors lives, and which
  // entries it has handed out (engine::file_mapping_for).
  std::weak_ptr<engine::HostBlock> file_mapping;
  std::vector<bool> mapped_entries;
  std::unique_ptr<engine::WarmBlock> warm;  // expect_host_load; last, so it goes before the source
};

namespace engine {

// A tensor's name as messages show it (at most 200 characters).
std::string shown_name(const IndexEntry& e);

// Re-throws `err` with the tensor and source it concerns prepended.
[[noreturn]] void rethrow_with_context(const Error& err, const std::string& context);

// A tensor's own header, parsed and checked against its index entry. A safetensors tensor has
// none (zero bytes): its details then come from the index alone, with no hashes to check.
std::unique_ptr<LoadedTensorInfo> loaded_info_from(const FileHeader& file, const IndexEntry& e,
                                                   std::string_view bytes);

// Reader::load after its checks: plans the destinations' tensors into read items and runs the
// workers (load_job.cc).
LoadResult run_load_job(Reader::Impl& reader, const std::vector<TensorDestination>& destinations,
                        const LoadOptions& options);

}  // namespace engine
}  // namespace tensorizer
