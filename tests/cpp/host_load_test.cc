// Host loads (tensorizer/host_load.h): each route gives the stored bytes exactly, the automatic
// choice follows the page cache (mapped when cached, direct I/O when not), unaligned files and
// encrypted files take their fallbacks, verify_hash catches a flipped byte on every route,
// results outlive the reader and the file, and tensor-by-tensor loads share one file mapping.
#include "tensorizer/host_load.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <sstream>

#include "engine/direct_io.h"
#include "tensorizer/transport.h"
#include "tensorizer/writer.h"
#include "test_util.h"

namespace tensorizer {
namespace {

using Sample = test::SampleTensor;  // float32 data

// Tensors of sizes around the edges: larger than a direct read, odd, tiny, empty.
std::vector<Sample> samples() {
  std::mt19937_64 rng(7);
  std::vector<Sample> out;
  for (size_t n :
       {size_t{20} << 20, size_t{3 << 20} + 12, size_t{4096}, size_t{36}, size_t{4}, size_t{0}}) {
    std::string b(n, '\0');
    for (auto& c : b) c = static_cast<char>(rng());
    out.push_back({"t" + std::to_string(out.size()), std::move(b)});
  }
  return out;
}

void write_samples(const std::string& path, const std::vector<Sample>& ts, bool aligned) {
  WriterOptions o;
  if (!aligned) o.alignment = o.large_alignment = 1;
  test::write_sample_tensors(path, ts, "<f4", o);
}

void warm_page_cache(const std::string& path) { (void)test::read_file(path); }

// Drops [offset, offset + length) of the file from the page cache (its whole pages; length 0:
// to the end).
void drop_range(const std::string& path, uint64_t offset, uint64_t length) {
  int fd = ::open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  fdatasync(fd);  // dirty pages stay
  posix_fadvise(fd, static_cast<off_t>(offset), static_cast<off_t>(length), POSIX_FADV_DONTNEED);
  ::close(fd);
}

bool direct_io_works(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  engine::DirectFile f(fd);
  const bool ok = f.ok();
  ::close(fd);
  return ok;
}

std::vector<size_t> all_entries(const Reader& r) {
  std::vector<size_t> v(r.entries().size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = i;
  return v;
}

void expect_samples(const std::vector<HostTensor>& got, const std::vector<Sample>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(want[i].name);
    ASSERT_EQ(got[i].size, want[i].bytes.size());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(got[i].data) % 4, 0u);  // the element size of <f4
    EXPECT_EQ(std::memcmp(got[i].data, want[i].bytes.data(), got[i].size), 0);
  }
}

class HostLoadTest : public ::testing::TestWithParam<bool> {  // param: written aligned
 protected:
  void SetUp() override {
    ts_ = samples();
    path_ = dir_.path("m.tensors");
    write_samples(path_, ts_, GetParam());
  }
  test::TempDir dir_;
  std::string path_;
  std::vector<Sample> ts_;
};

TEST_P(HostLoadTest, EveryForcedRouteGivesTheStoredBytes) {
  for (HostRoute route :
       {HostRoute::kMap, HostRoute::kDirect, HostRoute::kCopy, HostRoute::kAuto}) {
    SCOPED_TRACE(static_cast<int>(route));
    auto r = Reader::open(path_);
    LoadOptions o;
    o.verify_hash = true;
    expect_samples(load_to_host(*r, all_entries(*r), o, route), ts_);
  }
}

TEST_P(HostLoadTest, AutoMapsCachedPagesAndReadsColdOnesDirect) {
  if (!direct_io_works(path_)) GTEST_SKIP() << "no direct I/O on this file system";
  warm_page_cache(path_);
  {
    auto r = Reader::open(path_);
    auto got = load_to_host(*r, all_entries(*r));
    expect_samples(got, ts_);
    // Tensors stored at their element size are mapped (all those our writer aligned); the others
    // (and the empty one) are copied from the cache. An aligned file's come out 64-byte aligned.
    size_t off_element = 0;
    for (size_t i = 0; i < 5; ++i) {
      const bool in_place = r->entries()[i].data_offset % 4 == 0;
      off_element += !in_place;
      EXPECT_EQ(got[i].via, in_place ? LoadedVia::kMapped : LoadedVia::kCopied) << i;
      if (GetParam()) EXPECT_EQ(reinterpret_cast<uintptr_t>(got[i].data) % 64, 0u) << i;
    }
    EXPECT_EQ(off_element > 0, !GetParam())
        << "the unaligned file has tensors off their element size";
    EXPECT_EQ(got[5].via, LoadedVia::kCopied);
  }
  drop_range(path_, 0, 0);
  auto r = Reader::open(path_);
  auto got = load_to_host(*r, all_entries(*r));
  expect_samples(got, ts_);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(got[i].via, LoadedVia::kDirect) << i;
  EXPECT_LT(engine::Residency(r->source().local_fd())
                .fraction(r->entries()[0].data_offset, r->entries()[0].data_length),
            0.5)
      << "direct reads leave the page cache alone";
}

// A warm file that lost a few tensors' pages (reclaim ages pages out of a cache nobody reads) is
// mapped whole: only the missing pages are read, through the page cache, which holds the file
// whole again afterwards. A file mostly gone from the cache still reads its cold tensors direct.
TEST(HostLoadRoutes, AWarmFileMissingAFewTensorsIsMappedWholeAndCachedAgain) {
  test::TempDir dir;
  const std::string path = dir.path("m.tensors");
  std::mt19937_64 rng(11);
  std::vector<Sample> ts;
  for (int i = 0; i < 20; ++i) {
    std::string b(size_t{4} << 20, '\0');
    for (auto& c : b) c = static_cast<char>(rng());
    ts.push_back({std::string("t").append(std::to_string(i)), std::move(b)});
  }
  write_samples(path, ts, /*aligned=*/true);
  if (!direct_io_works(path)) GTEST_SKIP() << "no direct I/O on this file system";
  auto cached = [&](Reader& r, size_t i) {
    return engine::Residency(r.source().local_fd())
        .fraction(r.entries()[i].data_offset, r.entries()[i].data_length);
  };

  warm_page_cache(path);
  {
    auto r = Reader::open(path);
    drop_range(path, r->entries()[3].data_offset, r->entries()[3].data_length);
    ASSERT_EQ(cached(*r, 3), 0.0);
    auto got = load_to_host(*r, all_entries(*r));
    expect_samples(got, ts);
    for (size_t i = 0; i < ts.size(); ++i) EXPECT_EQ(got[i].via, LoadedVia::kMapped) << i;
    EXPECT_EQ(cached(*r, 3), 1.0) << "the missing pages came back into the page cache";
  }

  auto r = Reader::open(path);
  for (size_t i = 0; i < 8; ++i)
    drop_range(path, r->entries()[i].data_offset, r->entries()[i].data_length);
  auto got = load_to_host(*r, all_entries(*r));
  expect_samples(got, ts);
  for (size_t i = 0; i < ts.size(); ++i)
    EXPECT_EQ(got[i].via, i < 8 ? LoadedVia::kDirect : LoadedVia::kMapped) << i;
}

// The whole-file judgement: pages sampled evenly over ranges taken end to end.
TEST(HostLoadRoutes, ResidencyOfRangesTakenEndToEnd) {
  test::TempDir dir;
  const std::string path = dir.path("r.tensors");
  test::write_file(path, std::string(size_t{8} << 20, 'x'));
  warm_page_cache(path);
  const uint64_t mib = 1 << 20;
  drop_range(path, 2 * mib, 2 * mib);  // [2, 4) MiB gone
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  {
    const engine::Residency res(fd);
    if (res.fraction(2 * mib, 2 * mib) != 0.0) GTEST_SKIP() << "the page cache kept the pages";
    EXPECT_EQ(res.fraction({{0, 2 * mib}, {6 * mib, 2 * mib}}, 64), 1.0);
    EXPECT_EQ(res.fraction({{2 * mib, mib}, {3 * mib, mib}}, 64), 0.0);
    EXPECT_EQ(res.fraction({{0, 2 * mib}, {2 * mib, 2 * mib}}, 64), 0.5);  // half of each
    EXPECT_EQ(res.fraction({{2 * mib, 2 * mib}, {6 * mib, 2 * mib}}, 4), 0.5);
    EXPECT_EQ(res.fraction({}, 64), 1.0);  // nothing asked: mapping is the safe guess
  }
  ::close(fd);
}

TEST_P(HostLoadTest, ResultsOutliveTheReaderAndTheFile) {
  for (HostRoute route : {HostRoute::kMap, HostRoute::kDirect, HostRoute::kCopy}) {
    std::vector<HostTensor> got;
    {
      auto r = Reader::open(path_);
      got = load_to_host(*r, all_entries(*r), {}, route);
    }
    const std::string moved = path_ + ".old";
    ASSERT_EQ(std::rename(path_.c_str(), moved.c_str()), 0);
    write_samples(path_, samples(), !GetParam());  // replaced by rename, as writers do
    ASSERT_EQ(std::remove(moved.c_str()), 0);
    expect_samples(got, ts_);
    // Writes stay private to the result.
    got[1].data[0] ^= 0xff;
    auto again = Reader::open(path_);
    auto fresh = load_to_host(*again, all_entries(*again), {}, route);
    expect_samples(fresh, ts_);
  }
}

// Lines of /proc/self/maps: the process's mappings (a thread left unjoined keeps its stack's).
size_t mapping_count() {
  std::istringstream lines(test::read_file("/proc/self/maps"));
  size_t n = 0;
  for (std::string line; std::getline(lines, line);) ++n;
  return n;
}

TEST(HostLoadRoutes, TensorByTensorLoadsShareOneMappingAndHoldNoThreads) {
  // Lazy loads map one tensor per call; a process may hold about 65,000 mappings, and a model
  // may have more tensors than that. Each call used to map the whole file again and keep a
  // finished thread (and its stack's mapping) until the tensor went.
  test::TempDir dir;
  const std::string path = dir.path("many.tensors");
  std::vector<Sample> ts;
  for (int i = 0; i < 3000; ++i)
    ts.push_back({"t" + std::to_string(i), std::string(64 + i % 7 * 4, static_cast<char>(i))});
  write_samples(path, ts, true);
  warm_page_cache(path);
  auto r = Reader::open(path);
  const size_t before = mapping_count();
  std::vector<HostTensor> got;
  for (size_t i = 0; i < ts.size(); ++i) {
    auto one = load_to_host(*r, {i}, {}, HostRoute::kMap);
    ASSERT_EQ(one[0].via, LoadedVia::kMapped);
    got.push_back(std::move(one[0]));
  }
  EXPECT_LT(mapping_count(), before + 16);
  expect_samples(got, ts);
  // A tensor loaded again is a copy of its own: a write to one never shows in the other.
  auto again = load_to_host(*r, {5}, {}, HostRoute::kMap);
  ASSERT_NE(again[0].data, got[5].data);
  again[0].data[0] ^= 0xff;
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(got[5].data), got[5].size), ts[5].bytes);
  // Loads after every tensor went map afresh, and the same again.
  got.clear();
  again.clear();
  auto last = load_to_host(*r, {5, 6}, {}, HostRoute::kMap);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(last[0].data), last[0].size), ts[5].bytes);
}

