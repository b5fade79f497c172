// FP8 and MXFP8 scaled matmuls on neuron: torch._scaled_mm and _scaled_grouped_mm, native.
//
// Trainium 3 multiplies FP8 (and MXFP8: FP8 in blocks of 32 sharing a power-of-two E8M0 scale)
// on its Tensor engine with fp32 accumulation; Trainium 2 does not compute in FP8, so there
// these ops (and matrix products of FP8 tensors) raise, naming the platform and the fix.
//
// How: the operands are decoded exactly (FP8 values, and FP8 values times an E8M0 block scale,
// a power of two, are exact in bf16 and fp32), multiplied with fp32 accumulation (the Tensor
// engine's), and the tensor-wise / row-wise scales and the bias are applied to the fp32 sums in
// float64 before the one rounding to out_dtype (through round-to-odd, so it is one rounding).
// The operands are decoded to bf16 (fp32 for MX scales so extreme that a scaled value would leave
// bf16's normal range) and multiplied on the device's GEMM (cpu/gemm.h), which uses the host's
// BF16 dot products where it has them.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/ops/_scaled_grouped_mm_ops.h>
#include <ATen/ops/_scaled_grouped_mm_v2_ops.h>
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
#include "cpu/gemm.h"
#include "runtime/platform.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace torch_neuronx {

bool is_fp8(c10::ScalarType t) {
  return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2 || t == at::kFloat8_e4m3fnuz || t == at::kFloat8_e5m2fnuz;
}

void check_fp8_compute(const char* op, std::initializer_list<const at::Tensor*> tensors) {
  bool fp8 = false;
  for (const at::Tensor* t : tensors) fp8 = fp8 || (t->defined() && is_fp8(t->scalar_type()));
  if (fp8) check_fp8_platform(op);
}

