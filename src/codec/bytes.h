// Little-endian byte cursor and appender used by the codec. Pure: no I/O.
//
// ByteCursor checks every read against the bytes it was given and throws a kFormat Error that
// names what was being read ("what") and the absolute position, so a truncated or hostile input
// can never read out of bounds.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "tensorizer/error.h"

namespace tensorizer::codec {

class ByteCursor {
 public:
  // `base` is the absolute file offset of data[0]; used only for messages.
  ByteCursor(const uint8_t* data, size_t size, uint64_t base = 0)
      : data_(data), size_(size), base_(base) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  const uint8_t* here() const { return data_ + pos_; }
  void seek(size_t pos) {
    if (pos > size_) truncated("seek", pos - pos_);
    pos_ = pos;
  }

  template <typename T>
  T read(const char* what) {
    T v;
    need(sizeof(T), what);
    std::memcpy(&v, data_ + pos_, sizeof(T));  // little-endian host assumed (checked at build)
    pos_ += sizeof(T);
    return v;
  }
  std::string_view bytes(size_t n, const char* what) {
    need(n, what);
    std::string_view v(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return v;
  }
  void skip(size_t n, const char* what) {
    need(n, what);
    pos_ += n;
  }

 private:
  void need(size_t n, const char* what) const {
    if (n > size_ - pos_) truncated(what, n);
  }
  [[noreturn]] void truncated(const char* what, size_t n) const;

  const uint8_t* data_;
  size_t size_;
  uint64_t base_;
  size_t pos_ = 0;
};

// Appends little-endian values to a std::string used as a byte buffer.
class ByteAppender {
 public:
  explicit ByteAppender(std::string& out) : out_(out) {}
  template <typename T>
  void put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out_.append(b, sizeof(T));
  }
  void bytes(std::string_view s) { out_.append(s); }
  void zeros(size_t n) { out_.append(n, '\0'); }
  size_t size() const { return out_.size(); }

 private:
  std::string& out_;
};

// Writes a little-endian value into an existing buffer at `pos`.
template <typename T>
inline void store_le(void* dst, T v) {
  std::memcpy(dst, &v, sizeof(T));
}
template <typename T>
inline T load_le(const void* src) {
  T v;
  std::memcpy(&v, src, sizeof(T));
  return v;
}

}  // namespace tensorizer::codec