TEST_P(HostLoadTest, VerifyHashCatchesAFlippedByteOnEveryRoute) {
  std::string bytes = test::read_file(path_);
  {
    auto r = Reader::open(path_);
    bytes[r->entries()[1].data_offset + 1000] ^= 0x01;
  }
  test::write_file(path_, bytes);
  for (HostRoute route :
       {HostRoute::kMap, HostRoute::kDirect, HostRoute::kCopy, HostRoute::kAuto}) {
    SCOPED_TRACE(static_cast<int>(route));
    if (route == HostRoute::kAuto) drop_range(path_, 0, 0);
    auto r = Reader::open(path_);
    LoadOptions o;
    o.verify_hash = true;
    try {
      load_to_host(*r, all_entries(*r), o, route);
      ADD_FAILURE() << "no mismatch reported";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kHashMismatch);
      EXPECT_NE(std::string(e.what()).find("t1"), std::string::npos) << e.what();
    }
    auto unchecked = load_to_host(*r, {1}, {}, route);
    EXPECT_NE(std::memcmp(unchecked[0].data, ts_[1].bytes.data(), ts_[1].bytes.size()), 0);
  }
}

TEST_P(HostLoadTest, AFileTruncatedAfterOpenFailsOnEveryRoute) {
  for (HostRoute route : {HostRoute::kMap, HostRoute::kDirect, HostRoute::kCopy}) {
    SCOPED_TRACE(static_cast<int>(route));
    write_samples(path_, ts_, GetParam());
    auto r = Reader::open(path_);
    ASSERT_EQ(::truncate(path_.c_str(), static_cast<off_t>(r->entries()[0].data_offset + 1000)), 0);
    try {
      load_to_host(*r, all_entries(*r), {}, route);
      ADD_FAILURE() << "a truncated file loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, HostLoadTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "aligned" : "unaligned"; });

// The reference's own files (unaligned data): every route, cached or not, gives the manifest's
// bytes.
TEST(HostLoadFixtures, ReferenceFilesLoadExactlyOnEveryRoute) {
  test::TempDir dir;
  for (const auto& name : test::unencrypted_fixtures()) {
    SCOPED_TRACE(name);
    const std::string path = dir.path(name);
    test::write_file(path, test::read_file(test::fixture_path(name)));
    const auto& tensors = test::manifest()["files"][name]["tensors"];
    for (HostRoute route :
         {HostRoute::kAuto, HostRoute::kDirect, HostRoute::kMap, HostRoute::kCopy}) {
      drop_range(path, 0, 0);
      auto r = Reader::open(path);
      LoadOptions o;
      o.verify_hash = true;
      auto got = load_to_host(*r, all_entries(*r), o, route);
      ASSERT_EQ(got.size(), tensors.size());
      for (size_t i = 0; i < got.size(); ++i) {
        if (tensors[i]["meta"].get<bool>()) {
          EXPECT_EQ(got[i].via, LoadedVia::kCopied);
          continue;
        }
        EXPECT_EQ(test::sha256_hex(got[i].data, got[i].size),
                  tensors[i]["sha256"].get<std::string>())
            << i;
        // What torch needs: every tensor at its element size, wherever the reference put it.
        const IndexEntry& e = r->entries()[i];
        EXPECT_EQ(reinterpret_cast<uintptr_t>(got[i].data) % std::max<uint64_t>(e.itemsize(), 1),
                  0u)
            << i;
        if (route == HostRoute::kMap && e.data_length > 0)  // empty tensors are copied (nothing)
          EXPECT_EQ(got[i].via, e.data_offset % std::max<uint64_t>(e.itemsize(), 1) == 0
                                    ? LoadedVia::kMapped
                                    : LoadedVia::kCopied)
              << i;
      }
    }
  }
}

TEST(HostLoadFixtures, EncryptedFilesAreCopied) {
  ReaderOptions o;
  const std::string raw = test::read_file(test::fixture_path("encrypted_key.key"));
  Key key{};
  ASSERT_EQ(raw.size(), key.size());
  std::memcpy(key.data(), raw.data(), key.size());
  o.decryption = DecryptionParams::from_key(key);
  auto r = Reader::open(test::fixture_path("encrypted_key.tensors"), o);
  auto got = load_to_host(*r, all_entries(*r));
  const auto& tensors = test::manifest()["files"]["encrypted_key.tensors"]["tensors"];
  ASSERT_EQ(got.size(), tensors.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].via, LoadedVia::kCopied);
    EXPECT_EQ(test::sha256_hex(got[i].data, got[i].size), tensors[i]["sha256"].get<std::string>())
        << i;
  }
}

// A meta tensor's declared size is only a number in the file: loading it must commit no memory
// (the zeros are fresh anonymous pages), and a size no process can address fails before any
// allocation instead of wrapping round.
TEST(HostLoadMeta, DeclaredSizesCommitNothingAndUnaddressableOnesFail) {
  test::TempDir dir;
  const std::string path = dir.path("meta.tensors");
  const float small[3] = {1, 2, 3};
  std::vector<WriteRequest> reqs(2);
  reqs[0].path = TensorPath("big");
  reqs[0].dtype = "<f2";
  reqs[0].shape = {8, uint64_t{1} << 30};  // 16 GiB
  reqs[0].meta = true;
  reqs[1].path = TensorPath("small");
  reqs[1].dtype = "<f4";
  reqs[1].shape = {3};
  reqs[1].data = small;
  auto w = Writer::open(path, {});
  w->write(reqs);
  w->close();

  // The file, and the same bytes from memory: a source that is not a local file, whose load maps
  // its destinations ahead of the bytes (engine/prefault.h) and must leave a meta tensor's alone.
  const auto bytes = std::make_shared<const std::string>(test::read_file(path));
  for (int from_memory : {0, 1})
    for (HostRoute route : {HostRoute::kAuto, HostRoute::kCopy}) {
      SCOPED_TRACE(from_memory);
      auto r = from_memory ? Reader::open(make_memory_source(bytes)) : Reader::open(path);
      LoadOptions opt;
      opt.verify_hash = true;
      auto out = load_to_host(*r, {0, 1}, opt, route);
      ASSERT_EQ(out[0].size, size_t{16} << 30);
      EXPECT_EQ(std::memcmp(out[1].data, small, sizeof small), 0);
      // No page of the 16 GiB is resident; reading a few gives zeros.
      const size_t page = 4096, pages = out[0].size / page;
      std::vector<unsigned char> resident(pages);
      ASSERT_EQ(mincore(out[0].data, out[0].size, resident.data()), 0);
      size_t count = 0;
      for (unsigned char c : resident) count += c & 1;
      EXPECT_LT(count, 1024u);  // huge pages around the small tensor at most
      EXPECT_EQ(out[0].data[0] | out[0].data[out[0].size / 2] | out[0].data[out[0].size - 1], 0);
    }

  reqs[0].shape = {uint64_t{1} << 62};  // 2^63 bytes of float16
  reqs.resize(1);
  const std::string huge = dir.path("huge.tensors");
  auto w2 = Writer::open(huge, {});
  w2->write(reqs);
  w2->close();
  auto r = Reader::open(huge);
  try {
    load_to_host(*r, {0});
    ADD_FAILURE() << "a 2^63-byte meta tensor loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("more than a process can address"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace tensorizer
