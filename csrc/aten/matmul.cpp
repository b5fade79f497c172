// Matrix products on neuron, with a matrix-vector path of the device's own, behind the FP8
// platform gate (scaled_mm.cpp).
//
// mm and addmm run ATen's CPU kernels on device memory (kernel.h), except when one operand is a
// single row or column: a batch-1 decode step, a linear layer applied to one token, a gradient
// with respect to one input. There ATen hands fp32 to the BLAS, whose matrix-vector code reads
// the matrix at well under the memory bandwidth on some hosts (MKL on AMD: a third of it). A
// decode step is almost nothing else, so neuron computes these products itself, streaming the
// matrix once at memory speed.
//
// Numerics: fp32 products accumulated in fp32 in a fixed order (per output element, whatever
// the thread count), so results are deterministic; they may differ from the BLAS's in the last
// bits, as two BLAS libraries do.
//
// bf16 and fp16 products (mm, addmm, bmm, baddbmm and their out= / in-place forms) run on the
// device's GEMM (cpu/gemm.h): exact products of the 16-bit operands accumulated in fp32 (PSUM),
// scaled and biased in fp32, rounded once to the result's dtype, on every host.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/baddbmm_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/mm_ops.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "aten/kernel.h"
#include "cpu/gemm.h"

namespace torch_neuronx {
namespace cpu = neuron::cpu;
namespace {

using at::Tensor;

// Below this many matrix elements the matrix is cache-resident and the BLAS is as fast.
constexpr int64_t kMinElements = 1 << 16;
constexpr int64_t kMinK = 32;

// ---- kernels: written once, compiled for the baseline ISA and (on x86-64) for AVX2+FMA ----

// dot(x, w) over K elements, in 32 interleaved partial sums combined pairwise.
inline __attribute__((always_inline)) float dot_body(const float* __restrict x, const float* __restrict w, int64_t K) {
  constexpr int L = 32;
  float acc[L] = {};
  int64_t k = 0;
  for (; k + L <= K; k += L)
    for (int j = 0; j < L; ++j) acc[j] += x[k + j] * w[k + j];
  for (int j = 0; k < K; ++k, ++j) acc[j] += x[k] * w[k];
  for (int s = L / 2; s > 0; s /= 2)
    for (int j = 0; j < s; ++j) acc[j] += acc[j + s];
  return acc[0];
}

// y[j] = sum_k x[k] * w[k * sk + j] for j < n, accumulated over k in order.
inline __attribute__((always_inline)) void axpy_body(const float* __restrict x, const float* __restrict w, int64_t sk,
                                                     int64_t K, float* __restrict y, int64_t n) {
  std::memset(y, 0, n * sizeof(float));
  for (int64_t k = 0; k < K; ++k) {
    const float xk = x[k];
    const float* __restrict row = w + k * sk;
    for (int64_t j = 0; j < n; ++j) y[j] += xk * row[j];
  }
}

void dots_base(const float* x, const float* w, int64_t sn, int64_t K, float* y, int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) y[n - n0] = dot_body(x, w + n * sn, K);
}
void axpy_base(const float* x, const float* w, int64_t sk, int64_t K, float* y, int64_t n) {
  axpy_body(x, w, sk, K, y, n);
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) void dots_avx2(const float* x, const float* w, int64_t sn, int64_t K, float* y,
                                                    int64_t n0, int64_t n1) {
  for (int64_t n = n0; n < n1; ++n) y[n - n0] = dot_body(x, w + n * sn, K);
}
__attribute__((target("avx2,fma"))) void axpy_avx2(const float* x, const float* w, int64_t sk, int64_t K, float* y,
                                                    int64_t n) {
  axpy_body(x, w, sk, K, y, n);
}
bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#endif

void dots(const float* x, const float* w, int64_t sn, int64_t K, float* y, int64_t n0, int64_t n1) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_avx2()) return dots_avx2(x, w, sn, K, y, n0, n1);
#endif
  dots_base(x, w, sn, K, y, n0, n1);
}

void axpy(const float* x, const float* w, int64_t sk, int64_t K, float* y, int64_t n) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (has_avx2()) return axpy_avx2(x, w, sk, K, y, n);
#endif
  axpy_base(x, w, sk, K, y, n);
}

// ---- the product as a matrix-vector one ------------------------------------------------------

