// The driver of cpu/gemm.h (path choice, packing, blocking, threads) and the scalar path.
// Compiled for the baseline ISA; the SIMD micro-kernels are in gemm_avx2.cpp / gemm_avx512.cpp.
#include "cpu/gemm.h"

#include <algorithm>
#include <atomic>
#include <chrono>
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
  } else {  // (columns contiguous along i, x.rs == 1, are packed by pack_f32_columns)
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

// pack_f32 for panels [p0, p1) at once when x's columns are contiguous (x.rs == 1: an NKI tile
// read along its free dimension), k outermost: each column of x is read once, front to back.
// Panel by panel, each would read a few elements of every column, and columns a multiple of
// 4 KiB apart (SBUF partitions) share cache sets, so the next panel's reads missed again.
template <class E>
void pack_f32_columns(const MatrixRef& x, int64_t R, int64_t K, int64_t p0, int64_t p1, int P, float* base) {
  const auto* src = static_cast<const typename E::T*>(x.data);
  for (int64_t k = 0; k < K; ++k) {
    const auto* s = src + k * x.cs;
    for (int64_t p = p0; p < p1; ++p) {
      float* d = base + (p * K + k) * P;
      const int64_t r0 = p * P, rows = std::min<int64_t>(P, R - r0);
      for (int64_t i = 0; i < rows; ++i) d[i] = E::load(s[r0 + i]);
      for (int64_t i = rows; i < P; ++i) d[i] = 0.0f;
    }
  }
}

// Panels [p0, p1) of x, panel p (rows [p * P, p * P + P)) at `base` + p * P * depth words.
void pack_panels(const MatrixRef& x, int64_t R, int64_t K, int64_t p0, int64_t p1, int P, Panel panel, void* base) {
  if (panel == Panel::kFloat32 && x.rs == 1 && x.cs != 1) {
    float* d = static_cast<float*>(base);
    switch (x.dtype) {
      case Dtype::kFloat32: return pack_f32_columns<F32>(x, R, K, p0, p1, P, d);
      case Dtype::kBFloat16: return pack_f32_columns<BF16>(x, R, K, p0, p1, P, d);
      case Dtype::kFloat16: return pack_f32_columns<F16>(x, R, K, p0, p1, P, d);
    }
  }
  const int64_t depth = panel == Panel::kBf16Pairs ? (K + 1) / 2 : K;
  for (int64_t p = p0; p < p1; ++p) {
    pack_panel(x, R, K, p * P, P, panel, static_cast<uint32_t*>(base) + p * P * depth);
  }
}

// Whether a product wakes the host's threads. A parallel region costs microseconds on an idle
// machine and milliseconds when its cores are shared with other work (the pool's threads wait
// for a time slice): the choice follows measurement. Per size class, the speed of recent
// serial and threaded products is tracked and the faster mode taken; one product in 64 tries
// the other mode, so the choice follows the machine's load. Results do not depend on it.
class ThreadChoice {
 public:
  bool threads(int64_t work) {
    Stats& s = stats_[bucket(work)];
    const double serial = s.rate[0].load(std::memory_order_relaxed);
    const double threaded = s.rate[1].load(std::memory_order_relaxed);
    if (threaded == 0) return true;  // each mode measured once first
    if (serial == 0) return false;
    const bool pick = threaded >= serial;
    return s.calls.fetch_add(1, std::memory_order_relaxed) % 64 == 63 ? !pick : pick;
  }
  void record(int64_t work, bool threaded, double seconds) {
    std::atomic<double>& r = stats_[bucket(work)].rate[threaded];
    const double rate = static_cast<double>(work) / std::max(seconds, 1e-9), old = r.load(std::memory_order_relaxed);
    r.store(old == 0 ? rate : 0.75 * old + 0.25 * rate, std::memory_order_relaxed);
  }

 private:
  struct Stats {
    std::atomic<double> rate[2] = {0.0, 0.0};  // multiply-adds per second: serial, threaded
    std::atomic<uint64_t> calls{0};
  };
  static int bucket(int64_t work) {  // factors of 4 from 2^20
    int b = 0;
    for (int64_t w = work >> 20; w >= 4 && b < 15; w >>= 2) ++b;
    return b;
  }
  Stats stats_[16];
};

ThreadChoice& thread_choice() {
  static ThreadChoice c;
  return c;
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

namespace {

void check_supported(GemmPath p) {
  if (!gemm_path_supported(p)) {
    throw std::runtime_error(std::string("cpu::gemm: the ") + gemm_path_name(p) + " path needs " + missing_of(p) +
                             ", which this CPU lacks");
  }
}

// K == 0: zeros, or C unchanged when accumulating.
void empty_product(int64_t M, int64_t N, float* c, int64_t ldc, bool accumulate) {
  if (accumulate) return;
  for (int64_t m = 0; m < M; ++m) std::fill(c + m * ldc, c + m * ldc + N, 0.0f);
}

// One term of a product sum: A [M, K] times B [K, N], each as a matrix or as its panels.
struct Term {
  MatrixRef a, b;
  const char* packed_b;  // B's panels (pack_b), or null: packed here from b
  int64_t K;
  const char* packed_a = nullptr;  // A's panels (pack_a), or null: packed here from a
};

// C (+)= sum of the terms' products with kernel mk. Each term adds its K blocks to C in order,
// exactly as one run per term would (accumulating after the first); the terms share one
// parallel region, so several small products are worth threading together.
void run(const MicroKernel& mk, int64_t M, int64_t N, const std::vector<Term>& terms, float* c, int64_t ldc,
         const GemmOptions& options) {
  const bool pairs = mk.panel == Panel::kBf16Pairs;
  const int64_t rp = (M + mk.mr - 1) / mk.mr, cp = (N + mk.nr - 1) / mk.nr;
  const size_t nt = terms.size();
  // Per term: panel words along K, and where its A panels / its B panels (when packed here) start.
  std::vector<int64_t> depth(nt), a_at(nt), b_at(nt);
  int64_t a_words = 0, b_words = 0, work = 0;
  for (size_t t = 0; t < nt; ++t) {
    depth[t] = pairs ? (terms[t].K + 1) / 2 : terms[t].K;
    a_at[t] = a_words, b_at[t] = b_words;
    if (!terms[t].packed_a) a_words += rp * mk.mr * depth[t];
    if (!terms[t].packed_b) b_words += cp * mk.nr * depth[t];
    work += M * N * terms[t].K;
  }

  thread_local Scratch scratch;
  char* pa = static_cast<char*>(scratch.get(pairs, true, static_cast<size_t>(a_words)));
  char* pb = static_cast<char*>(scratch.get(pairs, false, static_cast<size_t>(b_words)));
  constexpr int64_t kWord = 4;

  // One parallel region per call (each costs a wake-up of every thread): tasks split the
  // longer side; each packs the panels of that side it owns and multiplies them with the other
  // operand, packed by the caller beforehand.
  const bool may_thread = options.parallel && *options.parallel && work >= (int64_t{1} << 20);
  const bool threaded = may_thread && thread_choice().threads(work);
  const bool split_n = N >= M;
  const int64_t own = split_n ? cp : rp;
  int64_t per_task = split_n ? mk.nc_panels : mk.mc_panels;
  if (threaded) per_task = std::max<int64_t>(1, std::min(per_task, (own + 7) / 8));  // at least 8 tasks
  const int64_t tasks = (own + per_task - 1) / per_task;
  auto a_panel = [&](size_t t, int64_t p) {
    const char* base = terms[t].packed_a ? terms[t].packed_a : pa + a_at[t] * kWord;
    return base + p * mk.mr * depth[t] * kWord;
  };
  auto b_panel = [&](size_t t, int64_t q) {
    const char* base = terms[t].packed_b ? terms[t].packed_b : pb + b_at[t] * kWord;
    return base + q * mk.nr * depth[t] * kWord;
  };
  // Panels [p0, p1) of term t's A or B.
  auto pack_a = [&](size_t t, int64_t p0, int64_t p1) {
    if (terms[t].packed_a) return;
    pack_panels(terms[t].a, M, terms[t].K, p0, p1, mk.mr, mk.panel, const_cast<char*>(a_panel(t, 0)));
  };
  auto pack_b = [&](size_t t, int64_t q0, int64_t q1) {
    if (terms[t].packed_b) return;
    const MatrixRef& b = terms[t].b;  // B's columns are the rows of its panels
    pack_panels(MatrixRef{b.data, b.dtype, b.cs, b.rs}, N, terms[t].K, q0, q1, mk.nr, mk.panel,
                const_cast<char*>(b_panel(t, 0)));
  };
  // The side every task reads is packed first, by every thread when the product is threaded (the
  // pool's threads wait between two parallel regions; a serial packing phase left one idle).
  const int64_t shared = split_n ? rp : cp;
  const auto pack_shared = [&](int64_t lo, int64_t hi) {
    while (lo < hi) {  // [lo, hi) over the terms' panels in turn
      const size_t t = static_cast<size_t>(lo / shared);
      const int64_t p0 = lo % shared, p1 = std::min(shared, p0 + hi - lo);
      split_n ? pack_a(t, p0, p1) : pack_b(t, p0, p1);
      lo += p1 - p0;
    }
  };
  const auto start = std::chrono::steady_clock::now();
  bool prepacked = true;  // every term's shared side came packed: nothing to do (no region)
  for (const Term& t : terms) prepacked = prepacked && (split_n ? t.packed_a : t.packed_b) != nullptr;
  const int64_t shared_panels = prepacked ? 0 : static_cast<int64_t>(nt) * shared;
  if (threaded && shared_panels > 1) {
    (*options.parallel)(shared_panels, pack_shared);
  } else {
    pack_shared(0, shared_panels);
  }

  auto body = [&](int64_t lo, int64_t hi) {
    alignas(64) float edge[12 * 32];
    for (int64_t task = lo; task < hi; ++task) {
      const int64_t s0 = task * per_task, s1 = std::min(own, s0 + per_task);
      for (size_t t = 0; t < nt; ++t) split_n ? pack_b(t, s0, s1) : pack_a(t, s0, s1);
      const int64_t p0 = split_n ? 0 : s0, p1 = split_n ? rp : s1, q0 = split_n ? s0 : 0, q1 = split_n ? s1 : cp;
      bool first = !options.accumulate;  // the first K block overwrites C
      for (size_t t = 0; t < nt; ++t) {
        for (int64_t d0 = 0; d0 < depth[t]; d0 += mk.kc) {
          const int64_t dn = std::min(mk.kc, depth[t] - d0);
          const bool add = !first;
          first = false;
          for (int64_t i0 = p0; i0 < p1; i0 += mk.mc_panels) {  // an A block of mc x kc stays in L2
            const int64_t i1 = std::min(p1, i0 + mk.mc_panels);
            for (int64_t q = q0; q < q1; ++q) {  // a B micro-panel stays in L1 while the A block streams past
              const char* bq = b_panel(t, q) + d0 * mk.nr * kWord;
              const int64_t n0 = q * mk.nr, cols = std::min<int64_t>(mk.nr, N - n0);
              for (int64_t p = i0; p < i1; ++p) {
                const char* ap = a_panel(t, p) + d0 * mk.mr * kWord;
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
      }
    }
  };
  if (threaded) {
    (*options.parallel)(tasks, body);
  } else {
    body(0, tasks);
  }
  if (may_thread) {
    const std::chrono::duration<double> spent = std::chrono::steady_clock::now() - start;
    thread_choice().record(work, threaded, spent.count());
  }
  scratch.trim();
}

}  // namespace

void gemm(int64_t M, int64_t N, int64_t K, const MatrixRef& a, const MatrixRef& b, float* c, int64_t ldc,
          const GemmOptions& options) {
  if (M <= 0 || N <= 0) return;
  check_supported(options.path);
  if (K <= 0) return empty_product(M, N, c, ldc, options.accumulate);
  run(kernel_for(options.path, a.dtype, b.dtype), M, N, {Term{a, b, nullptr, K}}, c, ldc, options);
}

void pack_b(int64_t K, int64_t N, const MatrixRef& b, Dtype a_dtype, GemmPath path, PackedB& out) {
  pack_b({PackBJob{K, N, b, a_dtype, &out}}, path, nullptr);
}

namespace {

// One operand to pack whole: the R rows of x [R, K] as panels of P rows into `words` (sized here).
struct PanelJob {
  MatrixRef x;
  int64_t R, K;
  int P;
  Panel panel;
  std::vector<uint32_t>* words;
};

// The jobs' panels, split over `parallel`'s threads when there are enough of them.
void pack_jobs(const std::vector<PanelJob>& jobs, const ParallelFor* parallel) {
  std::vector<int64_t> first(jobs.size() + 1, 0);  // panels of the jobs before each one
  int64_t elements = 0;
  for (size_t j = 0; j < jobs.size(); ++j) {
    const PanelJob& job = jobs[j];
    const int64_t depth = job.panel == Panel::kBf16Pairs ? (job.K + 1) / 2 : job.K, n = (job.R + job.P - 1) / job.P;
    job.words->resize(static_cast<size_t>(std::max<int64_t>(0, n * job.P * depth)));
    first[j + 1] = first[j] + (job.K > 0 ? n : 0);
    elements += std::max<int64_t>(0, job.K) * job.R;
  }
  const auto body = [&](int64_t lo, int64_t hi) {
    for (size_t j = 0; j < jobs.size() && lo < hi; ++j) {
      const int64_t q0 = std::max(lo, first[j]), q1 = std::min(hi, first[j + 1]);
      if (q0 >= q1) continue;
      const PanelJob& job = jobs[j];
      pack_panels(job.x, job.R, job.K, q0 - first[j], q1 - first[j], job.P, job.panel, job.words->data());
    }
  };
  // A 128 x 512 fp32 tile and up is worth waking the pool for (packing only moves memory).
  constexpr int64_t kParallelPackElements = int64_t{1} << 16;
  if (parallel && *parallel && first.back() > 1 && elements >= kParallelPackElements) {
    (*parallel)(first.back(), body);
  } else {
    body(0, first.back());
  }
}

}  // namespace

void pack_b(const std::vector<PackBJob>& jobs, GemmPath path, const ParallelFor* parallel) {
  check_supported(path);
  std::vector<PanelJob> panels;
  for (const PackBJob& job : jobs) {
    const MicroKernel mk = kernel_for(path, job.a_dtype, job.b.dtype);
    PackedB& out = *job.out;
    out.path = path, out.a_dtype = job.a_dtype, out.b_dtype = job.b.dtype, out.K = job.K, out.N = job.N;
    // B's columns are the rows of its panels.
    panels.push_back({MatrixRef{job.b.data, job.b.dtype, job.b.cs, job.b.rs}, job.N, job.K, mk.nr, mk.panel, &out.words});
  }
  pack_jobs(panels, parallel);
}

void pack_a(const std::vector<PackAJob>& jobs, GemmPath path, const ParallelFor* parallel) {
  check_supported(path);
  std::vector<PanelJob> panels;
  for (const PackAJob& job : jobs) {
    const MicroKernel mk = kernel_for(path, job.a.dtype, job.b_dtype);
    PackedA& out = *job.out;
    out.path = path, out.a_dtype = job.a.dtype, out.b_dtype = job.b_dtype, out.M = job.M, out.K = job.K;
    panels.push_back({job.a, job.M, job.K, mk.mr, mk.panel, &out.words});
  }
  pack_jobs(panels, parallel);
}

namespace {

// The kernel a product with prepacked B takes; throws when B was packed for another one.
MicroKernel packed_kernel(const GemmOptions& options, Dtype a_dtype, const PackedB& b) {
  check_supported(options.path);
  const MicroKernel mk = kernel_for(options.path, a_dtype, b.b_dtype);
  if (options.path != b.path || mk.tile != kernel_for(b.path, b.a_dtype, b.b_dtype).tile) {
    throw std::invalid_argument(std::string("cpu::gemm: B was packed for the ") + gemm_path_name(b.path) +
                                " path and another A dtype; pack it again for this product");
  }
  return mk;
}

}  // namespace

void gemm(int64_t M, const MatrixRef& a, const PackedB& b, float* c, int64_t ldc, const GemmOptions& options) {
  gemm_sum(M, {GemmTerm{a, &b}}, c, ldc, options);
}

void gemm_sum(int64_t M, const std::vector<GemmTerm>& terms, float* c, int64_t ldc, const GemmOptions& options) {
  if (terms.empty()) throw std::invalid_argument("cpu::gemm_sum: no terms");
  const int64_t N = terms[0].b->N;
  if (M <= 0 || N <= 0) return;
  const MicroKernel mk = packed_kernel(options, terms[0].a.dtype, *terms[0].b);
  std::vector<Term> run_terms;
  run_terms.reserve(terms.size());
  for (const GemmTerm& t : terms) {
    if (t.b->N != N || packed_kernel(options, t.a.dtype, *t.b).tile != mk.tile) {
      throw std::invalid_argument("cpu::gemm_sum: every term needs the same N and the same micro-kernel (dtypes)");
    }
    const PackedA* pa = t.packed_a;
    if (pa && (pa->path != options.path || pa->M != M || pa->K != t.b->K || pa->a_dtype != t.a.dtype ||
               kernel_for(pa->path, pa->a_dtype, pa->b_dtype).tile != mk.tile)) {
      throw std::invalid_argument("cpu::gemm_sum: A was packed for another path, shape or dtypes; pack it again "
                                  "for this product");
    }
    // A term with K == 0 adds nothing (and cannot be the one that overwrites C).
    if (t.b->K > 0) run_terms.push_back(Term{t.a, MatrixRef{nullptr, t.b->b_dtype, 0, 0},
                                             reinterpret_cast<const char*>(t.b->words.data()), t.b->K,
                                             pa ? reinterpret_cast<const char*>(pa->words.data()) : nullptr});
  }
  if (run_terms.empty()) return empty_product(M, N, c, ldc, options.accumulate);
  run(mk, M, N, run_terms, c, ldc, options);
}

}  // namespace neuron::cpu
