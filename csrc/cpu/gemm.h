// The host CPU's matrix product behind every simulated Tensor-engine product: the device's
// bf16/fp16 matmuls (csrc/aten/matmul.cpp), the FP8 scaled matmuls (csrc/aten/scaled_mm.cpp)
// and the NKI executor's nc_matmul (csrc/nki).
//
// Contract (the PE array's): products of 16-bit operands are exact in fp32 and are accumulated
// in fp32; fp32 operands multiply and accumulate in fp32. libtorch exports no GEMM that keeps
// this for 16-bit inputs on every host, hence this one.
//
// Paths, chosen once per process from CPUID, or forced with NEURON_CPU_GEMM:
//   avx512bf16  bf16 x bf16 on the BF16 dot-product instruction (vdpbf16ps: k pairs, odd then
//               even, subnormal inputs read as zero), other dtypes as avx512;
//   avx512      fp32 FMA micro-kernel, 12 x 32 register tile;
//   avx2        fp32 FMA micro-kernel, 6 x 16 register tile (16-bit operands widened exactly);
//   scalar      portable C++, no FMA: the reference the others are tested against.
// Every path packs its operands into register-tile panels, blocks K by a fixed depth and adds
// each block's fp32 sum to C: an element's sum order depends on the path only, never on the
// thread count or the split, so results are deterministic.
//
// No torch headers: the ATen kernels, the NKI executor and GoogleTest use it alike.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace neuron::cpu {

enum class GemmPath : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };
constexpr GemmPath kAllGemmPaths[] = {GemmPath::kScalar, GemmPath::kAvx2, GemmPath::kAvx512, GemmPath::kAvx512Bf16};

// "scalar", "avx2", "avx512", "avx512bf16": the names NEURON_CPU_GEMM takes.
const char* gemm_path_name(GemmPath p);

// The CPU features `p` needs that this host lacks ("" when it runs here), e.g. "avx512bf16".
std::string gemm_path_missing(GemmPath p);
inline bool gemm_path_supported(GemmPath p) { return gemm_path_missing(p).empty(); }

// The best path this host runs.
GemmPath best_gemm_path();

// The path a value of NEURON_CPU_GEMM names (null, "" or "auto": best_gemm_path()). Throws
// std::invalid_argument for an unknown name and std::runtime_error for a path this host cannot
// run, naming the missing instructions and the paths that work.
GemmPath parse_gemm_path(const char* value);

// The process's path: parse_gemm_path(getenv("NEURON_CPU_GEMM")), read once.
GemmPath gemm_path();

enum class Dtype : uint8_t { kFloat32, kBFloat16, kFloat16 };

// A matrix operand: element (i, j) at data + i * rs + j * cs, strides in elements of dtype
// (any strides: transposed, broadcast with stride 0, ...).
struct MatrixRef {
  const void* data;
  Dtype dtype;
  int64_t rs, cs;
};

// Runs body over [0, n) split into sub-ranges, possibly concurrently (at::parallel_for, the NKI
// executor's hook). Unset: everything on the calling thread.
using ParallelFor = std::function<void(int64_t n, const std::function<void(int64_t, int64_t)>& body)>;

struct GemmOptions {
  GemmPath path;                          // must be supported here (gemm_path() is)
  const ParallelFor* parallel = nullptr;  // not owned
  bool accumulate = false;                // C += A @ B instead of C = A @ B
};
GemmOptions default_gemm_options(const ParallelFor* parallel = nullptr, bool accumulate = false);

// C[m * ldc + n] (+)= sum_k A[m, k] * B[k, n] for A [M, K], B [K, N]; C is fp32. K == 0 gives
// zeros (or leaves C as it is when accumulating). C must not overlap A or B.
void gemm(int64_t M, int64_t N, int64_t K, const MatrixRef& a, const MatrixRef& b, float* c, int64_t ldc,
          const GemmOptions& options);

// B [K, N] packed once for several products that share it (the NKI executor's moving tiles, one
// tile against many stationary ones). Valid for the path and A dtype it was packed for.
struct PackedB {
  GemmPath path = GemmPath::kScalar;
  Dtype a_dtype = Dtype::kFloat32, b_dtype = Dtype::kFloat32;
  int64_t K = 0, N = 0;
  std::vector<uint32_t> words;  // the path's panels
};
void pack_b(int64_t K, int64_t N, const MatrixRef& b, Dtype a_dtype, GemmPath path, PackedB& out);

// Several B packed at once, their panels split over `parallel`'s threads when there are enough
// of them: each `out` is what pack_b gives. An `out` keeps its storage when packed again with
// the same shape (no allocation, no clearing).
struct PackBJob {
  int64_t K, N;
  MatrixRef b;
  Dtype a_dtype;
  PackedB* out;  // not owned; distinct per job
};
void pack_b(const std::vector<PackBJob>& jobs, GemmPath path, const ParallelFor* parallel);

// A [M, K] packed once for several products that share it (the NKI executor's stationary tiles,
// one against every column block of b), in batches like pack_b. Valid for the path and B dtype it
// was packed for.
struct PackedA {
  GemmPath path = GemmPath::kScalar;
  Dtype a_dtype = Dtype::kFloat32, b_dtype = Dtype::kFloat32;
  int64_t M = 0, K = 0;
  std::vector<uint32_t> words;  // the path's panels
};
struct PackAJob {
  int64_t M, K;
  MatrixRef a;
  Dtype b_dtype;
  PackedA* out;  // not owned; distinct per job
};
void pack_a(const std::vector<PackAJob>& jobs, GemmPath path, const ParallelFor* parallel);

// gemm() with B packed beforehand: the same results as with B itself.
void gemm(int64_t M, const MatrixRef& a, const PackedB& b, float* c, int64_t ldc, const GemmOptions& options);

// A sum of products over consecutive K ranges, C (+)= A_0 @ B_0 + A_1 @ B_1 + ... (A_t [M, K_t],
// B_t [K_t, N] packed for the same path and dtypes): bit for bit what gemm() called for each term
// in turn gives (accumulating after the first), in one parallel region. The NKI executor runs a
// chain of matmuls accumulating into one PSUM tile this way, each too small to thread alone.
struct GemmTerm {
  MatrixRef a;
  const PackedB* b;                   // not owned
  const PackedA* packed_a = nullptr;  // A's panels (pack_a) instead of `a`; not owned
};
void gemm_sum(int64_t M, const std::vector<GemmTerm>& terms, float* c, int64_t ldc, const GemmOptions& options);

// One half-precision value (bits) as fp32, exactly.
float half_to_float(uint16_t h);

}  // namespace neuron::cpu
