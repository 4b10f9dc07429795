// Helpers shared by the C++ tests: fixture paths, the fixture manifest, temp dirs, sources
// that serve a mutated copy of a file.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tensorizer/error.h"
#include "tensorizer/reader.h"
#include "tensorizer/tensor_path.h"
#include "tensorizer/transport.h"
#include "tensorizer/writer.h"

namespace tensorizer::test {

std::string fixtures_dir();
std::string fixture_path(const std::string& name);
const nlohmann::json& manifest();  // manifest.json of the fixtures
std::vector<std::string> unencrypted_fixtures();
std::vector<std::string> all_fixtures();

// One tensor of a test file: its bytes, stored as `dtype` (item size from the dtype).
struct SampleTensor {
  std::string name;
  std::string bytes;
  bool meta = false;  // shape only: loads as zeros
};
// Writes `tensors` as 1-D tensors of `dtype` ("|u1", "<f4", ...) with the Writer.
void write_sample_tensors(const std::string& path, const std::vector<SampleTensor>& tensors,
                          const std::string& dtype, const WriterOptions& options = {});

std::string read_file(const std::string& path);
void write_file(const std::string& path, const std::string& bytes);
// The names in a directory, sorted.
std::vector<std::string> dir_names(const std::string& dir);
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

// The ErrorCode `f` throws; fails the test (returning kCancelled) when it throws nothing.
template <typename F>
ErrorCode error_code_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "expected a tensorizer::Error";
  return ErrorCode::kCancelled;
}

// Runs a shell command, returning its exit status and stdout.
int run_command(const std::string& cmd, std::string* out);

// The built `tensorizer` program (empty when the CLI is not built).
std::string cli_path();

// `s` in single quotes, for a shell command line (test paths hold no quote).
std::string shell_quote(const std::string& s);

// Runs `env tensorizer args` (env: "NAME=value " assignments, or empty); returns its exit status,
// with its stdout and stderr together in `out`.
int run_cli(const std::string& args, std::string* out, const std::string& env = "");

// A manifest tensor name (a string, or an array of strings and ints) as a TensorPath.
TensorPath path_from_json(const nlohmann::json& name);

// CRC-32 (zlib polynomial), computed bit by bit: an independent check of crc32_update.
uint32_t crc32_bitwise(const void* data, size_t size);

// A field of /proc/self/smaps ("Rss", "Anonymous", "AnonHugePages", ...) in bytes, summed over the
// mappings [lo, hi) that `pick(lo, hi)` accepts; smaps_bytes_at: of the mapping that holds `p`.
uint64_t smaps_bytes(const std::string& field,
                     const std::function<bool(uintptr_t lo, uintptr_t hi)>& pick);
uint64_t smaps_bytes_at(const void* p, const std::string& field);

// Lower-case hex of bytes.
std::string hex(std::string_view bytes);

// Loads the given entries (all when `which` is empty) into one buffer each, sized
// expected_bytes(). Throws whatever Reader::load throws.
std::vector<std::string> load_entries(Reader& reader, const LoadOptions& options,
                                      std::vector<size_t> which = {});

}  // namespace tensorizer::test