// a [M, K] @ b [K, N] with M == 1 or N == 1, seen as v[n] = sum_k x[k] * w[k * sk + n * sn]
// for n < len: with M == 1, x is a's row and w is b; with N == 1, x is b's column and w is a
// transposed. Element n of the result is at (0, n) or (n, 0) of the [M, N] output.
struct MatVec {
  const float* x;
  const float* w;
  int64_t K, len, sk, sn;
  bool row;  // M == 1: the result is a row
  std::vector<float> x_copy;

  // Strides of the result (or of an [M, N] tensor laid out like it) along n.
  int64_t along(const Tensor& mn) const { return row ? mn.stride(1) : mn.stride(0); }

  // out[n] = alpha * v[n] (+ beta * bias[n] when bias is given and beta != 0).
  void run(float* out, int64_t os, const float* bias, int64_t bs, float alpha, float beta) const {
    const bool add_bias = bias != nullptr && beta != 0.0f;  // beta == 0 ignores self, as BLAS does
    auto finish = [&](const float* v, int64_t n0, int64_t n) {
      for (int64_t j = 0; j < n; ++j) {
        float r = alpha == 1.0f ? v[j] : alpha * v[j];
        if (add_bias) r += beta * bias[(n0 + j) * bs];
        out[(n0 + j) * os] = r;
      }
    };
    if (sk == 1) {
      // Rows of w are contiguous: one dot product per output element.
      int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / K);
      at::parallel_for(0, len, grain, [&](int64_t b, int64_t e) {
        std::vector<float> v(e - b);
        dots(x, w, sn, K, v.data(), b, e);
        finish(v.data(), b, e - b);
      });
    } else {
      // Columns of w are contiguous: accumulate rows of w into a span of outputs.
      constexpr int64_t kSpan = 1 << 14;  // accumulators stay in L1/L2
      int64_t grain = std::max<int64_t>(256, (int64_t{1} << 15) / K);
      at::parallel_for(0, len, grain, [&](int64_t b, int64_t e) {
        std::vector<float> v(std::min(kSpan, e - b));
        for (int64_t n0 = b; n0 < e; n0 += kSpan) {
          int64_t n = std::min(kSpan, e - n0);
          axpy(x, w + n0, sk, K, v.data(), n);
          finish(v.data(), n0, n);
        }
      });
    }
  }
};

bool dense_float(const Tensor& t) {
  return t.defined() && t.layout() == at::kStrided && t.scalar_type() == at::kFloat && t.has_storage() &&
         !t.is_neg() && t.data_ptr() != nullptr;
}

std::optional<MatVec> plan(const Tensor& a, const Tensor& b) {
  if (a.dim() != 2 || b.dim() != 2 || !dense_float(a) || !dense_float(b)) return std::nullopt;
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  if (b.size(0) != K || K < kMinK || (M != 1 && N != 1)) return std::nullopt;
  MatVec p;
  p.row = M == 1;
  p.K = K;
  p.len = p.row ? N : M;
  if (p.len * K < kMinElements) return std::nullopt;
  const float* x;
  int64_t sx;
  if (p.row) {
    x = a.const_data_ptr<float>(), sx = a.stride(1);
    p.w = b.const_data_ptr<float>(), p.sk = b.stride(0), p.sn = b.stride(1);
  } else {
    x = b.const_data_ptr<float>(), sx = b.stride(0);
    p.w = a.const_data_ptr<float>(), p.sk = a.stride(1), p.sn = a.stride(0);
  }
  if (p.len == 1) p.sn = 0;
  if (p.sk != 1 && p.sn != 1) return std::nullopt;  // neither layout streams: the BLAS copes
  if (sx != 1) {
    p.x_copy.resize(K);
    for (int64_t k = 0; k < K; ++k) p.x_copy[k] = x[k * sx];
    x = p.x_copy.data();
  }
  p.x = x;
  return p;
}

// An out= result the path may write directly: the right shape and dtype, sharing memory with
// no input (the CPU kernels define what overlapping arguments do).
bool writable_out(const Tensor& out, int64_t M, int64_t N, std::initializer_list<const Tensor*> inputs) {
  if (!dense_float(out) || out.dim() != 2 || out.size(0) != M || out.size(1) != N) return false;
  for (const Tensor* t : inputs) {
    if (t->defined() && t->has_storage() && out.storage().is_alias_of(t->storage())) return false;
  }
  return true;
}

