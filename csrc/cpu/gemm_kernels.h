// The register-tile micro-kernels of cpu/gemm.h, one per path. Each SIMD kernel lives in its
// own translation unit compiled for its instructions (a target pragma after the includes), and
// is reached only through the descriptor functions below, which are compiled for the baseline
// ISA: nothing the library runs before the CPUID check needs more than x86-64.
#pragma once

#include <cstdint>

namespace neuron::cpu::detail {

// How operands are packed into panels.
enum class Panel : uint8_t {
  kFloat32,    // [depth][rows] fp32 values (16-bit operands widened exactly)
  kBf16Pairs,  // [depth][rows] words of two bf16: k even in the low half, k odd in the high half
};

// c[i * ldc + j] = (add ? c[i * ldc + j] : 0) + sum over d < depth of ap[d * mr + i] * bp[d * nr + j]
// for i < mr, j < nr, summed over d in order in fp32 (a pair word is one d).
using TileFn = void (*)(int64_t depth, const void* ap, const void* bp, float* c, int64_t ldc, bool add);

struct MicroKernel {
  int mr, nr;          // register tile
  Panel panel;
  int64_t kc;          // K block (panel words): each block's sum is added to C
  int64_t mc_panels;   // row panels per task block (an A block of mc x kc stays in L2)
  int64_t nc_panels;   // column panels per task block
  TileFn tile;
};

MicroKernel scalar_kernel();
#if defined(__x86_64__) && defined(__GNUC__)
MicroKernel avx2_kernel();
MicroKernel avx512_kernel();
MicroKernel avx512bf16_kernel();
#endif

}  // namespace neuron::cpu::detail
