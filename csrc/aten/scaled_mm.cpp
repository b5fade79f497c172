// FP8 and MXFP8 scaled matmuls on neuron: torch._scaled_mm and _scaled_grouped_mm, native.
//
// Trainium 3 multiplies FP8 (and MXFP8: FP8 in blocks of 32 sharing a power-of-two E8M0 scale)
// on its Tensor engine with fp32 accumulation; Trainium 2 does not compute in FP8, so there
// these ops (and matrix products of FP8 tensors) raise, naming the platform and the fix.
//
// How: the operands are decoded exactly (FP8 values, and FP8 values times an E8M0 block scale,
// a power of two, are exact in fp32), multiplied with fp32 accumulation (the Tensor engine's),
// and the tensor-wise / row-wise scales and the bias are applied to the fp32 sums in float64
// before the one rounding to out_dtype (through round-to-odd, so it is one rounding).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ops/_scaled_grouped_mm_ops.h>
#include <ATen/ops/_scaled_mm_ops.h>
#include <ATen/ops/_scaled_mm_v2_ops.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <type_traits>

#include "aten/kernel.h"
#include "aten/neuron.h"
#include "runtime/platform.h"

namespace torch_neuronx {

bool is_fp8(c10::ScalarType t) {
  return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2 || t == at::kFloat8_e4m3fnuz || t == at::kFloat8_e5m2fnuz;
}

void check_fp8_compute(const char* op, std::initializer_list<const at::Tensor*> tensors) {
  bool fp8 = false;
  for (const at::Tensor* t : tensors) fp8 = fp8 || (t->defined() && is_fp8(t->scalar_type()));
  if (!fp8) return;
  const auto& chip = *neuron::rt::platform().chip;
  TORCH_CHECK(chip.supports_fp8, op, ": FP8 compute needs Trainium 3, but the simulated platform is ", chip.name,
              " (", chip.core_name, "), which does not compute in FP8. Set NEURON_PLATFORM=trn3 (or run on a "
              "Trainium 3 instance); on ", chip.name, " FP8 tensors can be stored and cast, not multiplied.");
}

namespace {

using at::Tensor;

enum class Scaling { kTensor, kRow, kBlock32 };

const char* scaling_name(Scaling s) {
  return s == Scaling::kTensor ? "tensor-wise" : s == Scaling::kRow ? "row-wise" : "MX (blocks of 32)";
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// E8M0 scales laid out as torchao's / cuBLAS's blocked ("swizzled") format -> [rows, blocks].
Tensor unswizzle(const Tensor& flat, int64_t rows, int64_t blocks) {
  const int64_t col_blocks = round_up(blocks, 4) / 4;
  auto idx = at::empty({rows, blocks}, at::TensorOptions().dtype(at::kLong));
  auto* p = idx.data_ptr<int64_t>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < blocks; ++c) {
      const int64_t block = (r / 128) * col_blocks + c / 4, ri = r % 128;
      p[r * blocks + c] = block * 512 + (ri % 32) * 16 + (ri / 32) * 4 + c % 4;
    }
  }
  return flat.reshape({-1}).index({idx});
}

// What a scale means for an operand with `rows` rows (M for self, N for mat2) and `K`
// contraction: returns the kind and, for MX, the scales as [rows, K / 32].
std::pair<Scaling, Tensor> classify(const Tensor& scale, int64_t rows, int64_t K, bool is_a) {
  const char* which = is_a ? "scale_a" : "scale_b";
  if (scale.scalar_type() == at::kFloat8_e8m0fnu) {
    TORCH_CHECK(K % 32 == 0, "_scaled_mm: MX scaling takes blocks of 32 along K, but K = ", K,
                " is not a multiple of 32; pad K to a multiple of 32");
    const int64_t blocks = K / 32;
    if (scale.numel() == rows * blocks) return {Scaling::kBlock32, scale.reshape({rows, blocks})};
    if (scale.numel() == round_up(rows, 128) * round_up(blocks, 4)) {
      return {Scaling::kBlock32, unswizzle(scale, rows, blocks)};
    }
    TORCH_CHECK(false, "_scaled_mm: MX ", which, " (float8_e8m0fnu) must hold one scale per 32 elements of K: [",
                rows, ", ", blocks, "], or ", round_up(rows, 128) * round_up(blocks, 4),
                " elements in the blocked (swizzled) layout; got shape ", scale.sizes());
  }
  TORCH_CHECK(scale.scalar_type() == at::kFloat, "_scaled_mm: ", which, " must be float32 (tensor-wise or row-wise "
              "scaling) or float8_e8m0fnu (MX block scaling), got ", scale.scalar_type());
  if (scale.numel() == 1) return {Scaling::kTensor, scale};
  const bool row_shape = is_a ? (scale.dim() == 2 && scale.size(0) == rows && scale.size(1) == 1)
                              : (scale.dim() == 2 && scale.size(0) == 1 && scale.size(1) == rows);
  TORCH_CHECK(row_shape, "_scaled_mm: ", which, " of shape ", scale.sizes(), " is neither tensor-wise (one element) "
              "nor row-wise (", is_a ? "[" + std::to_string(rows) + ", 1]" : "[1, " + std::to_string(rows) + "]", ")");
  return {Scaling::kRow, scale};
}

// Decoding tables: every FP8 / E8M0 code to its float value.
struct Fp8Tables {
  float e4m3fn[256], e5m2[256], e8m0[256];
  Fp8Tables() {
    for (int c = 0; c < 256; ++c) {
      const uint8_t b = static_cast<uint8_t>(c);
      e4m3fn[c] = static_cast<float>(c10::Float8_e4m3fn(b, c10::Float8_e4m3fn::from_bits()));
      e5m2[c] = static_cast<float>(c10::Float8_e5m2(b, c10::Float8_e5m2::from_bits()));
      e8m0[c] = static_cast<float>(c10::Float8_e8m0fnu(b, c10::Float8_e8m0fnu::from_bits()));
    }
  }
};
const Fp8Tables& tables() {
  static const Fp8Tables t;
  return t;
}

// x [R, C] (FP8, any strides) -> fp32 [R, C], exactly; with MX scales, element (i, j) is
// multiplied by 2^e of block scale(i, j) (still exact: a power of two).
template <class ScaleOf>
Tensor decode_f32(const Tensor& x, ScaleOf scale_of, bool scaled) {
  const int64_t R = x.size(0), C = x.size(1), s0 = x.stride(0), s1 = x.stride(1);
  const float* tab = x.scalar_type() == at::kFloat8_e5m2 ? tables().e5m2 : tables().e4m3fn;
  const uint8_t* src = reinterpret_cast<const uint8_t*>(x.const_data_ptr());
  Tensor out = at::empty({R, C}, x.options().dtype(at::kFloat));
  float* dst = out.mutable_data_ptr<float>();
  at::parallel_for(0, R, std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1)), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      for (int64_t j = 0; j < C; ++j) {
        float v = tab[src[i * s0 + j * s1]];
        if (scaled) v *= scale_of(i, j);
        dst[i * C + j] = v;
      }
    }
  });
  return out;
}

