// `tensorizer cp SRC DST`: copies a .tensors object between any two of a local file, http(s)://
// (source only), s3://bucket/key and redis://host:port/prefix, streaming with bounded memory
// (copy_object) and a progress line on stderr. The copy is checked to be a readable .tensors
// object first (its header and index), so a wrong URL fails before anything is written.
#include <cstdio>
#include <memory>

#include "cli/commands.h"
#include "tensorizer/error.h"

namespace tensorizer::cli {
namespace {

struct CpOptions {
  std::string src, dst;
  int workers = 0;
  bool quiet = false;
  TransportOptions transport;
};

void run_cp(const CpOptions& o) {
  {
    // Fail early (and clearly) when the source is not a tensorizer object.
    ReaderOptions ro;
    ro.transport = o.transport;
    ro.without_key = true;
    Reader::open(o.src, ro);
  }
  const auto progress = progress_printer(o.quiet);
  const uint64_t n = copy_object(o.src, o.dst, o.transport, o.workers, progress);
  if (!o.quiet)
    std::fprintf(stderr, "copied %s to %s (%s)\n", o.src.c_str(), o.dst.c_str(),
                 human_bytes(n).c_str());
}

}  // namespace

void register_cp(CLI::App& app) {
  auto o = std::make_shared<CpOptions>();
  auto* cmd =
      app.add_subcommand("cp", "copy a .tensors object between file, http(s), s3:// and redis://");
  cmd->add_option("SRC", o->src, "path or URI to read (file, http(s)://, s3://, redis://)")
      ->required();
  cmd->add_option("DST", o->dst, "path or URI to write (file, s3://, redis://)")->required();
  cmd->add_option("--workers", o->workers, "concurrent readers (default: what the source prefers)");
  cmd->add_flag("--quiet,-q", o->quiet, "no progress line");
  add_transport_options(cmd, o->transport);
  cmd->callback([o] { run_cp(*o); });
}

}  // namespace tensorizer::cli