// addmm's self, broadcast to [M, N] (as ATen requires), as a pointer and a stride along n.
std::optional<std::pair<const float*, int64_t>> bias_of(const Tensor& self, const MatVec& p, int64_t M, int64_t N) {
  if (!dense_float(self) || self.dim() > 2) return std::nullopt;
  auto fits = [](int64_t s, int64_t n) { return s == 1 || s == n; };
  if ((self.dim() >= 1 && !fits(self.size(-1), N)) || (self.dim() == 2 && !fits(self.size(0), M))) {
    return std::nullopt;  // not broadcastable: ATen's kernel raises its own error
  }
  Tensor e = self.expand({M, N});
  return std::make_pair(e.const_data_ptr<float>(), p.along(e));
}

}  // namespace

bool host_has_16bit_gemm(c10::ScalarType dtype) {
  // ATen asks oneDNN the same question before taking its 16-bit kernels.
  auto ask = [](const char* name) {
    auto op = c10::Dispatcher::singleton().findSchema({name, ""});
    return op.has_value() && op->typed<bool()>().call();  // absent in builds without oneDNN
  };
  static const bool bf16 = ask("mkldnn::_is_mkldnn_bf16_supported");
  static const bool fp16 = ask("mkldnn::_is_mkldnn_fp16_supported");
  return dtype == at::kBFloat16 ? bf16 : dtype == at::kHalf ? fp16 : false;
}

namespace {

// out= and in-place forms of a 16-bit product: the functional result, copied into `out`.
// Computed in full before writing, so `out` may overlap the operands.
Tensor& store(Tensor& out, const Tensor& result) {
  at::native::resize_output(out, result.sizes());
  out.copy_(result);
  return out;
}

// ---- 16-bit products on the device's GEMM ------------------------------------------------

// True when every defined tensor is bf16, or every one is fp16 (mixed dtypes take ATen's kernel,
// which keeps its type checks and messages).
bool same_16bit(std::initializer_list<const Tensor*> tensors) {
  std::optional<c10::ScalarType> dtype;
  for (const Tensor* t : tensors) {
    if (!t->defined()) continue;
    const c10::ScalarType s = t->scalar_type();
    if ((s != at::kBFloat16 && s != at::kHalf) || (dtype && *dtype != s)) return false;
    if (t->layout() != at::kStrided || t->is_neg() || t->is_conj()) return false;
    dtype = s;
  }
  return dtype.has_value();
}

cpu::MatrixRef matrix_ref(const Tensor& t) {
  return {t.const_data_ptr(), t.scalar_type() == at::kBFloat16 ? cpu::Dtype::kBFloat16 : cpu::Dtype::kFloat16,
          t.stride(0), t.stride(1)};
}

const cpu::ParallelFor& aten_parallel() {
  static const cpu::ParallelFor f = [](int64_t n, const std::function<void(int64_t, int64_t)>& body) {
    at::parallel_for(0, n, 1, body);
  };
  return f;
}

// a [M, K] @ b [K, N], or batched [B, M, K] @ [B, K, N], in fp32 (contiguous); nullopt when the
// shapes do not multiply (ATen's kernel then raises its own error).
std::optional<Tensor> gemm_f32(const Tensor& a, const Tensor& b) {
  const int64_t d = a.dim();
  if (!((d == 2 || d == 3) && b.dim() == d) || a.size(-1) != b.size(-2) || (d == 3 && a.size(0) != b.size(0))) {
    return std::nullopt;
  }
  const int64_t B = d == 3 ? a.size(0) : 1, M = a.size(-2), K = a.size(-1), N = b.size(-1);
  Tensor out = at::empty(d == 3 ? std::vector<int64_t>{B, M, N} : std::vector<int64_t>{M, N},
                         a.options().dtype(at::kFloat));
  if (out.numel() == 0) return out;
  float* c = out.mutable_data_ptr<float>();
  const cpu::GemmOptions serial = cpu::default_gemm_options();
  const cpu::GemmOptions threaded = cpu::default_gemm_options(&aten_parallel());
  auto one = [&](int64_t i, const cpu::GemmOptions& o) {
    cpu::gemm(M, N, K, matrix_ref(d == 3 ? a[i] : a), matrix_ref(d == 3 ? b[i] : b), c + i * M * N, N, o);
  };
  if (B > 1 && M * N * K < (int64_t{1} << 20)) {  // small products: threads over the batch
    at::parallel_for(0, B, 1, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) one(i, serial);
    });
  } else {
    for (int64_t i = 0; i < B; ++i) one(i, threaded);
  }
  return out;
}