// A float64 value to `float` rounded to odd: rounding that to any narrower binary format
// (bf16, fp16, fp8) then gives the float64 value correctly rounded once.
float round_to_odd(double d) {
  float f = static_cast<float>(d);
  if (static_cast<double>(f) == d || std::isnan(d) || std::isinf(f)) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) f = std::nextafter(f, 0.0f);
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits |= 1u;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <class T>
void epilogue_into(T* out, const float* acc, int64_t M, int64_t N, const double* sa, int64_t sa_step,
                   const double* sb, int64_t sb_step, const double* bias, double clamp) {
  at::parallel_for(0, M, std::max<int64_t>(1, 16384 / std::max<int64_t>(N, 1)), [&](int64_t b, int64_t e) {
    for (int64_t m = b; m < e; ++m) {
      const double a = sa[m * sa_step];
      for (int64_t n = 0; n < N; ++n) {
        double v = static_cast<double>(acc[m * N + n]) * a * sb[n * sb_step];
        if (bias) v += bias[n];
        if (clamp > 0) v = std::min(std::max(v, -clamp), clamp);
        if constexpr (std::is_same_v<T, float>) {
          out[m * N + n] = static_cast<float>(v);
        } else {
          out[m * N + n] = T(round_to_odd(v));
        }
      }
    }
  });
}

