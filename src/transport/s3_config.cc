// S3 credential and endpoint resolution (docs/reference-api.md §5.4); see s3_config.h. No network
// here.
#include "transport/s3_config.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <optional>

#include "tensorizer/error.h"

namespace tensorizer::s3 {
namespace {

constexpr const char* kDefaultReadEndpoint = "accel-object.ord1.coreweave.com";
constexpr const char* kDefaultWriteEndpoint = "object.ord1.coreweave.com";

std::string trim(const std::string& s) {
  size_t a = 0, b = s.size();
  while (a < b && std::isspace(static_cast<unsigned char>(s[a]))) ++a;
  while (b > a && std::isspace(static_cast<unsigned char>(s[b - 1]))) --b;
  return s.substr(a, b - a);
}

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

std::string home() {
  auto h = env("HOME");
  return h ? *h : std::string();
}

// "~/x" shown as given; the real path for opening.
std::string expand(const std::string& path) {
  if (path.rfind("~/", 0) == 0) return home() + path.substr(1);
  return path;
}

using Ini = std::vector<std::pair<std::string, std::string>>;

std::optional<std::string> lookup(const Ini& ini, const std::string& key) {
  for (const auto& [k, v] : ini)
    if (k == key) return v;
  return std::nullopt;
}

struct Found {
  std::string access_key, secret_key, session_token;
  std::string source;
  bool ok = false;
};

// s3cmd config: [default] access_key / secret_key / host_base / use_https.
struct S3cmd {
  bool parsed = false;
  std::optional<std::string> access_key, secret_key, host_base, use_https;
  std::string shown_path;
};

S3cmd read_s3cfg(const S3Options& o) {
  S3cmd r;
  std::string shown = o.config_path ? *o.config_path : std::string("~/.s3cfg");
  Ini ini;
  if (!parse_ini(expand(shown), ini)) {
    if (o.config_path)
      fail(ErrorCode::kNotFound, "S3 config file '" + shown + "' (s3_config_path) cannot be read");
    return r;
  }
  r.shown_path = shown;
  bool has_default = false;
  for (const auto& [k, v] : ini)
    if (k.rfind("default.", 0) == 0) has_default = true;
  if (!has_default) return r;
  r.parsed = true;
  r.access_key = lookup(ini, "default.access_key");
  r.secret_key = lookup(ini, "default.secret_key");
  r.host_base = lookup(ini, "default.host_base");
  r.use_https = lookup(ini, "default.use_https");
  return r;
}

std::string profile_name(const S3Options& o) {
  if (o.profile) return *o.profile;
  if (auto p = env("AWS_PROFILE")) return *p;
  return "default";
}

std::string credentials_file() {
  if (auto p = env("AWS_SHARED_CREDENTIALS_FILE")) return *p;
  return "~/.aws/credentials";
}

std::string config_file() {
  if (auto p = env("AWS_CONFIG_FILE")) return *p;
  return "~/.aws/config";
}

// The section prefix of `profile` in ~/.aws/config.
std::string config_section(const std::string& profile) {
  return profile == "default" ? std::string("default.") : "profile " + profile + ".";
}

// The keys `get` finds by their config-file names (aws_access_key_id, aws_secret_access_key, and
// aws_session_token if there is one), when both keys are there.
template <typename Get>
bool take_keys(const Get& get, const std::string& source, Found& f) {
  auto a = get("aws_access_key_id"), s = get("aws_secret_access_key");
  if (!a || !s) return false;
  f.access_key = *a;
  f.secret_key = *s;
  if (auto t = get("aws_session_token")) f.session_token = *t;
  f.source = source;
  f.ok = true;
  return true;
}

// The same keys in an ini file's section that starts with `prefix`.
bool keys_from(const Ini& ini, const std::string& prefix, const std::string& source, Found& f) {
  return take_keys([&](const std::string& key) { return lookup(ini, prefix + key); }, source, f);
}

Found aws_chain(const S3Options& o) {
  Found f;
  // The environment names the keys in upper case: AWS_ACCESS_KEY_ID, ...
  auto from_env = [](std::string key) {
    for (char& c : key) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    return env(key.c_str());
  };
  if (take_keys(from_env, "environment variables AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY", f))
    return f;
  const std::string profile = profile_name(o);
  Ini ini;
  const std::string cred_path = credentials_file();
  if (parse_ini(expand(cred_path), ini) &&
      keys_from(ini, profile + ".", cred_path + " (profile " + profile + ")", f))
    return f;
  ini.clear();
  const std::string conf_path = config_file();
  if (parse_ini(expand(conf_path), ini))
    keys_from(ini, config_section(profile), conf_path + " (profile " + profile + ")", f);
  return f;
}

// Endpoint and region settings of the AWS config profile.
std::optional<std::string> profile_setting(const S3Options& o, const std::string& key) {
  Ini ini;
  if (!parse_ini(expand(config_file()), ini)) return std::nullopt;
  return lookup(ini, config_section(profile_name(o)) + key);
}

std::string host_of(const std::string& endpoint) {
  size_t p = endpoint.find("://");
  std::string rest = p == std::string::npos ? endpoint : endpoint.substr(p + 3);
  size_t end = rest.find_first_of(":/");
  return end == std::string::npos ? rest : rest.substr(0, end);
}

}  // namespace

bool parse_ini(const std::string& path, Ini& out) {
  std::ifstream f(path);
  if (!f) return false;
  std::string line, section, parent;  // parent: key of an "s3 =" block being filled
  while (std::getline(f, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    std::string t = trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[' && t.back() == ']') {
      section = trim(t.substr(1, t.size() - 2));
      parent.clear();
      continue;
    }
    size_t eq = t.find('=');
    if (eq == std::string::npos) continue;
    std::string key = trim(t.substr(0, eq)), value = trim(t.substr(eq + 1));
    const bool indented = std::isspace(static_cast<unsigned char>(line[0]));
    if (indented && !parent.empty()) {
      out.emplace_back(section + "." + parent + "." + key, value);
      continue;
    }
    parent = value.empty() ? key : std::string();
    if (!value.empty()) out.emplace_back(section + "." + key, value);
  }
  return true;
}

ResolvedS3 resolve(const S3Options& o, bool for_write) {
  ResolvedS3 r;
  std::optional<std::string> endpoint = o.endpoint;
  bool endpoint_from_env = false;
  std::optional<bool> force_http = o.force_http;

  // 1-2. Explicit credentials, else the s3cmd config filling what is missing.
  std::optional<std::string> ak = o.access_key_id, sk = o.secret_access_key;
  bool have = false;
  if (ak && sk) {
    have = true;
    r.credential_source = "explicit arguments";
  } else {
    S3cmd cfg = read_s3cfg(o);
    if (cfg.parsed) {
      std::optional<std::string> a = ak ? ak : cfg.access_key, s = sk ? sk : cfg.secret_key;
      if (a && s) {
        ak = a;
        sk = s;
        have = true;
        r.credential_source = cfg.shown_path;
        if (!endpoint && cfg.host_base) endpoint = cfg.host_base;
        if (!force_http && cfg.use_https) force_http = *cfg.use_https == "False";
      }
    }
  }
  // 3. The AWS chain.
  if (!have) {
    Found f = aws_chain(o);
    if (f.ok) {
      ak = f.access_key;
      sk = f.secret_key;
      r.session_token = f.session_token;
      r.credential_source = f.source;
      have = true;
    }
  }
  if (have && ak->empty() && sk->empty()) {
    r.anonymous = true;
    r.credential_source += " (empty keys: anonymous access)";
  } else if (have) {
    r.access_key = *ak;
    r.secret_key = *sk;
  } else {
    r.anonymous = true;
    r.credential_source = "no credentials found (anonymous access)";
  }
  if (!r.anonymous && o.session_token) r.session_token = *o.session_token;

  // Endpoint: argument → .s3cfg host_base → environment → AWS profile → default.
  if (!endpoint) {
    if (auto e = env("AWS_ENDPOINT_URL_S3"))
      endpoint = e, endpoint_from_env = true;
    else if (auto e2 = env("AWS_ENDPOINT_URL"))
      endpoint = e2, endpoint_from_env = true;
    else if (auto e3 = profile_setting(o, "s3.endpoint_url"))
      endpoint = e3, endpoint_from_env = true;
    else if (auto e4 = profile_setting(o, "endpoint_url"))
      endpoint = e4, endpoint_from_env = true;
    else
      endpoint = for_write ? kDefaultWriteEndpoint : kDefaultReadEndpoint;
  }
  std::string ep = *endpoint;
  while (!ep.empty() && ep.back() == '/') ep.pop_back();
  const bool http = force_http.value_or(false);
  if (ep.rfind("https://", 0) == 0) {
    if (http) ep = "http://" + ep.substr(8);
  } else if (ep.rfind("http://", 0) == 0) {
    if (!http && !endpoint_from_env)
      fail(ErrorCode::kInvalidArgument, "Non-HTTPS endpoint URLs are not allowed (" + ep +
                                            "); pass force_http to use plain HTTP");
  } else if (ep.find("://") != std::string::npos) {
    fail(ErrorCode::kInvalidArgument, "unsupported S3 endpoint scheme in '" + ep + "'");
  } else {
    ep = (http ? "http://" : "https://") + ep;
  }
  r.endpoint = ep;

  if (o.region)
    r.region = *o.region;
  else if (auto e = env("AWS_REGION"))
    r.region = *e;
  else if (auto e2 = env("AWS_DEFAULT_REGION"))
    r.region = *e2;
  else if (auto e3 = profile_setting(o, "region"))
    r.region = *e3;
  else
    r.region = "us-east-1";

  const std::string host = host_of(ep);
  r.virtual_hosted = o.virtual_hosted.value_or(host == "cwobject.com" || host == "cwlota.com");
  r.credential_source = "credentials from " + r.credential_source;
  if (r.anonymous && !have) r.credential_source = "no credentials found (anonymous access)";
  return r;
}

}  // namespace tensorizer::s3
