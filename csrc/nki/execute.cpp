// The executor: runs a verified program on simulated HBM/SBUF/PSUM.
//
// Every engine decodes its inputs to fp32, computes in fp32 and encodes the result to the
// destination's dtype (numerics.h); copies between tensors of one dtype move bits. Tiles are
// processed whole: an access is gathered into a dense [partitions, free] fp32 buffer, the
// operation runs over it, and the result is scattered back.
#include "nki/execute.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <tuple>
#include <memory>
#include <deque>
#include <stdexcept>
#include <unordered_map>

#include "cpu/gemm_bf16.h"
#include "nki/numerics.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif


namespace neuron::nki {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

float alu(Alu op, float a, float b) {
  switch (op) {
    case Alu::kAdd: return a + b;
    case Alu::kSubtract: return a - b;
    case Alu::kMultiply: return a * b;
    case Alu::kDivide: return a / b;
    case Alu::kMaximum: return std::fmax(a, b);
    case Alu::kMinimum: return std::fmin(a, b);
    case Alu::kPower: return std::pow(a, b);
    case Alu::kAbsMax: return std::fabs(a) >= std::fabs(b) ? a : b;
    case Alu::kAbsMin: return std::fabs(a) <= std::fabs(b) ? a : b;
    case Alu::kEqual: return a == b;
    case Alu::kNotEqual: return a != b;
    case Alu::kGreater: return a > b;
    case Alu::kGreaterEqual: return a >= b;
    case Alu::kLess: return a < b;
    case Alu::kLessEqual: return a <= b;
    case Alu::kLogicalAnd: return (a != 0) && (b != 0);
    case Alu::kLogicalOr: return (a != 0) || (b != 0);
    case Alu::kLogicalXor: return (a != 0) != (b != 0);
    case Alu::kBitwiseAnd: return static_cast<float>(static_cast<int64_t>(a) & static_cast<int64_t>(b));
    case Alu::kBitwiseOr: return static_cast<float>(static_cast<int64_t>(a) | static_cast<int64_t>(b));
    case Alu::kBitwiseXor: return static_cast<float>(static_cast<int64_t>(a) ^ static_cast<int64_t>(b));
    case Alu::kLeftShift: return static_cast<float>(static_cast<uint32_t>(static_cast<int64_t>(a)) << static_cast<int>(b));
    case Alu::kRightShift: return static_cast<float>(static_cast<uint32_t>(static_cast<int64_t>(a)) >> static_cast<int>(b));
    case Alu::kAbs: return std::fabs(a);
    case Alu::kSquare: return a * a;
    case Alu::kRelu: return a > 0 ? a : 0.0f;
    case Alu::kRsqrt: return 1.0f / std::sqrt(a);
    case Alu::kReciprocal: return 1.0f / a;
    case Alu::kBypass: return a;
    case Alu::kAverage: return a + b;  // summed, divided by the count afterwards
  }
  return kNaN;
}

// The same operators on integers, exactly (GpSimd's native int32 path).
int64_t alu_int(Alu op, int64_t a, int64_t b) {
  switch (op) {
    case Alu::kAdd: return a + b;
    case Alu::kSubtract: return a - b;
    case Alu::kMultiply: return a * b;
    case Alu::kDivide: return b == 0 ? 0 : a / b;
    case Alu::kMaximum: return std::max(a, b);
    case Alu::kMinimum: return std::min(a, b);
    case Alu::kEqual: return a == b;
    case Alu::kNotEqual: return a != b;
    case Alu::kGreater: return a > b;
    case Alu::kGreaterEqual: return a >= b;
    case Alu::kLess: return a < b;
    case Alu::kLessEqual: return a <= b;
    case Alu::kLogicalAnd: return a && b;
    case Alu::kLogicalOr: return a || b;
    case Alu::kLogicalXor: return (a != 0) != (b != 0);
    case Alu::kBitwiseAnd: return a & b;
    case Alu::kBitwiseOr: return a | b;
    case Alu::kBitwiseXor: return a ^ b;
    case Alu::kLeftShift: return static_cast<int64_t>(static_cast<uint32_t>(a) << (b & 31));
    case Alu::kRightShift: return static_cast<int64_t>(static_cast<uint32_t>(a) >> (b & 31));
    case Alu::kAbs: return a < 0 ? -a : a;
    case Alu::kSquare: return a * a;
    case Alu::kRelu: return a > 0 ? a : 0;
    case Alu::kBypass: return a;
    case Alu::kAbsMax: return (a < 0 ? -a : a) >= (b < 0 ? -b : b) ? a : b;
    case Alu::kAbsMin: return (a < 0 ? -a : a) <= (b < 0 ? -b : b) ? a : b;
    default: return static_cast<int64_t>(std::nearbyint(alu(op, static_cast<float>(a), static_cast<float>(b))));
  }
}

// Bitwise and shift results keep their low bits; arithmetic results saturate.
bool alu_wraps(Alu op) { return alu_is_bitvec(op); }

bool alu_unary(Alu op) {
  return op == Alu::kAbs || op == Alu::kSquare || op == Alu::kRelu || op == Alu::kRsqrt || op == Alu::kReciprocal ||
         op == Alu::kBypass;
}

float identity_of(Alu op) {
  switch (op) {
    case Alu::kMultiply: case Alu::kLogicalAnd: return 1.0f;
    case Alu::kMaximum: return -std::numeric_limits<float>::infinity();
    case Alu::kMinimum: return std::numeric_limits<float>::infinity();
    case Alu::kBitwiseAnd: return -1.0f;
    default: return 0.0f;
  }
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

float act(Act op, float x) {
  constexpr float kInvSqrt2 = 0.70710678118654752f;
  constexpr float kInvSqrtPi2 = 0.3989422804014327f;  // 1/sqrt(2*pi)
  switch (op) {
    case Act::kCopy: return x;
    case Act::kExp: return std::exp(x);
    case Act::kLog: return std::log(x);
    case Act::kTanh: return std::tanh(x);
    case Act::kSigmoid: return sigmoid(x);
    case Act::kRelu: return x > 0 ? x : 0.0f;
    case Act::kGelu: return 0.5f * x * (1.0f + std::erf(x * kInvSqrt2));
    case Act::kGeluApprxTanh:
      return 0.5f * x * (1.0f + std::tanh(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    case Act::kGeluApprxSigmoid: return x * sigmoid(1.702f * x);
    case Act::kSilu: return x * sigmoid(x);
    case Act::kSqrt: return std::sqrt(x);
    case Act::kRsqrt: return 1.0f / std::sqrt(x);
    case Act::kReciprocal: return 1.0f / x;
    case Act::kSquare: return x * x;
    case Act::kAbs: return std::fabs(x);
    case Act::kSign: return static_cast<float>((x > 0) - (x < 0));
    case Act::kSin: return std::sin(x);
    case Act::kCos: return std::cos(x);
    case Act::kArctan: return std::atan(x);
    case Act::kSoftplus: return softplus(x);
    case Act::kMish: return x * std::tanh(softplus(x));
    case Act::kErf: return std::erf(x);
    case Act::kGeluDx:
      return 0.5f * (1.0f + std::erf(x * kInvSqrt2)) + x * kInvSqrtPi2 * std::exp(-0.5f * x * x);
    case Act::kSiluDx: { float s = sigmoid(x); return s * (1.0f + x * (1.0f - s)); }
    case Act::kErfDx: return 1.1283791670955126f * std::exp(-x * x);
    case Act::kNegative: return -x;
  }
  return kNaN;
}

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

ParallelFor& parallel_hook() {
  static ParallelFor hook;
  return hook;
}

// Large tiles split their row blocks over the host's threads (results do not depend on the split).
void matmul_tile(const float* S, int64_t lds, const float* V, int64_t ldv, float* R, int64_t K, int64_t M,
                 int64_t N) {
  const ParallelFor& par = parallel_hook();
  const int64_t blocks = (M + 7) / 8;
  if (!par || K * M * N < (1 << 20) || blocks < 2) return matmul_rows(S, lds, V, ldv, R, K, N, 0, M);
  par(blocks, [&](int64_t b, int64_t e) {
    matmul_rows(S, lds, V, ldv, R, K, N, b * 8, std::min<int64_t>(M, e * 8));
  });
}

// Calls f(element_offset, element_stride, count, dense_index) for each innermost run of a.
template <class F>
void for_runs(const Access& a, F&& f) {
  const size_t nd = a.dims.size();
  if (nd == 0) {
    f(a.offset, 1, 1, 0);
    return;
  }
  const int64_t inner = a.dims[nd - 1].size, inner_stride = a.dims[nd - 1].stride;
  int64_t idx[8] = {0};
  int64_t dense = 0;
  int64_t outer = 1;
  for (size_t i = 0; i + 1 < nd; ++i) outer *= a.dims[i].size;
  for (int64_t r = 0; r < outer; ++r) {
    int64_t off = a.offset;
    for (size_t i = 0; i + 1 < nd; ++i) off += idx[i] * a.dims[i].stride;
    f(off, inner_stride, inner, dense);
    dense += inner;
    for (int64_t i = static_cast<int64_t>(nd) - 2; i >= 0; --i) {
      if (++idx[i] < a.dims[i].size) break;
      idx[i] = 0;
    }
  }
}

PrintSink& print_hook() {
  static PrintSink hook;
  return hook;
}

// Hands a device_print's values to the host's sink, or writes them to stdout.
void emit_print(const PrintedTensor& t) {
  if (const PrintSink& sink = print_hook()) return sink(t);
  std::cout << format_printed(t) << std::endl;  // endl flushes: in order with the host's own output
}

}  // namespace

void set_parallel_for(ParallelFor f) { parallel_hook() = std::move(f); }
void set_print_sink(PrintSink f) { print_hook() = std::move(f); }

std::string format_printed(const PrintedTensor& t) {
  const size_t nd = t.shape.size();
  std::vector<int64_t> stride(nd + 1, 1);  // elements per index of each dimension
  for (size_t d = nd; d-- > 0;) stride[d] = stride[d + 1] * t.shape[d];
  const bool summarize = stride[0] > 1000;
  std::string out = t.label + " ";
  auto value = [&](int64_t i) {
    if (t.dtype == DType::kBool) return std::string(t.ints[i] ? "True" : "False");
    char b[40];
    if (is_float(t.dtype)) {
      std::snprintf(b, sizeof b, "%.9g", static_cast<double>(t.floats[i]));  // 9 digits tell any two fp32 apart
    } else {
      std::snprintf(b, sizeof b, "%lld", static_cast<long long>(t.ints[i]));
    }
    return std::string(b);
  };
  auto rows = [&](auto&& self, size_t d, int64_t at) -> void {
    if (d == nd) {
      out += value(at);
      return;
    }
    std::string sep(d + 1 == nd ? 1 : d + 2, ' ');  // " " between values, newline + indent between rows
    if (d + 1 < nd) sep[0] = '\n';
    out += '[';
    for (int64_t i = 0; i < t.shape[d]; ++i) {
      if (i > 0) out += sep;
      if (summarize && t.shape[d] > 6 && i == 3) {
        out += "...";
        out += sep;
        i = t.shape[d] - 3;
      }
      self(self, d + 1, at + i * stride[d + 1]);
    }
    out += ']';
  };
  rows(rows, 0, 0);
  return out;
}

struct Program::State {
  State(Program& program, const std::vector<void*>& external) : p(program), ext(external) {}
  Program& p;
  const std::vector<void*>& ext;
  float act_regs[128] = {};  // Scalar engine's per-partition reduce registers
  float vec_regs[128] = {};  // Vector engine's accumulator (shared by its reducing instructions)
  std::vector<float> buf[6];

  uint8_t* base(int t) const {
    const TensorDecl& d = p.k_.tensors[t];
    if (d.external >= 0) return static_cast<uint8_t*>(ext.at(d.external));
    return p.arena_.data() + p.offset_[t];
  }
  DType dt(const Access& a) const { return p.k_.tensors[a.tensor].dtype; }
  Buffer bufkind(const Access& a) const { return p.k_.tensors[a.tensor].buffer; }

  float* gather(const Access& a, int slot) {
    std::vector<float>& v = buf[slot];
    v.resize(a.elements());
    const DType d = dt(a);
    const size_t es = dtype_size(d);
    uint8_t* b = base(a.tensor);
    for_runs(a, [&](int64_t off, int64_t stride, int64_t n, int64_t at) { decode_run(d, b + off * es, stride, n, v.data() + at); });
    return v.data();
  }
  void scatter(const Access& a, const float* in) {
    const DType d = dt(a);
    const size_t es = dtype_size(d);
    uint8_t* b = base(a.tensor);
    for_runs(a, [&](int64_t off, int64_t stride, int64_t n, int64_t at) { encode_run(d, in + at, n, b + off * es, stride); });
  }
  int64_t* gather_int(const Access& a, std::vector<int64_t>& v) {
    v.resize(a.elements());
    const DType d = dt(a);
    const size_t es = dtype_size(d);
    uint8_t* b = base(a.tensor);
    for_runs(a, [&](int64_t off, int64_t stride, int64_t n, int64_t at) { decode_int_run(d, b + off * es, stride, n, v.data() + at); });
    return v.data();
  }
  void scatter_int(const Access& a, const int64_t* in, bool wrap) {
    const DType d = dt(a);
    const size_t es = dtype_size(d);
    uint8_t* b = base(a.tensor);
    for_runs(a, [&](int64_t off, int64_t stride, int64_t n, int64_t at) { encode_int_run(d, in + at, n, b + off * es, stride, wrap); });
  }
  std::vector<int64_t> ibuf[2];

  // An access's elements as raw bytes, densely in access order (and back).
  void gather_raw(const Access& a, std::vector<uint8_t>& out) {
    const size_t es = dtype_size(dt(a));
    if (a.index.present()) {  // a vector index (indirect dma_transpose; exec_dynamic checked the rows)
      out.clear();
      std::vector<uint8_t> row_bytes;
      int64_t v;
      for (int64_t w = 0; w < a.dims[0].size; ++w) {
        gather_raw(resolved(a, w, &v), row_bytes);
        out.insert(out.end(), row_bytes.begin(), row_bytes.end());
      }
      return;
    }
    out.resize(a.elements() * es);
    const uint8_t* b = base(a.tensor);
    for_runs(a, [&](int64_t off, int64_t stride, int64_t n, int64_t at) {
      for (int64_t i = 0; i < n; ++i) std::memcpy(out.data() + (at + i) * es, b + (off + i * stride) * es, es);
    });
  }
  void scatter_raw(const Access& a, const std::vector<uint8_t>& in) {
    const size_t es = dtype_size(dt(a));
    uint8_t* b = base(a.tensor);
    for_runs(a, [&](int64_t off, int64_t stride, int64_t n, int64_t at) {
      for (int64_t i = 0; i < n; ++i) std::memcpy(b + (off + i * stride) * es, in.data() + (at + i) * es, es);
    });
  }
  std::vector<uint8_t> raw_[3];

  // reduce_cmd (nisa.reduce_cmd): idle 0, reset 1, reduce 2, reset_reduce 3, load_reduce 4.
  static bool accumulates(int64_t cmd) { return cmd >= 2; }
  void acc_start(float* regs, int64_t cmd, Alu op, const std::vector<float>& init, int64_t P) {
    if (cmd == 1 || cmd == 3) std::fill(regs, regs + P, identity_of(op));
    if (cmd == 4) {
      if (static_cast<int64_t>(init.size()) >= P) std::copy(init.begin(), init.begin() + P, regs);
      else std::fill(regs, regs + P, identity_of(op));
    }
  }
  void acc_write(const Access& res, const float* regs, int64_t P, bool negate = false) {
    if (!res.present()) return;
    std::vector<float>& v = buf[5];
    v.assign(regs, regs + P);
    if (negate) for (float& x : v) x = -x;
    scatter(res, v.data());
  }

  // Same-dtype copy: bits move unchanged (integers above 2**24, NaN payloads).
  void copy_raw(const Access& dst, const Access& src) {
    switch (dtype_size(dt(src))) {  // element-typed loops for the strided runs (transposing DMAs)
      case 4: return copy_raw_as<uint32_t>(dst, src);
      case 2: return copy_raw_as<uint16_t>(dst, src);
      default: return copy_raw_as<uint8_t>(dst, src);
    }
  }
  template <class E>
  void copy_raw_as(const Access& dst, const Access& src) {
    std::vector<E> tmp(src.elements());
    const E* sb = reinterpret_cast<const E*>(base(src.tensor));
    for_runs(src, [&](int64_t off, int64_t stride, int64_t n, int64_t at) {
      for (int64_t i = 0; i < n; ++i) tmp[at + i] = sb[off + i * stride];
    });
    E* db = reinterpret_cast<E*>(base(dst.tensor));
    for_runs(dst, [&](int64_t off, int64_t stride, int64_t n, int64_t at) {
      for (int64_t i = 0; i < n; ++i) db[off + i * stride] = tmp[at + i];
    });
  }
  // Elements per partition row when an access's free elements are contiguous, else -1.
  static int64_t dense_row(const Access& a, int64_t* ld) {
    if (a.dims.empty()) return -1;
    int64_t expect = 1;
    for (size_t i = a.dims.size() - 1; i >= 1; --i) {
      if (a.dims[i].size != 1 && a.dims[i].stride != expect) return -1;
      expect *= a.dims[i].size;
    }
    *ld = a.dims[0].size == 1 ? expect : a.dims[0].stride;
    return expect;
  }

  void copy(const Access& dst, const Access& src) {
    int64_t lds, ldd;
    const int64_t ns = dense_row(src, &lds), nd = dense_row(dst, &ldd);
    // Row by row without staging, unless source and destination share a tensor (they may overlap).
    if (ns > 0 && ns == nd && src.dims[0].size == dst.dims[0].size && src.tensor != dst.tensor) {
      const DType sd = dt(src), dd = dt(dst);
      const size_t ss = dtype_size(sd), ds = dtype_size(dd);
      const uint8_t* sp = base(src.tensor) + src.offset * ss;
      uint8_t* dp = base(dst.tensor) + dst.offset * ds;
      std::vector<float>& row = buf[5];
      if (sd != dd) row.resize(ns);
      for (int64_t p = 0; p < src.dims[0].size; ++p) {
        if (sd == dd) {
          std::memmove(dp + p * ldd * ds, sp + p * lds * ss, ns * ss);
        } else {
          decode_run(sd, sp + p * lds * ss, 1, ns, row.data());
          encode_run(dd, row.data(), ns, dp + p * ldd * ds, 1);
        }
      }
      return;
    }
    if (dt(dst) == dt(src)) return copy_raw(dst, src);
    scatter(dst, gather(src, 0));
  }
  // The per-partition value of an optional (P, 1) operand, or the immediate.
  std::vector<float> column(const Access& a, double imm, int64_t P, int slot) {
    std::vector<float> c(P, static_cast<float>(imm));
    if (a.present()) {
      const float* v = gather(a, slot);
      std::copy(v, v + P, c.begin());
    }
    return c;
  }

  // An fp32 access whose free elements are contiguous in every partition: its memory, read in
  // place, with *ld elements between partitions.
  const float* dense_f32(const Access& a, int64_t* ld) {
    if (dt(a) != DType::kFloat32 || dense_row(a, ld) < 0) return nullptr;
    return reinterpret_cast<const float*>(base(a.tensor)) + a.offset;
  }

  // Marks/queries "a matmul has written this PSUM element" (first write overwrites).
  uint8_t* written_flags(int t) { return p.psum_written_.data() + p.offset_[t]; }

  void matmul(const Instr& in) {
    const Access &dst = in.args[0], &st = in.args[1], &mv = in.args[2];
    const int64_t K = st.partitions(), M = st.free_elements(), N = mv.free_elements();
    std::vector<float>& R = buf[3];
    R.resize(M * N);
#if defined(__x86_64__) && defined(__GNUC__)
    if (dt(st) == DType::kBFloat16 && dt(mv) == DType::kBFloat16 && neuron::cpu::has_avx512_bf16()) {
      const int64_t K2 = (K + 1) / 2;
      pack_pairs(st, K, M, packed_s_);
      // The moving tile is often the same SBUF data for many matmuls (one column block of b
      // against every row block): pack it once per version of its tensor.
      const uint32_t* vp;
      PackedOperand& pm = packed_moving_[(static_cast<int64_t>(mv.tensor) << 40) ^ mv.offset];
      if (pm.version == version_[mv.tensor] && pm.offset == mv.offset && same_dims(pm.dims, mv.dims)) {
        vp = pm.data.data();
      } else {
        pack_pairs(mv, K, N, pm.data);
        pm.version = version_[mv.tensor], pm.offset = mv.offset, pm.dims = mv.dims;
        vp = pm.data.data();
      }
      // Straight into an fp32 PSUM tile when every element of it is in the same state (all
      // fresh: overwrite; all written, or accumulate=True: add), else through R.
      float* out = R.data();
      int64_t ldo = N;
      bool add = false, direct = false;
      int64_t ldd;
      if (float* d = const_cast<float*>(dense_f32(dst, &ldd))) {
        const int64_t acc_mode = in.ints.empty() ? -1 : in.ints[0];
        uint8_t* w = written_flags(dst.tensor) + (d - reinterpret_cast<float*>(base(dst.tensor)));
        bool all = true, none = true;
        for (int64_t m = 0; m < M && (all || none); ++m) {
          all = all && std::memchr(w + m * ldd, 0, N) == nullptr;
          none = none && std::memchr(w + m * ldd, 1, N) == nullptr;
        }
        if (acc_mode == 1 || (acc_mode == -1 && all)) direct = true, add = true;
        else if (acc_mode == 0 || (acc_mode == -1 && none)) direct = true, add = false;
        if (direct) {
          out = d, ldo = ldd;
          for (int64_t m = 0; m < M; ++m) std::memset(w + m * ldd, 1, N);
        }
      }
      const int64_t blocks = (M + kBf16Rows - 1) / kBf16Rows;
      const ParallelFor& par = parallel_hook();
      if (par && K * M * N >= (1 << 20) && blocks > 1) {
        par(blocks, [&](int64_t b, int64_t e) {
          matmul_bf16_rows(packed_s_.data(), vp, out, ldo, add, K2, M, N, b * kBf16Rows,
                           std::min(M, e * kBf16Rows));
        });
      } else {
        matmul_bf16_rows(packed_s_.data(), vp, out, ldo, add, K2, M, N, 0, M);
      }
      if (!direct) accumulate_psum(in, dst, R, M, N);
      return;
    }
#endif
    int64_t lds = M, ldv = N;
    const float* S = dense_f32(st, &lds);  // [K, M] rows, read in place when possible
    if (!S) S = gather(st, 1), lds = M;
    const float* V = dense_f32(mv, &ldv);  // [K, N]
    if (!V) V = gather(mv, 2), ldv = N;
    matmul_tile(S, lds, V, ldv, R.data(), K, M, N);
    accumulate_psum(in, dst, R, M, N);
  }

  // bf16 operand [K, X] -> (k even, k odd) pairs per column: out[(k / 2) * X + x].
  std::vector<uint32_t> packed_s_;
  struct PackedOperand {
    int64_t version = -1, offset = 0;
    std::vector<Dim> dims;
    std::vector<uint32_t> data;
  };
  std::unordered_map<int64_t, PackedOperand> packed_moving_;  // by (tensor, offset)
  std::unordered_map<int, int64_t> version_;
  static bool same_dims(const std::vector<Dim>& x, const std::vector<Dim>& y) {
    if (x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i].stride != y[i].stride || x[i].size != y[i].size) return false;
    return true;
  }
  void pack_pairs(const Access& a, int64_t K, int64_t X, std::vector<uint32_t>& out) {
    const uint16_t* rows;
    int64_t ld;
    uint8_t* b = base(a.tensor);
    if (dense_row(a, &ld) == X) {  // partition rows of contiguous elements: read in place
      rows = reinterpret_cast<const uint16_t*>(b) + a.offset;
    } else {
      std::vector<uint16_t>& bits = bits16_;
      bits.resize(K * X);
      for_runs(a, [&](int64_t off, int64_t stride, int64_t n, int64_t at) {
        for (int64_t i = 0; i < n; ++i) std::memcpy(&bits[at + i], b + (off + i * stride) * 2, 2);
      });
      rows = bits.data();
      ld = X;
    }
    const int64_t K2 = (K + 1) / 2;
    out.resize(K2 * X);
    for (int64_t k = 0; k < K2; ++k) {
      const uint16_t* even = rows + 2 * k * ld;
      uint32_t* o = out.data() + k * X;
      if (2 * k + 1 < K) {
        const uint16_t* odd = even + ld;
        for (int64_t x = 0; x < X; ++x) o[x] = even[x] | (static_cast<uint32_t>(odd[x]) << 16);
      } else {
        for (int64_t x = 0; x < X; ++x) o[x] = even[x];
      }
    }
  }
  std::vector<uint16_t> bits16_;

  void accumulate_psum(const Instr& in, const Access& dst, const std::vector<float>& R, int64_t M, int64_t N) {
    // PSUM: accumulate=None -> the first matmul write to an element overwrites it, later
    // ones add; accumulate=False always overwrites, True always adds.
    const int64_t acc = in.ints.empty() ? -1 : in.ints[0];
    uint8_t* flags = written_flags(dst.tensor);
    int64_t ldd;
    if (float* d = const_cast<float*>(dense_f32(dst, &ldd))) {  // fp32 PSUM: update in place
      const int64_t f0 = d - reinterpret_cast<float*>(base(dst.tensor));
      for (int64_t m = 0; m < M; ++m) {
        float* row = d + m * ldd;
        uint8_t* w = flags + f0 + m * ldd;
        const float* r = R.data() + m * N;
        // A row is usually all written (accumulating) or all fresh (the first matmul).
        const bool all_written = acc == 1 || (acc == -1 && std::memchr(w, 0, N) == nullptr);
        const bool none_written = acc == 0 || (acc == -1 && !all_written && std::memchr(w, 1, N) == nullptr);
        if (all_written) {
          for (int64_t n = 0; n < N; ++n) row[n] += r[n];
        } else if (none_written) {
          std::memcpy(row, r, N * sizeof(float));
        } else {
          for (int64_t n = 0; n < N; ++n) row[n] = w[n] ? row[n] + r[n] : r[n];
        }
        std::memset(w, 1, N);
      }
      return;
    }
    float* old = gather(dst, 0);
    int64_t i = 0;
    for_runs(dst, [&](int64_t off, int64_t stride, int64_t n, int64_t at) {
      for (int64_t j = 0; j < n; ++j, ++i) {
        uint8_t& w = flags[off + j * stride];
        const bool add = acc == 1 || (acc == -1 && w);
        old[at + j] = add ? old[at + j] + R[at + j] : R[at + j];
        w = 1;
      }
    });
    scatter(dst, old);
  }

  void transpose(const Instr& in) {
    const Access &dst = in.args[0], &src = in.args[1];
    const int64_t P = src.partitions(), F = src.free_elements();
    const float* x = gather(src, 0);
    std::vector<float>& y = buf[1];
    y.resize(P * F);
    for (int64_t p = 0; p < P; ++p)
      for (int64_t f = 0; f < F; ++f) y[f * P + p] = x[p * F + f];
    scatter(dst, y.data());
  }

  void affine(const Instr& in, int first_pair, const Access& dst, std::vector<float>& out) {
    std::vector<int64_t>& v = ibuf[1];
    affine_int(in, first_pair, dst, v);
    out.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i]);
  }