void check_operands(const Tensor& a, const Tensor& b) {
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2, "_scaled_mm: expected 2-D operands, got ", a.sizes(), " and ", b.sizes());
  TORCH_CHECK(is_fp8(a.scalar_type()) && is_fp8(b.scalar_type()), "_scaled_mm: operands must be FP8 "
              "(float8_e4m3fn / float8_e5m2), got ", a.scalar_type(), " and ", b.scalar_type(),
              "; quantize them first (for bf16 operands use torch.mm)");
  TORCH_CHECK(a.scalar_type() != at::kFloat8_e4m3fnuz && a.scalar_type() != at::kFloat8_e5m2fnuz &&
              b.scalar_type() != at::kFloat8_e4m3fnuz && b.scalar_type() != at::kFloat8_e5m2fnuz,
              "_scaled_mm: the fnuz FP8 variants are AMD's; Trainium uses float8_e4m3fn and float8_e5m2");
  TORCH_CHECK(!(a.scalar_type() == at::kFloat8_e5m2 && b.scalar_type() == at::kFloat8_e5m2),
              "_scaled_mm: two float8_e5m2 operands are not supported (e5m2 pairs with e4m3fn)");
  TORCH_CHECK(b.size(0) == a.size(1), "_scaled_mm: shapes ", a.sizes(), " and ", b.sizes(), " cannot be multiplied");
}

