// Local files beyond the regular case (src/transport/file.cc). Writes land through symbolic links
// on the file they name (the links stay), in place on a device (its node stays a device: /dev/null
// must never become a regular file), and not at all on a directory, FIFO or socket, refused before
// anything is written and without waiting for a FIFO's reader. Device nodes are made in a temp dir
// (mknod needs root; skipped without it), so a regression replaces those, never the system's.
// Reads of a FIFO (a shell pipe as /dev/stdin) take the stream to its end and load from it, up to
// a bound (FileOptions::max_pipe_bytes): an endless pipe is an error, not all of memory.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "tensorizer/error.h"
#include "tensorizer/reader.h"
#include "tensorizer/transport.h"
#include "test_util.h"

namespace tensorizer {
namespace {

namespace fs = std::filesystem;

void write_through_sink(const std::string& uri, const std::string& bytes) {
  auto sink = open_sink(uri);
  sink->write_at(0, bytes.data(), bytes.size());
  sink->commit();
}

void expect_refused(const std::string& uri, const std::string& expected) {
  try {
    open_sink(uri);
    ADD_FAILURE() << "opened " << uri;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
  }
}

TEST(FileTransportTest, ASymbolicLinkIsFollowedAndStays) {
  test::TempDir dir;
  fs::create_directory(dir.path("blobs"));
  std::ofstream(dir.path("blobs/abc")) << "old";
  fs::create_symlink("blobs/abc", dir.path("model.tensors"));  // relative, from the link's dir
  fs::create_symlink("model.tensors", dir.path("alias"));      // a chain of two
  write_through_sink(dir.path("alias"), "new bytes");
  EXPECT_TRUE(fs::is_symlink(dir.path("alias")));
  EXPECT_TRUE(fs::is_symlink(dir.path("model.tensors")));
  EXPECT_EQ(test::read_file(dir.path("blobs/abc")), "new bytes");
  EXPECT_EQ(test::dir_names(dir.path(".")),
            (std::vector<std::string>{"alias", "blobs", "model.tensors"}));
  EXPECT_EQ(test::dir_names(dir.path("blobs")), std::vector<std::string>{"abc"});

  // A link to a file not made yet: the file is made where the link points.
  fs::create_symlink("blobs/later", dir.path("dangling"));
  write_through_sink(dir.path("dangling"), "made");
  EXPECT_TRUE(fs::is_symlink(dir.path("dangling")));
  EXPECT_EQ(test::read_file(dir.path("blobs/later")), "made");

  // A loop fails with a clear error, not a hang.
  fs::create_symlink("loop_b", dir.path("loop_a"));
  fs::create_symlink("loop_a", dir.path("loop_b"));
  try {
    open_sink(dir.path("loop_a"));
    ADD_FAILURE() << "opened a symlink loop";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("symbolic links"), std::string::npos) << e.what();
  }
}

TEST(FileTransportTest, ADeviceIsWrittenInPlaceAndStaysADevice) {
  test::TempDir dir;
  const std::string null_dev = dir.path("null"), full_dev = dir.path("full");
  if (::mknod(null_dev.c_str(), S_IFCHR | 0666, makedev(1, 3)) != 0 ||
      ::mknod(full_dev.c_str(), S_IFCHR | 0666, makedev(1, 7)) != 0)
    GTEST_SKIP() << "mknod: " << std::strerror(errno);
  fs::create_symlink("null", dir.path("via_link"));
  for (const std::string& uri : {null_dev, dir.path("via_link")}) {
    write_through_sink(uri, std::string(1 << 20, 'x'));
    EXPECT_TRUE(fs::is_character_file(null_dev)) << uri;
  }
  // /dev/full refuses every write: the error names the path, and the node is still the device.
  auto sink = open_sink(full_dev);
  try {
    sink->write_at(0, "bytes", 5);
    ADD_FAILURE() << "wrote to /dev/full";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kIO);
    EXPECT_NE(std::string(e.what()).find(full_dev), std::string::npos) << e.what();
  }
  sink->abort();
  EXPECT_TRUE(fs::is_character_file(full_dev));
  EXPECT_EQ(test::dir_names(dir.path(".")), (std::vector<std::string>{"full", "null", "via_link"}));
}

TEST(FileTransportTest, DirectoriesFifosAndSocketsAreRefusedBeforeAnyWrite) {
  test::TempDir dir;
  fs::create_directory(dir.path("a_dir"));
  expect_refused(dir.path("a_dir"), "is a directory");
  ASSERT_EQ(::mkfifo(dir.path("fifo").c_str(), 0644), 0);
  expect_refused(dir.path("fifo"), "FIFO or socket");  // no reader: opening it would wait
  const int s = ::socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  const std::string sock = dir.path("sock");
  ASSERT_LT(sock.size(), sizeof addr.sun_path);
  std::memcpy(addr.sun_path, sock.c_str(), sock.size());
  ASSERT_EQ(::bind(s, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  expect_refused(sock, "FIFO or socket");
  ::close(s);
  EXPECT_TRUE(fs::is_directory(dir.path("a_dir")) && fs::is_fifo(dir.path("fifo")) &&
              fs::is_socket(sock));
  EXPECT_EQ(test::dir_names(dir.path(".")), (std::vector<std::string>{"a_dir", "fifo", "sock"}));
}

TEST(FileTransportTest, AFifoIsReadToItsEndAndLoads) {
  test::TempDir dir;
  const std::string fifo = dir.path("pipe.tensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const std::string name = test::unencrypted_fixtures().front();
  const std::string bytes = test::read_file(test::fixture_path(name));
  std::thread writer([&] {  // as `cat model.tensors > pipe.tensors` would
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    for (size_t off = 0; off < bytes.size();) {
      const ssize_t n = ::write(fd, bytes.data() + off, std::min<size_t>(bytes.size() - off, 4096));
      ASSERT_GT(n, 0);
      off += static_cast<size_t>(n);
    }
    ::close(fd);
  });
  auto piped = Reader::open(fifo);
  writer.join();
  EXPECT_EQ(piped->source().size(), bytes.size());
  EXPECT_EQ(piped->uri(), fifo);
  auto file = Reader::open(test::fixture_path(name));
  LoadOptions verify;
  verify.verify_hash = true;
  EXPECT_EQ(test::load_entries(*piped, verify), test::load_entries(*file, verify));
}

TEST(FileTransportTest, APipeLongerThanTheBoundIsAnErrorNamingIt) {
  test::TempDir dir;
  const std::string fifo = dir.path("endless");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  const auto previous = ::signal(SIGPIPE, SIG_IGN);  // the writer outlives its reader
  std::thread writer([&] {  // as `yes > endless` would: more than any bound
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_CLOEXEC);
    const std::string chunk(64 << 10, 'y');
    while (fd >= 0 && ::write(fd, chunk.data(), chunk.size()) > 0) {
    }
    if (fd >= 0) ::close(fd);
  });
  TransportOptions options;
  options.file.max_pipe_bytes = 3 << 20;
  try {
    open_source(fifo, options);
    ADD_FAILURE() << "read an endless pipe";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("more than 3145728 bytes"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("TENSORIZER_PIPE_MAX_GIB"), std::string::npos) << e.what();
  }
  writer.join();  // its write failed (EPIPE) once the source was gone
  ::signal(SIGPIPE, previous);
}

}  // namespace
}  // namespace tensorizer
