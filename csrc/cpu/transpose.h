// Transposes of 4-byte elements for the NKI executor's transposing copies (a matmul's a.T loads):
// bits move unchanged (NaN payloads, integers).
#pragma once

#include <cstdint>

#include "cpu/gemm.h"

namespace neuron::cpu {

// dst[a * ldd + b] = src[b * lds + a] for a < na, b < nb. 8 x 8 blocks, in AVX2 registers when
// `path` has AVX2 (every path but kScalar), element by element on kScalar.
void transpose32(const uint32_t* src, int64_t lds, uint32_t* dst, int64_t ldd, int64_t na, int64_t nb,
                 GemmPath path = gemm_path());

}  // namespace neuron::cpu
