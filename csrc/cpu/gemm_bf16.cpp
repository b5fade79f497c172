#include "cpu/gemm_bf16.h"

#include <algorithm>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace neuron::cpu {

bool has_avx512_bf16() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512bf16");
  return yes;
#else
  return false;
#endif
}

#if defined(__x86_64__) && defined(__GNUC__)
namespace {

// One register tile over the whole K: the B panel (32 columns) is two vectors per k pair and
// each A element a broadcast operand, 24 independent accumulators hide the dot-product latency.
__attribute__((target("avx512f,avx512bw,avx512bf16"))) void tile_kernel(const uint32_t* ap, const uint32_t* bp,
                                                                       int64_t K2, float* tile) {
  __m512 acc[kTileRows][2];
  for (int i = 0; i < kTileRows; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < K2; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * kTileCols);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + p * kTileCols + 16);
    _mm_prefetch(reinterpret_cast<const char*>(bp + (p + 8) * kTileCols), _MM_HINT_T0);
#pragma GCC unroll 12
    for (int i = 0; i < kTileRows; ++i) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(ap[p * kTileRows + i]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], a, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], a, b1);
    }
  }
  for (int i = 0; i < kTileRows; ++i) {
    _mm512_storeu_ps(tile + i * kTileCols, acc[i][0]);
    _mm512_storeu_ps(tile + i * kTileCols + 16, acc[i][1]);
  }
}

}  // namespace
#endif

void gemm_bf16_tiles(const uint32_t* packed_a, const uint32_t* packed_b, int64_t M, int64_t N, int64_t K,
                     int64_t rp_begin, int64_t rp_end, int64_t cp_begin, int64_t cp_end, const TileFn& fn) {
#if defined(__x86_64__) && defined(__GNUC__)
  const int64_t K2 = k_pairs(K);
  alignas(64) float tile[kTileRows * kTileCols];
  // Column panel outer: its B panel stays in cache while the row panels stream past it.
  for (int64_t q = cp_begin; q < cp_end; ++q) {
    const uint32_t* bp = packed_b + q * kTileCols * K2;
    const int64_t n0 = q * kTileCols, cols = std::min(kTileCols, N - n0);
    for (int64_t p = rp_begin; p < rp_end; ++p) {
      tile_kernel(packed_a + p * kTileRows * K2, bp, K2, tile);
      const int64_t m0 = p * kTileRows;
      fn(m0, n0, std::min(kTileRows, M - m0), cols, tile);
    }
  }
#else
  (void)packed_a, (void)packed_b, (void)M, (void)N, (void)K, (void)rp_begin, (void)rp_end, (void)cp_begin,
      (void)cp_end, (void)fn;
#endif
}

}  // namespace neuron::cpu