// One scaled matmul on CPU views of device memory: a [M, K], b [K, N], scales already
// normalized (tensor-wise: one element; row-wise: [M, 1] / [1, N]; MX: [M, K/32] / [N, K/32]).
Tensor scaled_mm_impl(const Tensor& a, const Tensor& b, Scaling ka, const Tensor& sa, Scaling kb, const Tensor& sb,
                      const std::optional<Tensor>& bias, const std::optional<Tensor>& scale_result,
                      std::optional<c10::ScalarType> out_dtype) {
  const int64_t M = a.size(0), K = a.size(1), N = b.size(1);
  TORCH_CHECK((ka == Scaling::kBlock32) == (kb == Scaling::kBlock32), "_scaled_mm: scale_a is ", scaling_name(ka),
              " and scale_b is ", scaling_name(kb), "; MX block scaling applies to both operands or neither");
  const c10::ScalarType dt = out_dtype.value_or(a.scalar_type());
  TORCH_CHECK(dt == at::kBFloat16 || dt == at::kHalf || dt == at::kFloat || dt == at::kFloat8_e4m3fn ||
              dt == at::kFloat8_e5m2, "_scaled_mm: out_dtype must be bfloat16, float16, float32, float8_e4m3fn or "
              "float8_e5m2, got ", dt);
  const bool mx = ka == Scaling::kBlock32;
  Tensor sa_codes = mx ? sa.contiguous() : Tensor(), sb_codes = mx ? sb.contiguous() : Tensor();
  const float* e8m0 = tables().e8m0;
  const uint8_t* pa = mx ? reinterpret_cast<const uint8_t*>(sa_codes.const_data_ptr()) : nullptr;
  const uint8_t* pb = mx ? reinterpret_cast<const uint8_t*>(sb_codes.const_data_ptr()) : nullptr;
  const int64_t blocks = K / 32;
  Tensor a32 = decode_f32(a, [&](int64_t m, int64_t k) { return e8m0[pa[m * blocks + k / 32]]; }, mx);
  Tensor b32 = decode_f32(b, [&](int64_t k, int64_t n) { return e8m0[pb[n * blocks + k / 32]]; }, mx);
  // Products of the decoded values are exact in fp32; the GEMM accumulates in fp32.
  Tensor acc = at::mm(a32, b32).contiguous();

  // Scales and bias in float64, one rounding to out_dtype.
  const double one = 1.0;
  Tensor sa64 = mx ? Tensor() : sa.to(at::kDouble).contiguous(), sb64 = mx ? Tensor() : sb.to(at::kDouble).contiguous();
  const double* psa = mx ? &one : sa64.const_data_ptr<double>();
  const double* psb = mx ? &one : sb64.const_data_ptr<double>();
  const int64_t sa_step = (!mx && ka == Scaling::kRow) ? 1 : 0, sb_step = (!mx && kb == Scaling::kRow) ? 1 : 0;
  Tensor bias64;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == N, "_scaled_mm: bias must have N = ", N, " elements, got shape ", bias->sizes());
    bias64 = bias->to(at::kDouble).contiguous();
  }
  Tensor sb_scaled;  // scale_result (FP8 outputs) folded into scale_b
  double clamp = 0.0;
  if (dt == at::kFloat8_e4m3fn || dt == at::kFloat8_e5m2) {
    clamp = dt == at::kFloat8_e5m2 ? 57344.0 : 448.0;  // saturate, as the hardware's converter does
    if (scale_result.has_value() && scale_result->defined()) {
      const double r = scale_result->to(at::kDouble).item<double>();
      sb_scaled = (mx ? at::ones({1}, at::TensorOptions().dtype(at::kDouble)) : sb64) * r;
      psb = sb_scaled.const_data_ptr<double>();
    }
  }
  const double* pbias = bias64.defined() ? bias64.const_data_ptr<double>() : nullptr;
  Tensor out = at::empty({M, N}, a.options().dtype(dt));
  const float* pacc = acc.const_data_ptr<float>();
  switch (dt) {
    case at::kFloat: epilogue_into(out.mutable_data_ptr<float>(), pacc, M, N, psa, sa_step, psb, sb_step, pbias, clamp); break;
    case at::kBFloat16:
      epilogue_into(out.mutable_data_ptr<c10::BFloat16>(), pacc, M, N, psa, sa_step, psb, sb_step, pbias, clamp);
      break;
    case at::kHalf: epilogue_into(out.mutable_data_ptr<c10::Half>(), pacc, M, N, psa, sa_step, psb, sb_step, pbias, clamp); break;
    case at::kFloat8_e4m3fn:
      epilogue_into(out.mutable_data_ptr<c10::Float8_e4m3fn>(), pacc, M, N, psa, sa_step, psb, sb_step, pbias, clamp);
      break;
    default:
      epilogue_into(out.mutable_data_ptr<c10::Float8_e5m2>(), pacc, M, N, psa, sa_step, psb, sb_step, pbias, clamp);
  }
  return out;
}

// torch._scaled_mm: the scaling mode follows from the scales' shapes and dtypes.
Tensor scaled_mm_cpu(const Tensor& a, const Tensor& b, const Tensor& scale_a, const Tensor& scale_b,
                     const std::optional<Tensor>& bias, const std::optional<Tensor>& scale_result,
                     std::optional<c10::ScalarType> out_dtype) {
  check_operands(a, b);
  auto [ka, sa] = classify(scale_a, a.size(0), a.size(1), true);
  auto [kb, sb] = classify(scale_b, b.size(1), a.size(1), false);
  return scaled_mm_impl(a, b, ka, sa, kb, sb, bias, scale_result, out_dtype);
}

