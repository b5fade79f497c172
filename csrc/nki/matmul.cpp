// The NKI executor's matmul kernels: fp32 register-blocked products compiled per ISA (base,
// AVX2, AVX-512) and bf16 pair products on AVX512-BF16.
#include "nki/matmul.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "cpu/gemm_bf16.h"
#include "nki/numerics.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace neuron::nki {
namespace {

// R[M, N] = S[K, M].T @ V[K, N] in fp32, each element summed over k in order. Register
// blocks of MB rows x NB columns stay in registers while k runs; compiled per ISA below.
template <int MB, int NB>
inline __attribute__((always_inline)) void matmul_body(const float* __restrict S, int64_t lds,
                                                      const float* __restrict V, int64_t ldv, float* __restrict R,
                                                      int64_t K, int64_t N, int64_t m_begin, int64_t m_end) {
  // Column blocks outside: the [K, NB] slab of V stays in L1 while every row block uses it.
  const int64_t m_full = m_begin + (m_end - m_begin) / MB * MB;
  int64_t n0 = 0;
  for (; n0 + NB <= N; n0 += NB) {
    for (int64_t m0 = m_begin; m0 < m_full; m0 += MB) {
      float acc[MB][NB] = {};
      for (int64_t k = 0; k < K; ++k) {
        const float* v = V + k * ldv + n0;
        const float* s = S + k * lds + m0;
        for (int i = 0; i < MB; ++i)
          for (int j = 0; j < NB; ++j) acc[i][j] += s[i] * v[j];
      }
      for (int i = 0; i < MB; ++i)
        for (int j = 0; j < NB; ++j) R[(m0 + i) * N + n0 + j] = acc[i][j];
    }
  }
  // Remainders: columns past the last full block, rows past the last block of 4.
  for (int64_t m = m_begin; m < m_end; ++m) {
    for (int64_t n = (m < m_full ? n0 : 0); n < N; ++n) {
      float a = 0.0f;
      for (int64_t k = 0; k < K; ++k) a += S[k * lds + m] * V[k * ldv + n];
      R[m * N + n] = a;
    }
  }
}

#define NKI_MATMUL_ARGS const float *S, int64_t lds, const float *V, int64_t ldv, float *R, int64_t K, int64_t N, \
                        int64_t b, int64_t e
void matmul_rows_base(NKI_MATMUL_ARGS) { matmul_body<4, 16>(S, lds, V, ldv, R, K, N, b, e); }
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) void matmul_rows_avx2(NKI_MATMUL_ARGS) {
  matmul_body<4, 32>(S, lds, V, ldv, R, K, N, b, e);
}
__attribute__((target("avx512f"))) void matmul_rows_avx512(NKI_MATMUL_ARGS) {
  matmul_body<8, 32>(S, lds, V, ldv, R, K, N, b, e);
}
#endif

void matmul_rows(NKI_MATMUL_ARGS) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const int isa = __builtin_cpu_supports("avx512f") ? 2 : (__builtin_cpu_supports("avx2") &&
                                                                   __builtin_cpu_supports("fma")) ? 1 : 0;
  if (isa == 2) return matmul_rows_avx512(S, lds, V, ldv, R, K, N, b, e);
  if (isa == 1) return matmul_rows_avx2(S, lds, V, ldv, R, K, N, b, e);
#endif
  matmul_rows_base(S, lds, V, ldv, R, K, N, b, e);
}

// bf16 x bf16 products on CPUs with AVX512-BF16: operands packed as (k even, k odd) pairs of
// bf16, each pair's two exact products added to the fp32 accumulator (odd first, then even):
// fp32 accumulation as in PSUM, twice the multiply rate of the fp32 kernel.
#if defined(__x86_64__) && defined(__GNUC__)
float pair_dot(uint32_t s, uint32_t v, float acc) {
  auto hi = [](uint32_t x) { return bits_to_float(x & 0xffff0000u); };
  auto lo = [](uint32_t x) { return bits_to_float(x << 16); };
  acc = std::fma(hi(s), hi(v), acc);
  return std::fma(lo(s), lo(v), acc);
}

// R[m * ldr + n] = (add ? R[...] : 0) + sum_k, so results can land in PSUM directly. Register
// blocks of kBf16Rows rows x 32 columns (24 accumulators) stay in registers while k runs.
constexpr int kBf16Rows = 12;

