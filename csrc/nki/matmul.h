// The Tensor engine's products computed on the host CPU (SIMD kernels chosen at run time).
// Results do not depend on the kernel or on how rows are split over threads: every element
// is summed over k in order, in fp32 as in PSUM.
#pragma once

#include <cstdint>

#include "nki/execute.h"

namespace neuron::nki {

// R[M, N] = S[K, M].T @ V[K, N] (row strides lds, ldv; R dense). Large products split their
// rows over `par` (when set).
void matmul_f32(const float* S, int64_t lds, const float* V, int64_t ldv, float* R, int64_t K, int64_t M, int64_t N,
                const ParallelFor& par);

// Whether this CPU multiplies bf16 pairs natively (matmul_bf16_pairs may be called).
bool has_bf16_pair_matmul();

// bf16 products: Sp [ceil(K/2), M] and Vp [ceil(K/2), N] hold (k even, k odd) pairs of bf16
// per uint32 (even in the low half); R[m * ldr + n] = (add ? R[...] : 0) + sum over k.
void matmul_bf16_pairs(const uint32_t* Sp, const uint32_t* Vp, float* R, int64_t ldr, bool add, int64_t K, int64_t M,
                       int64_t N, const ParallelFor& par);

}  // namespace neuron::nki
