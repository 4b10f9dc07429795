// crypto_bench: decryption throughput of encrypted loads, side by side with an unencrypted load of
// the same tensors and with libsodium's single-core secretbox speed (the ceiling is cores x that).
//
//   crypto_bench [--size-mb N] [--dir D] [--repeat R] [--workers W] [--keep]
//
// Writes the same synthetic model twice (plain and encrypted with a random key) into D, warms the
// page cache, then times Reader::load of every tensor into pre-touched buffers (median of R) and
// the encrypted write. Prints GB/s (10^9 bytes/s of tensor data). Not a test: never run by ctest.
#include <sodium.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tensorizer/reader.h"
#include "tensorizer/writer.h"

using namespace tensorizer;
using Clock = std::chrono::steady_clock;

namespace {

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// CPU seconds (user + system) used by this process so far: on a shared machine the cost per byte
// is steadier than wall time, and cores / (CPU s per GB) estimates the all-cores rate.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec +
         u.ru_stime.tv_usec / 1e6;
}

struct Timing {
  double wall;  // median seconds
  double cpu;   // median CPU seconds
};
double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Region {  // pre-touched anonymous memory
  uint8_t* p;
  size_t n;
  explicit Region(size_t size) : n(std::max<size_t>(size, 1)) {
    p = static_cast<uint8_t*>(
        mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (p == MAP_FAILED) throw std::runtime_error("mmap failed");
    std::memset(p, 1, n);
  }
  ~Region() { munmap(p, n); }
};

double single_core_secretbox_gbps() {
  const size_t chunk = 2 << 20;
  std::vector<uint8_t> buf(chunk, 7);
  uint8_t key[32] = {1}, nonce[24] = {2}, mac[16];
  crypto_secretbox_detached(buf.data(), mac, buf.data(), chunk, nonce, key);
  const int rounds = 400;  // 800 MiB
  const double t = cpu_seconds();
  for (int i = 0; i < rounds; ++i) {
    // Seal then open, in place: both directions run XSalsa20 + Poly1305 over the chunk.
    crypto_secretbox_detached(buf.data(), mac, buf.data(), chunk, nonce, key);
    if (crypto_secretbox_open_detached(buf.data(), buf.data(), mac, chunk, nonce, key) != 0)
      throw std::runtime_error("open failed");
  }
  return 2.0 * rounds * chunk / (cpu_seconds() - t) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t size_mb = 1536;
  std::string dir = std::filesystem::temp_directory_path().string();
  int repeat = 5, workers = 0;
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] { return std::string(i + 1 < argc ? argv[++i] : ""); };
    if (a == "--size-mb")
      size_mb = std::stoull(next());
    else if (a == "--dir")
      dir = next();
    else if (a == "--repeat")
      repeat = std::stoi(next());
    else if (a == "--workers")
      workers = std::stoi(next());
    else if (a == "--keep")
      keep = true;
    else {
      std::fprintf(
          stderr,
          "usage: crypto_bench [--size-mb N] [--dir D] [--repeat R] [--workers W] [--keep]\n");
      return 2;
    }
  }
  if (sodium_init() < 0) return 1;
  const int cores = usable_cores();

  // Tensors of a transformer-ish mix: 64 MiB, 16 MiB and 1 MiB + 12 bytes (odd sizes too).
  std::vector<uint64_t> sizes;
  uint64_t total = 0;
  const uint64_t pattern[] = {64ull << 20, 16ull << 20, 16ull << 20, (1ull << 20) + 12,
                              48ull << 20};
  for (size_t k = 0; total < (size_mb << 20); ++k) {
    sizes.push_back(pattern[k % 5]);
    total += sizes.back();
  }
  Region src(total);
  std::mt19937_64 g(1);
  for (uint64_t i = 0; i + 8 <= total; i += 8) {
    const uint64_t v = g();
    std::memcpy(src.p + i, &v, 8);
  }
  std::vector<WriteRequest> reqs;
  uint64_t off = 0;
  for (size_t k = 0; k < sizes.size(); ++k) {
    WriteRequest r;
    r.path = TensorPath("layer." + std::to_string(k) + ".weight");
    r.dtype = "|u1";
    r.shape = {sizes[k]};
    r.data = src.p + off;
    reqs.push_back(r);
    off += sizes[k];
  }

  const std::string plain = dir + "/crypto_bench.plain.tensors",
                    enc = dir + "/crypto_bench.enc.tensors";
  const EncryptionParams params = EncryptionParams::random();
  auto time_write = [&](const std::string& path, std::optional<EncryptionParams> e) {
    std::vector<double> wall, cpu;
    for (int i = 0; i < std::max(1, repeat / 2); ++i) {
      WriterOptions wo;
      wo.encryption = e;
      wo.num_workers = workers;
      const double c = cpu_seconds();
      auto t = Clock::now();
      auto w = Writer::open(path, wo);
      w->write(reqs);
      w->close();
      wall.push_back(since(t));
      cpu.push_back(cpu_seconds() - c);
    }
    return Timing{median(wall), median(cpu)};
  };
  const Timing plain_w = time_write(plain, std::nullopt);
  const Timing enc_w = time_write(enc, params);

  Region dst(total);
  auto time_load = [&](const std::string& path, std::optional<DecryptionParams> dec) {
    ReaderOptions ro;
    ro.decryption = dec;
    auto r = Reader::open(path, ro);
    std::vector<TensorDestination> dests;
    uint64_t o = 0;
    for (size_t k = 0; k < r->entries().size(); ++k) {
      dests.push_back({k, dst.p + o});
      o += r->entries()[k].expected_bytes();
    }
    LoadOptions lo;
    lo.num_workers = workers;
    r->load(dests, lo);  // warm-up: page cache and buffers
    if (std::memcmp(dst.p, src.p, total) != 0)
      throw std::runtime_error("loaded bytes differ: " + path);
    std::vector<double> wall, cpu;
    for (int i = 0; i < repeat; ++i) {
      const double c = cpu_seconds();
      auto t = Clock::now();
      r->load(dests, lo);
      wall.push_back(since(t));
      cpu.push_back(cpu_seconds() - c);
    }
    return Timing{median(wall), median(cpu)};
  };
  const Timing plain_r = time_load(plain, std::nullopt);
  const Timing enc_r = time_load(enc, DecryptionParams::from_key(params.key));
  const double one = single_core_secretbox_gbps();
  const double gb = total / 1e9;

  std::printf(
      "crypto_bench: %.2f GB in %zu tensors, %d usable cores, workers %s, median of %d (page "
      "cache)\n",
      gb, sizes.size(), cores, workers ? std::to_string(workers).c_str() : "auto", repeat);
  std::printf("  %-34s: %6.2f GB/s (CPU time) -> ceiling %d x = %.2f GB/s\n",
              "secretbox, 1 core, in memory", one, cores, one * cores);
  auto line = [&](const char* what, const Timing& t) {
    std::printf("  %-34s: %6.2f GB/s wall (%.3f s); CPU %.3f s/GB -> %5.2f GB/s on %d cores\n",
                what, gb / t.wall, t.wall, t.cpu / gb, cores * gb / t.cpu, cores);
  };
  line("load, unencrypted", plain_r);
  line("load, encrypted (read + decrypt)", enc_r);
  std::printf("  encrypted load = %.0f%% of the secretbox ceiling (wall), %.0f%% (CPU estimate)\n",
              100.0 * gb / enc_r.wall / (one * cores), 100.0 * gb / enc_r.cpu / one);
  line("write, unencrypted (hash + write)", plain_w);
  line("write, encrypted (hash+seal+write)", enc_w);
  if (!keep) {
    std::filesystem::remove(plain);
    std::filesystem::remove(enc);
  }
  return 0;
}
