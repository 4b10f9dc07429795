// `tensorizer convert SRC DST`: re-encodes a .tensors or safetensors object as the other format
// (or as .tensors again, e.g. to encrypt with --encrypt-key-file), any transport to any transport,
// streaming with bounded memory (tensorizer/convert.h) and a progress line on stderr. The output
// format is --to, else what DST's name ends with (.safetensors), else .tensors.
#include "tensorizer/convert.h"

#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>

#include "cli/commands.h"
#include "tensorizer/error.h"

namespace tensorizer::cli {
namespace {

struct ConvertOptions {
  std::string src, dst, to, encrypt_key_file;
  bool quiet = false;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void run_convert(const CommonOptions& common, const ConvertOptions& o) {
  std::string to = o.to;
  if (to.empty()) to = ends_with(o.dst, ".safetensors") ? "safetensors" : "tensors";
  if (to != "safetensors" && to != "tensors")
    fail(ErrorCode::kInvalidArgument, "--to '" + to + "': expected tensors or safetensors");
  auto in = Reader::open(o.src, reader_options(common));
  const auto progress = progress_printer(o.quiet);
  if (to == "safetensors") {
    if (!o.encrypt_key_file.empty())
      fail(ErrorCode::kInvalidArgument, "safetensors files cannot be encrypted");
    auto sink = open_sink(o.dst, common.transport);
    const uint64_t n = convert_to_safetensors(*in, *sink, common.workers, progress);
    if (!o.quiet)
      std::fprintf(stderr, "wrote %s: %zu tensors, safetensors, %s\n", o.dst.c_str(),
                   in->entries().size(), human_bytes(static_cast<double>(n)).c_str());
    return;
  }
  WriterOptions wo;
  wo.transport = common.transport;
  wo.num_workers = common.workers;
  if (!o.encrypt_key_file.empty()) {
    CommonOptions key_only;
    key_only.key_file = o.encrypt_key_file;
    wo.encryption = EncryptionParams::from_key(*reader_options(key_only).decryption->key);
  }
  const FileHeader h = convert_to_tensors(*in, o.dst, wo, progress);
  if (!o.quiet)
    std::fprintf(stderr, "wrote %s: %zu tensors, data version %u%s\n", o.dst.c_str(),
                 in->entries().size(), h.version, h.has_crypt_info() ? ", encrypted" : "");
}

}  // namespace

void register_convert(CLI::App& app, CommonOptions& common) {
  auto o = std::make_shared<ConvertOptions>();
  auto* cmd = app.add_subcommand(
      "convert", "re-encode a .tensors or safetensors object as .tensors or safetensors");
  cmd->add_option("SRC", o->src, "path or URI to read (.tensors or safetensors)")->required();
  cmd->add_option("DST", o->dst, "path or URI to write (file, s3://, redis://)")->required();
  cmd->add_option("--to", o->to, "tensors or safetensors (default: from DST's name)");
  cmd->add_option("--encrypt-key-file", o->encrypt_key_file,
                  "encrypt the .tensors output with this 32-byte key");
  cmd->add_flag("--quiet,-q", o->quiet, "no progress or summary");
  add_common_options(cmd, common);
  cmd->callback([o, &common] { run_convert(common, *o); });
}

}  // namespace tensorizer::cli
