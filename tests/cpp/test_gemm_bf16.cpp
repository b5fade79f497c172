// The host bf16 GEMM behind the simulated Tensor engine (csrc/cpu/gemm_bf16.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cpu/gemm_bf16.h"

namespace {

using namespace neuron::cpu;

uint16_t bf16_bits(float f) {  // truncation: the test draws values that are exact in bf16
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>(u >> 16);
}

float bf16_value(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Packs x [R, K] (row-major bf16 bits) into panels of P rows, as gemm_bf16.h lays them out.
std::vector<uint32_t> pack(const std::vector<uint16_t>& x, int64_t R, int64_t K, int64_t P) {
  const int64_t K2 = k_pairs(K), panels = (R + P - 1) / P;
  std::vector<uint32_t> out(panels * P * K2, 0u);
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t k = 0; k < K; ++k) {
      const uint32_t v = x[r * K + k];
      out[(r / P) * P * K2 + (k / 2) * P + r % P] |= (k % 2) ? v << 16 : v;
    }
  }
  return out;
}

struct Case {
  int64_t M, N, K;
};

class GemmBf16 : public ::testing::TestWithParam<Case> {};

TEST_P(GemmBf16, MatchesFloat64ReferenceAndIsIndependentOfTheSplit) {
  if (!has_avx512_bf16()) GTEST_SKIP() << "host has no AVX512-BF16";
  const auto [M, N, K] = GetParam();
  std::mt19937 rng(M * 1000003 + N * 1009 + K);
  std::uniform_int_distribution<int> mant(-255, 255), ex(-6, 6);
  auto draw = [&]() { return bf16_bits(std::ldexp(static_cast<float>(mant(rng)), ex(rng) - 7)); };
  std::vector<uint16_t> a(M * K), bt(N * K);  // b given by columns: bt[n, k] = b[k, n]
  for (auto& v : a) v = draw();
  for (auto& v : bt) v = draw();
  const auto pa = pack(a, M, K, kTileRows), pb = pack(bt, N, K, kTileCols);
  ASSERT_EQ(static_cast<int64_t>(pa.size()), packed_a_words(M, K));
  ASSERT_EQ(static_cast<int64_t>(pb.size()), packed_b_words(N, K));

  auto run = [&](int64_t rsplit, int64_t csplit) {
    std::vector<float> c(M * N, std::nanf(""));
    std::vector<int> seen(M * N, 0);
    const TileFn fn = [&](int64_t m0, int64_t n0, int64_t rows, int64_t cols, const float* t) {
      ASSERT_LE(m0 + rows, M);
      ASSERT_LE(n0 + cols, N);
      for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) c[(m0 + i) * N + n0 + j] = t[i * kTileCols + j], ++seen[(m0 + i) * N + n0 + j];
    };
    const int64_t rp = row_panels(M), cp = col_panels(N);
    for (int64_t r0 = 0; r0 < rp; r0 += rsplit)
      for (int64_t c0 = 0; c0 < cp; c0 += csplit)
        gemm_bf16_tiles(pa.data(), pb.data(), M, N, K, r0, std::min(rp, r0 + rsplit), c0, std::min(cp, c0 + csplit), fn);
    for (int s : seen) EXPECT_EQ(s, 1);  // every element delivered exactly once
    return c;
  };
  const auto whole = run(1 << 30, 1 << 30);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = static_cast<double>(bf16_value(a[m * K + k])) * bf16_value(bt[n * K + k]);
        ref += p, mag += std::fabs(p);
      }
      // fp32 accumulation: at most K roundings of partial sums bounded by the sum of |products|.
      ASSERT_NEAR(whole[m * N + n], ref, mag * K * std::ldexp(1.0, -24) + 1e-30) << m << "," << n;
    }
  }
  const auto split = run(1, 1);
  EXPECT_EQ(std::memcmp(whole.data(), split.data(), whole.size() * 4), 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GemmBf16,
                         ::testing::Values(Case{1, 1, 1}, Case{12, 32, 2}, Case{13, 33, 7}, Case{25, 70, 64},
                                           Case{100, 5, 129}, Case{3, 200, 300}, Case{48, 96, 1024}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return "M" + std::to_string(i.param.M) + "_N" + std::to_string(i.param.N) + "_K" +
                                  std::to_string(i.param.K);
                         });

TEST(GemmBf16Exact, SmallIntegerProductsAreExact) {
  if (!has_avx512_bf16()) GTEST_SKIP() << "host has no AVX512-BF16";
  // Integers below 2^8 are exact in bf16 and their sums below 2^24 exact in fp32.
  const int64_t M = 17, N = 40, K = 33;
  std::vector<uint16_t> a(M * K), bt(N * K);
  for (int64_t i = 0; i < M * K; ++i) a[i] = bf16_bits(static_cast<float>(i % 13 - 6));
  for (int64_t i = 0; i < N * K; ++i) bt[i] = bf16_bits(static_cast<float>(i % 7 - 3));
  const auto pa = pack(a, M, K, kTileRows), pb = pack(bt, N, K, kTileCols);
  std::vector<float> c(M * N);
  gemm_bf16_tiles(pa.data(), pb.data(), M, N, K, 0, row_panels(M), 0, col_panels(N),
                  [&](int64_t m0, int64_t n0, int64_t rows, int64_t cols, const float* t) {
                    for (int64_t i = 0; i < rows; ++i)
                      for (int64_t j = 0; j < cols; ++j) c[(m0 + i) * N + n0 + j] = t[i * kTileCols + j];
                  });
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      float ref = 0;
      for (int64_t k = 0; k < K; ++k) ref += bf16_value(a[m * K + k]) * bf16_value(bt[n * K + k]);
      EXPECT_EQ(c[m * N + n], ref);
    }
}

}  // namespace
