// `tensorizer bench`: the C++ main job. Writes a model-sized file of random fp16 tensors shaped
// like a transformer's, loads it back with 1 and N workers (after a warm-up, several times),
// verifies every hash, and prints GB/s next to a raw read() of the same file in the same run.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>

#include "cli/commands.h"
#include "tensorizer/dtype.h"
#include "tensorizer/error.h"
#include "tensorizer/writer.h"

namespace tensorizer::cli {
namespace {

using Clock = std::chrono::steady_clock;

struct BenchOptions {
  uint64_t size_mb = 1024;
  std::string file;
  int repeat = 5;
  int workers = 0;
  bool keep = false;
};

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Page-aligned anonymous memory. Pre-touched (huge pages advised), so first-touch page faults are
// not timed; or fresh, never touched, so loads into it pay the page faults a real load pays.
struct Buffer {
  enum Kind { kPretouched, kFresh };
  uint8_t* data = nullptr;
  size_t size = 0;
  explicit Buffer(size_t n, Kind kind = kPretouched) : size(std::max<size_t>(n, 1)) {
    void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) fail(ErrorCode::kIO, "cannot allocate " + std::to_string(size) + " bytes");
    data = static_cast<uint8_t*>(p);
    if (kind == kFresh) return;
    madvise(p, size, MADV_HUGEPAGE);
    std::memset(data, 1, size);
  }
  ~Buffer() { munmap(data, size); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

// Tensor shapes of a decoder-only transformer (hidden h, 4h MLP), repeated until `bytes`.
std::vector<std::pair<std::string, std::vector<uint64_t>>> model_shapes(uint64_t bytes) {
  // A 2048-wide model with a 32,000-token embedding; narrower, with a smaller vocabulary, where
  // that embedding alone would take more than a quarter of `bytes`.
  uint64_t h = 2048, vocab = 32000;
  while (h > 64 && vocab * h * 2 > bytes / 4) h /= 2;
  while (vocab > 1000 && vocab * h * 2 > bytes / 4) vocab /= 2;
  std::vector<std::pair<std::string, std::vector<uint64_t>>> out;
  uint64_t total = 0;
  out.push_back({"embed.weight", {vocab, h}});
  total += vocab * h * 2;
  for (int layer = 0; total < bytes; ++layer) {
    const std::string p = "layers." + std::to_string(layer) + ".";
    const std::pair<const char*, std::vector<uint64_t>> parts[] = {
        {"attn.qkv.weight", {3 * h, h}}, {"attn.out.weight", {h, h}}, {"mlp.up.weight", {4 * h, h}},
        {"mlp.down.weight", {h, 4 * h}}, {"norm1.weight", {h}},       {"norm2.weight", {h}}};
    for (const auto& [name, shape] : parts) {
      out.push_back({p + name, shape});
      uint64_t n = 2;
      for (uint64_t d : shape) n *= d;
      total += n;
    }
  }
  return out;
}

void fill_random(uint8_t* p, size_t n, uint64_t seed) {
  uint64_t x = seed;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    x += 0x9e3779b97f4a7c15ull;
    uint64_t z = x;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    std::memcpy(p + i, &z, 8);
  }
  for (; i < n; ++i) p[i] = static_cast<uint8_t>(i);
}

double raw_read_seconds(const std::string& path, uint8_t* dst, size_t size) {
  auto t = Clock::now();
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) fail(ErrorCode::kIO, "cannot open '" + path + "': " + std::strerror(errno));
  size_t done = 0;
  while (done < size) {
    ssize_t r = ::read(fd, dst + done, std::min<size_t>(size - done, 1u << 30));
    if (r <= 0) break;
    done += static_cast<size_t>(r);
  }
  ::close(fd);
  return seconds_since(t);
}

// A new, unique file in the temp directory, removed (unless kept) when the bench ends, however.
struct TempFile {
  std::string path;
  bool keep;
  explicit TempFile(bool keep_file) : keep(keep_file) {
    path = (std::filesystem::temp_directory_path() / "tensorizer-bench-XXXXXX.tensors").string();
    const int fd = ::mkstemps(path.data(), static_cast<int>(std::strlen(".tensors")));
    if (fd < 0) fail(ErrorCode::kIO, "cannot create '" + path + "': " + std::strerror(errno));
    ::close(fd);
  }
  ~TempFile() {
    std::error_code ec;
    if (!keep) std::filesystem::remove(path, ec);
  }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;
};

void run_bench(const BenchOptions& o) {
  std::optional<TempFile> temp;
  if (o.file.empty()) temp.emplace(o.keep);
  const std::string path = temp ? temp->path : o.file;
  auto shapes = model_shapes(o.size_mb << 20);
  std::vector<uint64_t> offsets;
  uint64_t total = 0;
  for (auto& [name, shape] : shapes) {
    offsets.push_back(total);
    uint64_t n = 2;
    for (uint64_t d : shape) n *= d;
    total += n;
  }
  std::printf("tensorizer bench: %zu fp16 tensors, %.3g GB, file %s, %d usable cores\n",
              shapes.size(), total / 1e9, path.c_str(), usable_cores());
  Buffer src(total);
  fill_random(src.data, total, 42);

  // Write.
  std::vector<WriteRequest> reqs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    WriteRequest r;
    r.path = TensorPath(shapes[i].first);
    r.dtype = dtype_string_for_torch("float16");
    r.shape = shapes[i].second;
    r.data = src.data + offsets[i];
    reqs.push_back(std::move(r));
  }
  std::vector<double> write_s;
  for (int rep = 0; rep < std::max(1, o.repeat / 2); ++rep) {
    auto t = Clock::now();
    auto w = Writer::open(path);
    w->write(reqs);
    w->close();
    write_s.push_back(seconds_since(t));
  }
  const uint64_t file_size = std::filesystem::file_size(path);

