// In-memory source: serves reads from a shared byte string (tests, Python file-like objects).
#include <algorithm>
#include <atomic>
#include <cstring>

#include "tensorizer/error.h"
#include "tensorizer/transport.h"

namespace tensorizer {
namespace {

class MemorySource final : public Source {
 public:
  MemorySource(std::shared_ptr<const std::string> bytes, std::string name,
               std::shared_ptr<std::atomic<uint64_t>> counter)
      : bytes_(std::move(bytes)), name_(std::move(name)), read_(std::move(counter)) {}

  uint64_t size() override { return bytes_->size(); }

  void read_scatter(uint64_t offset, const IoSlice* slices, size_t count) override {
    uint64_t total = 0;
    for (size_t i = 0; i < count; ++i) total += slices[i].size;
    if (offset > bytes_->size() || total > bytes_->size() - offset)
      fail(ErrorCode::kFormat, "read of " + std::to_string(total) + " bytes at offset " +
                                   std::to_string(offset) + " runs past the end of " + name_ +
                                   " (" + std::to_string(bytes_->size()) + " bytes)");
    const char* p = bytes_->data() + offset;
    for (size_t i = 0; i < count; ++i) {
      if (slices[i].size) std::memcpy(slices[i].data, p, slices[i].size);
      p += slices[i].size;
    }
    *read_ += total;
  }

  std::unique_ptr<Source> clone() override {
    return std::make_unique<MemorySource>(bytes_, name_, read_);
  }
  const std::string& uri() const override { return name_; }
  uint64_t bytes_read() const override { return read_->load(); }

 private:
  std::shared_ptr<const std::string> bytes_;
  std::string name_;
  std::shared_ptr<std::atomic<uint64_t>> read_;
};

}  // namespace

std::unique_ptr<Source> make_memory_source(std::shared_ptr<const std::string> bytes,
                                           std::string name) {
  return std::make_unique<MemorySource>(std::move(bytes), std::move(name),
                                        std::make_shared<std::atomic<uint64_t>>(0));
}

}  // namespace tensorizer
