// Shared helpers for the C++ tests (see test_util.h).
#include "test_util.h"

#include <gtest/gtest.h>
#include <openssl/sha.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "tensorizer/dtype.h"
#include "tensorizer/error.h"
#include "tensorizer/hash.h"

namespace tensorizer::test {

std::string fixtures_dir() { return TZ_FIXTURES_DIR; }
std::string fixture_path(const std::string& name) { return fixtures_dir() + "/" + name; }

const nlohmann::json& manifest() {
  static const nlohmann::json m = [] {
    std::ifstream f(fixture_path("manifest.json"));
    if (!f) throw std::runtime_error("fixtures missing: " + fixture_path("manifest.json"));
    return nlohmann::json::parse(f);
  }();
  return m;
}

std::vector<std::string> all_fixtures() {
  std::vector<std::string> names;
  for (auto& [name, _] : manifest()["files"].items()) names.push_back(name);
  return names;
}

std::vector<std::string> unencrypted_fixtures() {
  std::vector<std::string> names;
  for (auto& [name, f] : manifest()["files"].items())
    if (!f.contains("encryption") || f["encryption"].is_null()) names.push_back(name);
  return names;
}

void write_sample_tensors(const std::string& path, const std::vector<SampleTensor>& tensors,
                          const std::string& dtype, const WriterOptions& options) {
  const uint64_t itemsize = parse_dtype(dtype).itemsize;
  auto w = Writer::open(path, options);
  std::vector<WriteRequest> reqs;
  for (const auto& t : tensors) {
    WriteRequest r;
    r.path = TensorPath{t.name};
    r.dtype = dtype;
    r.shape = {t.bytes.size() / itemsize};
    r.data = t.bytes.data();
    r.meta = t.meta;
    reqs.push_back(r);
  }
  w->write(reqs);
  w->close();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw std::runtime_error("cannot read " + path);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

std::vector<std::string> dir_names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string sha256_hex(const void* data, size_t size) {
  uint8_t d[32];
  SHA256(static_cast<const uint8_t*>(data), size, d);
  return to_hex(d, 32);
}

TempDir::TempDir() {
  std::random_device rd;
  dir_ = (std::filesystem::temp_directory_path() / ("tz-test-" + std::to_string(rd()))).string();
  std::filesystem::create_directories(dir_);
}
TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

namespace {
class TruncatedSource final : public Source {
 public:
  TruncatedSource(std::shared_ptr<const std::string> b, uint64_t size)
      : b_(std::move(b)), size_(size) {}
  uint64_t size() override { return size_; }
  void read_scatter(uint64_t offset, const IoSlice* slices, size_t count) override {
    uint64_t total = 0;
    for (size_t i = 0; i < count; ++i) total += slices[i].size;
    if (offset > size_ || total > size_ - offset)
      fail(ErrorCode::kFormat, "read past end of truncated source");
    const char* p = b_->data() + offset;
    for (size_t i = 0; i < count; ++i) {
      std::memcpy(slices[i].data, p, slices[i].size);
      p += slices[i].size;
    }
  }
  std::unique_ptr<Source> clone() override { return std::make_unique<TruncatedSource>(b_, size_); }
  const std::string& uri() const override { return name_; }
  uint64_t bytes_read() const override { return 0; }

 private:
  std::shared_ptr<const std::string> b_;
  uint64_t size_;
  std::string name_ = "<truncated>";
};
}  // namespace

std::unique_ptr<Source> truncated_source(std::shared_ptr<const std::string> bytes, uint64_t size) {
  return std::make_unique<TruncatedSource>(std::move(bytes), size);
}

std::string cli_path() { return TZ_CLI_PATH; }

std::string shell_quote(const std::string& s) { return "'" + s + "'"; }

int run_cli(const std::string& args, std::string* out, const std::string& env) {
  return run_command(env + shell_quote(cli_path()) + " " + args + " 2>&1", out);
}

TensorPath path_from_json(const nlohmann::json& name) {
  if (name.is_string()) return TensorPath(name.get<std::string>());
  std::vector<PathComponent> components;
  for (const auto& c : name) {
    if (c.is_string())
      components.emplace_back(c.get<std::string>());
    else
      components.emplace_back(c.get<uint64_t>());
  }
  return TensorPath(std::move(components));
}

uint32_t crc32_bitwise(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t crc = 0xffffffffu;
  for (size_t i = 0; i < size; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xedb88320u & (0u - (crc & 1u)));
  }
  return crc ^ 0xffffffffu;
}

std::string hex(std::string_view bytes) {
  return to_hex(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
}

std::vector<std::string> load_entries(Reader& reader, const LoadOptions& options,
                                      std::vector<size_t> which) {
  if (which.empty())
    for (size_t i = 0; i < reader.entries().size(); ++i) which.push_back(i);
  std::vector<std::string> buffers(which.size());
  std::vector<TensorDestination> dests;
  for (size_t k = 0; k < which.size(); ++k) {
    buffers[k].assign(reader.entries()[which[k]].expected_bytes(), '\xAA');
    dests.push_back({which[k], buffers[k].data()});
  }
  reader.load(dests, options);
  return buffers;
}

int run_command(const std::string& cmd, std::string* out) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0)
    if (out) out->append(buf, n);
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

uint64_t smaps_bytes(const std::string& field,
                     const std::function<bool(uintptr_t lo, uintptr_t hi)>& pick) {
  std::ifstream f("/proc/self/smaps");
  const std::string key = field + ":";
  uint64_t total = 0;
  bool inside = false;
  for (std::string line; std::getline(f, line);) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = pick(lo, hi);
      continue;
    }
    if (inside && line.rfind(key, 0) == 0) total += std::stoull(line.substr(key.size())) * 1024;
  }
  return total;
}

uint64_t smaps_bytes_at(const void* p, const std::string& field) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  return smaps_bytes(field, [at](uintptr_t lo, uintptr_t hi) { return lo <= at && at < hi; });
}

}  // namespace tensorizer::test
