// A private temporary file that sinks stage an object in before uploading it (internal header).
//
// Created in the system temp dir ($TMPDIR, else /tmp) and unlinked at once, so nothing is left
// behind whatever happens; the open descriptor is the only way to it. Writes at offsets may come
// from several threads at once (pwrite).
#pragma once

#include <cstdint>
#include <string>

#include "tensorizer/transport.h"

namespace tensorizer {

class StagingFile {
 public:
  explicit StagingFile(const std::string& tag);
  ~StagingFile() { remove(); }
  StagingFile(const StagingFile&) = delete;
  StagingFile& operator=(const StagingFile&) = delete;

  // `what` names the final destination in error messages.
  void write_gather(uint64_t offset, const IoSlice* slices, size_t count, const std::string& what);
  void reserve(uint64_t size);
  uint64_t size() const;  // the end of the furthest write
  int fd() const { return fd_; }
  // Reads [offset, offset+size) back (exactly, or throws).
  void read_at(uint64_t offset, void* dst, size_t size) const;
  void remove();

 private:
  int fd_ = -1;
};

}  // namespace tensorizer