// torch.nn.functional.scaled_mm (_scaled_mm_v2): the recipe and swizzle are given per operand.
// ScalingType: 0 TensorWise, 1 RowWise, 3 BlockWise1x32 (MXFP8) here; SwizzleType: 0 none,
// 1 the blocked 32x4x4 layout.
std::pair<Scaling, Tensor> from_recipe(at::TensorList scales, at::IntArrayRef recipe, at::IntArrayRef swizzle,
                                       int64_t rows, int64_t K, bool is_a) {
  const char* which = is_a ? "scale_a" : "scale_b";
  TORCH_CHECK(scales.size() == 1 && recipe.size() == 1, "scaled_mm: one scale tensor and one recipe per operand "
              "(got ", scales.size(), " and ", recipe.size(), " for ", which, ")");
  const Tensor& s = scales[0];
  static const char* names[] = {"TensorWise", "RowWise", "BlockWise1x16", "BlockWise1x32", "BlockWise1x128",
                                "BlockWise128x128"};
  const int64_t r = recipe[0];
  switch (r) {
    case 0:
      TORCH_CHECK(s.numel() == 1 && s.scalar_type() == at::kFloat, "scaled_mm: a TensorWise ", which,
                  " is one float32 element, got ", s.scalar_type(), " of shape ", s.sizes());
      return {Scaling::kTensor, s};
    case 1:
      TORCH_CHECK(s.numel() == rows && s.scalar_type() == at::kFloat, "scaled_mm: a RowWise ", which, " holds ",
                  rows, " float32 scales, got ", s.scalar_type(), " of shape ", s.sizes());
      return {Scaling::kRow, is_a ? s.reshape({rows, 1}) : s.reshape({1, rows})};
    case 3: {
      TORCH_CHECK(s.scalar_type() == at::kFloat8_e8m0fnu, "scaled_mm: a BlockWise1x32 (MXFP8) ", which,
                  " is float8_e8m0fnu, got ", s.scalar_type());
      TORCH_CHECK(K % 32 == 0, "scaled_mm: MX scaling takes blocks of 32 along K, but K = ", K,
                  " is not a multiple of 32; pad K to a multiple of 32");
      const int64_t blocks = K / 32;
      if (!swizzle.empty() && swizzle[0] == 1) {
        TORCH_CHECK(s.numel() == round_up(rows, 128) * round_up(blocks, 4), "scaled_mm: a swizzled MX ", which,
                    " has ", round_up(rows, 128) * round_up(blocks, 4), " elements, got shape ", s.sizes());
        return {Scaling::kBlock32, unswizzle(s, rows, blocks)};
      }
      TORCH_CHECK(s.numel() == rows * blocks, "scaled_mm: an MX ", which, " holds one scale per 32 elements of K: [",
                  rows, ", ", blocks, "], got shape ", s.sizes());
      return {Scaling::kBlock32, s.reshape({rows, blocks})};
    }
    default:
      TORCH_CHECK_NOT_IMPLEMENTED(false, "scaled_mm on neuron: the ", r >= 0 && r <= 5 ? names[r] : "unknown",
                                  " recipe is not supported; TensorWise, RowWise and BlockWise1x32 (MXFP8) are");
  }
}

Tensor scaled_mm_v2_cpu(const Tensor& a, const Tensor& b, at::TensorList scale_a, at::IntArrayRef recipe_a,
                        at::IntArrayRef swizzle_a, at::TensorList scale_b, at::IntArrayRef recipe_b,
                        at::IntArrayRef swizzle_b, const std::optional<Tensor>& bias,
                        std::optional<c10::ScalarType> out_dtype, at::IntArrayRef contraction_dim) {
  TORCH_CHECK(contraction_dim.empty() || (contraction_dim.size() == 2 && contraction_dim[0] == 1 &&
                                          contraction_dim[1] == 0),
              "scaled_mm: neuron contracts a's last and b's first dimension (contraction_dim [1, 0]), got ",
              contraction_dim);
  check_operands(a, b);
  auto [ka, sa] = from_recipe(scale_a, recipe_a, swizzle_a, a.size(0), a.size(1), true);
  auto [kb, sb] = from_recipe(scale_b, recipe_b, swizzle_b, b.size(1), a.size(1), false);
  return scaled_mm_impl(a, b, ka, sa, kb, sb, bias, std::nullopt, out_dtype);
}

