// The driver of cpu/gemm.h (path choice, packing, blocking, threads) and the scalar path.
// Compiled for the baseline ISA; the SIMD micro-kernels are in gemm_avx2.cpp / gemm_avx512.cpp.
#include "cpu/gemm.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "cpu/gemm_kernels.h"

namespace neuron::cpu {

namespace detail {
namespace {

constexpr int kScalarMr = 4, kScalarNr = 16;

// Plain C++ (no FMA in the baseline ISA): each product rounded to fp32, then added.
void tile_scalar(int64_t depth, const void* ap, const void* bp, float* c, int64_t ldc, bool add) {
  const float* a = static_cast<const float*>(ap);
  const float* b = static_cast<const float*>(bp);
  float acc[kScalarMr][kScalarNr] = {};
  for (int64_t d = 0; d < depth; ++d, a += kScalarMr, b += kScalarNr) {
    for (int i = 0; i < kScalarMr; ++i) {
      for (int j = 0; j < kScalarNr; ++j) acc[i][j] += a[i] * b[j];
    }
  }
  for (int i = 0; i < kScalarMr; ++i) {
    float* ci = c + i * ldc;
    for (int j = 0; j < kScalarNr; ++j) ci[j] = add ? ci[j] + acc[i][j] : acc[i][j];
  }
}

}  // namespace

MicroKernel scalar_kernel() { return {kScalarMr, kScalarNr, Panel::kFloat32, 256, 36, 16, &tile_scalar}; }

}  // namespace detail

namespace {

using detail::MicroKernel;
using detail::Panel;

std::string find_missing(GemmPath p) {
  std::string m;
  auto need = [&m](bool ok, const char* feature) {
    if (!ok) m += (m.empty() ? "" : ", ") + std::string(feature);
  };
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  switch (p) {
    case GemmPath::kScalar: break;
    case GemmPath::kAvx2:
      need(__builtin_cpu_supports("avx2"), "avx2");
      need(__builtin_cpu_supports("fma"), "fma");
      break;
    case GemmPath::kAvx512: need(__builtin_cpu_supports("avx512f"), "avx512f"); break;
    case GemmPath::kAvx512Bf16:
      need(__builtin_cpu_supports("avx512f"), "avx512f");
      need(__builtin_cpu_supports("avx512bw"), "avx512bw");
      need(__builtin_cpu_supports("avx512bf16"), "avx512bf16");
      break;
  }
#else
  need(p == GemmPath::kScalar, "an x86-64 CPU");
#endif
  return m;
}

const std::string& missing_of(GemmPath p) {
  static const std::string missing[4] = {find_missing(GemmPath::kScalar), find_missing(GemmPath::kAvx2),
                                         find_missing(GemmPath::kAvx512), find_missing(GemmPath::kAvx512Bf16)};
  return missing[static_cast<int>(p)];
}

}  // namespace

GemmPath parse_gemm_path(const char* value) {
  const std::string want = value ? value : "";
  if (want.empty() || want == "auto") return best_gemm_path();
  for (GemmPath p : kAllGemmPaths) {
    if (want != gemm_path_name(p)) continue;
    if (!gemm_path_supported(p)) {
      std::string runs;
      for (GemmPath q : kAllGemmPaths) {
        if (gemm_path_supported(q)) runs += (runs.empty() ? "" : ", ") + std::string(gemm_path_name(q));
      }
      throw std::runtime_error("NEURON_CPU_GEMM=" + want + ": this CPU lacks " + missing_of(p) +
                               ", which that path needs. Paths this CPU runs: " + runs +
                               " (or unset NEURON_CPU_GEMM for the best of them)");
    }
    return p;
  }
  throw std::invalid_argument("NEURON_CPU_GEMM='" + want + "' names no GEMM path; use scalar, avx2, avx512 or "
                              "avx512bf16 (or unset it for the best path this CPU runs)");
}

namespace {

MicroKernel kernel_for(GemmPath p, Dtype a, Dtype b) {
#if defined(__x86_64__) && defined(__GNUC__)
  switch (p) {
    case GemmPath::kAvx512Bf16:
      if (a == Dtype::kBFloat16 && b == Dtype::kBFloat16) return detail::avx512bf16_kernel();
      return detail::avx512_kernel();
    case GemmPath::kAvx512: return detail::avx512_kernel();
    case GemmPath::kAvx2: return detail::avx2_kernel();
    case GemmPath::kScalar: break;
  }
#else
  (void)p, (void)a, (void)b;
#endif
  return detail::scalar_kernel();
}

inline float bf16_to_float(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct F32 {
  using T = float;
  static float load(T x) { return x; }
};
struct BF16 {
  using T = uint16_t;
  static float load(T x) { return bf16_to_float(x); }
};
struct F16 {
  using T = uint16_t;
  static float load(T x) { return half_to_float(x); }
};

// Rows [r0, r0 + P) of x [R, K] (x(i, k) = data[i * rs + k * cs]) as one fp32 panel
// dst[k * P + i]; rows past R are zero.
template <class E>
void pack_f32(const MatrixRef& x, int64_t R, int64_t K, int64_t r0, int P, float* dst) {
  const auto* src = static_cast<const typename E::T*>(x.data);
  const int64_t rows = std::min<int64_t>(P, R - r0);
  if (x.cs == 1) {  // rows contiguous along k
    for (int64_t i = 0; i < rows; ++i) {
      const auto* s = src + (r0 + i) * x.rs;
      for (int64_t k = 0; k < K; ++k) dst[k * P + i] = E::load(s[k]);
    }
  } else {
    for (int64_t k = 0; k < K; ++k) {
      const auto* s = src + k * x.cs + r0 * x.rs;
      for (int64_t i = 0; i < rows; ++i) dst[k * P + i] = E::load(s[i * x.rs]);
    }
  }
  if (rows < P) {
    for (int64_t k = 0; k < K; ++k) std::fill(dst + k * P + rows, dst + k * P + P, 0.0f);
  }
}

// The same for bf16 pair panels: dst[kp * P + i] = x(i, 2kp) | x(i, 2kp + 1) << 16 (zero past K).
void pack_pairs(const MatrixRef& x, int64_t R, int64_t K, int64_t r0, int P, uint32_t* dst) {
  const auto* src = static_cast<const uint16_t*>(x.data);
  const int64_t rows = std::min<int64_t>(P, R - r0), K2 = (K + 1) / 2;
  for (int64_t i = 0; i < rows; ++i) {
    const uint16_t* s = src + (r0 + i) * x.rs;
    for (int64_t kp = 0; kp < K2; ++kp) {
      const uint32_t lo = s[2 * kp * x.cs];
      const uint32_t hi = 2 * kp + 1 < K ? s[(2 * kp + 1) * x.cs] : 0u;
      dst[kp * P + i] = lo | hi << 16;
    }
  }
  if (rows < P) {
    for (int64_t kp = 0; kp < K2; ++kp) std::fill(dst + kp * P + rows, dst + kp * P + P, 0u);
  }
}

void pack_panel(const MatrixRef& x, int64_t R, int64_t K, int64_t r0, int P, Panel panel, void* dst) {
  if (panel == Panel::kBf16Pairs) return pack_pairs(x, R, K, r0, P, static_cast<uint32_t*>(dst));
  float* d = static_cast<float*>(dst);
  switch (x.dtype) {
    case Dtype::kFloat32: return pack_f32<F32>(x, R, K, r0, P, d);
    case Dtype::kBFloat16: return pack_f32<BF16>(x, R, K, r0, P, d);
    case Dtype::kFloat16: return pack_f32<F16>(x, R, K, r0, P, d);
  }
}

// The calling thread's packing buffers (workers of a parallel call read them). Large ones are
// released after the call.
struct Scratch {
  std::vector<float> a, b;
  std::vector<uint32_t> a2, b2;
  void* get(bool pairs, bool is_a, size_t words) {
    if (pairs) {
      auto& v = is_a ? a2 : b2;
      if (v.size() < words) v.resize(words);
      return v.data();
    }
    auto& v = is_a ? a : b;
    if (v.size() < words) v.resize(words);
    return v.data();
  }
  void trim() {
    constexpr size_t kKeep = size_t{1} << 22;  // words
    if (a.size() > kKeep) std::vector<float>().swap(a);
    if (b.size() > kKeep) std::vector<float>().swap(b);
    if (a2.size() > kKeep) std::vector<uint32_t>().swap(a2);
    if (b2.size() > kKeep) std::vector<uint32_t>().swap(b2);
  }
};

}  // namespace

const char* gemm_path_name(GemmPath p) {
  switch (p) {
    case GemmPath::kScalar: return "scalar";
    case GemmPath::kAvx2: return "avx2";
    case GemmPath::kAvx512: return "avx512";
    case GemmPath::kAvx512Bf16: return "avx512bf16";
  }
  return "?";
}

std::string gemm_path_missing(GemmPath p) { return missing_of(p); }

GemmPath best_gemm_path() {
  for (GemmPath p : {GemmPath::kAvx512Bf16, GemmPath::kAvx512, GemmPath::kAvx2}) {
    if (gemm_path_supported(p)) return p;
  }
  return GemmPath::kScalar;
}

GemmPath gemm_path() {
  // A throw leaves it unset: every later call throws again.
  static const GemmPath p = parse_gemm_path(std::getenv("NEURON_CPU_GEMM"));
  return p;
}

GemmOptions default_gemm_options(const ParallelFor* parallel, bool accumulate) {
  GemmOptions o;
  o.path = gemm_path();
  o.parallel = parallel;
  o.accumulate = accumulate;
  return o;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    const float f = static_cast<float>(man) * 5.9604644775390625e-8f;  // man * 2^-24, exact
    std::memcpy(&u, &f, 4);
    u |= sign;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | man << 13;
  } else {
    u = sign | (exp + 112) << 23 | man << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void gemm(int64_t M, int64_t N, int64_t K, const MatrixRef& a, const MatrixRef& b, float* c, int64_t ldc,
          const GemmOptions& options) {
  if (M <= 0 || N <= 0) return;
  if (!gemm_path_supported(options.path)) {
    throw std::runtime_error(std::string("cpu::gemm: the ") + gemm_path_name(options.path) +
                             " path needs " + missing_of(options.path) + ", which this CPU lacks");
  }
  if (K <= 0) {
    if (!options.accumulate) {
      for (int64_t m = 0; m < M; ++m) std::fill(c + m * ldc, c + m * ldc + N, 0.0f);
    }
    return;
  }
  const MicroKernel mk = kernel_for(options.path, a.dtype, b.dtype);
  const bool pairs = mk.panel == Panel::kBf16Pairs;
  const int64_t depth = pairs ? (K + 1) / 2 : K;  // panel words along K
  const int64_t rp = (M + mk.mr - 1) / mk.mr, cp = (N + mk.nr - 1) / mk.nr;
  const int64_t a_panel = mk.mr * depth, b_panel = mk.nr * depth;  // words per panel

  thread_local Scratch scratch;
  char* pa = static_cast<char*>(scratch.get(pairs, true, static_cast<size_t>(rp * a_panel)));
  char* pb = static_cast<char*>(scratch.get(pairs, false, static_cast<size_t>(cp * b_panel)));
  constexpr int64_t kWord = 4;
  const MatrixRef bt{b.data, b.dtype, b.cs, b.rs};  // B's columns are the rows of its panels

  const ParallelFor* par = options.parallel && *options.parallel && M * N * K >= (int64_t{1} << 20)
                               ? options.parallel
                               : nullptr;
  auto pack = [&](int64_t lo, int64_t hi) {
    for (int64_t t = lo; t < hi; ++t) {
      if (t < rp) {
        pack_panel(a, M, K, t * mk.mr, mk.mr, mk.panel, pa + t * a_panel * kWord);
      } else {
        pack_panel(bt, N, K, (t - rp) * mk.nr, mk.nr, mk.panel, pb + (t - rp) * b_panel * kWord);
      }
    }
  };

  // Task blocks of mcp row panels x ncp column panels; with threads, at least 8 of them.
  int64_t mcp = std::min(mk.mc_panels, rp), ncp = std::min(mk.nc_panels, cp);
  auto blocks = [&] { return ((rp + mcp - 1) / mcp) * ((cp + ncp - 1) / ncp); };
  while (par && blocks() < 8 && (mcp > 1 || ncp > 1)) {
    if (ncp * mk.nr >= mcp * mk.mr && ncp > 1) {
      ncp = (ncp + 1) / 2;
    } else {
      mcp = (mcp + 1) / 2;
    }
  }
  const int64_t col_blocks = (cp + ncp - 1) / ncp, tasks = blocks();
  auto compute = [&](int64_t lo, int64_t hi) {
    alignas(64) float edge[12 * 32];
    for (int64_t t = lo; t < hi; ++t) {
      const int64_t p0 = (t / col_blocks) * mcp, p1 = std::min(rp, p0 + mcp);
      const int64_t q0 = (t % col_blocks) * ncp, q1 = std::min(cp, q0 + ncp);
      for (int64_t d0 = 0; d0 < depth; d0 += mk.kc) {
        const int64_t dn = std::min(mk.kc, depth - d0);
        const bool add = options.accumulate || d0 > 0;
        for (int64_t q = q0; q < q1; ++q) {  // a B micro-panel stays in L1 while the A block streams past
          const char* bq = pb + (q * b_panel + d0 * mk.nr) * kWord;
          const int64_t n0 = q * mk.nr, cols = std::min<int64_t>(mk.nr, N - n0);
          for (int64_t p = p0; p < p1; ++p) {
            const char* ap = pa + (p * a_panel + d0 * mk.mr) * kWord;
            const int64_t m0 = p * mk.mr, rows = std::min<int64_t>(mk.mr, M - m0);
            float* ct = c + m0 * ldc + n0;
            if (rows == mk.mr && cols == mk.nr) {
              mk.tile(dn, ap, bq, ct, ldc, add);
              continue;
            }
            mk.tile(dn, ap, bq, edge, mk.nr, false);
            for (int64_t i = 0; i < rows; ++i) {
              for (int64_t j = 0; j < cols; ++j) {
                ct[i * ldc + j] = add ? ct[i * ldc + j] + edge[i * mk.nr + j] : edge[i * mk.nr + j];
              }
            }
          }
        }
      }
    }
  };
  if (par) {
    (*par)(rp + cp, pack);
    (*par)(tasks, compute);
  } else {
    pack(0, rp + cp);
    compute(0, tasks);
  }
  scratch.trim();
}

}  // namespace neuron::cpu