__attribute__((target("avx512f,avx512bw,avx512bf16"))) void matmul_bf16_rows(const uint32_t* Sp, const uint32_t* Vp,
                                                                             float* R, int64_t ldr, bool add,
                                                                             int64_t K2, int64_t M, int64_t N,
                                                                             int64_t mb, int64_t me) {
  int64_t n0 = 0;
  for (; n0 + 32 <= N; n0 += 32) {
    for (int64_t m0 = mb; m0 < me; m0 += kBf16Rows) {
      const int rows = static_cast<int>(std::min<int64_t>(kBf16Rows, me - m0));
      __m512 acc[kBf16Rows][2];
      for (int i = 0; i < kBf16Rows; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
      if (rows == kBf16Rows) {
        for (int64_t k = 0; k < K2; ++k) {
          const __m512bh v0 = (__m512bh)_mm512_loadu_si512(Vp + k * N + n0);
          const __m512bh v1 = (__m512bh)_mm512_loadu_si512(Vp + k * N + n0 + 16);
          const uint32_t* srow = Sp + k * M + m0;
          for (int i = 0; i < kBf16Rows; ++i) {
            const __m512bh sv = (__m512bh)_mm512_set1_epi32(static_cast<int>(srow[i]));
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], sv, v0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], sv, v1);
          }
        }
      } else {
        for (int64_t k = 0; k < K2; ++k) {
          const __m512bh v0 = (__m512bh)_mm512_loadu_si512(Vp + k * N + n0);
          const __m512bh v1 = (__m512bh)_mm512_loadu_si512(Vp + k * N + n0 + 16);
          for (int i = 0; i < rows; ++i) {
            const __m512bh sv = (__m512bh)_mm512_set1_epi32(static_cast<int>(Sp[k * M + m0 + i]));
            acc[i][0] = _mm512_dpbf16_ps(acc[i][0], sv, v0);
            acc[i][1] = _mm512_dpbf16_ps(acc[i][1], sv, v1);
          }
        }
      }
      for (int i = 0; i < rows; ++i) {
        float* r = R + (m0 + i) * ldr + n0;
        if (add) {
          acc[i][0] = _mm512_add_ps(_mm512_loadu_ps(r), acc[i][0]);
          acc[i][1] = _mm512_add_ps(_mm512_loadu_ps(r + 16), acc[i][1]);
        }
        _mm512_storeu_ps(r, acc[i][0]);
        _mm512_storeu_ps(r + 16, acc[i][1]);
      }
    }
  }
  for (int64_t m = mb; m < me; ++m) {
    for (int64_t n = n0; n < N; ++n) {
      float a = 0.0f;
      for (int64_t k = 0; k < K2; ++k) a = pair_dot(Sp[k * M + m], Vp[k * N + n], a);
      R[m * ldr + n] = add ? R[m * ldr + n] + a : a;
    }
  }
}
#endif

}  // namespace

// Large tiles split their row blocks over the host's threads (results do not depend on the split).
void matmul_f32(const float* S, int64_t lds, const float* V, int64_t ldv, float* R, int64_t K, int64_t M, int64_t N,
                const ParallelFor& par) {
  const int64_t blocks = (M + 7) / 8;
  if (!par || K * M * N < (1 << 20) || blocks < 2) return matmul_rows(S, lds, V, ldv, R, K, N, 0, M);
  par(blocks, [&](int64_t b, int64_t e) {
    matmul_rows(S, lds, V, ldv, R, K, N, b * 8, std::min<int64_t>(M, e * 8));
  });
}

bool has_bf16_pair_matmul() {
#if defined(__x86_64__) && defined(__GNUC__)
  return neuron::cpu::has_avx512_bf16();
#else
  return false;
#endif
}

void matmul_bf16_pairs(const uint32_t* Sp, const uint32_t* Vp, float* R, int64_t ldr, bool add, int64_t K, int64_t M,
                       int64_t N, const ParallelFor& par) {
#if defined(__x86_64__) && defined(__GNUC__)
  const int64_t K2 = (K + 1) / 2;
  const int64_t blocks = (M + kBf16Rows - 1) / kBf16Rows;
  if (par && K * M * N >= (1 << 20) && blocks > 1) {
    par(blocks, [&](int64_t b, int64_t e) {
      matmul_bf16_rows(Sp, Vp, R, ldr, add, K2, M, N, b * kBf16Rows, std::min(M, e * kBf16Rows));
    });
  } else {
    matmul_bf16_rows(Sp, Vp, R, ldr, add, K2, M, N, 0, M);
  }
#else
  (void)Sp, (void)Vp, (void)R, (void)ldr, (void)add, (void)K, (void)M, (void)N, (void)par;
  throw std::logic_error("nki: bf16 pair products need AVX512-BF16 (check has_bf16_pair_matmul first)");
#endif
}

}  // namespace neuron::nki