  // Load: warm-up, then repeats with 1 and N workers; raw read() baseline in the same run.
  Buffer dst(std::max(total, file_size));
  auto reader = Reader::open(path);
  std::vector<TensorDestination> dests;
  for (size_t i = 0; i < reader->entries().size(); ++i) dests.push_back({i, dst.data + offsets[i]});
  raw_read_seconds(path, dst.data, file_size);  // warm the page cache
  const int n_workers = o.workers > 0 ? o.workers : usable_cores();
  std::vector<int> worker_counts = {1};
  if (n_workers > 1) worker_counts.push_back(n_workers);
  std::vector<double> raw;
  std::vector<std::vector<double>> loads(worker_counts.size());
  for (int rep = 0; rep < o.repeat + 1; ++rep) {
    double r = raw_read_seconds(path, dst.data, file_size);
    std::vector<double> l;
    for (int w : worker_counts) {
      LoadOptions lo;
      lo.num_workers = w;
      auto t = Clock::now();
      reader->load(dests, lo);
      l.push_back(seconds_since(t));
    }
    if (rep == 0) continue;  // warm-up
    raw.push_back(r);
    for (size_t k = 0; k < l.size(); ++k) loads[k].push_back(l[k]);
  }
  if (std::memcmp(dst.data, src.data, total) != 0)
    fail(ErrorCode::kFormat, "loaded bytes differ from written bytes");
  LoadOptions vo;
  vo.verify_hash = true;
  auto t = Clock::now();
  reader->load(dests, vo);
  double verify_s = seconds_since(t);

  // Loads into fresh memory (what a real load gets): the page faults that zero and map it are
  // timed; once with the engine's MADV_HUGEPAGE advice and once without, next to read() into
  // fresh memory.
  std::vector<double> fresh_raw, fresh_small, fresh_huge;
  for (int rep = 0; rep < o.repeat + 1; ++rep) {
    std::vector<double> l;
    for (int mode = 0; mode < 3; ++mode) {
      Buffer fresh(std::max(total, file_size), Buffer::kFresh);
      if (mode == 0) {
        l.push_back(raw_read_seconds(path, fresh.data, file_size));
        continue;
      }
      std::vector<TensorDestination> fd;
      for (size_t i = 0; i < reader->entries().size(); ++i)
        fd.push_back({i, fresh.data + offsets[i]});
      LoadOptions lo;
      lo.num_workers = n_workers;
      lo.advise_huge_pages = mode == 2;
      auto t0 = Clock::now();
      reader->load(fd, lo);
      l.push_back(seconds_since(t0));
    }
    if (rep == 0) continue;  // warm-up
    fresh_raw.push_back(l[0]);
    fresh_small.push_back(l[1]);
    fresh_huge.push_back(l[2]);
  }

  const double gb = total / 1e9, raw_gbps = file_size / 1e9 / median(raw);
  std::printf("%-36s %10s %10s\n", "operation", "GB/s", "vs read()");
  std::printf("%-36s %10.2f %10s\n", "raw read() of the file", raw_gbps, "1.00");
  for (size_t k = 0; k < worker_counts.size(); ++k) {
    double g = gb / median(loads[k]);
    char label[64];
    std::snprintf(label, sizeof label, "load, %d worker%s", worker_counts[k],
                  worker_counts[k] > 1 ? "s" : "");
    std::printf("%-36s %10.2f %10.2f\n", label, g, g / raw_gbps);
  }
  std::printf("%-36s %10.2f %10.2f\n", "load + verify CRC32/SHA-256", gb / verify_s,
              gb / verify_s / raw_gbps);
  const double fresh_gbps = file_size / 1e9 / median(fresh_raw);
  std::printf("%-36s %10.2f %10s\n", "read() into fresh memory", fresh_gbps, "-");
  std::printf("%-36s %10.2f %10.2f\n", "load into fresh memory, 4 KiB pages",
              gb / median(fresh_small), gb / median(fresh_small) / fresh_gbps);
  std::printf("%-36s %10.2f %10.2f\n", "load into fresh memory, huge pages",
              gb / median(fresh_huge), gb / median(fresh_huge) / fresh_gbps);
  std::printf("%-36s %10.2f %10s\n", "write (hash + write)", gb / median(write_s), "-");
  std::printf("median of %d runs after a warm-up; all bytes checked\n", o.repeat);
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("bench", "write and load a synthetic model-sized file, print GB/s");
  auto o = std::make_shared<BenchOptions>();
  cmd->add_option("--size-mb", o->size_mb, "approximate model size in MiB (default 1024)")
      ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 30));
  cmd->add_option("--file", o->file, "where to write the file (default: temp dir, removed after)");
  cmd->add_option("--repeat", o->repeat, "timed repetitions (default 5)")
      ->check(CLI::Range(1, 1000));
  cmd->add_option("--workers", o->workers, "workers for the parallel load (default: usable cores)")
      ->check(CLI::Range(1, 1024));
  cmd->add_flag("--keep", o->keep, "keep the file");
  cmd->callback([o] { run_bench(*o); });
}

}  // namespace tensorizer::cli