struct ScaledMmV2 : at::_ops::_scaled_mm_v2 {
  static Tensor redispatch(c10::DispatchKeySet, const Tensor& a, const Tensor& b, at::TensorList scale_a,
                           at::IntArrayRef recipe_a, at::IntArrayRef swizzle_a, at::TensorList scale_b,
                           at::IntArrayRef recipe_b, at::IntArrayRef swizzle_b, const std::optional<Tensor>& bias,
                           std::optional<c10::ScalarType> out_dtype, at::IntArrayRef contraction_dim, bool) {
    return scaled_mm_v2_cpu(a, b, scale_a, recipe_a, swizzle_a, scale_b, recipe_b, swizzle_b, bias, out_dtype,
                            contraction_dim);
  }
};

struct ScaledMm : at::_ops::_scaled_mm {
  static Tensor redispatch(c10::DispatchKeySet, const Tensor& a, const Tensor& b, const Tensor& scale_a,
                           const Tensor& scale_b, const std::optional<Tensor>& bias,
                           const std::optional<Tensor>& scale_result, std::optional<c10::ScalarType> out_dtype,
                           bool /*use_fast_accum: the Tensor engine always accumulates in fp32*/) {
    return scaled_mm_cpu(a, b, scale_a, scale_b, bias, scale_result, out_dtype);
  }
};

struct ScaledMmOut : at::_ops::_scaled_mm_out {
  static Tensor& redispatch(c10::DispatchKeySet, const Tensor& a, const Tensor& b, const Tensor& scale_a,
                            const Tensor& scale_b, const std::optional<Tensor>& bias,
                            const std::optional<Tensor>& scale_result, std::optional<c10::ScalarType> out_dtype,
                            bool, Tensor& out) {
    Tensor r = scaled_mm_cpu(a, b, scale_a, scale_b, bias, scale_result, out_dtype.value_or(out.scalar_type()));
    TORCH_CHECK(out.scalar_type() == r.scalar_type(), "_scaled_mm: out has dtype ", out.scalar_type(),
                " but out_dtype is ", r.scalar_type());
    out.resize_(r.sizes());
    out.copy_(r);
    return out;
  }
};

