// libFuzzer target for the .tensors header/index parser (run with `make fuzz`).
//
// The input is treated as a whole file, .tensors or safetensors (Reader::open tells them apart),
// and goes through the same paths Reader::open uses (file header, index, path rules, or the
// safetensors JSON header and its validation), then every tensor's own header is read and checked
// against its index entry, and small files are loaded the way a default Python load does
// (load_to_host) with hash verification; encrypted ones with a passphrase under a tiny Argon2id
// cap, so the crypt info and key derivation checks run too. The input is also parsed directly as
// one per-tensor header in each layout. Any tensorizer::Error is
// an expected rejection; a crash, sanitizer report, other exception or hang is a finding.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorizer/error.h"
#include "tensorizer/format.h"
#include "tensorizer/host_load.h"
#include "tensorizer/reader.h"
#include "tensorizer/transport.h"

namespace {

constexpr uint64_t kMaxLoadBytes = 1 << 20;  // bigger (claimed) tensors are not loaded

void fuzz_file(const uint8_t* data, size_t size) {
  auto bytes = std::make_shared<const std::string>(reinterpret_cast<const char*>(data), size);
  tensorizer::ReaderOptions options;
  options.without_key = true;
  std::unique_ptr<tensorizer::Reader> reader;
  try {
    reader = tensorizer::Reader::open(tensorizer::make_memory_source(bytes, "<fuzz>"), options);
  } catch (const tensorizer::Error&) {
    return;
  }
  const auto& entries = reader->entries();
  bool headers_ok = true;
  uint64_t total = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    try {
      reader->read_header(i);
    } catch (const tensorizer::Error&) {
      headers_ok = false;
    }
    if (__builtin_add_overflow(total, entries[i].expected_bytes(), &total)) total = UINT64_MAX;
  }
  if (!headers_ok || total > kMaxLoadBytes) return;
  std::vector<size_t> all(entries.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  if (reader->encrypted()) {  // reopened with a passphrase (`entries` dies with the old reader)
    options.without_key = false;
    options.decryption = tensorizer::DecryptionParams::from_passphrase("fuzz");
    options.decryption->max_kdf = {1, 8192};  // anything costlier is refused before deriving
    try {
      reader = tensorizer::Reader::open(tensorizer::make_memory_source(bytes, "<fuzz>"), options);
    } catch (const tensorizer::Error&) {
      return;
    }
  }
  tensorizer::LoadOptions load;
  load.num_workers = 1;
  load.verify_hash = true;
  try {
    tensorizer::load_to_host(*reader, all, load);
  } catch (const tensorizer::Error&) {
  }
}

void fuzz_tensor_header(const uint8_t* data, size_t size) {
  for (int layout = 0; layout < 4; ++layout) {
    try {
      const bool crypt = layout & 1, long_shape = layout & 2;
      tensorizer::TensorHeader h = tensorizer::parse_tensor_header(data, size, crypt, long_shape);
      std::string hashed = tensorizer::hashable_header(data, size, h);
      if (hashed.size() > size) __builtin_trap();
      if (h.has_crypt_field) (void)h.crypt_info(data);
    } catch (const tensorizer::Error&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz_file(data, size);
  fuzz_tensor_header(data, size);
  return 0;
}
