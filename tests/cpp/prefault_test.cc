// engine/prefault.h: BackgroundPrefault maps every page of fresh ranges without changing a byte,
// including bytes written while it runs, and stops early when asked or destroyed; read-only, it
// maps a private file mapping's cached pages without copying them (engine/host_block.h's
// map_in_background);
// map_ahead_of_write maps the whole pages of a fresh range and leaves alone a range already
// mapped, one too small to matter and memory that is not mapped at all.
#include "engine/prefault.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/host_block.h"
#include "test_util.h"

namespace tensorizer::engine {
namespace {

constexpr size_t kBytes = size_t{64} << 20;

struct Fresh {
  Fresh()
      : data(static_cast<uint8_t*>(
            mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0))) {}
  ~Fresh() { munmap(data, kBytes); }
  // Pages of the range that are mapped (mincore).
  size_t resident_pages() const {
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    std::vector<unsigned char> v(kBytes / page);
    if (mincore(data, kBytes, v.data()) != 0) return 0;
    size_t n = 0;
    for (unsigned char c : v) n += c & 1;
    return n;
  }
  uint8_t* data;
};

TEST(BackgroundPrefault, MapsEveryPageAndKeepsWhatIsWritten) {
  Fresh f;
  ASSERT_NE(f.data, MAP_FAILED);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  ASSERT_EQ(f.resident_pages(), 0u);
  std::memset(f.data + kBytes / 2, 0xAB, 1 << 20);  // written before
  {
    BackgroundPrefault prefault({{f.data, kBytes}});
    std::memset(f.data + kBytes - (1 << 20), 0xCD, 1 << 20);  // written while it runs
    for (int i = 0; i < 500 && prefault.done() < kBytes; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (prefault.done() == 0) GTEST_SKIP() << "no MADV_POPULATE_WRITE on this kernel";
    EXPECT_EQ(prefault.done(), kBytes);
  }
  EXPECT_EQ(f.resident_pages(), kBytes / page);
  for (size_t i = 0; i < kBytes; i += 4096) {
    const uint8_t want = i >= kBytes - (1 << 20)                           ? 0xCD
                         : (i >= kBytes / 2 && i < kBytes / 2 + (1 << 20)) ? 0xAB
                                                                           : 0;
    ASSERT_EQ(f.data[i], want) << i;
  }
}

TEST(BackgroundPrefault, StopsWhenDestroyed) {
  Fresh f;
  ASSERT_NE(f.data, MAP_FAILED);
  size_t done;
  {
    BackgroundPrefault prefault({{f.data, kBytes}});
    done = prefault.done();
  }  // joins at the next 4 MiB piece
  EXPECT_LE(done, kBytes);
  BackgroundPrefault nothing({{nullptr, 0}});  // an empty range starts no thread
  EXPECT_EQ(nothing.done(), 0u);
}

TEST(BackgroundPrefault, MapsSeveralUnalignedRangesAndStopsWhenAsked) {
  Fresh f;
  ASSERT_NE(f.data, MAP_FAILED);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  {
    // Two ranges cut mid-page, and a null one: the whole pages inside the two are mapped.
    BackgroundPrefault prefault(
        {{f.data + 100, 4 * page}, {nullptr, page}, {f.data + 8 * page, 2 * page}});
    for (int i = 0; i < 500 && prefault.done() < 5 * page; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (prefault.done() == 0) GTEST_SKIP() << "no MADV_POPULATE_WRITE on this kernel";
    EXPECT_EQ(prefault.done(), 5 * page);  // pages 1-3 and 8-9
  }
  EXPECT_EQ(f.resident_pages(), 5u);
  Fresh g;
  BackgroundPrefault stopped({{g.data, kBytes}});
  stopped.stop();  // returns at once; the thread ends at its next piece
  const size_t at_stop = stopped.done();
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_LE(stopped.done(), at_stop + (size_t{4} << 20));
}

TEST(BackgroundPrefault, MapsAFilesCachedPagesReadOnlyWithoutCopyingThem) {
  if (madvise(Fresh().data, 4096, 22 /* MADV_POPULATE_READ */) != 0)
    GTEST_SKIP() << "no MADV_POPULATE_READ on this kernel (before 5.14)";
  const std::string path = testing::TempDir() + "/prefault_read.bin";
  std::vector<uint8_t> bytes(size_t{16} << 20);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7 + (i >> 12));
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  const int fd = open(path.c_str(), O_RDONLY);
  ASSERT_GE(fd, 0);
  {
    auto block = HostBlock::file_private(fd, bytes.size(), path);
    EXPECT_EQ(test::smaps_bytes_at(block->data(), "Rss"),
              0u);  // a fresh mapping: nothing mapped yet
    block->map_in_background({{block->data(), bytes.size()}});
    block->wait_mapped();
    EXPECT_EQ(test::smaps_bytes_at(block->data(), "Rss"),
              bytes.size());                                          // every page, from the cache
    EXPECT_EQ(test::smaps_bytes_at(block->data(), "Anonymous"), 0u);  // none of them copied
    EXPECT_EQ(std::memcmp(block->data(), bytes.data(), bytes.size()), 0);
    block->data()[5] = 0xEE;  // still a private mapping: the write stays here
    EXPECT_EQ(test::smaps_bytes_at(block->data(), "Anonymous"), 4096u);
  }
  std::ifstream in(path, std::ios::binary);
  std::string first(8, '\0');
  in.read(first.data(), 8);
  EXPECT_EQ(static_cast<uint8_t>(first[5]), bytes[5]);
  {
    // Dropped while its thread maps: the block stops and joins it before unmapping.
    auto block = HostBlock::file_private(fd, bytes.size(), path);
    block->map_in_background({{block->data(), bytes.size()}});
  }
  close(fd);
  std::remove(path.c_str());
}

TEST(MapAheadOfWrite, MapsAFreshRangeAndLeavesOthersAlone) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  Fresh f;
  ASSERT_NE(f.data, MAP_FAILED);
  map_ahead_of_write(f.data + 100, kBytes - 200);  // the whole pages inside: all but two
  if (f.resident_pages() == 0) GTEST_SKIP() << "no MADV_POPULATE_WRITE on this kernel";
  EXPECT_EQ(f.resident_pages(), kBytes / page - 2);
  for (size_t i = 0; i < kBytes; i += page / 2) ASSERT_EQ(f.data[i], 0) << i;

  Fresh started;  // its first page written already: someone is filling it, leave it be
  started.data[0] = 7;
  map_ahead_of_write(started.data, kBytes);
  EXPECT_EQ(started.resident_pages(), 1u);
  EXPECT_EQ(started.data[0], 7);

  Fresh small;
  map_ahead_of_write(small.data, 32 << 10);  // under 64 KiB: a few faults cost less than a call
  EXPECT_EQ(small.resident_pages(), 0u);

  void* gone = mmap(nullptr, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(gone, MAP_FAILED);
  munmap(gone, 1 << 20);
  map_ahead_of_write(gone, 1 << 20);  // not mapped (as device memory would be): nothing happens
}

}  // namespace
}  // namespace tensorizer::engine