  // iota's value per element, computed in int32 (wrapping) as GpSimd does.
  void affine_int(const Instr& in, int first_pair, const Access& dst, std::vector<int64_t>& out) {
    const int64_t P = dst.partitions(), F = dst.free_elements();
    const int64_t offset = in.ints[first_pair - 2], cm = in.ints[first_pair - 1];
    std::vector<std::pair<int64_t, int64_t>> pat;  // (step, num), outermost first
    for (size_t i = first_pair; i + 1 < in.ints.size(); i += 2) pat.emplace_back(in.ints[i], in.ints[i + 1]);
    out.resize(P * F);
    for (int64_t p = 0; p < P; ++p) {
      for (int64_t f = 0; f < F; ++f) {
        int64_t v = offset + p * cm, rem = f;
        for (int64_t k = static_cast<int64_t>(pat.size()) - 1; k >= 0; --k) {
          v += (rem % pat[k].second) * pat[k].first;
          rem /= pat[k].second;
        }
        out[p * F + f] = static_cast<int32_t>(static_cast<uint32_t>(v));
      }
    }
  }

  // Run-time offsets (DynamicIndex): the offsets are read when the instruction runs, which then
  // runs with static ones; a vector index, one row per value. An offset that puts the access
  // outside its tensor raises, or (dma_copy's oob_mode.skip) skips the instruction / row.
  int64_t index_value(const DynamicIndex& ix, int64_t i) {
    const DType d = p.k_.tensors[ix.tensor].dtype;
    int64_t v = 0;
    decode_int_run(d, base(ix.tensor) + (ix.offset + i * ix.step) * dtype_size(d), 1, 1, &v);
    return v;
  }
  bool in_bounds(const Access& a) const {
    const auto [lo, hi] = a.span();
    return lo >= 0 && hi < p.k_.tensors[a.tensor].elements();
  }
  // The access with its run-time index applied: the whole access for a scalar index, row w of
  // dims[0] for a vector one. *value is the index read.
  Access resolved(const Access& a, int64_t w, int64_t* value) {
    Access r = a;
    *value = index_value(a.index, a.index.vector ? w : 0);
    r.offset += *value * a.index.stride;
    if (a.index.vector) r.dims[0].size = 1;
    r.index = {};
    return r;
  }
  [[noreturn]] void out_of_bounds(const Instr& in, const Access& a, int64_t value) const {
    const TensorDecl& t = p.k_.tensors[a.tensor];
    throw std::out_of_range(in.loc.file + ":" + std::to_string(in.loc.line) + ": " + op_name(in.op) +
                            ": the run-time offset " + std::to_string(value) + " puts the access to '" + t.name +
                            "' outside the tensor (" + std::to_string(t.elements()) + " elements)" +
                            (in.op == Op::kDmaCopy ? "; nisa.dma_copy(..., oob_mode=nisa.oob_mode.skip) skips such "
                                                     "accesses"
                                                   : ""));
  }
  void exec_dynamic(const Instr& in) {
    const bool skip = (in.op == Op::kDmaCopy || in.op == Op::kDmaCompute) && !in.ints.empty() && in.ints[0] == 1;
    Instr r = in;
    std::vector<size_t> vec;  // operands with a vector index (a read-modify-write has two)
    int64_t v;
    for (size_t i = 0; i < r.args.size(); ++i) {
      Access& a = r.args[i];
      if (!a.present() || !a.index.present()) continue;
      if (a.index.vector) {
        vec.push_back(i);
        continue;
      }
      a = resolved(a, 0, &v);
      if (!in_bounds(a)) {
        if (skip) return;
        out_of_bounds(in, a, v);
      }
    }
    if (vec.empty()) return exec(r);
    const int64_t n = r.args[vec[0]].dims[0].size;  // the verifier made every operand's dims[0] n long
    if (in.op == Op::kDmaTranspose) {  // its source is gathered row by row (gather_raw), then transposed
      for (int64_t w = 0; w < n; ++w) {
        const Access row = resolved(r.args[vec[0]], w, &v);
        if (!in_bounds(row)) out_of_bounds(in, row, v);
      }
      return exec(r);
    }
    for (int64_t w = 0; w < n; ++w) {
      Instr row = r;
      bool outside = false;
      for (size_t i = 0; i < row.args.size(); ++i) {
        Access& a = row.args[i];
        if (!a.present()) continue;
        if (a.index.present()) {
          a = resolved(a, w, &v);
          if (!in_bounds(a)) {
            if (!skip) out_of_bounds(in, a, v);
            outside = true;
          }
        } else {
          a.offset += w * a.dims[0].stride;
          a.dims[0].size = 1;
        }
      }
      if (!outside) exec(row);
    }
  }
  void run(const Instr& in) {
    for (const Access& a : in.args) {
      if (a.present() && a.index.present()) return exec_dynamic(in);
    }
    exec(in);
  }

