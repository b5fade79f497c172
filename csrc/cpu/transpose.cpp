#include "cpu/transpose.h"

#include <algorithm>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace neuron::cpu {
namespace {

constexpr int64_t kB = 8;

// One block of up to 8 x 8, element by element. 8: rows on both sides are often 4 KiB multiples
// apart (the same L1 set), so a block uses at most 8 lines per side.
void block_scalar(const uint32_t* src, int64_t lds, uint32_t* dst, int64_t ldd, int64_t na, int64_t nb) {
  for (int64_t a = 0; a < na; ++a) {
    for (int64_t b = 0; b < nb; ++b) dst[a * ldd + b] = src[b * lds + a];
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx2")

// A full 8 x 8 block through registers: rows of src (8 a's at one b) in, rows of dst (8 b's at one
// a) out. Float shuffles move the 32-bit patterns without arithmetic.
void block_avx2(const uint32_t* src, int64_t lds, uint32_t* dst, int64_t ldd) {
  __m256 r[8], t[8];
  for (int k = 0; k < 8; ++k) r[k] = _mm256_loadu_ps(reinterpret_cast<const float*>(src + k * lds));
  for (int k = 0; k < 8; k += 2) {
    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
  }
  for (int k = 0; k < 8; k += 4) {
    r[k] = _mm256_shuffle_ps(t[k], t[k + 2], 0x44);
    r[k + 1] = _mm256_shuffle_ps(t[k], t[k + 2], 0xEE);
    r[k + 2] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0x44);
    r[k + 3] = _mm256_shuffle_ps(t[k + 1], t[k + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    t[k] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x20);
    t[k + 4] = _mm256_permute2f128_ps(r[k], r[k + 4], 0x31);
  }
  for (int k = 0; k < 8; ++k) _mm256_storeu_ps(reinterpret_cast<float*>(dst + k * ldd), t[k]);
}

#pragma GCC pop_options
#endif

}  // namespace

void transpose32(const uint32_t* src, int64_t lds, uint32_t* dst, int64_t ldd, int64_t na, int64_t nb,
                 GemmPath path) {
#if defined(__x86_64__) && defined(__GNUC__)
  const bool avx2 = path != GemmPath::kScalar;
#else
  (void)path;
#endif
  for (int64_t a0 = 0; a0 < na; a0 += kB) {
    const int64_t ma = std::min(kB, na - a0);
    for (int64_t b0 = 0; b0 < nb; b0 += kB) {
      const int64_t mb = std::min(kB, nb - b0);
      const uint32_t* s = src + b0 * lds + a0;
      uint32_t* d = dst + a0 * ldd + b0;
#if defined(__x86_64__) && defined(__GNUC__)
      if (avx2 && ma == kB && mb == kB) {
        block_avx2(s, lds, d, ldd);
        continue;
      }
#endif
      block_scalar(s, lds, d, ldd, ma, mb);
    }
  }
}

}  // namespace neuron::cpu
