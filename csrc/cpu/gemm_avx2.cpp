// The avx2 path of cpu/gemm.h: a 6 x 16 fp32 register tile (12 accumulators) updated with FMA.
#include <cstdint>

#include "cpu/gemm_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

namespace neuron::cpu::detail {
namespace {

constexpr int kMr = 6, kNr = 16;

#pragma GCC push_options
#pragma GCC target("avx2,fma")

void tile_avx2(int64_t depth, const void* ap, const void* bp, float* c, int64_t ldc, bool add) {
  const float* a = static_cast<const float*>(ap);
  const float* b = static_cast<const float*>(bp);
  __m256 acc[kMr][2];
#pragma GCC unroll 6
  for (int i = 0; i < kMr; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < depth; ++d, a += kMr, b += kNr) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
    _mm_prefetch(reinterpret_cast<const char*>(b + 8 * kNr), _MM_HINT_T0);
#pragma GCC unroll 6
    for (int i = 0; i < kMr; ++i) {
      const __m256 x = _mm256_broadcast_ss(a + i);
      acc[i][0] = _mm256_fmadd_ps(x, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(x, b1, acc[i][1]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < kMr; ++i) {
    float* ci = c + i * ldc;
    if (add) {
      acc[i][0] = _mm256_add_ps(_mm256_loadu_ps(ci), acc[i][0]);
      acc[i][1] = _mm256_add_ps(_mm256_loadu_ps(ci + 8), acc[i][1]);
    }
    _mm256_storeu_ps(ci, acc[i][0]);
    _mm256_storeu_ps(ci + 8, acc[i][1]);
  }
}

#pragma GCC pop_options

}  // namespace

// KC 256 (a 16 KiB B micro-panel in L1), MC 144 (a 144 KiB A block in L2), NC 256.
MicroKernel avx2_kernel() { return {kMr, kNr, Panel::kFloat32, 256, 24, 16, &tile_avx2}; }

}  // namespace neuron::cpu::detail
#endif
