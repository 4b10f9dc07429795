// Loads every tensor of a .tensors object at a URI into memory with the C++ engine and prints
// the throughput as one JSON line: {"uri", "bytes", "open_seconds", "seconds", "gbps"}.
//   remote_load URI [--workers N] [--reps R]    (best of R loads; memory is allocated and
//                                                 touched before timing)
//   remote_load --make PATH SIZE_MB              writes a test model: 64 MiB fp16 tensors
// S3 endpoint and credentials come from the environment (AWS_*), as for the CLI.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tensorizer/error.h"
#include "tensorizer/reader.h"
#include "tensorizer/writer.h"

namespace {

// A model of `size_mb` MiB in 64 MiB fp16 tensors of pseudo-random bytes.
void make_model(const std::string& path, uint64_t size_mb) {
  constexpr uint64_t kTensor = 64ull << 20;
  std::vector<char> data(kTensor);
  uint64_t x = 88172645463325252ull;
  for (size_t i = 0; i + 8 <= data.size(); i += 8) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    std::memcpy(&data[i], &x, 8);
  }
  auto w = tensorizer::Writer::open(path);
  std::vector<tensorizer::WriteRequest> reqs;
  for (uint64_t left = size_mb << 20, i = 0; left > 0; ++i) {
    const uint64_t n = std::min(left, kTensor);
    tensorizer::WriteRequest r;
    r.path = tensorizer::TensorPath("layers." + std::to_string(i) + ".weight");
    r.dtype = "<f2";
    r.shape = {n / 2};
    r.data = data.data();
    reqs.push_back(r);
    left -= n;
  }
  w->write(reqs);
  w->close();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: remote_load URI [--workers N] [--reps R]\n");
    return 2;
  }
  std::string uri = argv[1];
  if (uri == "--make" && argc == 4) {
    make_model(argv[2], std::strtoull(argv[3], nullptr, 10));
    return 0;
  }
  int workers = 0, reps = 3;
  for (int i = 2; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--workers")) workers = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  try {
    double best = 1e30, open_s = 0;
    uint64_t bytes = 0;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      auto reader = tensorizer::Reader::open(uri);
      const auto& entries = reader->entries();
      std::vector<std::vector<char>> buffers(entries.size());
      std::vector<tensorizer::TensorDestination> dests;
      bytes = 0;
      for (size_t i = 0; i < entries.size(); ++i) {
        buffers[i].resize(entries[i].expected_bytes());  // zero-filled: pages are touched
        dests.push_back({i, buffers[i].data()});
        bytes += entries[i].data_length;
      }
      const auto t1 = std::chrono::steady_clock::now();
      tensorizer::LoadOptions lo;
      lo.num_workers = workers;
      reader->load(dests, lo);
      const auto t2 = std::chrono::steady_clock::now();
      // The load itself; opening (one small request for the index) is reported apart.
      const double secs = std::chrono::duration<double>(t2 - t1).count();
      if (secs < best) open_s = std::chrono::duration<double>(t1 - t0).count();
      best = std::min(best, secs);
    }
    std::printf(
        "{\"uri\":\"%s\",\"bytes\":%llu,\"open_seconds\":%.4f,\"seconds\":%.4f,\"gbps\":%.3f}\n",
        uri.c_str(), static_cast<unsigned long long>(bytes), open_s, best, bytes / best / 1e9);
  } catch (const tensorizer::Error& e) {
    std::fprintf(stderr, "remote_load: %s\n", e.what());
    return 1;
  }
  return 0;
}