  void exec(const Instr& in) {
    const auto& a = in.args;
    // Whatever an instruction may write gets a new version (matmul writes only PSUM), so a
    // packed copy of an operand is reused only while its tensor is unchanged.
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].present() && (in.op != Op::kMatmul || i == 0) && in.op != Op::kDevicePrint) ++version_[a[i].tensor];
    }
    switch (in.op) {
      case Op::kDmaCopy:
      case Op::kTensorCopy:
        copy(a[0], a[1]);
        return;
      case Op::kMemset: {
        if (!is_float(dt(a[0]))) {  // integers exactly (a float would round above 2**24)
          std::vector<int64_t>& v = ibuf[0];
          v.assign(a[0].elements(), static_cast<int64_t>(std::nearbyint(in.floats.at(0))));
          scatter_int(a[0], v.data(), false);
          return;
        }
        std::vector<float>& v = buf[0];
        v.assign(a[0].elements(), static_cast<float>(in.floats.at(0)));
        scatter(a[0], v.data());
        return;
      }
      case Op::kIota:
        if (!is_float(dt(a[0]))) {
          affine_int(in, 2, a[0], ibuf[0]);
          scatter_int(a[0], ibuf[0].data(), true);
          return;
        }
        affine(in, 2, a[0], buf[0]);
        scatter(a[0], buf[0].data());
        return;
      case Op::kAffineSelect: {
        affine(in, 3, a[0], buf[4]);
        const Alu cmp = static_cast<Alu>(in.ints[0]);
        float* t = gather(a[1], 1);
        const float f = static_cast<float>(in.floats.at(0));
        for (size_t i = 0; i < buf[4].size(); ++i) t[i] = alu(cmp, buf[4][i], 0.0f) != 0 ? t[i] : f;
        scatter(a[0], t);
        return;
      }
      case Op::kMatmul: matmul(in); return;
      case Op::kTranspose: transpose(in); return;
      case Op::kTensorTensor: {
        const Alu op = static_cast<Alu>(in.ints[0]);
        if (!is_float(dt(a[0])) && !is_float(dt(a[1])) && !is_float(dt(a[2]))) {  // integers: exact
          int64_t* x = gather_int(a[1], ibuf[0]);
          const int64_t* y = gather_int(a[2], ibuf[1]);
          for (int64_t i = 0, n = a[0].elements(); i < n; ++i) x[i] = alu_int(op, x[i], y[i]);
          scatter_int(a[0], x, alu_wraps(op));
          return;
        }
        float* x = gather(a[1], 0);
        const float* y = gather(a[2], 1);
        const int64_t n = a[0].elements();
        switch (op) {  // the hot ones without the switch per element
          case Alu::kAdd: for (int64_t i = 0; i < n; ++i) x[i] += y[i]; break;
          case Alu::kSubtract: for (int64_t i = 0; i < n; ++i) x[i] -= y[i]; break;
          case Alu::kMultiply: for (int64_t i = 0; i < n; ++i) x[i] *= y[i]; break;
          default: for (int64_t i = 0; i < n; ++i) x[i] = alu(op, x[i], y[i]);
        }
        scatter(a[0], x);
        return;
      }
      case Op::kTensorScalar: {
        const int64_t P = a[1].partitions(), F = a[1].free_elements();
        if (!is_float(dt(a[0])) && !is_float(dt(a[1])) && !a[2].present() && !a[3].present()) {
          const Alu op0 = static_cast<Alu>(in.ints[0]);
          const bool rev0 = in.ints[1], has1 = in.ints[2] >= 0, rev1 = in.ints[3];
          const Alu op1 = has1 ? static_cast<Alu>(in.ints[2]) : Alu::kBypass;
          const int64_t v0 = static_cast<int64_t>(std::nearbyint(in.floats.at(0)));
          const int64_t v1 = static_cast<int64_t>(std::nearbyint(in.floats.at(1)));
          int64_t* x = gather_int(a[1], ibuf[0]);
          for (int64_t i = 0; i < P * F; ++i) {
            int64_t t = alu_unary(op0) ? alu_int(op0, x[i], 0) : rev0 ? alu_int(op0, v0, x[i]) : alu_int(op0, x[i], v0);
            if (has1) t = alu_unary(op1) ? alu_int(op1, t, 0) : rev1 ? alu_int(op1, v1, t) : alu_int(op1, t, v1);
            x[i] = t;
          }
          scatter_int(a[0], x, alu_wraps(op0) || (has1 && alu_wraps(op1)));
          return;
        }
        float* x = gather(a[1], 0);
        const Alu op0 = static_cast<Alu>(in.ints[0]);
        const bool rev0 = in.ints[1];
        const std::vector<float> c0 = column(a[2], in.floats.at(0), P, 1);
        const bool has1 = in.ints[2] >= 0;
        const Alu op1 = has1 ? static_cast<Alu>(in.ints[2]) : Alu::kBypass;
        const bool rev1 = in.ints[3];
        const std::vector<float> c1 = column(a[3], in.floats.at(1), P, 1);
        for (int64_t p = 0; p < P; ++p) {
          float* r = x + p * F;
          const float v0 = c0[p], v1 = c1[p];
          for (int64_t f = 0; f < F; ++f) {
            float t = alu_unary(op0) ? alu(op0, r[f], 0) : rev0 ? alu(op0, v0, r[f]) : alu(op0, r[f], v0);
            if (has1) t = alu_unary(op1) ? alu(op1, t, 0) : rev1 ? alu(op1, v1, t) : alu(op1, t, v1);
            r[f] = t;
          }
        }
        scatter(a[0], x);
        return;
      }
      case Op::kActivation: {
        const int64_t P = a[1].partitions(), F = a[1].free_elements();
        float* x = gather(a[1], 0);
        const Act fn = static_cast<Act>(in.ints[0]);
        const int64_t cmd = in.ints[1];
        const std::vector<float> bias = column(a[2], in.floats.at(1), P, 1);
        const std::vector<float> scale = column(a[3], in.floats.at(0), P, 2);
        if (cmd == 1 || cmd == 3) std::fill(act_regs, act_regs + 128, 0.0f);
        for (int64_t p = 0; p < P; ++p) {
          float* r = x + p * F;
          float sum = 0.0f;
          for (int64_t f = 0; f < F; ++f) {
            r[f] = act(fn, r[f] * scale[p] + bias[p]);
            sum += r[f];
          }
          if (cmd == 2 || cmd == 3) act_regs[p] += sum;
        }
        scatter(a[0], x);
        if (a[4].present()) scatter(a[4], act_regs);
        return;
      }
      case Op::kTensorReduce: {
        const Alu op = static_cast<Alu>(in.ints[0]);
        const bool negate = in.ints[1];
        const int64_t naxes = static_cast<int64_t>(in.ints.size()) - 2;
        int64_t R = 1;
        for (int64_t i = 0; i < naxes; ++i) R *= a[1].dims[a[1].dims.size() - 1 - i].size;
        const float* x = gather(a[1], 0);
        const int64_t groups = a[1].elements() / R;
        std::vector<float>& out = buf[1];
        out.resize(groups);
        for (int64_t g = 0; g < groups; ++g) {
          float acc = identity_of(op);
          const float* r = x + g * R;
          if (op == Alu::kAdd) {
            for (int64_t j = 0; j < R; ++j) acc += r[j];
          } else {
            for (int64_t j = 0; j < R; ++j) acc = alu(op, acc, r[j]);
          }
          out[g] = negate ? -acc : acc;
        }
        scatter(a[0], out.data());
        return;
      }
      case Op::kTensorTensorScan: {
        const int64_t P = a[1].partitions(), F = a[1].free_elements();
        float* x = gather(a[1], 0);
        const float* y = gather(a[2], 1);
        const Alu op0 = static_cast<Alu>(in.ints[0]), op1 = static_cast<Alu>(in.ints[1]);
        const bool rev0 = in.ints[2], rev1 = in.ints[3];
        const std::vector<float> init = column(a[3], in.floats.at(0), P, 2);
        for (int64_t p = 0; p < P; ++p) {
          float prev = init[p];
          for (int64_t f = 0; f < F; ++f) {
            const int64_t i = p * F + f;
            float t = rev0 ? alu(op0, prev, x[i]) : alu(op0, x[i], prev);
            prev = rev1 ? alu(op1, y[i], t) : alu(op1, t, y[i]);
            x[i] = prev;
          }
        }
        scatter(a[0], x);
        return;
      }
      case Op::kBnStats: {
        const int64_t P = a[1].partitions(), F = a[1].free_elements();
        const float* x = gather(a[1], 0);
        std::vector<float>& out = buf[1];
        out.assign(P * 6, 0.0f);
        for (int64_t p = 0; p < P; ++p) {
          for (int par = 0; par < 2; ++par) {
            double n = 0, mean = 0, m2 = 0;
            for (int64_t f = par; f < F; f += 2) {
              n += 1;
              double d = x[p * F + f] - mean;
              mean += d / n;
              m2 += d * (x[p * F + f] - mean);
            }
            out[p * 6 + par * 3 + 0] = static_cast<float>(n);
            out[p * 6 + par * 3 + 1] = static_cast<float>(mean);
            out[p * 6 + par * 3 + 2] = static_cast<float>(m2);
          }
        }
        scatter(a[0], out.data());
        return;
      }
      case Op::kBnAggr: {
        const int64_t P = a[1].partitions(), F = a[1].free_elements();
        const float* x = gather(a[1], 0);
        std::vector<float>& out = buf[1];
        out.assign(P * 2, 0.0f);
        for (int64_t p = 0; p < P; ++p) {
          double n = 0, mean = 0, m2 = 0;
          for (int64_t t = 0; t + 3 <= F; t += 3) {
            const double nb = x[p * F + t], mb = x[p * F + t + 1], m2b = x[p * F + t + 2];
            if (nb == 0) continue;
            const double tot = n + nb, d = mb - mean;
            mean += d * nb / tot;
            m2 += m2b + d * d * n * nb / tot;
            n = tot;
          }
          out[p * 2] = static_cast<float>(mean);
          out[p * 2 + 1] = static_cast<float>(n > 0 ? m2 / n : 0.0);
        }
        scatter(a[0], out.data());
        return;
      }
      case Op::kMax8: {
        const int64_t P = a[1].partitions(), F = a[1].free_elements();
        float* x = gather(a[1], 0);
        std::vector<float>& out = buf[1];
        out.resize(P * 8);
        for (int64_t p = 0; p < P; ++p) {
          std::partial_sort(x + p * F, x + p * F + 8, x + (p + 1) * F, std::greater<float>());
          std::copy(x + p * F, x + p * F + 8, out.data() + p * 8);
        }
        scatter(a[0], out.data());
        return;
      }
      case Op::kFindIndex8: {
        const int64_t P = a[1].partitions(), F = a[1].free_elements();
        const float* x = gather(a[1], 0);
        const float* vals = gather(a[2], 1);
        std::vector<float>& out = buf[2];
        out.resize(P * 8);
        for (int64_t p = 0; p < P; ++p) {
          std::map<float, int64_t> next;  // duplicates find successive occurrences
          for (int j = 0; j < 8; ++j) {
            const float v = vals[p * 8 + j];
            int64_t start = next.count(v) ? next[v] : 0, found = -1;
            for (int64_t f = start; f < F; ++f) {
              if (x[p * F + f] == v) { found = f; break; }
            }
            next[v] = found < 0 ? F : found + 1;
            out[p * 8 + j] = found < 0 ? 4294967295.0f : static_cast<float>(found);
          }
        }
        scatter(a[0], out.data());
        return;
      }
      case Op::kReciprocal: {
        float* x = gather(a[1], 0);
        for (int64_t i = 0, n = a[1].elements(); i < n; ++i) x[i] = 1.0f / x[i];
        scatter(a[0], x);
        return;
      }
      case Op::kPartitionReduce: {
        const Alu op = static_cast<Alu>(in.ints[0]);
        const int64_t P = a[1].partitions(), F = a[1].free_elements();
        const float* x = gather(a[1], 0);
        std::vector<float>& out = buf[1];
        out.assign(F, identity_of(op));
        for (int64_t p = 0; p < P; ++p)
          for (int64_t f = 0; f < F; ++f) out[f] = alu(op, out[f], x[p * F + f]);
        if (op == Alu::kAverage)
          for (float& v : out) v /= static_cast<float>(P);
        scatter(a[0], out.data());
        return;
      }
      case Op::kScalarTensorTensor: {
        const int64_t P = a[1].partitions(), F = a[1].free_elements();
        float* x = gather(a[1], 0);
        const float* y = gather(a[3], 1);
        const Alu op0 = static_cast<Alu>(in.ints[0]), op1 = static_cast<Alu>(in.ints[1]);
        const bool rev0 = in.ints[2], rev1 = in.ints[3];
        const std::vector<float> c0 = column(a[2], in.floats.at(0), P, 2);
        for (int64_t p = 0; p < P; ++p) {
          for (int64_t f = 0; f < F; ++f) {
            const int64_t i = p * F + f;
            float t = rev0 ? alu(op0, c0[p], x[i]) : alu(op0, x[i], c0[p]);
            x[i] = rev1 ? alu(op1, y[i], t) : alu(op1, t, y[i]);
          }
        }
        scatter(a[0], x);
        return;
      }
      case Op::kSelect: {
        const int64_t P = a[1].partitions(), F = a[1].free_elements();
        const float* pred = gather(a[1], 0);
        float* t = gather(a[2], 1);
        const std::vector<float> f = column(a.size() > 3 ? a[3] : Access{}, in.floats.at(0), P, 2);
        for (int64_t p = 0; p < P; ++p)
          for (int64_t j = 0; j < F; ++j) t[p * F + j] = pred[p * F + j] != 0 ? t[p * F + j] : f[p];
        scatter(a[0], t);
        return;
      }
      case Op::kCopyPredicated: {
        const int64_t n = a[0].elements();
        const bool rev = in.ints.at(0);
        std::vector<int64_t>& pred = ibuf[1];
        gather_int(a[2], pred);
        gather_raw(a[0], raw_[0]);
        const size_t es = dtype_size(dt(a[0]));
        if (a[1].present()) {
          gather_raw(a[1], raw_[1]);  // same dtype: bits move unchanged
        } else {
          std::vector<float> imm(n, static_cast<float>(in.floats.at(0)));
          raw_[1].resize(n * es);
          if (is_float(dt(a[0]))) {
            encode_run(dt(a[0]), imm.data(), n, raw_[1].data(), 1);
          } else {
            std::vector<int64_t> iv(n, static_cast<int64_t>(std::nearbyint(in.floats.at(0))));
            encode_int_run(dt(a[0]), iv.data(), n, raw_[1].data(), 1, false);
          }
        }
        for (int64_t i = 0; i < n; ++i) {
          if ((pred[i] != 0) != rev) std::memcpy(raw_[0].data() + i * es, raw_[1].data() + i * es, es);
        }
        scatter_raw(a[0], raw_[0]);
        return;
      }
      case Op::kSelectReduce: {
        const int64_t P = a[2].partitions(), F = a[2].free_elements();
        const int64_t cmd = in.ints.at(0);
        const bool rev = in.ints.at(1);
        const float* pred = gather(a[1], 0);
        float* t = gather(a[2], 1);
        const std::vector<float> f = column(a[3], in.floats.at(0), P, 2);
        acc_start(vec_regs, cmd, Alu::kMaximum, {}, P);
        for (int64_t p = 0; p < P; ++p) {
          for (int64_t j = 0; j < F; ++j) {
            float& v = t[p * F + j];
            v = ((pred[p * F + j] != 0) != rev) ? v : f[p];
            if (accumulates(cmd)) vec_regs[p] = std::fmax(vec_regs[p], v);
          }
        }
        scatter(a[0], t);
        acc_write(a[4], vec_regs, P);
        return;
      }
      case Op::kRangeSelect: {
        const int64_t P = a[1].partitions(), F = a[1].free_elements();
        const Alu c0 = static_cast<Alu>(in.ints.at(0)), c1 = static_cast<Alu>(in.ints.at(1));
        const int64_t cmd = in.ints.at(2), start = in.ints.at(3);
        float* t = gather(a[1], 0);
        const std::vector<float> b0 = column(a[2], 0.0, P, 1), b1 = column(a[3], 0.0, P, 2);
        const float fill = static_cast<float>(in.floats.at(0));
        acc_start(vec_regs, cmd, Alu::kMaximum, {}, P);
        for (int64_t p = 0; p < P; ++p) {
          for (int64_t j = 0; j < F; ++j) {
            const float idx = static_cast<float>(start + j);
            float& v = t[p * F + j];
            if (!(alu(c0, idx, b0[p]) != 0 && alu(c1, idx, b1[p]) != 0)) v = fill;
            if (accumulates(cmd)) vec_regs[p] = std::fmax(vec_regs[p], v);
          }
        }
        scatter(a[0], t);
        acc_write(a[4], vec_regs, P);
        return;
      }
      case Op::kTensorScalarReduce: {
        const int64_t P = a[1].partitions(), F = a[1].free_elements();
        const Alu op0 = static_cast<Alu>(in.ints.at(0)), rop = static_cast<Alu>(in.ints.at(1));
        const int64_t cmd = in.ints.at(2);
        float* x = gather(a[1], 0);
        const std::vector<float> c0 = column(a[2], in.floats.at(0), P, 1);
        acc_start(vec_regs, cmd, rop, column(a[4], in.floats.at(1), P, 2), P);
        for (int64_t p = 0; p < P; ++p) {
          for (int64_t j = 0; j < F; ++j) {
            float& v = x[p * F + j];
            v = alu_unary(op0) ? alu(op0, v, 0) : alu(op0, v, c0[p]);
            if (accumulates(cmd)) vec_regs[p] = alu(rop, vec_regs[p], v);
          }
        }
        scatter(a[0], x);
        acc_write(a[3], vec_regs, P, in.ints.at(3) != 0);
        return;
      }
      case Op::kTensorScalarCumulative: {
        const int64_t P = a[1].partitions(), F = a[1].free_elements();
        const Alu op0 = static_cast<Alu>(in.ints.at(0)), op1 = static_cast<Alu>(in.ints.at(1));
        const int64_t cmd = in.ints.at(2);
        float* x = gather(a[1], 0);
        const std::vector<float> c0 = column(a[2], in.floats.at(0), P, 1);
        acc_start(vec_regs, cmd, op1 == Alu::kSubtract ? Alu::kAdd : op1, column(a[3], in.floats.at(1), P, 2), P);
        for (int64_t p = 0; p < P; ++p) {
          float reg = vec_regs[p];
          for (int64_t j = 0; j < F; ++j) {
            float& v = x[p * F + j];
            reg = alu(op1, alu_unary(op0) ? alu(op0, v, 0) : alu(op0, v, c0[p]), reg);
            v = reg;
          }
          vec_regs[p] = reg;
        }
        scatter(a[0], x);
        return;
      }
      case Op::kExponential: {
        const int64_t P = a[1].partitions(), F = a[1].free_elements();
        const int64_t cmd = in.ints.at(0);
        float* x = gather(a[1], 0);
        const std::vector<float> m = column(a[2], in.floats.at(0), P, 1);
        acc_start(vec_regs, cmd, Alu::kAdd, column(a[4], in.floats.at(1), P, 2), P);
        for (int64_t p = 0; p < P; ++p) {
          for (int64_t j = 0; j < F; ++j) {
            float& v = x[p * F + j];
            v = std::exp(v - m[p]);
            if (accumulates(cmd)) vec_regs[p] += v;
          }
        }
        scatter(a[0], x);
        acc_write(a[3], vec_regs, P);
        return;
      }
      case Op::kActivate2: {
        const int64_t P = a[1].partitions(), F = a[1].free_elements();
        const Act fn = static_cast<Act>(in.ints.at(0));
        const Alu op0 = static_cast<Alu>(in.ints.at(1)), op1 = static_cast<Alu>(in.ints.at(2));
        const bool rev0 = in.ints.at(3), rev1 = in.ints.at(4);
        const bool has_reduce = in.ints.at(5) >= 0;
        const Alu rop = has_reduce ? static_cast<Alu>(in.ints.at(5)) : Alu::kAdd;
        const int64_t cmd = in.ints.at(6);
        float* x = gather(a[1], 0);
        const std::vector<float> i0 = column(a[2], in.floats.at(0), P, 1), i1 = column(a[3], in.floats.at(1), P, 2);
        acc_start(act_regs, cmd, rop, {}, P);
        auto stage = [](Alu op, float v, float imm, bool rev) {
          return op == Alu::kBypass ? v : rev ? alu(op, imm, v) : alu(op, v, imm);
        };
        for (int64_t p = 0; p < P; ++p) {
          for (int64_t j = 0; j < F; ++j) {
            float& v = x[p * F + j];
            v = act(fn, stage(op1, stage(op0, v, i0[p], rev0), i1[p], rev1));
            if (has_reduce && accumulates(cmd)) act_regs[p] = alu(rop, act_regs[p], v);
          }
        }
        scatter(a[0], x);
        acc_write(a[5], act_regs, P);
        return;
      }
      case Op::kMatchReplace8: {
        const int64_t P = a[1].partitions(), F = a[1].free_elements();
        float* x = gather(a[1], 0);
        const float* vals = gather(a[2], 1);
        const float imm = static_cast<float>(in.floats.at(0));
        std::vector<float>& idx = buf[2];
        idx.assign(P * 8, 4294967295.0f);
        std::vector<uint8_t> replaced(F);
        for (int64_t p = 0; p < P; ++p) {
          std::fill(replaced.begin(), replaced.end(), 0);
          for (int j = 7; j >= 0; --j) {  // duplicates: the last val takes the first match
            const float v = vals[p * 8 + j];
            for (int64_t f = 0; f < F; ++f) {
              if (!replaced[f] && x[p * F + f] == v) {
                replaced[f] = 1;
                idx[p * 8 + j] = static_cast<float>(f);
                break;
              }
            }
          }
          for (int64_t f = 0; f < F; ++f) if (replaced[f]) x[p * F + f] = imm;
        }
        scatter(a[0], x);
        if (a.size() > 3 && a[3].present()) scatter(a[3], idx.data());
        return;
      }
      case Op::kStreamShuffle: {
        const int64_t Pd = a[0].partitions(), Ps = a[1].partitions();
        const size_t es = dtype_size(dt(a[0]));
        const int64_t row = a[0].free_elements() * es;
        gather_raw(a[1], raw_[1]);  // before writing: in place is allowed
        gather_raw(a[0], raw_[0]);
        for (int64_t i = 0; i < Pd; ++i) {
          const int64_t m = in.ints.at(i % 32);
          const int64_t from = i / 32 * 32 + m;
          if (m == 255 || from >= Ps) continue;
          std::memcpy(raw_[0].data() + i * row, raw_[1].data() + from * row, row);
        }
        scatter_raw(a[0], raw_[0]);
        return;
      }
      case Op::kDmaTranspose: {
        const Access &dst = a[0], &src = a[1];
        const size_t nd = src.dims.size(), es = dtype_size(dt(src));
        std::vector<int64_t> perm = nd == 2 ? std::vector<int64_t>{1, 0} : nd == 3 ? std::vector<int64_t>{2, 1, 0}
                                                                                   : std::vector<int64_t>{3, 1, 2, 0};
        gather_raw(src, raw_[1]);
        std::vector<int64_t> sstride(nd, 1);
        for (int64_t i = static_cast<int64_t>(nd) - 2; i >= 0; --i) sstride[i] = sstride[i + 1] * src.dims[i + 1].size;
        raw_[0].resize(raw_[1].size());
        std::vector<int64_t> j(nd, 0);
        for (int64_t k = 0, n = dst.elements(); k < n; ++k) {
          int64_t from = 0;
          for (size_t i = 0; i < nd; ++i) from += j[i] * sstride[perm[i]];
          std::memcpy(raw_[0].data() + k * es, raw_[1].data() + from * es, es);
          for (int64_t i = static_cast<int64_t>(nd) - 1; i >= 0; --i) {
            if (++j[i] < dst.dims[i].size) break;
            j[i] = 0;
          }
        }
        scatter_raw(dst, raw_[0]);
        return;
      }
      case Op::kNGather: {
        const int64_t P = a[1].partitions(), Fd = a[1].free_elements(), Fi = a[2].free_elements();
        const size_t es = dtype_size(dt(a[1]));
        gather_raw(a[1], raw_[1]);
        const int64_t* idx = gather_int(a[2], ibuf[0]);
        raw_[0].resize(P * Fi * es);
        for (int64_t p = 0; p < P; ++p) {
          for (int64_t j = 0; j < Fi; ++j) {
            const int64_t i = idx[p * Fi + j];
            if (i < 0 || i >= Fd) {
              throw std::out_of_range("nki: nc_n_gather index " + std::to_string(i) + " at partition " +
                                      std::to_string(p) + " is outside [0, " + std::to_string(Fd) + ") (" +
                                      in.loc.file + ":" + std::to_string(in.loc.line) + ")");
            }
            std::memcpy(raw_[0].data() + (p * Fi + j) * es, raw_[1].data() + (p * Fd + i) * es, es);
          }
        }
        scatter_raw(a[0], raw_[0]);
        return;
      }
      case Op::kLocalGather: {
        const int64_t P = a[1].partitions(), Fs = a[1].free_elements(), Fi = a[2].free_elements();
        const int64_t n_elem = in.ints.at(0), valid = in.ints.at(1);
        const size_t es = dtype_size(dt(a[1]));
        gather_raw(a[1], raw_[1]);
        const int64_t* idx = gather_int(a[2], ibuf[0]);
        const int64_t Fo = valid * n_elem;
        raw_[0].resize(P * Fo * es);
        std::vector<int64_t> flat(16 * Fi);
        for (int64_t c = 0; c < P / 16; ++c) {
          for (int64_t col = 0; col < Fi; ++col)  // partition-first (column-major) order
            for (int64_t r = 0; r < 16; ++r) flat[col * 16 + r] = idx[(c * 16 + r) * Fi + col];
          for (int64_t r = c * 16; r < c * 16 + 16; ++r) {
            for (int64_t k = 0; k < valid; ++k) {
              for (int64_t e = 0; e < n_elem; ++e) {
                const int64_t from = flat[k] + e;
                if (from < 0 || from >= Fs) {
                  throw std::out_of_range("nki: local_gather index " + std::to_string(flat[k]) + " reads element " +
                                          std::to_string(from) + " of " + std::to_string(Fs) + " per partition (" +
                                          in.loc.file + ":" + std::to_string(in.loc.line) + ")");
                }
                std::memcpy(raw_[0].data() + (r * Fo + k * n_elem + e) * es, raw_[1].data() + (r * Fs + from) * es, es);
              }
            }
          }
        }
        scatter_raw(a[0], raw_[0]);
        return;
      }
      case Op::kNonzeroWithCount: {
        // Only the first partition of each GpSimd core (absolute partitions 0, 16, ..., 112) is
        // read and written; the other partitions of dst keep their values.
        const int64_t P = a[1].partitions(), T = a[1].free_elements();
        const int64_t first = a[1].offset / p.k_.tensors[a[1].tensor].partition_elements();
        const float* src = gather(a[1], 0);
        int64_t* out = gather_int(a[0], ibuf[0]);
        const int64_t index_offset = in.ints.at(0), padding = in.ints.at(1);
        for (int64_t q = 0; q < P; ++q) {
          if ((first + q) % 16 != 0) continue;
          int64_t* row = out + q * (T + 1);
          int64_t n = 0;
          for (int64_t i = 0; i < T; ++i) {
            if (src[q * T + i] != 0.0f) row[n++] = i + index_offset;
          }
          std::fill(row + n, row + T, padding);
          row[T] = n;
        }
        scatter_int(a[0], out, false);
        return;
      }
      case Op::kDmaCompute: {  // dst = sum of scale * src, in fp32
        std::vector<float>& acc = buf[4];
        acc.assign(a[0].elements(), 0.0f);
        for (size_t i = 1; i < a.size(); ++i) {
          const float* v = gather(a[i], 0);
          const float scale = static_cast<float>(in.floats.at(i - 1));
          for (size_t e = 0; e < acc.size(); ++e) acc[e] += v[e] * scale;
        }
        scatter(a[0], acc.data());
        return;
      }
      case Op::kDevicePrint: {  // reads only: the program's results are the same with or without it
        PrintedTensor t{in.text, dt(a[0]), {}, {}, {}};
        for (const Dim& d : a[0].dims) t.shape.push_back(d.size);
        if (is_float(t.dtype)) {
          const float* v = gather(a[0], 0);
          t.floats.assign(v, v + a[0].elements());
        } else {
          gather_int(a[0], t.ints);
        }
        emit_print(t);
        return;
      }
      case Op::kSendRecv:
      case Op::kCoreBarrier:
        throw std::logic_error("nki executor: sendrecv / core_barrier run through run_launch");
    }
    throw std::logic_error("nki executor: unknown instruction");
  }
};

