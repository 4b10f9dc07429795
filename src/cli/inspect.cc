// `tensorizer inspect FILE [--json]`: the file header and every tensor, from the index and the
// tensors' own headers (module index, hashes). Encrypted files need no key to be inspected.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "cli/json_writer.h"
#include "tensorizer/dtype.h"
#include "tensorizer/error.h"
#include "tensorizer/hash.h"

namespace tensorizer::cli {
namespace {

std::string json_path(const TensorPath& p) {
  auto component = [](const PathComponent& c) {
    if (const auto* s = std::get_if<std::string>(&c)) return json_string(*s);
    return std::to_string(std::get<uint64_t>(c));
  };
  if (p.is_plain()) return component(p.components[0]);
  std::string out = "[";
  for (size_t i = 0; i < p.components.size(); ++i)
    out += (i ? "," : "") + component(p.components[i]);
  return out + "]";
}

std::string json_shape(const std::vector<uint64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? "," : "") + std::to_string(shape[i]);
  return out + "]";
}

std::string printable_dtype(const std::string& d) {
  std::string out;
  for (char c : d) out += c == '\0' ? std::string("\\0") : std::string(1, c);
  return out;
}

void run_inspect(const std::string& uri, bool json, const CommonOptions& common) {
  ReaderOptions options = reader_options(common);
  options.without_key = true;
  auto reader = Reader::open(uri, options);
  const FileHeader& h = reader->header();
  const uint64_t file_size = reader->source().size();
  const bool safetensors = reader->format() == FileFormat::kSafetensors;
  if (json) {
    std::printf(
        "{\"uri\":%s,\"format\":\"%s\",\"file_size\":%llu,\"version\":%u,\"flags\":%llu,"
        "\"encrypted\":%s,\"tensor_size\":%llu,\"tensor_count\":%llu,\"index_size\":%llu,"
        "\"tensors\":[",
        json_string(uri).c_str(), safetensors ? "safetensors" : "tensorizer",
        (unsigned long long)file_size, h.version, (unsigned long long)h.flags,
        h.has_crypt_info() ? "true" : "false", (unsigned long long)h.tensor_size,
        (unsigned long long)h.tensor_count, (unsigned long long)h.index_size);
  } else if (safetensors) {
    std::printf("%s: safetensors, %llu tensors, %llu data bytes, header %llu bytes\n", uri.c_str(),
                (unsigned long long)h.tensor_count, (unsigned long long)h.tensor_size,
                (unsigned long long)h.index_size);
    for (const auto& [key, value] : reader->metadata())
      std::printf("  metadata %s = %s\n", shown_bytes(key).c_str(), shown_bytes(value).c_str());
  } else {
    std::printf(
        "%s: data version %u, flags %llu%s, %llu tensors, %llu data bytes, index %llu bytes\n",
        uri.c_str(), h.version, (unsigned long long)h.flags,
        h.has_crypt_info() ? " (encrypted)" : "", (unsigned long long)h.tensor_count,
        (unsigned long long)h.tensor_size, (unsigned long long)h.index_size);
  }
  if (!json)
    std::printf("%-40s %-10s %4s %-16s %-18s %12s %12s %12s\n", "name", "type", "mod", "dtype",
                "shape", "bytes", "header@", "data@");
  const auto& entries = reader->entries();
  for (size_t i = 0; i < entries.size(); ++i) {
    const IndexEntry& e = entries[i];
    const LoadedTensorInfo& info = reader->read_header(i);
    DType dt = parse_dtype(e.dtype);
    if (json) {
      std::string hashes;
      const uint8_t* raw = info.header_data();
      for (const auto& hv : info.header.hashes) {
        hashes += std::string(hashes.empty() ? "" : ",") +
                  "{\"type\":" + json_string(hv.type == HashType::kCrc32 ? "crc32" : "sha256") +
                  ",\"value\":\"" + to_hex(raw + hv.value_offset, hv.value_size) + "\"}";
      }
      std::printf(
          "%s{\"name\":%s,\"type\":%d,\"type_name\":\"%s\",\"module_idx\":%u,\"dtype\":%s,"
          "\"torch_dtype\":%s,\"shape\":%s,\"nbytes\":%llu,\"loaded_bytes\":%llu,\"meta\":%s,"
          "\"encrypted\":%s,\"header_offset\":%llu,\"data_offset\":%llu,\"hashes\":[%s]}",
          i ? "," : "", json_path(e.path).c_str(), static_cast<int>(e.type),
          tensor_type_name(e.type), info.module_idx, json_string(e.dtype).c_str(),
          json_string(dt.torch_name()).c_str(), json_shape(e.shape).c_str(),
          (unsigned long long)e.data_length, (unsigned long long)e.expected_bytes(),
          e.is_meta() ? "true" : "false",
          info.header.has_crypt_field && info.header.crypt_info_size > 2 ? "true" : "false",
          (unsigned long long)e.header_offset, (unsigned long long)e.data_offset, hashes.c_str());
    } else {
      std::printf("%-40s %-10s %4u %-16s %-18s %12llu %12llu %12llu%s\n",
                  display_path(e.path).c_str(), tensor_type_name(e.type), info.module_idx,
                  printable_dtype(e.dtype).c_str(), json_shape(e.shape).c_str(),
                  (unsigned long long)e.expected_bytes(), (unsigned long long)e.header_offset,
                  (unsigned long long)e.data_offset, e.is_meta() ? " meta" : "");
    }
  }
  if (json) std::printf("]}\n");
}

}  // namespace

void register_inspect(CLI::App& app, CommonOptions& common) {
  auto* cmd = app.add_subcommand("inspect", "print the header and every tensor of a .tensors file");
  auto uri = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("FILE", *uri, "path or URI")->required();
  cmd->add_flag("--json", *json, "machine-readable output");
  add_common_options(cmd, common);
  cmd->callback([uri, json, &common] { run_inspect(*uri, *json, common); });
}

}  // namespace tensorizer::cli
