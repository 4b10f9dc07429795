// Re-encoding an open object as .tensors or safetensors (see tensorizer/convert.h).
#include "tensorizer/convert.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "tensorizer/error.h"
#include "tensorizer/safetensors_writer.h"

namespace tensorizer {
namespace {

constexpr uint64_t kStreamAbove = 16ull << 20;  // tensors larger than this are streamed
constexpr char kNamesKey[] = "tensorizer.names";
constexpr char kTypesKey[] = "tensorizer.types";

// One tensor of a batch: its loaded bytes (nullptr for a meta tensor, which stores none).
struct Loaded {
  size_t entry;
  const uint8_t* data;
};
using PieceSource = std::function<void(const Reader::PieceConsumer&)>;

// Visits every tensor of `in` in index order: small ones in batches loaded (and hash-checked) on
// all cores into one buffer of at most kConvertBatchBytes, large ones one at a time as pieces.
void visit_tensors(Reader& in, int workers, const std::function<void(std::vector<Loaded>&)>& batch,
                   const std::function<void(size_t, const PieceSource&)>& streamed) {
  const auto& entries = in.entries();
  LoadOptions lo;
  lo.num_workers = workers;
  lo.verify_hash = true;
  std::vector<size_t> pending;
  uint64_t pending_bytes = 0;
  auto flush = [&] {
    if (pending.empty()) return;
    std::unique_ptr<uint8_t[]> buf(new uint8_t[std::max<uint64_t>(pending_bytes, 1)]);
    std::vector<TensorDestination> dests;
    std::vector<Loaded> loaded;
    uint64_t off = 0;
    for (size_t i : pending) {
      const bool meta = entries[i].is_meta();
      loaded.push_back({i, meta ? nullptr : buf.get() + off});
      if (meta) continue;  // no bytes: only its header is needed
      dests.push_back({i, buf.get() + off});
      off += entries[i].data_length;
    }
    in.load(dests, lo);
    batch(loaded);
    pending.clear();
    pending_bytes = 0;
  };
  for (size_t i = 0; i < entries.size(); ++i) {
    const IndexEntry& e = entries[i];
    if (e.data_length <= kStreamAbove) {
      if (pending_bytes + e.data_length > kConvertBatchBytes) flush();
      pending.push_back(i);
      pending_bytes += e.data_length;
      continue;
    }
    flush();
    streamed(i, [&, i](const Reader::PieceConsumer& consume) { in.read_streamed(i, consume, lo); });
  }
  flush();
}

uint64_t total_bytes(const Reader& in) {
  uint64_t n = 0;
  for (const IndexEntry& e : in.entries()) n += e.expected_bytes();
  return n;
}

std::string flattened(const TensorPath& path) {
  if (path.is_plain()) return std::get<std::string>(path.components[0]);
  std::string out;
  for (const PathComponent& c : path.components) {
    if (!out.empty()) out += '.';
    out += std::holds_alternative<std::string>(c) ? std::get<std::string>(c)
                                                  : std::to_string(std::get<uint64_t>(c));
  }
  return out;
}

// Names and types recorded by convert_to_safetensors, read back from a safetensors input.
struct RecordedNames {
  std::unordered_map<std::string, TensorPath> paths;
  std::unordered_map<std::string, TensorType> types;
};

RecordedNames recorded_names(const Reader& in) {
  RecordedNames out;
  for (const auto& [key, value] : in.metadata()) {
    if (key != kNamesKey && key != kTypesKey) continue;
    const auto j = nlohmann::json::parse(value, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object())
      fail(ErrorCode::kFormat, "'" + in.uri() + "': metadata " + key + " is not a JSON object");
    for (const auto& [name, v] : j.items()) {
      if (key == kNamesKey && v.is_array()) {
        std::string encoded(1, '\x1e');  // the structured-name marker (docs/format.md §2.1)
        encoded += v.dump();
        out.paths.emplace(name, decode_path(encoded));
      } else if (key == kTypesKey && v.is_number_unsigned() && v.get<uint64_t>() <= 2) {
        out.types.emplace(name, static_cast<TensorType>(v.get<uint64_t>()));
      } else {
        fail(ErrorCode::kFormat, "'" + in.uri() + "': metadata " + key + " has a malformed entry");
      }
    }
  }
  return out;
}

}  // namespace

FileHeader convert_to_tensors(Reader& in, const std::string& out, WriterOptions wo,
                              const ConvertProgress& progress) {
  const auto& entries = in.entries();
  const RecordedNames recorded = recorded_names(in);
  uint64_t index_bytes = 0;  // the whole index is written with the first batch: size it for all
  for (const auto& e : entries) {
    IndexEntry sized = e;
    if (auto p = recorded.paths.find(e.name); p != recorded.paths.end())
      sized.name = encode_path(p->second);
    index_bytes += index_entry_size(sized, true);
  }
  wo.index_reserve = std::max({wo.index_reserve, kReferenceIndexSize, index_bytes});
  auto writer = Writer::open(out, wo);
  const uint64_t total = total_bytes(in);
  uint64_t done = 0;
  auto request = [&](size_t i) {
    const IndexEntry& e = entries[i];
    const LoadedTensorInfo* info = in.loaded_info(i);
    WriteRequest r;
    r.path = e.path;
    r.type = e.type;
    r.module_idx = (info ? *info : in.read_header(i)).module_idx;
    if (auto p = recorded.paths.find(e.name); p != recorded.paths.end()) r.path = p->second;
    if (auto t = recorded.types.find(e.name); t != recorded.types.end()) r.type = t->second;
    r.dtype = e.dtype;
    r.shape = e.shape;
    r.meta = e.is_meta();
    return r;
  };
  visit_tensors(
      in, wo.num_workers,
      [&](std::vector<Loaded>& batch) {
        std::vector<WriteRequest> reqs;
        for (const Loaded& l : batch) {
          reqs.push_back(request(l.entry));
          reqs.back().data = l.data;
          done += entries[l.entry].expected_bytes();
        }
        writer->write(reqs);
        if (progress) progress(done, total);
      },
      [&](size_t i, const PieceSource& pieces) {
        writer->write_streamed(request(i), [&](const Writer::Emit& emit) {
          pieces([&](uint64_t, const uint8_t* data, size_t n) {
            emit(data, n);
            done += n;
            if (progress) progress(done, total);
          });
        });
      });
  writer->close();
  return writer->header();
}

uint64_t convert_to_safetensors(Reader& in, Sink& sink, int num_workers,
                                const ConvertProgress& progress) {
  const auto& entries = in.entries();
  const auto plan = [&] {
    std::vector<SafetensorsTensor> tensors;
    nlohmann::json names = nlohmann::json::object(), types = nlohmann::json::object();
    std::unordered_map<std::string, size_t> seen;
    for (size_t i = 0; i < entries.size(); ++i) {
      const IndexEntry& e = entries[i];
      std::string flat = flattened(e.path);
      if (auto [it, fresh] = seen.emplace(flat, i); !fresh)
        fail(ErrorCode::kInvalidArgument,
             "tensors '" + display_path(entries[it->second].path) + "' and '" +
                 display_path(e.path) + "' have the same flattened name '" + shown_bytes(flat) +
                 "'; safetensors names are plain strings");
      if (!e.path.is_plain()) names[flat] = nlohmann::json::parse(encode_path(e.path).substr(1));
      if (e.type != TensorType::kStateDict) types[flat] = static_cast<int>(e.type);
      tensors.push_back({std::move(flat), e.dtype, e.shape});
    }
    auto metadata = in.metadata();
    std::erase_if(metadata,
                  [](const auto& kv) { return kv.first == kNamesKey || kv.first == kTypesKey; });
    if (!names.empty()) metadata.emplace_back(kNamesKey, names.dump());
    if (!types.empty()) metadata.emplace_back(kTypesKey, types.dump());
    const bool has_metadata = !metadata.empty() || in.format() == FileFormat::kSafetensors;
    return plan_safetensors(tensors, has_metadata ? std::optional(metadata) : std::nullopt);
  };
  return publish_safetensors(sink, plan, [&](const SafetensorsLayout& layout) {
    const uint64_t total = total_bytes(in);
    uint64_t done = 0;
    auto write_zeros = [&](uint64_t at, uint64_t n) {  // a meta tensor's bytes
      static const std::string zeros(1 << 20, '\0');
      for (uint64_t off = 0; off < n; off += zeros.size())
        sink.write_at(at + off, zeros.data(), std::min<uint64_t>(zeros.size(), n - off));
    };
    visit_tensors(
        in, num_workers,
        [&](std::vector<Loaded>& batch) {
          for (const Loaded& l : batch) {
            const uint64_t n = layout.data_length[l.entry];
            if (l.data)
              sink.write_at(layout.data_offset[l.entry], l.data, n);
            else
              write_zeros(layout.data_offset[l.entry], n);
            done += n;
          }
          if (progress) progress(done, total);
        },
        [&](size_t i, const PieceSource& pieces) {
          pieces([&](uint64_t off, const uint8_t* data, size_t n) {
            sink.write_at(layout.data_offset[i] + off, data, n);
            done += n;
            if (progress) progress(done, total);
          });
        });
  });
}

}  // namespace tensorizer