Program::Program(Kernel k) : k_(std::move(k)) {
  verify(k_);
  plan();
}

// First-fit placement by live range: tensors whose lifetimes do not overlap share bytes.
void Program::plan() {
  const size_t nt = k_.tensors.size(), ni = k_.instrs.size();
  const auto [first, last] = live_ranges(k_);
  offset_.assign(nt, -1);
  alloc_at_.assign(ni, {});
  std::vector<int> order;
  for (size_t t = 0; t < nt; ++t)
    if (k_.tensors[t].external < 0 && k_.tensors[t].alias < 0 && first[t] >= 0) order.push_back(static_cast<int>(t));
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return first[x] < first[y]; });
  struct Block { int64_t begin, end; int tensor; };
  std::vector<Block> active;  // sorted by begin
  int64_t top = 0;
  for (int t : order) {
    active.erase(std::remove_if(active.begin(), active.end(), [&](const Block& b) { return last[b.tensor] < first[t]; }),
                 active.end());
    const TensorDecl& d = k_.tensors[t];
    const int64_t bytes = (d.elements() * static_cast<int64_t>(dtype_size(d.dtype)) + 63) / 64 * 64;
    int64_t at = 0;
    for (const Block& b : active) {
      if (b.begin - at >= bytes) break;
      at = std::max(at, b.end);
    }
    offset_[t] = at;
    top = std::max(top, at + bytes);
    active.push_back({at, at + bytes, t});
    std::sort(active.begin(), active.end(), [](const Block& x, const Block& y) { return x.begin < y.begin; });
    alloc_at_[first[t]].push_back(t);
  }
  for (size_t t = 0; t < nt; ++t) {  // an alias is its base's memory: the same bytes or argument
    TensorDecl& d = k_.tensors[t];
    if (d.alias < 0) continue;
    offset_[t] = offset_[d.alias];
    d.external = k_.tensors[d.alias].external;
  }
  arena_.assign(top, 0);
  psum_written_.assign(top, 0);
}

