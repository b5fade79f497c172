// The avx512 and avx512bf16 paths of cpu/gemm.h: 12 x 32 fp32 register tiles (24 of the 32
// vector registers), updated with FMA, or with the BF16 dot-product instruction on k pairs.
#include <cstdint>

#include "cpu/gemm_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

namespace neuron::cpu::detail {
namespace {

constexpr int kMr = 12, kNr = 32;

#pragma GCC push_options
#pragma GCC target("avx512f")

void store_tile(__m512 (&acc)[kMr][2], float* c, int64_t ldc, bool add) {
#pragma GCC unroll 12
  for (int i = 0; i < kMr; ++i) {
    float* ci = c + i * ldc;
    if (add) {
      acc[i][0] = _mm512_add_ps(_mm512_loadu_ps(ci), acc[i][0]);
      acc[i][1] = _mm512_add_ps(_mm512_loadu_ps(ci + 16), acc[i][1]);
    }
    _mm512_storeu_ps(ci, acc[i][0]);
    _mm512_storeu_ps(ci + 16, acc[i][1]);
  }
}

void tile_avx512(int64_t depth, const void* ap, const void* bp, float* c, int64_t ldc, bool add) {
  const float* a = static_cast<const float*>(ap);
  const float* b = static_cast<const float*>(bp);
  __m512 acc[kMr][2];
#pragma GCC unroll 12
  for (int i = 0; i < kMr; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t d = 0; d < depth; ++d, a += kMr, b += kNr) {
    const __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
    _mm_prefetch(reinterpret_cast<const char*>(b + 8 * kNr), _MM_HINT_T0);
#pragma GCC unroll 12
    for (int i = 0; i < kMr; ++i) {
      const __m512 x = _mm512_set1_ps(a[i]);
      acc[i][0] = _mm512_fmadd_ps(x, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(x, b1, acc[i][1]);
    }
  }
  store_tile(acc, c, ldc, add);
}

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512bf16")

// One pair word per depth step: acc += a_odd * b_odd + a_even * b_even (vdpbf16ps).
void tile_avx512bf16(int64_t depth, const void* ap, const void* bp, float* c, int64_t ldc, bool add) {
  const uint32_t* a = static_cast<const uint32_t*>(ap);
  const uint32_t* b = static_cast<const uint32_t*>(bp);
  __m512 acc[kMr][2];
#pragma GCC unroll 12
  for (int i = 0; i < kMr; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t d = 0; d < depth; ++d, a += kMr, b += kNr) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 16);
    _mm_prefetch(reinterpret_cast<const char*>(b + 8 * kNr), _MM_HINT_T0);
#pragma GCC unroll 12
    for (int i = 0; i < kMr; ++i) {
      const __m512bh x = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[i]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], x, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], x, b1);
    }
  }
  store_tile(acc, c, ldc, add);
}

#pragma GCC pop_options

}  // namespace

// KC 192 words (a 24 KiB B micro-panel in L1), MC 144 rows, NC 256 columns.
MicroKernel avx512_kernel() { return {kMr, kNr, Panel::kFloat32, 192, 12, 8, &tile_avx512}; }
MicroKernel avx512bf16_kernel() { return {kMr, kNr, Panel::kBf16Pairs, 192, 12, 8, &tile_avx512bf16}; }

}  // namespace neuron::cpu::detail
#endif
