// Crash-safe local writes (transport/temp_file.h): the destination is the old file until publish
// and the new one after; an unnamed file shows nothing in the directory; a writer killed with
// SIGKILL leaves nothing (unnamed) or a temp file the next write removes (named); live writers'
// files and files that only look similar are left alone.
#include "transport/temp_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace tensorizer {
namespace {

namespace fs = std::filesystem;

void put(int fd, const std::string& bytes) {
  ASSERT_EQ(::pwrite(fd, bytes.data(), bytes.size(), 0), static_cast<ssize_t>(bytes.size()));
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

class TempFileTest : public ::testing::TestWithParam<bool> {};

TEST_P(TempFileTest, TheDestinationIsTheOldFileUntilPublishedAndTheNewOneAfter) {
  test::TempDir dir;
  const std::string dest = dir.path("model.tensors");
  write_file(dest, "old");
  {
    TempFile f(dest, GetParam());
    put(f.fd(), "new bytes");
    EXPECT_EQ(test::read_file(dest), "old");
    const auto names = test::dir_names(dir.path("."));
    if (f.unnamed()) {
      EXPECT_EQ(names, std::vector<std::string>{"model.tensors"});
    } else {
      ASSERT_EQ(names.size(), 2u);
      EXPECT_EQ(names[0].rfind(".model.tensors.tmp-", 0), 0u) << names[0];
    }
    f.publish(/*sync=*/true);
    EXPECT_THROW(f.publish(false), Error);
  }
  EXPECT_EQ(test::read_file(dest), "new bytes");
  EXPECT_EQ(test::dir_names(dir.path(".")), std::vector<std::string>{"model.tensors"});

  {
    TempFile f(dest, GetParam());
    put(f.fd(), "discarded");
  }  // dropped unpublished
  EXPECT_EQ(test::read_file(dest), "new bytes");
  EXPECT_EQ(test::dir_names(dir.path(".")), std::vector<std::string>{"model.tensors"});
}

TEST_P(TempFileTest, AKilledWriterLeavesNothingOnceTheNextWriteRan) {
  test::TempDir dir;
  const std::string dest = dir.path("sub/model.tensors");
  write_file(dir.path("keep.txt"), "x");
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    TempFile f(dest, GetParam());
    (void)::pwrite(f.fd(), "partial", 7, 0);
    ::kill(::getpid(), SIGKILL);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFSIGNALED(status));
  EXPECT_FALSE(fs::exists(dest));
  const size_t left = test::dir_names(dir.path("sub")).size();
  EXPECT_LE(left, 1u);  // nothing (unnamed) or the dead writer's hidden file

  TempFile next(dest, GetParam());
  put(next.fd(), "whole");
  next.publish(false);
  EXPECT_EQ(test::dir_names(dir.path("sub")), std::vector<std::string>{"model.tensors"});
  EXPECT_EQ(test::read_file(dest), "whole");
}

INSTANTIATE_TEST_SUITE_P(Unnamed, TempFileTest, ::testing::Values(true, false),
                         [](const auto& info) { return info.param ? "Unnamed" : "Named"; });

TEST(TempFileSweep, RemovesOnlyUnlockedTempFilesOfTheRightShape) {
  test::TempDir dir;
  const std::string d = dir.path(".");
  for (const char* name :
       {".a.tensors.tmp-1", ".b.tmp-123456789", ".c.tmp-x1", "d.tmp-5", ".e.tmp-", "f.tensors"})
    write_file(d + "/" + name, "x");
  fs::create_directory(d + "/.g.tmp-7");
  fs::create_symlink(d + "/f.tensors", d + "/.h.tmp-8");
  TempFile live(d + "/live.tensors", /*unnamed=*/false);  // sweeps the two dead ones first
  std::vector<std::string> names = test::dir_names(d);
  ASSERT_EQ(names.size(), 7u);
  EXPECT_EQ(names[4].rfind(".live.tensors.tmp-", 0), 0u) << names[4];
  names[4] = "(live)";
  EXPECT_EQ(names, (std::vector<std::string>{".c.tmp-x1", ".e.tmp-", ".g.tmp-7", ".h.tmp-8",
                                             "(live)", "d.tmp-5", "f.tensors"}));
  EXPECT_EQ(remove_stale_temp_files(d), 0);  // the live writer holds its lock
  live.discard();
  write_file(d + "/.i.tmp-9", "x");
  EXPECT_EQ(remove_stale_temp_files(d), 1);
  EXPECT_EQ(remove_stale_temp_files(dir.path("missing")), 0);
}

}  // namespace
}  // namespace tensorizer
