// Writes a safetensors object through a Sink (see tensorizer/safetensors_writer.h).
#include "tensorizer/safetensors_writer.h"

#include <algorithm>

#include "common/worker_pool.h"
#include "tensorizer/cancel.h"
#include "tensorizer/error.h"

namespace tensorizer {
namespace {

constexpr uint64_t kPieceBytes = 16ull << 20;  // one write of one worker

}  // namespace

uint64_t publish_safetensors(Sink& sink, const std::function<SafetensorsLayout()>& plan,
                             const std::function<void(const SafetensorsLayout&)>& write_data) {
  try {
    const SafetensorsLayout layout = plan();
    sink.reserve(layout.file_size);
    sink.write_at(0, layout.prefix.data(), layout.prefix.size());
    write_data(layout);
    if (sink.wants_parts()) sink.set_parts(layout.parts);
    sink.commit();
    return layout.file_size;
  } catch (...) {
    sink.abort();
    throw;
  }
}

uint64_t write_safetensors(
    Sink& sink, const std::vector<SafetensorsTensor>& tensors, const std::vector<const void*>& data,
    const std::optional<std::vector<std::pair<std::string, std::string>>>& metadata,
    int num_workers) {
  if (data.size() != tensors.size())
    fail(ErrorCode::kInvalidArgument, "write_safetensors: one data pointer per tensor is needed");
  return publish_safetensors(
      sink, [&] { return plan_safetensors(tensors, metadata); },
      [&](const SafetensorsLayout& layout) {
        struct Piece {
          size_t tensor;
          uint64_t begin, length;
        };
        std::vector<Piece> pieces;
        for (size_t t = 0; t < tensors.size(); ++t) {
          const uint64_t length = layout.data_length[t];
          if (length > 0 && !data[t])
            fail(ErrorCode::kInvalidArgument,
                 "tensor '" + shown_bytes(tensors[t].name) + "' has no data");
          for (uint64_t b = 0; b < length; b += kPieceBytes)
            pieces.push_back({t, b, std::min(kPieceBytes, length - b)});
        }
        parallel_for(pieces.size(), default_workers(num_workers), [&](size_t i) {
          check_cancelled();
          const Piece& p = pieces[i];
          sink.write_at(layout.data_offset[p.tensor] + p.begin,
                        static_cast<const uint8_t*>(data[p.tensor]) + p.begin, p.length);
        });
      });
}

}  // namespace tensorizer
