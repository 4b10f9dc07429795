// `tensorizer verify FILE`: recomputes every tensor's CRC32/SHA-256 and names each mismatch.
#include <cstdio>
#include <memory>

#include "cli/commands.h"

namespace tensorizer::cli {

void register_verify(CLI::App& app, CommonOptions& common) {
  auto* cmd = app.add_subcommand(
      "verify", "check every stored hash of a .tensors file (a safetensors file is read whole)");
  auto uri = std::make_shared<std::string>();
  cmd->add_option("FILE", *uri, "path or URI")->required();
  add_common_options(cmd, common);
  cmd->callback([uri, &common] {
    auto reader = Reader::open(*uri, reader_options(common));
    std::vector<std::string> mismatches = reader->verify_all(common.workers);
    for (const auto& m : mismatches) std::printf("MISMATCH %s\n", m.c_str());
    if (reader->format() == FileFormat::kSafetensors) {  // read whole, but nothing to compare
      std::printf("OK %s: %zu tensors read; safetensors files store no hashes\n", uri->c_str(),
                  reader->entries().size());
    } else if (mismatches.empty()) {
      std::printf("OK %s: %zu tensors verified\n", uri->c_str(), reader->entries().size());
    } else {
      std::printf("FAILED %s: %zu of %zu tensors do not match their hashes\n", uri->c_str(),
                  mismatches.size(), reader->entries().size());
      set_exit_code(1);
    }
  });
}

}  // namespace tensorizer::cli
