// Helpers shared by the C++ tests: fixture paths, the fixture manifest, temp dirs, sources
// that serve a mutated copy of a file.
#pragma once

#include <nlohmann/json.hpp>
#include <memory>
#include <string>
#include <vector>

#include "tensorizer/transport.h"

namespace tensorizer::test {

std::string fixtures_dir();
std::string fixture_path(const std::string& name);
const nlohmann::json& manifest();  // manifest.json of the fixtures
std::vector<std::string> unencrypted_fixtures();
std::vector<std::string> all_fixtures();

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& bytes);
std::string sha256_hex(const void* data, size_t size);

// A fresh directory under the system temp dir, removed with the object.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

 private:
  std::string dir_;
};

// A source over `bytes`, cut to its first `size` bytes (to simulate truncation without copying).
std::unique_ptr<Source> truncated_source(std::shared_ptr<const std::string> bytes, uint64_t size);

// Runs a shell command, returning its exit status and stdout.
int run_command(const std::string& cmd, std::string* out);

}  // namespace tensorizer::test
