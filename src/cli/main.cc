// The `tensorizer` command-line program: a small layer over the C++ API.
//
//   tensorizer inspect FILE [--json]   header, flags and every tensor
//   tensorizer verify FILE             recompute every hash; exit 0 only if all match
//   tensorizer bench [--size-mb N]     write + load a synthetic model, print GB/s
//   tensorizer encrypt IN OUT (--key-file F | --passphrase-env VAR)   add encryption
//   tensorizer decrypt IN OUT (--key-file F | --passphrase-env VAR)   remove it
//   tensorizer cp SRC DST              copy between file, http(s) (read only), s3:// and redis://
//
// Exit status: 0 on success, 1 when verify finds a mismatch, 2 on a usage error or a failure.
// Ctrl-C cancels the running command (tensorizer/cancel.h): it stops within a fraction of a
// second, removes partial outputs and exits with status 130; a second Ctrl-C kills at once.
#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "tensorizer/cancel.h"
#include "tensorizer/error.h"

namespace {

tensorizer::CancelToken g_interrupt;

extern "C" void on_interrupt(int) { g_interrupt.cancel(); }  // an atomic store: signal-safe

}  // namespace

int main(int argc, char** argv) {
  struct sigaction sa = {};
  sa.sa_handler = on_interrupt;
  sa.sa_flags = SA_RESETHAND;  // the next Ctrl-C gets the default action
  sigaction(SIGINT, &sa, nullptr);
  tensorizer::CancelScope scope(&g_interrupt);

  CLI::App app{"tensorizer: inspect, verify and move .tensors files"};
  app.set_version_flag("--version", TZ_VERSION);
  app.require_subcommand(1);
  tensorizer::cli::CommonOptions common;
  tensorizer::cli::register_inspect(app, common);
  tensorizer::cli::register_verify(app, common);
  tensorizer::cli::register_bench(app);
  tensorizer::cli::register_crypt(app, common);
  tensorizer::cli::register_cp(app);
  tensorizer::cli::register_convert(app, common);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help, or a usage error: status 2, as for other errors
  } catch (const tensorizer::Error& e) {
    if (g_interrupt.fired()) {
      std::fprintf(stderr, "tensorizer: interrupted\n");
      return 130;
    }
    std::fprintf(stderr, "tensorizer: %s: %s\n", tensorizer::error_code_name(e.code()), e.what());
    return 2;
  }
  return tensorizer::cli::exit_code();
}
