// S3 credential and endpoint resolution, exactly as docs/reference-api.md §5.4 (internal header).
//
// Order for credentials: explicit options → s3cmd config (s3_config_path, else ~/.s3cfg) →
// AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY(/AWS_SESSION_TOKEN) → shared credentials file
// (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials) → AWS config file (AWS_CONFIG_FILE, else
// ~/.aws/config), profile from s3_profile / AWS_PROFILE / "default" → anonymous. The result says
// where the credentials came from (for access errors) and never prints them.
#pragma once

#include <string>

#include "tensorizer/transport.h"

namespace tensorizer::s3 {

struct ResolvedS3 {
  std::string endpoint;  // scheme://host[:port], no trailing slash
  std::string region;
  std::string access_key, secret_key, session_token;
  bool anonymous = false;
  std::string credential_source;  // e.g. "~/.s3cfg", "environment (AWS_ACCESS_KEY_ID)"
  bool virtual_hosted = false;
};

// `for_write` picks the default endpoint (object.… for writes, accel-object.… for reads).
ResolvedS3 resolve(const S3Options& options, bool for_write);

// Parses an INI file into "section.key" → value (nested "s3 =" blocks become "section.s3.key").
// Returns false when the file cannot be read.
bool parse_ini(const std::string& path, std::vector<std::pair<std::string, std::string>>& out);

}  // namespace tensorizer::s3
