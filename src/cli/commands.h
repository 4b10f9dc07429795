// Subcommands of the tensorizer CLI; each registers itself on the CLI11 app and runs from
// its callback. Exit codes: 0 success, 1 verification failed, 2 error.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <functional>
#include <string>

#include "tensorizer/reader.h"

namespace tensorizer::cli {

struct CommonOptions {
  std::string key_file;        // 32 raw key bytes, for encrypted files
  std::string passphrase_env;  // name of an environment variable holding a passphrase
  int workers = 0;
  TransportOptions transport;  // --ca-file, --s3-endpoint, ... (see transport_flags.cc)
};

// Adds the remote-transport flags (TLS trust, S3 endpoint/config/region, timeouts).
void add_transport_options(CLI::App* cmd, TransportOptions& transport);

// Adds --key-file / --passphrase-env / --workers to a subcommand.
void add_common_options(CLI::App* cmd, CommonOptions& common);
// Reader options built from the common flags.
ReaderOptions reader_options(const CommonOptions& common);

void register_inspect(CLI::App& app, CommonOptions& common);
void register_verify(CLI::App& app, CommonOptions& common);
void register_bench(CLI::App& app);
// `encrypt` / `decrypt` (crypt.cc).
void register_crypt(CLI::App& app, CommonOptions& common);
void register_cp(CLI::App& app);
void register_convert(CLI::App& app, CommonOptions& common);

// "1.2 GB": bytes in decimal units.
std::string human_bytes(double bytes);
// A progress(done, total) callback printing "done / total (N%) rate/s" on stderr: redrawn every
// 250 ms on a terminal, every 5 s otherwise, always once at the end; nothing when `quiet`.
std::function<void(uint64_t, uint64_t)> progress_printer(bool quiet);

void set_exit_code(int code);
int exit_code();

}  // namespace tensorizer::cli
