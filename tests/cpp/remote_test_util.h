// Helpers for the transport tests that talk to real servers (started by scripts/with-servers.sh):
// server URLs from TZ_TEST_* variables (missing ones fail under `make test`, where
// TZ_REQUIRE_SERVERS=1, and skip elsewhere), loading fixtures over a URI and checking them against
// the manifest, the fault-injecting proxy (tests/tools/fault_proxy.py) as a child process,
// scoped environment variables, and writing a fixture into Redis in the reference key layout.
#pragma once

#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <thread>

#include "tensorizer/error.h"
#include "tensorizer/format.h"
#include "tensorizer/reader.h"
#include "tensorizer/writer.h"
#include "test_util.h"

extern char** environ;

namespace tensorizer::test {

inline std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// Declares `var` = the value of environment variable `name`; fails (under make test) or skips
// the test when it is missing.
#define TZ_SERVER_ENV(var, name)                                                               \
  const std::string var = ::tensorizer::test::env_or_empty(name);                              \
  if (var.empty()) {                                                                           \
    if (::tensorizer::test::env_or_empty("TZ_REQUIRE_SERVERS") == "1")                         \
      FAIL() << name                                                                           \
             << " is not set although TZ_REQUIRE_SERVERS=1: the test servers did not start";   \
    GTEST_SKIP() << name << " is not set: run under scripts/with-servers.sh (make test does)"; \
  }

inline const nlohmann::json& fixture_manifest(const std::string& name) {
  return manifest()["files"][name];
}

inline bool fixture_encrypted(const std::string& name) {
  const auto& m = fixture_manifest(name);
  return m.contains("encryption") && !m["encryption"].is_null();
}

inline ReaderOptions fixture_reader_options(const std::string& name, const TransportOptions& t) {
  ReaderOptions o;
  o.transport = t;
  if (fixture_encrypted(name)) {
    const auto& enc = fixture_manifest(name)["encryption"];
    if (enc.contains("key_file")) {
      const std::string bytes = read_file(fixture_path(enc["key_file"].get<std::string>()));
      Key k{};
      std::copy(bytes.begin(), bytes.end(), k.begin());
      o.decryption = DecryptionParams::from_key(k);
    } else {
      o.decryption = DecryptionParams::from_passphrase(enc["passphrase"].get<std::string>());
    }
  }
  return o;
}

// Opens `uri` (which holds fixture `name`), loads every tensor with `workers` workers (and hash
// verification) and checks each against the manifest's SHA-256 (meta tensors: zeros).
inline void expect_fixture_loads(const std::string& uri, const std::string& name,
                                 const TransportOptions& t, int workers) {
  SCOPED_TRACE(uri + " with " + std::to_string(workers) + " workers");
  auto reader = Reader::open(uri, fixture_reader_options(name, t));
  const auto& tensors = fixture_manifest(name)["tensors"];
  ASSERT_EQ(reader->entries().size(), tensors.size());
  LoadOptions lo;
  lo.num_workers = workers;
  lo.verify_hash = true;
  std::vector<std::string> buffers = load_entries(*reader, lo);
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& m = tensors[i];
    SCOPED_TRACE(m["name"].dump());
    if (m["meta"].get<bool>())
      EXPECT_EQ(buffers[i].find_first_not_of('\0'), std::string::npos);
    else
      EXPECT_EQ(sha256_hex(buffers[i].data(), buffers[i].size()), m["sha256"].get<std::string>());
  }
}

// Every byte of `uri` read through a Source, in pieces of `piece` bytes.
inline std::string read_all(const std::string& uri, const TransportOptions& t,
                            size_t piece = 1 << 20) {
  auto src = open_source(uri, t);
  std::string out(src->size(), '\0');
  for (size_t off = 0; off < out.size(); off += piece)
    src->read_at(off, out.data() + off, std::min(piece, out.size() - off));
  return out;
}

// "http://host:port/..." -> "host:port".
inline std::string host_port(const std::string& url) {
  size_t a = url.find("://");
  a = a == std::string::npos ? 0 : a + 3;
  size_t b = url.find('/', a);
  return url.substr(a, b == std::string::npos ? std::string::npos : b - a);
}

// Sets (or unsets, with nullopt) environment variables for the life of the object.
class ScopedEnv {
 public:
  ScopedEnv() = default;
  ~ScopedEnv() {
    for (auto& [k, v] : saved_) v ? ::setenv(k.c_str(), v->c_str(), 1) : ::unsetenv(k.c_str());
  }
  void set(const std::string& k, const std::optional<std::string>& v) {
    if (!saved_.count(k)) {
      const char* old = std::getenv(k.c_str());
      saved_[k] = old ? std::optional<std::string>(old) : std::nullopt;
    }
    v ? ::setenv(k.c_str(), v->c_str(), 1) : ::unsetenv(k.c_str());
  }

 private:
  std::map<std::string, std::optional<std::string>> saved_;
};