void check_fp8_platform(const char* op) {
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
    // As with cuBLAS, _scaled_mm takes MX scales in the blocked (swizzled 32x4x4) layout only:
    // a plain [rows, K / 32] matrix has the same number of elements whenever rows is a multiple
    // of 128 and K / 32 of 4, so accepting both would be ambiguous. Plain scales go through
    // torch.nn.functional.scaled_mm with SwizzleType.NO_SWIZZLE.
    const int64_t blocks = K / 32;
    TORCH_CHECK(scale.numel() == round_up(rows, 128) * round_up(blocks, 4), "_scaled_mm: MX ", which,
                " (float8_e8m0fnu) holds one scale per 32 elements of K in the blocked (swizzled) layout: ",
                round_up(rows, 128) * round_up(blocks, 4), " elements for ", rows, " rows and ", blocks,
                " blocks, got shape ", scale.sizes(), ". Rearrange [", rows, ", ", blocks, "] scales with "
                "torchao.prototype.mx_formats.utils.to_blocked, or pass them unswizzled to "
                "torch.nn.functional.scaled_mm with swizzle SwizzleType.NO_SWIZZLE");
    return {Scaling::kBlock32, unswizzle(scale, rows, blocks)};
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

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// Decoding tables: every FP8 / E8M0 code to its float value, and FP8 codes to bf16 bits (exact:
// every FP8 value is a bf16 value).
struct Fp8Tables {
  float e4m3fn[256], e5m2[256], e8m0[256];
  uint16_t e4m3fn_bf16[256], e5m2_bf16[256];
  Fp8Tables() {
    for (int c = 0; c < 256; ++c) {
      const uint8_t b = static_cast<uint8_t>(c);
      e4m3fn[c] = static_cast<float>(c10::Float8_e4m3fn(b, c10::Float8_e4m3fn::from_bits()));
      e5m2[c] = static_cast<float>(c10::Float8_e5m2(b, c10::Float8_e5m2::from_bits()));
      e8m0[c] = static_cast<float>(c10::Float8_e8m0fnu(b, c10::Float8_e8m0fnu::from_bits()));
      e4m3fn_bf16[c] = static_cast<uint16_t>(float_bits(e4m3fn[c]) >> 16);
      e5m2_bf16[c] = static_cast<uint16_t>(float_bits(e5m2[c]) >> 16);
    }
  }
};
const Fp8Tables& tables() {
  static const Fp8Tables t;
  return t;
}

// x [R, C] (FP8, any strides) -> Out (float or bf16) [R, C], exactly; with MX scales, element
// (i, j) is multiplied by 2^e of block scale(i, j) (still exact: a power of two; for bf16 the
// caller checked mx_fits_bf16).
template <class Out, class ScaleOf>
Tensor decode(const Tensor& x, ScaleOf scale_of, bool scaled) {
  const int64_t R = x.size(0), C = x.size(1), s0 = x.stride(0), s1 = x.stride(1);
  const bool e5m2 = x.scalar_type() == at::kFloat8_e5m2;
  const float* tab = e5m2 ? tables().e5m2 : tables().e4m3fn;
  const uint16_t* bf = e5m2 ? tables().e5m2_bf16 : tables().e4m3fn_bf16;
  const uint8_t* src = reinterpret_cast<const uint8_t*>(x.const_data_ptr());
  Tensor out = at::empty({R, C}, x.options().dtype(c10::CppTypeToScalarType<Out>::value));
  Out* dst = out.mutable_data_ptr<Out>();
  at::parallel_for(0, R, std::max<int64_t>(1, 16384 / std::max<int64_t>(C, 1)), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      for (int64_t j = 0; j < C; ++j) {
        const uint8_t code = src[i * s0 + j * s1];
        if constexpr (std::is_same_v<Out, c10::BFloat16>) {
          dst[i * C + j] = scaled ? c10::BFloat16(tab[code] * scale_of(i, j))
                                  : c10::BFloat16(bf[code], c10::BFloat16::from_bits());
        } else {
          dst[i * C + j] = scaled ? tab[code] * scale_of(i, j) : tab[code];
        }
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

// Epilogue of one row: out[n] = acc[n] * a * sb[n] (+ bias[n]), in float64, rounded once.
template <class T>
void epilogue_row(T* out, const float* acc, int64_t cols, double a, const double* sb, int64_t sb_step,
                  const double* bias, double clamp) {
  for (int64_t n = 0; n < cols; ++n) {
    double v = static_cast<double>(acc[n]) * a * sb[n * sb_step];
    if (bias) v += bias[n];
    if (clamp > 0) v = std::min(std::max(v, -clamp), clamp);
    if constexpr (std::is_same_v<T, float>) {
      out[n] = static_cast<float>(v);
    } else {
      out[n] = T(round_to_odd(v));
    }
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// The same for fp32 and bf16 outputs, 8 lanes of float64 at a time. bf16: round to odd into
// fp32 (truncate, then set the last bit when inexact), then round to nearest even, as above.
template <class T>
__attribute__((target("avx512f,avx512dq,avx512bw,avx512vl"))) void epilogue_row_avx512(
    T* out, const float* acc, int64_t cols, double a, const double* sb, int64_t sb_step, const double* bias) {
  const __m512d va = _mm512_set1_pd(a);
  for (int64_t n = 0; n < cols; n += 8) {
    const __mmask8 m = static_cast<__mmask8>(cols - n >= 8 ? 0xff : (1u << (cols - n)) - 1);
    __m512d v = _mm512_mul_pd(_mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, acc + n)), va);
    v = _mm512_mul_pd(v, sb_step ? _mm512_maskz_loadu_pd(m, sb + n) : _mm512_set1_pd(sb[0]));
    if (bias) v = _mm512_add_pd(v, _mm512_maskz_loadu_pd(m, bias + n));
    if constexpr (std::is_same_v<T, float>) {
      _mm256_mask_storeu_ps(out + n, m, _mm512_cvtpd_ps(v));
    } else {
      const __m256 f = _mm512_cvt_roundpd_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __mmask8 inexact = _mm512_cmp_pd_mask(_mm512_cvtps_pd(f), v, _CMP_NEQ_UQ);
      __m256i bits = _mm256_castps_si256(f);
      bits = _mm256_mask_or_epi32(bits, inexact, bits, _mm256_set1_epi32(1));
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
      __m256i r = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
      const __mmask8 nan = _mm256_cmpgt_epu32_mask(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff)),
                                                   _mm256_set1_epi32(0x7f800000));
      r = _mm256_mask_mov_epi32(r, nan, _mm256_set1_epi32(0x7fc0));
      _mm_mask_storeu_epi16(out + n, m, _mm256_cvtepi32_epi16(r));
    }
  }
}
#endif

// Epilogue of a block of rows x cols sums (acc, row stride lda) into out (row stride ldo);
// sa / sb / bias point at the block's first row / column.
template <class T>
void epilogue_block(T* out, int64_t ldo, const float* acc, int64_t lda, int64_t rows, int64_t cols,
                    const double* sa, int64_t sa_step, const double* sb, int64_t sb_step, const double* bias,
                    double clamp) {
#if defined(__x86_64__) && defined(__GNUC__)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>) {
    if (clamp == 0 && neuron::cpu::gemm_path() == neuron::cpu::GemmPath::kAvx512Bf16) {
      for (int64_t i = 0; i < rows; ++i) {
        epilogue_row_avx512(out + i * ldo, acc + i * lda, cols, sa[i * sa_step], sb, sb_step, bias);
      }
      return;
    }
  }
#endif
  for (int64_t i = 0; i < rows; ++i) {
    epilogue_row(out + i * ldo, acc + i * lda, cols, sa[i * sa_step], sb, sb_step, bias, clamp);
  }
}

// Whether MX-scaled FP8 values and their products stay normal in bf16 / fp32 (|exponent| <= 40:
// the smallest product is 2^-112), so the bf16 GEMM's flush of subnormals cannot change a sum.
bool mx_fits_bf16(const Tensor& codes) {
  const uint8_t* c = reinterpret_cast<const uint8_t*>(codes.const_data_ptr());
  const int64_t n = codes.numel();
  for (int64_t i = 0; i < n; ++i) {
    if (c[i] < 127 - 40 || c[i] > 127 + 40) return false;
  }
  return true;
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
  const uint8_t* pa = mx ? reinterpret_cast<const uint8_t*>(sa_codes.const_data_ptr()) : nullptr;
  const uint8_t* pb = mx ? reinterpret_cast<const uint8_t*>(sb_codes.const_data_ptr()) : nullptr;

  // Scales and bias in float64 (MX scales are in the operands already).
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
  if (M == 0 || N == 0) return out;

  auto run = [&](auto* po) {
    namespace cpu = neuron::cpu;
    // bf16 operands unless an MX-scaled value would leave bf16's normal range (the host's BF16
    // dot products read subnormals as zero); products are exact either way, sums fp32.
    const bool bf16 = !mx || (mx_fits_bf16(sa_codes) && mx_fits_bf16(sb_codes));
    const float* e8m0 = tables().e8m0;
    const int64_t blocks = K / 32;
    auto scale_a = [&](int64_t m, int64_t k) { return e8m0[pa[m * blocks + k / 32]]; };
    auto scale_b = [&](int64_t k, int64_t n) { return e8m0[pb[n * blocks + k / 32]]; };
    Tensor da = bf16 ? decode<c10::BFloat16>(a, scale_a, mx) : decode<float>(a, scale_a, mx);
    Tensor db = bf16 ? decode<c10::BFloat16>(b, scale_b, mx) : decode<float>(b, scale_b, mx);
    const cpu::Dtype kind = bf16 ? cpu::Dtype::kBFloat16 : cpu::Dtype::kFloat32;
    Tensor acc = at::empty({M, N}, a.options().dtype(at::kFloat));
    static const cpu::ParallelFor par = [](int64_t n, const std::function<void(int64_t, int64_t)>& body) {
      at::parallel_for(0, n, 1, body);
    };
    cpu::gemm(M, N, K, {da.const_data_ptr(), kind, K, 1}, {db.const_data_ptr(), kind, N, 1},
              acc.mutable_data_ptr<float>(), N, cpu::default_gemm_options(&par));
    const float* pacc = acc.const_data_ptr<float>();
    at::parallel_for(0, M, std::max<int64_t>(1, 16384 / N), [&](int64_t lo, int64_t hi) {
      epilogue_block(po + lo * N, N, pacc + lo * N, N, hi - lo, N, psa + lo * sa_step, sa_step, psb, sb_step, pbias,
                     clamp);
    });
  };
  switch (dt) {
    case at::kFloat: run(out.mutable_data_ptr<float>()); break;
    case at::kBFloat16: run(out.mutable_data_ptr<c10::BFloat16>()); break;
    case at::kHalf: run(out.mutable_data_ptr<c10::Half>()); break;
    case at::kFloat8_e4m3fn: run(out.mutable_data_ptr<c10::Float8_e4m3fn>()); break;
    default: run(out.mutable_data_ptr<c10::Float8_e5m2>());
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

// Grouped (MoE) products with row-wise scales, the four layouts of torch._grouped_mm:
//   2-D x 3-D: self [total_M, K], mat2 [G, K, N], offs ends along M -> [total_M, N];
//              scale_a one per row of self, scale_b [G, N]  (routed experts, forward)
//   3-D x 2-D: self [G, M, K], mat2 [K, total_N], offs ends along N -> [M, total_N];
//              scale_a [G, M], scale_b one per column of mat2
//   2-D x 2-D: self [M, total_K], mat2 [total_K, N], offs ends along K -> [G, M, N];
//              scale_a [G * M], scale_b [G * N]  (weight gradients)
//   3-D x 3-D: self [G, M, K], mat2 [G, K, N], no offs -> [G, M, N]; scale_a [G, M], scale_b [G, N]
Tensor scaled_grouped_mm_impl(const char* op, const Tensor& a, const Tensor& b, const Tensor& scale_a,
                              const Tensor& scale_b, const std::optional<Tensor>& offs,
                              const std::optional<Tensor>& bias, const std::optional<Tensor>& scale_result,
                              std::optional<c10::ScalarType> out_dtype) {
  TORCH_CHECK((a.dim() == 2 || a.dim() == 3) && (b.dim() == 2 || b.dim() == 3), op, ": self and mat2 are 2-D or 3-D, "
              "got ", a.sizes(), " and ", b.sizes());
  TORCH_CHECK(!bias.has_value() || !bias->defined(), op, ": bias is not supported (as in PyTorch)");
  const c10::ScalarType dt = out_dtype.value_or(at::kBFloat16);
  const bool has_offs = offs.has_value() && offs->defined();
  const int64_t K = a.size(-1);
  TORCH_CHECK(b.size(-2) == K, op, ": self ", a.sizes(), " and mat2 ", b.sizes(), " disagree on K");
  auto check_scale = [&](const Tensor& s, std::vector<int64_t> want, const char* which) {
    TORCH_CHECK(s.scalar_type() == at::kFloat, op, ": ", which, " must be float32 row-wise scales, got ",
                s.scalar_type());
    const bool ok = want.size() == 1 ? s.numel() == want[0] : (s.dim() == 2 && s.sizes() == at::IntArrayRef(want));
    TORCH_CHECK(ok, op, ": ", which, " must be ", want.size() == 1 ? "one-dimensional with " : "", at::IntArrayRef(want),
                want.size() == 1 ? " elements" : "", " for self ", a.sizes(), " and mat2 ", b.sizes(), ", got ",
                s.sizes());
  };
  auto mm = [&](const Tensor& x, const Tensor& y, const Tensor& sx, const Tensor& sy) {
    return scaled_mm_cpu(x, y, sx.reshape({-1, 1}), sy.reshape({1, -1}), std::nullopt, scale_result, dt);
  };
  if (a.dim() == 3 && b.dim() == 3) {
    TORCH_CHECK(!has_offs, op, ": 3-D x 3-D is a batched product; offs must not be given");
    const int64_t G = a.size(0), M = a.size(1), N = b.size(2);
    TORCH_CHECK(b.size(0) == G, op, ": ", G, " groups in self but ", b.size(0), " in mat2");
    check_scale(scale_a, {G, M}, "scale_a");
    check_scale(scale_b, {G, N}, "scale_b");
    Tensor out = at::empty({G, M, N}, a.options().dtype(dt));
    for (int64_t g = 0; g < G; ++g) out[g].copy_(mm(a[g], b[g], scale_a[g], scale_b[g]));
    return out;
  }
  TORCH_CHECK(has_offs, op, ": with a 2-D operand, offs (the cumulative end of each group along the grouped "
              "dimension) is required");
  TORCH_CHECK(offs->dim() == 1 && !at::isFloatingType(offs->scalar_type()), op, ": offs must be a 1-D integer "
              "tensor, got ", offs->scalar_type(), " of shape ", offs->sizes());
  const int64_t G = offs->numel();
  Tensor ends = offs->to(at::kCPU).to(at::kLong).contiguous();
  const int64_t* pe = ends.const_data_ptr<int64_t>();
  // The grouped dimension's length and each group's [start, end).
  auto groups = [&](int64_t total, const char* dim) {
    std::vector<std::pair<int64_t, int64_t>> r;
    int64_t start = 0;
    for (int64_t g = 0; g < G; ++g) {
      TORCH_CHECK(start <= pe[g] && pe[g] <= total, op, ": offs must be non-decreasing and at most ", total,
                  " (the length of ", dim, "), got ", pe[g], " after ", start);
      r.emplace_back(start, pe[g]);
      start = pe[g];
    }
    return r;
  };
  if (a.dim() == 2 && b.dim() == 3) {
    const int64_t N = b.size(2);
    TORCH_CHECK(b.size(0) == G, op, ": offs has ", G, " entries for ", b.size(0), " groups in mat2");
    check_scale(scale_a, {a.size(0)}, "scale_a");
    check_scale(scale_b, {G, N}, "scale_b");
    Tensor sa = scale_a.reshape({-1});
    Tensor out = at::zeros({a.size(0), N}, a.options().dtype(dt));
    const auto gs = groups(a.size(0), "self's rows");
    for (int64_t g = 0; g < G; ++g) {
      auto [s, e] = gs[g];
      if (e > s) out.slice(0, s, e).copy_(mm(a.slice(0, s, e), b[g], sa.slice(0, s, e), scale_b[g]));
    }
    return out;
  }
  if (a.dim() == 3 && b.dim() == 2) {
    const int64_t M = a.size(1);
    TORCH_CHECK(a.size(0) == G, op, ": offs has ", G, " entries for ", a.size(0), " groups in self");
    check_scale(scale_a, {G, M}, "scale_a");
    check_scale(scale_b, {b.size(1)}, "scale_b");
    Tensor sb = scale_b.reshape({-1});
    Tensor out = at::zeros({M, b.size(1)}, a.options().dtype(dt));
    const auto gs = groups(b.size(1), "mat2's columns");
    for (int64_t g = 0; g < G; ++g) {
      auto [s, e] = gs[g];
      if (e > s) out.slice(1, s, e).copy_(mm(a[g], b.slice(1, s, e), scale_a[g], sb.slice(0, s, e)));
    }
    return out;
  }
  const int64_t M = a.size(0), N = b.size(1);  // 2-D x 2-D: groups along K
  check_scale(scale_a, {G * M}, "scale_a");
  check_scale(scale_b, {G * N}, "scale_b");
  Tensor sa = scale_a.reshape({-1}), sb = scale_b.reshape({-1});
  Tensor out = at::zeros({G, M, N}, a.options().dtype(dt));
  const auto gs = groups(K, "K");
  for (int64_t g = 0; g < G; ++g) {
    auto [s, e] = gs[g];
    if (e > s) {
      out[g].copy_(mm(a.slice(1, s, e), b.slice(0, s, e), sa.slice(0, g * M, (g + 1) * M),
                      sb.slice(0, g * N, (g + 1) * N)));
    }
  }
  return out;
}

struct ScaledGroupedMm : at::_ops::_scaled_grouped_mm {
  static Tensor redispatch(c10::DispatchKeySet, const Tensor& a, const Tensor& b, const Tensor& scale_a,
                           const Tensor& scale_b, const std::optional<Tensor>& offs,
                           const std::optional<Tensor>& bias, const std::optional<Tensor>& scale_result,
                           std::optional<c10::ScalarType> out_dtype, bool) {
    return scaled_grouped_mm_impl("_scaled_grouped_mm", a, b, scale_a, scale_b, offs, bias, scale_result, out_dtype);
  }
};

// torch.nn.functional.scaled_grouped_mm: one RowWise scale tensor per operand.
struct ScaledGroupedMmV2 : at::_ops::_scaled_grouped_mm_v2 {
  static Tensor redispatch(c10::DispatchKeySet, const Tensor& a, const Tensor& b, at::TensorList scale_a,
                           at::IntArrayRef recipe_a, at::IntArrayRef, at::TensorList scale_b,
                           at::IntArrayRef recipe_b, at::IntArrayRef, const std::optional<Tensor>& offs,
                           const std::optional<Tensor>& bias, std::optional<c10::ScalarType> out_dtype,
                           at::IntArrayRef contraction_dim, bool) {
    TORCH_CHECK(contraction_dim.empty(), "scaled_grouped_mm: neuron contracts self's last and mat2's "
                "second-to-last dimension; contraction_dim must be empty, got ", contraction_dim);
    for (auto [scales, recipe, which] : {std::tuple{scale_a, recipe_a, "scale_a"}, std::tuple{scale_b, recipe_b, "scale_b"}}) {
      TORCH_CHECK(scales.size() == 1 && recipe.size() == 1, "scaled_grouped_mm: one scale tensor and one recipe for ",
                  which, ", got ", scales.size(), " and ", recipe.size());
      TORCH_CHECK_NOT_IMPLEMENTED(recipe[0] == 1, "scaled_grouped_mm on neuron: ", which, " uses recipe ", recipe[0],
                                  "; grouped products take RowWise scales (ScalingType.RowWise). MX grouped "
                                  "GEMMs are not supported yet");
    }
    return scaled_grouped_mm_impl("scaled_grouped_mm", a, b, scale_a[0], scale_b[0], offs, bias, std::nullopt,
                                  out_dtype);
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
  m.impl("_scaled_grouped_mm_v2", [](const Tensor& a, const Tensor& b, at::TensorList sa, at::IntArrayRef ra,
                                     at::IntArrayRef wa, at::TensorList sb, at::IntArrayRef rb, at::IntArrayRef wb,
                                     const std::optional<Tensor>& offs, const std::optional<Tensor>& bias,
                                     std::optional<c10::ScalarType> dt, at::IntArrayRef cdim, bool fast) {
    check_fp8_compute("scaled_grouped_mm", {&a, &b});
    return NeuronKernel<ScaledGroupedMmV2, false>::run(a, b, sa, ra, wa, sb, rb, wb, offs, bias, dt, cdim, fast);
  });
}

}  // namespace torch_neuronx