void Program::check_external(const std::vector<void*>& external) const {
  for (const TensorDecl& t : k_.tensors) {
    if (t.external >= 0 && (t.external >= static_cast<int>(external.size()) || external[t.external] == nullptr)) {
      throw std::invalid_argument("nki: no memory given for kernel tensor '" + t.name + "'");
    }
  }
}

void Program::prepare(size_t i) {
  for (int t : alloc_at_[i]) {  // fresh memory: NaN / 4 sentinels, no matmul writes yet
    const TensorDecl& d = k_.tensors[t];
    // The sentinel pattern is encoded once per dtype, then copied.
    const int64_t n = d.elements();
    const size_t es = dtype_size(d.dtype);
    std::vector<uint8_t>& pattern = fill_patterns_[static_cast<int>(d.dtype)];
    if (pattern.empty()) {
      std::vector<float> v(4096, is_float(d.dtype) ? kNaN : 4.0f);
      pattern.resize(4096 * es);
      encode_run(d.dtype, v.data(), 4096, pattern.data(), 1);
    }
    uint8_t* dst = arena_.data() + offset_[t];
    for (int64_t i = 0; i < n; i += 4096) std::memcpy(dst + i * es, pattern.data(), std::min<int64_t>(4096, n - i) * es);
    if (d.buffer == Buffer::kPsum) std::memset(psum_written_.data() + offset_[t], 0, n);
  }
}

