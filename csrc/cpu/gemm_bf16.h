// bf16 x bf16 -> fp32 matrix product on the host CPU's AVX512-BF16 dot-product instructions.
//
// The simulated Tensor engine multiplies bf16 (and FP8, exact in bf16) with fp32 accumulation.
// libtorch exports no GEMM with that contract (its bf16 matmul rounds the result to bf16), so
// the device has its own: operands packed once into register-tile panels, a 12 x 32 register
// tile accumulating over the whole K, and each finished tile handed to the caller while it is
// still in cache (where scales, bias and the one rounding to the output dtype are applied).
// No torch headers: used by the ATen kernels and testable on its own.
#pragma once

#include <cstdint>
#include <functional>

namespace neuron::cpu {

// AVX-512 with the BF16 dot-product instructions (vdpbf16ps), checked once.
bool has_avx512_bf16();

// Register tile: kTileRows x kTileCols fp32 accumulators.
constexpr int64_t kTileRows = 12, kTileCols = 32;

inline int64_t k_pairs(int64_t K) { return (K + 1) / 2; }
inline int64_t row_panels(int64_t M) { return (M + kTileRows - 1) / kTileRows; }
inline int64_t col_panels(int64_t N) { return (N + kTileCols - 1) / kTileCols; }

// Packed layouts, in 32-bit words holding two bf16 (element k even in the low half, k odd in
// the high half; an odd K is padded with a zero):
//   A [M, K]: row panel p holds rows [12p, 12p + 12) as [k_pairs(K)][kTileRows] words;
//   B [K, N]: column panel q holds columns [32q, 32q + 32) as [k_pairs(K)][kTileCols] words.
// Rows and columns past M / N are zero.
inline int64_t packed_a_words(int64_t M, int64_t K) { return row_panels(M) * kTileRows * k_pairs(K); }
inline int64_t packed_b_words(int64_t N, int64_t K) { return col_panels(N) * kTileCols * k_pairs(K); }

// Receives each finished tile: rows [m0, m0 + rows) x columns [n0, n0 + cols) of the product,
// at tile[i * kTileCols + j].
using TileFn = std::function<void(int64_t m0, int64_t n0, int64_t rows, int64_t cols, const float* tile)>;

// Products of row panels [rp_begin, rp_end) with column panels [cp_begin, cp_end). Needs
// has_avx512_bf16(). Accumulation is fp32, products exact (bf16 x bf16 fits fp32); the sum
// order is fixed, so results do not depend on how callers split the panels across threads.
void gemm_bf16_tiles(const uint32_t* packed_a, const uint32_t* packed_b, int64_t M, int64_t N, int64_t K,
                     int64_t rp_begin, int64_t rp_end, int64_t cp_begin, int64_t cp_end, const TileFn& fn);

}  // namespace neuron::cpu
