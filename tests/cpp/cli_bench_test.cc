// `tensorizer bench`: a small run writes a transformer-shaped file whose hashes verify, prints
// every row, removes its temp file (or keeps it with --keep) and refuses bad options with status 2
// before writing anything.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <regex>

#include "tensorizer/reader.h"
#include "test_util.h"

namespace tensorizer {
namespace {

namespace fs = std::filesystem;

// Runs `tensorizer bench ARGS` with TMPDIR=tmp; returns the status, stdout and stderr in `out`.
int bench(const std::string& tmp, const std::string& args, std::string* out) {
  return test::run_cli("bench " + args, out, "TMPDIR=" + test::shell_quote(tmp) + " ");
}

size_t files_in(const std::string& dir) {
  return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator()));
}

class CliBench : public ::testing::Test {
 protected:
  void SetUp() override {
    if (test::cli_path().empty()) GTEST_SKIP() << "CLI not built";
  }
  test::TempDir dir_;
  std::string tmp() const { return dir_.path("tmp"); }
};

TEST_F(CliBench, SmallRunWritesAVerifiableModelAndPrintsEveryRow) {
  const std::string file = dir_.path("model.tensors");
  std::string out;
  ASSERT_EQ(bench(dir_.path(""), "--size-mb 2 --repeat 1 --file " + test::shell_quote(file), &out),
            0)
      << out;
  for (const char* row :
       {"raw read() of the file", "load, 1 worker", "load, 2 workers",
        "load + verify CRC32/SHA-256", "read() into fresh memory",
        "load into fresh memory, 4 KiB pages", "load into fresh memory, huge pages",
        "write (hash + write)", "median of 1 runs after a warm-up; all bytes checked"})
    EXPECT_NE(out.find(row), std::string::npos) << row << " missing from:\n" << out;

  std::smatch m;
  ASSERT_TRUE(std::regex_search(out, m, std::regex(R"(bench: (\d+) fp16 tensors)"))) << out;
  auto reader = Reader::open(file);
  const auto& entries = reader->entries();
  ASSERT_EQ(entries.size(), std::stoul(m[1]));
  // 2 MiB: the embedding shrinks to a quarter of it at most (4000 x 64), not 32000 x 2048.
  EXPECT_EQ(entries[0].name, "embed.weight");
  EXPECT_EQ(entries[0].shape, (std::vector<uint64_t>{4000, 64}));
  uint64_t bytes = 0;
  for (const auto& e : entries) {
    EXPECT_EQ(e.dtype, "<f2") << e.name;
    bytes += e.data_length;
  }
  EXPECT_GE(bytes, 2u << 20);
  EXPECT_LT(bytes, 3u << 20);

  std::string verified;
  EXPECT_EQ(test::run_cli("verify " + test::shell_quote(file), &verified), 0) << verified;
}

TEST_F(CliBench, TempFileIsRemovedUnlessKept) {
  fs::create_directories(tmp());
  std::string out;
  ASSERT_EQ(bench(tmp(), "--size-mb 1 --repeat 1", &out), 0) << out;
  EXPECT_EQ(files_in(tmp()), 0u) << out;

  ASSERT_EQ(bench(tmp(), "--size-mb 1 --repeat 1 --keep", &out), 0) << out;
  ASSERT_EQ(files_in(tmp()), 1u) << out;
  const std::string kept = fs::directory_iterator(tmp())->path().string();
  EXPECT_NE(out.find(kept), std::string::npos) << "the kept file is named: " << out;
  EXPECT_GT(Reader::open(kept)->entries().size(), 1u);
}

TEST_F(CliBench, BadOptionsFailWithStatus2AndWriteNothing) {
  fs::create_directories(tmp());
  const std::pair<const char*, const char*> cases[] = {{"--size-mb 1 --repeat 0", "--repeat"},
                                                       {"--size-mb 0", "--size-mb"},
                                                       {"--size-mb 1 --workers 0", "--workers"},
                                                       {"--size-mb 1 --repeat x", "--repeat"}};
  for (const auto& [args, option] : cases) {
    std::string out;
    EXPECT_EQ(bench(tmp(), args, &out), 2) << args << ":\n" << out;
    EXPECT_NE(out.find(option), std::string::npos) << args << ": names " << option << ":\n" << out;
    EXPECT_EQ(files_in(tmp()), 0u) << args;
  }
}

}  // namespace
}  // namespace tensorizer
