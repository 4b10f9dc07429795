// A file written in private beside its destination and published there whole (internal header).
//
// On Linux file systems that have it, the file is an unnamed O_TMPFILE inode: a writer that dies
// (SIGKILL, power loss) leaves nothing at all, and publishing links it under a temporary name and
// renames that over the destination. Elsewhere it is a hidden named file, ".NAME.tmp-N", held
// under an exclusive flock(2) for as long as its writer lives; creating a TempFile first removes
// every such file in the directory whose lock nobody holds, i.e. those of dead writers. Either
// way the destination is always the old file or the new one, whole. Not thread-safe.
#pragma once

#include <string>

namespace tensorizer {

class TempFile {
 public:
  // Creates the private file for `destination` (creating its directory). `unnamed`: try O_TMPFILE
  // first. Throws kIO (kNotFound when the directory cannot be made) naming the destination.
  TempFile(const std::string& destination, bool unnamed);
  ~TempFile() { discard(); }
  TempFile(const TempFile&) = delete;
  TempFile& operator=(const TempFile&) = delete;

  int fd() const { return fd_; }
  bool unnamed() const { return unnamed_; }
  // Moves the file into place (fsyncing it, then its directory, when `sync`). Throws on failure,
  // leaving the destination as it was.
  void publish(bool sync);
  // Drops the file unpublished. Idempotent.
  void discard();

 private:
  std::string destination_, dir_, temp_;  // temp_: the current name, when it has one
  int fd_ = -1;
  bool unnamed_ = false;
};

// Removes the ".NAME.tmp-N" files in `dir` that no live writer holds. Returns how many went.
int remove_stale_temp_files(const std::string& dir);

}  // namespace tensorizer
