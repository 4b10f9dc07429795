// copy_streaming: memcpy with non-temporal stores (see stream_copy.h).
#include "common/stream_copy.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace tensorizer {

void copy_streaming(void* dst, const void* src, size_t n) {
#if defined(__x86_64__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // Up to the destination's first line boundary with memcpy; whole lines streamed (SSE2, part of
  // x86-64 itself, moves them as fast as wider stores here); the last partial line with memcpy.
  const size_t head = std::min(n, (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63);
  std::memcpy(d, s, head);
  d += head, s += head, n -= head;
  for (size_t lines = n / 64; lines > 0; --lines, d += 64, s += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + 48), e);
  }
  // Streaming stores are weakly ordered: fenced before anyone is told the bytes landed.
  _mm_sfence();
  std::memcpy(d, s, n % 64);
#else
  std::memcpy(dst, src, n);
#endif
}

}  // namespace tensorizer