// tests/tools/fault_proxy.py in front of `upstream` ("host:port"), applying `actions`.
class FaultProxy {
 public:
  FaultProxy(const std::string& upstream, const std::string& actions, int seed = 1) {
    const std::string script = env_or_empty("TZ_TEST_FAULT_PROXY");
    if (script.empty()) throw std::runtime_error("TZ_TEST_FAULT_PROXY is not set");
    port_file_ = dir_.path("port");
    log_ = dir_.path("log");
    std::vector<std::string> args = {"python3",   script,  "--upstream",  upstream,
                                     "--actions", actions, "--port-file", port_file_,
                                     "--log",     log_,    "--seed",      std::to_string(seed)};
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (posix_spawnp(&pid_, "python3", nullptr, nullptr, argv.data(), environ) != 0)
      throw std::runtime_error("cannot start the fault proxy");
    for (int i = 0; i < 200; ++i) {
      std::ifstream f(port_file_);
      int port = 0;
      if (f >> port && port > 0) {
        port_ = port;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    throw std::runtime_error("the fault proxy did not start");
  }
  ~FaultProxy() { stop(); }
  void stop() {
    if (pid_ > 0) {
      ::kill(pid_, SIGTERM);
      int status;
      ::waitpid(pid_, &status, 0);
      pid_ = -1;
    }
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  // The proxy's log: one line per finished connection.
  std::string log_text() const {
    std::ifstream f(log_);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  }
  // How many connections the proxy faulted (from its log).
  // Bytes forwarded to clients over every finished connection.
  uint64_t bytes_forwarded() const {
    std::ifstream f(log_);
    uint64_t total = 0, n = 0;
    std::string id, action, outcome;
    while (f >> id >> action >> n >> outcome) total += n;
    return total;
  }
  // `kind` ("drop", "503", ...) counts only that action; empty counts all.
  int faulted(const std::string& kind = "") const {
    std::ifstream f(log_);
    std::string line;
    int n = 0;
    while (std::getline(f, line))
      if (line.find(" faulted") != std::string::npos && line.find(" " + kind) != std::string::npos)
        ++n;
    return n;
  }

 private:
  TempDir dir_;
  std::string port_file_, log_;
  pid_t pid_ = -1;
  int port_ = 0;
};

// "redis://host:port" -> a hiredis connection (fails the test when it cannot connect).
inline redisContext* redis_connect(const std::string& url) {
  std::string hp = host_port(url);
  size_t colon = hp.rfind(':');
  redisContext* c = redisConnect(hp.substr(0, colon).c_str(), std::atoi(hp.c_str() + colon + 1));
  if (!c || c->err) throw std::runtime_error("cannot connect to " + url);
  return c;
}

inline void redis_set(redisContext* c, const std::string& key, const std::string& value) {
  auto* r = static_cast<redisReply*>(
      redisCommand(c, "SET %b %b", key.data(), key.size(), value.data(), value.size()));
  if (!r || r->type == REDIS_REPLY_ERROR) throw std::runtime_error("SET failed");
  freeReplyObject(r);
}

inline std::optional<std::string> redis_get(redisContext* c, const std::string& key) {
  auto* r = static_cast<redisReply*>(redisCommand(c, "GET %b", key.data(), key.size()));
  if (!r) throw std::runtime_error("GET failed");
  std::optional<std::string> out;
  if (r->type == REDIS_REPLY_STRING) out = std::string(r->str, r->len);
  freeReplyObject(r);
  return out;
}

// Stores `file` under `prefix` exactly as the reference's TensorDeserializer.to_redis does
// (docs/format.md §4), independently of our Redis sink: header:0, then per tensor a header key and
// a data key (an empty one for meta tensors).
inline void redis_store_reference_layout(redisContext* c, const std::string& prefix,
                                         const std::string& file) {
  FileHeader h = parse_file_header(reinterpret_cast<const uint8_t*>(file.data()), file.size());
  const uint64_t index_end = kPreludeSize + h.index_size;
  redis_set(c, prefix + ":header:0", file.substr(0, index_end));
  auto entries = parse_index(reinterpret_cast<const uint8_t*>(file.data()) + kPreludeSize,
                             h.index_size, h, file.size());
  for (const auto& e : entries) {
    redis_set(c, prefix + ":" + e.name + ":" + std::to_string(e.header_offset),
              file.substr(e.header_offset, e.header_size()));
    redis_set(c, prefix + ":" + e.name + ":" + std::to_string(e.data_offset),
              file.substr(e.data_offset, e.data_length));
  }
}

// A name unique to this test process, for keys and object names.
inline std::string unique_name(const std::string& base) {
  return base + "-" + std::to_string(::getpid()) + "-" +
         std::to_string(std::chrono::steady_clock::now().time_since_epoch().count() % 1000000007);
}

// Tensors with a known pattern: a few small ones and one of `big` bytes.
struct Model {
  std::vector<std::string> data;
  std::vector<WriteRequest> requests;
};

inline Model make_model(size_t big) {
  Model m;
  const size_t sizes[] = {4, 1000, big, 4096 * 3};
  for (size_t i = 0; i < 4; ++i) {
    std::string d(sizes[i], '\0');
    uint32_t x = 0x9e3779b9u * static_cast<uint32_t>(i + 1);
    for (auto& ch : d) ch = static_cast<char>((x = x * 1664525u + 1013904223u) >> 24);
    m.data.push_back(std::move(d));
  }
  for (size_t i = 0; i < 4; ++i) {
    WriteRequest r;
    r.path = TensorPath("layer" + std::to_string(i) + ".weight");
    r.dtype = "|u1";
    r.shape = {m.data[i].size()};
    r.data = m.data[i].data();
    m.requests.push_back(r);
  }
  return m;
}

inline void expect_model(const std::string& uri, const TransportOptions& t, const Model& m) {
  ReaderOptions ro;
  ro.transport = t;
  auto reader = Reader::open(uri, ro);
  ASSERT_EQ(reader->entries().size(), m.data.size());
  LoadOptions lo;
  lo.num_workers = 4;
  lo.verify_hash = true;
  auto buffers = test::load_entries(*reader, lo);
  for (size_t i = 0; i < m.data.size(); ++i) EXPECT_TRUE(buffers[i] == m.data[i]) << "tensor " << i;
}

}  // namespace tensorizer::test
