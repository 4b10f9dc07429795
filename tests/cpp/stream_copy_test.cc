// copy_streaming against memcpy: every destination and source alignment within a cache line, and
// sizes around the line size, exact bytes and nothing written outside the destination.
#include "common/stream_copy.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

namespace tensorizer {
namespace {

TEST(StreamCopy, CopiesExactlyTheBytesAtEveryAlignmentAndSize) {
  std::string src(4096 + 128, '\0');
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<char>(i * 131 + 7);
  for (size_t size : {0, 1, 2, 15, 63, 64, 65, 127, 128, 129, 1000, 4096}) {
    for (size_t to = 0; to < 64; to += 7) {
      for (size_t from = 0; from < 64; from += 13) {
        alignas(64) char dst[4096 + 256];
        std::memset(dst, 'z', sizeof dst);
        copy_streaming(dst + 64 + to, src.data() + from, size);
        ASSERT_EQ(std::string(dst + 64 + to, size), src.substr(from, size))
            << size << " " << to << " " << from;
        ASSERT_EQ(std::string(dst, 64 + to), std::string(64 + to, 'z'));  // nothing before
        const size_t end = 64 + to + size;
        ASSERT_EQ(std::string(dst + end, sizeof dst - end), std::string(sizeof dst - end, 'z'));
      }
    }
  }
}

}  // namespace
}  // namespace tensorizer
