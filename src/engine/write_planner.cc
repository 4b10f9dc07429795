// Write planner implementation (see write_planner.h). Pure: no I/O.
#include "engine/write_planner.h"

#include <algorithm>
#include <string_view>

#include "crypto/tensor_crypto.h"
#include "tensorizer/dtype.h"
#include "tensorizer/error.h"

namespace tensorizer::engine {
namespace {

constexpr uint64_t kLongDim = uint64_t{1} << 32;

uint64_t round_up(uint64_t v, uint64_t m) { return m <= 1 ? v : (v + m - 1) / m * m; }

// Checks one request and fills the entry's name, type, dtype, shape and data length; raises the
// version in `next` to what the tensor needs.
IndexEntry describe(const WriteRequest& r, bool streamed, FileHeader& next) {
  IndexEntry e;
  e.path = r.path;
  e.name = encode_path(r.path);
  const std::string label = "tensor '" + display_path(r.path).substr(0, 200) + "'";
  if (e.name.size() > 0xffff)
    fail(ErrorCode::kInvalidArgument, label + ": name longer than 65535 bytes");
  if (r.type != TensorType::kStateDict && !r.path.is_plain())
    fail(ErrorCode::kInvalidArgument, label + ": structured names need tensor type STATE_DICT");
  if (r.dtype.size() > 255) fail(ErrorCode::kInvalidArgument, label + ": dtype string too long");
  if (r.shape.size() > 255) fail(ErrorCode::kInvalidArgument, label + ": more than 255 dimensions");
  DType dt;
  try {
    dt = parse_dtype(r.dtype);
    if (dt.opaque())
      torch_dtype_itemsize(dt.torch);  // a real, non-quantized torch dtype
    else if (std::string_view("biufc").find(dt.kind) == std::string_view::npos)
      fail(ErrorCode::kInvalidArgument, "no torch dtype stores numpy kind '" +
                                            std::string(1, dt.kind) + "' ('" + r.dtype + "')");
  } catch (const Error& err) {
    fail(ErrorCode::kInvalidArgument, label + ": " + err.what());
  }
  e.type = r.type;
  e.dtype = r.dtype;
  e.shape = r.shape;
  const bool long_dims =
      std::any_of(r.shape.begin(), r.shape.end(), [](uint64_t d) { return d >= kLongDim; });
  e.entry_version = long_dims ? kLongDimsVersion : 1;
  uint64_t bytes = 0;
  uint64_t elements = 1;
  bool overflow = false;
  for (uint64_t d : r.shape) overflow |= __builtin_mul_overflow(elements, d, &elements);
  if (overflow || __builtin_mul_overflow(elements, uint64_t{dt.itemsize}, &bytes))
    fail(ErrorCode::kInvalidArgument, label + ": size overflows 64 bits");
  e.data_length = r.meta ? 0 : bytes;
  if (e.data_length > 0 && !r.data && !streamed)
    fail(ErrorCode::kInvalidArgument, label + ": no data");
  next.version = std::max(next.version, dt.min_version());
  if (r.meta && bytes > 0) next.version = std::max(next.version, kMetaVersion);
  if (long_dims) {
    next.version = std::max(next.version, kLongDimsVersion);
    next.flags |= kFlagVersionedEntries;
  }
  return e;
}

// The header of one laid-out tensor; hash fields and the CryptInfo body are zero.
EncodedTensorHeader encode_header(const PlannedWrite& p, const WriterOptions& options,
                                  uint64_t at) {
  const IndexEntry& e = p.entry;
  TensorHeaderFields f;
  f.module_idx = p.request->module_idx;
  f.type = e.type;
  f.name = e.name;
  f.dtype = e.dtype;
  f.shape = &e.shape;
  f.long_shape = e.long_shape();
  f.crc32 = f.sha256 = options.hashes;
  f.data_length = e.data_length;
  if (options.encryption) {
    // Sealed tensors carry SHA-256 only; meta and zero-length ones an empty CryptInfo (§3.8).
    f.crypt_field = true;
    f.crc32 = f.crc32 && e.data_length == 0;
    f.crypt_info_size = e.data_length > 0 ? crypto::TensorEncryptor::crypt_info_size(
                                                *options.encryption, e.data_length)
                                          : crypto::kEmptyCryptInfoSize;
  }
  const uint64_t align =
      e.data_length >= options.large_threshold ? options.large_alignment : options.alignment;
  return encode_tensor_header(f, at, align);
}

}  // namespace

WritePlan plan_writes(const std::vector<WriteRequest>& requests, const WrittenSoFar& so_far,
                      const WriterOptions& options, bool streamed, const std::string& sink_uri) {
  WritePlan plan{so_far.header, {}, so_far.cursor};
  codec::PathRules batch_paths;  // names inside this batch
  plan.tensors.reserve(requests.size());
  for (const WriteRequest& r : requests) {
    const auto label = [&r] { return "tensor '" + display_path(r.path).substr(0, 200) + "'"; };
    PlannedWrite p{&r, describe(r, streamed, plan.header), {}};
    so_far.paths.check(r.path, label, ErrorCode::kInvalidArgument);
    batch_paths.add(r.path, label, ErrorCode::kInvalidArgument);
    plan.tensors.push_back(std::move(p));
  }

  // The index is sized on the first batch, with room to spare for later ones.
  const bool versioned = plan.header.versioned_entries();
  uint64_t index_needed = 0;
  for (const auto& e : so_far.entries) index_needed += index_entry_size(e, versioned);
  for (const auto& p : plan.tensors) index_needed += index_entry_size(p.entry, versioned);
  if (!so_far.started) {
    plan.header.index_size =
        std::max(options.index_reserve, round_up(index_needed + index_needed / 4, 4096));
    plan.end = kPreludeSize + plan.header.index_size;
  } else if (index_needed > plan.header.index_size) {
    fail(ErrorCode::kInvalidArgument,
         "metadata overflow: the index of '" + sink_uri + "' was sized to " +
             std::to_string(plan.header.index_size) + " bytes on the first write and " +
             std::to_string(index_needed) +
             " are needed; write all tensors in one call or raise WriterOptions::index_reserve");
  }

  // Headers and data back to back.
  for (auto& p : plan.tensors) {
    p.header = encode_header(p, options, plan.end);
    p.entry.header_offset = plan.end;
    p.entry.data_offset = plan.end + p.header.bytes.size();
    plan.end = p.entry.data_offset + p.entry.data_length;
  }
  return plan;
}

}  // namespace tensorizer::engine