void Program::run(const std::vector<void*>& external) { run_launch({this}, {external}); }

void run_launch(const std::vector<Program*>& programs, const std::vector<std::vector<void*>>& external) {
  const int n = static_cast<int>(programs.size());
  if (external.size() != programs.size()) throw std::invalid_argument("nki: one memory list per program");
  std::vector<std::unique_lock<std::mutex>> locks;
  std::vector<std::unique_ptr<Program::State>> st;
  for (int r = 0; r < n; ++r) {
    locks.emplace_back(programs[r]->mu_);
    programs[r]->check_external(external[r]);
    st.emplace_back(new Program::State{*programs[r], external[r]});
  }
  enum Status { kRunning, kWaiting, kDone };
  std::vector<Status> status(n, kRunning);
  std::vector<size_t> pc(n, 0);
  std::vector<bool> sent(n, false);
  std::map<std::tuple<int, int, int64_t>, std::deque<std::vector<uint8_t>>> mail;  // (from, to, pipe_id)
  auto at = [&](int r) -> const Instr& { return programs[r]->k_.instrs[pc[r]]; };
  auto where = [&](int r) { return at(r).loc.file + ":" + std::to_string(at(r).loc.line); };
  auto rank_ok = [&](int r, int64_t rank, const char* what) {
    if (rank < 0 || rank >= n) {
      throw std::out_of_range(where(r) + ": " + op_name(at(r).op) + ": " + what + " " + std::to_string(rank) +
                              " is not a program of this launch (" + std::to_string(n) + " programs; launch the "
                              "kernel as kernel[2] for the two cores of a logical NeuronCore)");
    }
  };
  for (;;) {
    bool progress = false, all_done = true;
    for (int r = 0; r < n; ++r) {
      if (status[r] == kDone) continue;
      all_done = false;
      Program& p = *programs[r];
      if (status[r] == kRunning) {  // to the end or the next instruction that waits for other programs
        for (; pc[r] < p.k_.instrs.size(); ++pc[r]) {
          p.prepare(pc[r]);
          if (synchronizes(p.k_.instrs[pc[r]].op)) break;
          st[r]->run(p.k_.instrs[pc[r]]);
        }
        progress = true;
        if (pc[r] == p.k_.instrs.size()) {
          status[r] = kDone;
          continue;
        }
        status[r] = kWaiting;
      }
      const Instr& in = at(r);
      if (in.op != Op::kSendRecv) continue;
      const int to = static_cast<int>(in.ints.at(0)), from = static_cast<int>(in.ints.at(1));
      rank_ok(r, to, "send_to_rank");
      rank_ok(r, from, "recv_from_rank");
      if (!sent[r]) {
        std::vector<uint8_t> bytes;
        st[r]->gather_raw(in.args[1], bytes);
        mail[{r, to, in.ints.at(2)}].push_back(std::move(bytes));
        sent[r] = true;
        progress = true;
      }
      auto box = mail.find({from, r, in.ints.at(2)});
      if (box == mail.end() || box->second.empty()) continue;
      const size_t want = in.args[0].elements() * dtype_size(st[r]->dt(in.args[0]));
      if (box->second.front().size() != want) {
        throw std::invalid_argument(where(r) + ": sendrecv: program " + std::to_string(from) + " sent " +
                                    std::to_string(box->second.front().size()) + " bytes; this dst holds " +
                                    std::to_string(want));
      }
      st[r]->scatter_raw(in.args[0], box->second.front());
      ++st[r]->version_[in.args[0].tensor];
      box->second.pop_front();
      sent[r] = false;
      status[r] = kRunning;
      ++pc[r];
      progress = true;
    }
    // A barrier opens when every core it names waits at a barrier.
    for (int r = 0; r < n; ++r) {
      if (status[r] != kWaiting || at(r).op != Op::kCoreBarrier) continue;
      std::vector<int64_t> cores = at(r).ints;  // and the program itself
      if (std::find(cores.begin(), cores.end(), r) == cores.end()) cores.push_back(r);
      bool open = true;
      for (int64_t c : cores) {
        rank_ok(r, c, "core");
        open = open && status[c] == kWaiting && at(static_cast<int>(c)).op == Op::kCoreBarrier;
      }
      if (!open) continue;
      for (int64_t c : cores) status[c] = kRunning, ++pc[c];
      progress = true;
    }
    if (all_done) return;
    if (!progress) {
      std::string msg = "nki: the programs of this launch wait for each other forever:";
      for (int r = 0; r < n; ++r) {
        msg += "\n  program " + std::to_string(r) + ": ";
        if (status[r] == kDone) {
          msg += "has ended";
        } else if (at(r).op == Op::kSendRecv) {
          msg += "waits in sendrecv for program " + std::to_string(at(r).ints[1]) + " (pipe_id " +
                 std::to_string(at(r).ints[2]) + ") at " + where(r);
        } else {
          msg += "waits in core_barrier at " + where(r);
        }
      }
      throw std::runtime_error(msg);
    }
  }
}

}  // namespace neuron::nki