// Grouped (MoE) form: a [total_M, K] 2-D with b [G, K, N] and offs [G] (cumulative row ends),
// or a [G, M, K] with b [G, K, N]. Row-wise scales: scale_a [total_M] or [G, M], scale_b [G, N].
struct ScaledGroupedMm : at::_ops::_scaled_grouped_mm {
  static Tensor redispatch(c10::DispatchKeySet, const Tensor& a, const Tensor& b, const Tensor& scale_a,
                           const Tensor& scale_b, const std::optional<Tensor>& offs,
                           const std::optional<Tensor>& bias, const std::optional<Tensor>& scale_result,
                           std::optional<c10::ScalarType> out_dtype, bool) {
    TORCH_CHECK(b.dim() == 3, "_scaled_grouped_mm: mat2 must be [groups, K, N], got ", b.sizes());
    TORCH_CHECK(!bias.has_value() || !bias->defined(), "_scaled_grouped_mm: bias is not supported");
    const int64_t G = b.size(0), N = b.size(2);
    const c10::ScalarType dt = out_dtype.value_or(at::kBFloat16);
    TORCH_CHECK(scale_b.dim() == 2 && scale_b.size(0) == G && scale_b.size(1) == N,
                "_scaled_grouped_mm: scale_b must be [groups, N] = [", G, ", ", N, "], got ", scale_b.sizes());
    if (a.dim() == 3) {
      TORCH_CHECK(a.size(0) == G, "_scaled_grouped_mm: ", a.size(0), " groups in self but ", G, " in mat2");
      TORCH_CHECK(scale_a.dim() == 2 && scale_a.size(0) == G && scale_a.size(1) == a.size(1),
                  "_scaled_grouped_mm: scale_a must be [groups, M], got ", scale_a.sizes());
      std::vector<Tensor> outs;
      for (int64_t g = 0; g < G; ++g) {
        outs.push_back(scaled_mm_cpu(a[g], b[g], scale_a[g].unsqueeze(1), scale_b[g].unsqueeze(0), std::nullopt,
                                     scale_result, dt));
      }
      return at::stack(outs);
    }
    TORCH_CHECK(a.dim() == 2 && offs.has_value() && offs->defined(), "_scaled_grouped_mm: a 2-D self [total_M, K] "
                "needs offs (the cumulative end row of each group)");
    TORCH_CHECK(offs->numel() == G, "_scaled_grouped_mm: offs has ", offs->numel(), " entries for ", G, " groups");
    TORCH_CHECK(scale_a.numel() == a.size(0), "_scaled_grouped_mm: scale_a must have one scale per row of self (",
                a.size(0), "), got shape ", scale_a.sizes());
    Tensor ends = offs->to(at::kLong);
    Tensor out = at::zeros({a.size(0), N}, a.options().dtype(dt));
    int64_t start = 0;
    for (int64_t g = 0; g < G; ++g) {
      const int64_t end = ends[g].item<int64_t>();
      TORCH_CHECK(start <= end && end <= a.size(0), "_scaled_grouped_mm: offs must be non-decreasing and at most ",
                  a.size(0), ", got ", end, " after ", start);
      if (end > start) {
        out.slice(0, start, end).copy_(scaled_mm_cpu(a.slice(0, start, end), b[g],
                                                     scale_a.reshape({-1, 1}).slice(0, start, end),
                                                     scale_b[g].unsqueeze(0), std::nullopt, scale_result, dt));
      }
      start = end;
    }
    return out;
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_scaled_mm", [](const Tensor& a, const Tensor& b, const Tensor& sa, const Tensor& sb,
                          const std::optional<Tensor>& bias, const std::optional<Tensor>& sr,
                          std::optional<c10::ScalarType> dt, bool fast) {
    check_fp8_compute("_scaled_mm", {&a, &b});
    return NeuronKernel<ScaledMm, false>::run(a, b, sa, sb, bias, sr, dt, fast);
  });
  m.impl("_scaled_mm.out", [](const Tensor& a, const Tensor& b, const Tensor& sa, const Tensor& sb,
                              const std::optional<Tensor>& bias, const std::optional<Tensor>& sr,
                              std::optional<c10::ScalarType> dt, bool fast, Tensor& out) -> Tensor& {
    check_fp8_compute("_scaled_mm", {&a, &b});
    return NeuronKernel<ScaledMmOut, false>::run(a, b, sa, sb, bias, sr, dt, fast, out);
  });
  m.impl("_scaled_mm_v2", [](const Tensor& a, const Tensor& b, at::TensorList sa, at::IntArrayRef ra,
                             at::IntArrayRef wa, at::TensorList sb, at::IntArrayRef rb, at::IntArrayRef wb,
                             const std::optional<Tensor>& bias, std::optional<c10::ScalarType> dt,
                             at::IntArrayRef cdim, bool fast) {
    check_fp8_compute("scaled_mm", {&a, &b});
    return NeuronKernel<ScaledMmV2, false>::run(a, b, sa, ra, wa, sb, rb, wb, bias, dt, cdim, fast);
  });
  m.impl("_scaled_grouped_mm", [](const Tensor& a, const Tensor& b, const Tensor& sa, const Tensor& sb,
                                  const std::optional<Tensor>& offs, const std::optional<Tensor>& bias,
                                  const std::optional<Tensor>& sr, std::optional<c10::ScalarType> dt, bool fast) {
    check_fp8_compute("_scaled_grouped_mm", {&a, &b});
    return NeuronKernel<ScaledGroupedMm, false>::run(a, b, sa, sb, offs, bias, sr, dt, fast);
  });
}

}  // namespace torch_neuronx
