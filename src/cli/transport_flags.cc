// Command-line flags for remote sources and sinks (TLS trust, S3 endpoint/config, timeouts),
// shared by every subcommand that opens a URI. Credentials are never taken as flags: they come
// from the environment or config files (docs/reference-api.md §5.4), so they stay out of shell
// history.
#include "cli/commands.h"

namespace tensorizer::cli {

void add_transport_options(CLI::App* cmd, TransportOptions& t) {
  cmd->add_option("--ca-file", t.http.ca_file, "CA bundle to trust for https:// and S3");
  cmd->add_option("--ca-path", t.http.ca_path,
                  "directory of CA certificates to trust (c_rehash'ed)");
  cmd->add_flag("--insecure", t.http.allow_untrusted, "do not verify TLS certificates");
  cmd->add_option("--max-redirects", t.http.max_redirects,
                  "redirects an http(s):// request follows (default 50; 0 refuses them)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--header", t.http.headers,
                  "extra HTTP request header 'Name: value' (repeatable)");
  cmd->add_option_function<std::string>(
      "--s3-endpoint", [&t](const std::string& v) { t.s3.endpoint = v; },
      "S3 endpoint (host[:port] or URL)");
  cmd->add_option_function<std::string>(
      "--s3-config", [&t](const std::string& v) { t.s3.config_path = v; },
      "s3cmd config file with credentials (default ~/.s3cfg)");
  cmd->add_option_function<std::string>(
      "--s3-region", [&t](const std::string& v) { t.s3.region = v; },
      "S3 region for request signing");
  cmd->add_option_function<std::string>(
      "--s3-profile", [&t](const std::string& v) { t.s3.profile = v; },
      "profile in ~/.aws/credentials and ~/.aws/config");
  cmd->add_flag_callback(
      "--force-http", [&t] { t.s3.force_http = true; }, "talk plain HTTP to the S3 endpoint");
  cmd->add_flag_callback(
      "--s3-virtual-hosted", [&t] { t.s3.virtual_hosted = true; },
      "virtual-hosted S3 addressing (bucket.host) instead of path-style");
  cmd->add_option_function<uint64_t>(
         "--read-mib", [&t](uint64_t mib) { t.http.read_bytes = mib << 20; },
         "MiB per ranged GET of http(s):// and s3:// loads (default $TENSORIZER_READ_MIB, else 16)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 20));
  cmd->add_option("--stall-timeout", t.retry.stall_timeout_s,
                  "seconds without progress before a transfer fails");
  cmd->add_option("--retries", t.retry.max_retries,
                  "retries of a failed transfer (consecutive, without progress)");
  cmd->add_option("--cache-dir", t.cache.dir,
                  "keep http(s):// and s3:// objects read here for later reads (default "
                  "$TENSORIZER_CACHE_DIR)");
}

}  // namespace tensorizer::cli