// beta * self + alpha * (a @ b) in fp32, rounded once to a's dtype; nullopt when the shapes do
// not fit (self must broadcast to the product, as ATen requires).
std::optional<Tensor> product16(const Tensor* self, const Tensor& a, const Tensor& b, const at::Scalar& beta,
                                const at::Scalar& alpha) {
  std::optional<Tensor> r = gemm_f32(a, b);
  if (!r) return std::nullopt;
  if (self && self->defined()) {
    if (self->dim() > r->dim()) return std::nullopt;
    for (int64_t i = 1; i <= self->dim(); ++i) {
      if (self->size(-i) != 1 && self->size(-i) != r->size(-i)) return std::nullopt;
    }
  }
  const float al = alpha.to<float>(), be = beta.to<float>();
  if (al != 1.0f) r->mul_(al);
  if (self && self->defined() && be != 0.0f) r->add_(*self, be);  // beta == 0 ignores self, as BLAS does
  return r->to(a.scalar_type());
}

// Each op is ATen's with its CPU redispatch replaced where the path applies; NeuronKernel
// (kernel.h) does the rest (aliases, device checks, counting, profiling) as for any op.
struct Mm : at::_ops::mm {
  static Tensor redispatch(c10::DispatchKeySet ks, const Tensor& a, const Tensor& b) {
    check_fp8_compute("mm", {&a, &b});
    if (same_16bit({&a, &b})) {
      if (auto r = product16(nullptr, a, b, 0, 1)) return *r;
    }
    if (auto p = plan(a, b)) {
      Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
      p->run(out.mutable_data_ptr<float>(), p->along(out), nullptr, 0, 1.0f, 0.0f);
      return out;
    }
    return at::_ops::mm::redispatch(ks, a, b);
  }
};

struct MmOut : at::_ops::mm_out {
  static Tensor& redispatch(c10::DispatchKeySet ks, const Tensor& a, const Tensor& b, Tensor& out) {
    check_fp8_compute("mm", {&a, &b});
    if (same_16bit({&a, &b, &out})) {
      if (auto r = product16(nullptr, a, b, 0, 1)) return store(out, *r);
    }
    if (auto p = plan(a, b); p && writable_out(out, a.size(0), b.size(1), {&a, &b})) {
      p->run(out.mutable_data_ptr<float>(), p->along(out), nullptr, 0, 1.0f, 0.0f);
      return out;
    }
    return at::_ops::mm_out::redispatch(ks, a, b, out);
  }
};

struct Addmm : at::_ops::addmm {
  static Tensor redispatch(c10::DispatchKeySet ks, const Tensor& self, const Tensor& a, const Tensor& b,
                           const at::Scalar& beta, const at::Scalar& alpha) {
    check_fp8_compute("addmm", {&a, &b});
    if (same_16bit({&self, &a, &b})) {
      if (auto r = product16(&self, a, b, beta, alpha)) return *r;
    }
    if (auto p = plan(a, b)) {
      if (auto bias = bias_of(self, *p, a.size(0), b.size(1))) {
        Tensor out = at::empty({a.size(0), b.size(1)}, a.options());
        p->run(out.mutable_data_ptr<float>(), p->along(out), bias->first, bias->second, alpha.to<float>(),
               beta.to<float>());
        return out;
      }
    }
    return at::_ops::addmm::redispatch(ks, self, a, b, beta, alpha);
  }
};

struct AddmmOut : at::_ops::addmm_out {
  static Tensor& redispatch(c10::DispatchKeySet ks, const Tensor& self, const Tensor& a, const Tensor& b,
                            const at::Scalar& beta, const at::Scalar& alpha, Tensor& out) {
    check_fp8_compute("addmm", {&a, &b});
    if (same_16bit({&self, &a, &b, &out})) {
      if (auto r = product16(&self, a, b, beta, alpha)) return store(out, *r);
    }
    if (auto p = plan(a, b); p && writable_out(out, a.size(0), b.size(1), {&self, &a, &b})) {
      if (auto bias = bias_of(self, *p, a.size(0), b.size(1))) {
        p->run(out.mutable_data_ptr<float>(), p->along(out), bias->first, bias->second, alpha.to<float>(),
               beta.to<float>());
        return out;
      }
    }
    return at::_ops::addmm_out::redispatch(ks, self, a, b, beta, alpha, out);
  }
};

