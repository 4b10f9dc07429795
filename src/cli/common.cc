// Options shared by the CLI subcommands (keys, workers) and the exit-code state.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>

#include "cli/commands.h"
#include "tensorizer/error.h"

namespace tensorizer::cli {
namespace {
int g_exit_code = 0;
}

void set_exit_code(int code) { g_exit_code = code; }
int exit_code() { return g_exit_code; }

void add_common_options(CLI::App* cmd, CommonOptions& common) {
  cmd->add_option("--key-file", common.key_file,
                  "file holding the 32-byte key of an encrypted file");
  cmd->add_option("--passphrase-env", common.passphrase_env,
                  "environment variable holding the passphrase of an encrypted file");
  cmd->add_option("--workers", common.workers, "concurrent readers (default: one per core)");
  add_transport_options(cmd, common.transport);
}

ReaderOptions reader_options(const CommonOptions& common) {
  ReaderOptions options;
  options.transport = common.transport;
  if (!common.key_file.empty()) {
    std::ifstream f(common.key_file, std::ios::binary);
    if (!f) fail(ErrorCode::kNotFound, "cannot read key file '" + common.key_file + "'");
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    if (bytes.size() != 32)
      fail(ErrorCode::kInvalidArgument, "key file '" + common.key_file +
                                            "' must hold exactly 32 bytes, not " +
                                            std::to_string(bytes.size()));
    Key key;
    std::copy(bytes.begin(), bytes.end(), key.begin());
    options.decryption = DecryptionParams::from_key(key);
  } else if (!common.passphrase_env.empty()) {
    const char* p = std::getenv(common.passphrase_env.c_str());
    if (!p || !*p)
      fail(ErrorCode::kInvalidArgument,
           "environment variable '" + common.passphrase_env + "' is not set");
    options.decryption = DecryptionParams::from_passphrase(p);
  }
  return options;
}

std::string human_bytes(double bytes) {
  const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (bytes >= 1000 && u < 4) bytes /= 1000, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", bytes, units[u]);
  return buf;
}

std::function<void(uint64_t, uint64_t)> progress_printer(bool quiet) {
  if (quiet) return [](uint64_t, uint64_t) {};
  const bool tty = ::isatty(2);
  const auto start = std::chrono::steady_clock::now();
  auto last = tty ? start - std::chrono::seconds(10) : start;
  return [tty, start, last](uint64_t done, uint64_t total) mutable {
    const auto now = std::chrono::steady_clock::now();
    const bool final = done == total;
    if (!final && now - last < std::chrono::milliseconds(tty ? 250 : 5000)) return;
    last = now;
    const double secs = std::chrono::duration<double>(now - start).count();
    std::fprintf(stderr, "%s%s / %s (%3.0f%%) %s/s%s", tty ? "\r" : "", human_bytes(done).c_str(),
                 human_bytes(total).c_str(), total ? 100.0 * done / total : 100.0,
                 human_bytes(secs > 0 ? done / secs : 0).c_str(), tty && !final ? "   " : "\n");
    std::fflush(stderr);
  };
}

}  // namespace tensorizer::cli
