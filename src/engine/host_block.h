// Blocks of host memory that loaded tensors live in, and per-tensor owners of views into them
// (internal header).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace tensorizer::engine {

// One mapping, unmapped on destruction: anonymous memory (2 MiB-aligned; advised for huge pages
// when asked: direct reads then pin 2 MiB per page, but on a VM that backs guest memory lazily a
// fresh huge page costs a host fault per 4 KiB on first touch, which made copies from the page
// cache 2x slower in a fresh process: 0.30-0.41 s against 0.16-0.21 s for 0.8 GB), or a whole local
// file mapped copy-on-write (writes stay private; the kernel maps the page cache's large folios
// with 2 MiB entries, so pre-faulting a cached file costs almost nothing).
class HostBlock {
 public:
  static std::shared_ptr<HostBlock> anonymous(size_t size, bool huge_pages);
  static std::shared_ptr<HostBlock> file_private(int fd, size_t size, const std::string& what);
  ~HostBlock();
  HostBlock(const HostBlock&) = delete;
  HostBlock& operator=(const HostBlock&) = delete;
  uint8_t* data() const { return data_; }

 private:
  HostBlock(uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t* data_;
  size_t size_;
};

// An owner for [data, data+size) inside `block`: when it goes, the 2 MiB pages wholly inside the
// range are given back to the kernel at once, and `block` is unmapped with its last view.
std::shared_ptr<void> block_view(std::shared_ptr<HostBlock> block, uint8_t* data, size_t size);

}  // namespace tensorizer::engine