// In-place addmm_: self must already have the product's shape (ATen's kernel says so otherwise).
struct AddmmInplace : at::_ops::addmm_ {
  static Tensor& redispatch(c10::DispatchKeySet ks, Tensor& self, const Tensor& a, const Tensor& b,
                            const at::Scalar& beta, const at::Scalar& alpha) {
    check_fp8_compute("addmm_", {&a, &b});
    if (same_16bit({&self, &a, &b}) && a.dim() == 2 && b.dim() == 2 && self.dim() == 2 && self.size(0) == a.size(0) &&
        self.size(1) == b.size(1)) {
      if (auto r = product16(&self, a, b, beta, alpha)) return store(self, *r);
    }
    return at::_ops::addmm_::redispatch(ks, self, a, b, beta, alpha);
  }
};

// Batched products: the device's GEMM for 16-bit floats, else ATen's kernels; behind the FP8
// platform gate.
struct Bmm : at::_ops::bmm {
  static Tensor redispatch(c10::DispatchKeySet ks, const Tensor& a, const Tensor& b) {
    check_fp8_compute("bmm", {&a, &b});
    if (same_16bit({&a, &b})) {
      if (auto r = product16(nullptr, a, b, 0, 1)) return *r;
    }
    return at::_ops::bmm::redispatch(ks, a, b);
  }
};

struct BmmOut : at::_ops::bmm_out {
  static Tensor& redispatch(c10::DispatchKeySet ks, const Tensor& a, const Tensor& b, Tensor& out) {
    check_fp8_compute("bmm", {&a, &b});
    if (same_16bit({&a, &b, &out})) {
      if (auto r = product16(nullptr, a, b, 0, 1)) return store(out, *r);
    }
    return at::_ops::bmm_out::redispatch(ks, a, b, out);
  }
};

struct Baddbmm : at::_ops::baddbmm {
  static Tensor redispatch(c10::DispatchKeySet ks, const Tensor& self, const Tensor& a, const Tensor& b,
                           const at::Scalar& beta, const at::Scalar& alpha) {
    check_fp8_compute("baddbmm", {&a, &b});
    if (same_16bit({&self, &a, &b})) {
      if (auto r = product16(&self, a, b, beta, alpha)) return *r;
    }
    return at::_ops::baddbmm::redispatch(ks, self, a, b, beta, alpha);
  }
};

struct BaddbmmInplace : at::_ops::baddbmm_ {
  static Tensor& redispatch(c10::DispatchKeySet ks, Tensor& self, const Tensor& a, const Tensor& b,
                            const at::Scalar& beta, const at::Scalar& alpha) {
    check_fp8_compute("baddbmm_", {&a, &b});
    if (same_16bit({&self, &a, &b}) && a.dim() == 3 && b.dim() == 3 && self.dim() == 3 && self.size(0) == a.size(0) &&
        self.size(1) == a.size(1) && self.size(2) == b.size(2)) {
      if (auto r = product16(&self, a, b, beta, alpha)) return store(self, *r);
    }
    return at::_ops::baddbmm_::redispatch(ks, self, a, b, beta, alpha);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("mm", TORCH_FN((NeuronKernel<Mm, false>::run)));
  m.impl("mm.out", TORCH_FN((NeuronKernel<MmOut, false>::run)));
  m.impl("addmm", TORCH_FN((NeuronKernel<Addmm, false>::run)));
  m.impl("addmm.out", TORCH_FN((NeuronKernel<AddmmOut, false>::run)));
  m.impl("bmm", TORCH_FN((NeuronKernel<Bmm, false>::run)));
  m.impl("bmm.out", TORCH_FN((NeuronKernel<BmmOut, false>::run)));
  m.impl("baddbmm", TORCH_FN((NeuronKernel<Baddbmm, false>::run)));
  m.impl("addmm_", TORCH_FN((NeuronKernel<AddmmInplace, false>::run)));
  m.impl("baddbmm_", TORCH_FN((NeuronKernel<BaddbmmInplace, false>::run)));
}

}  // namespace torch_neuronx
