// The engines' arithmetic: element encodings (decode to fp32, encode with the hardware's
// rounding) and the ALU operators and activation functions every engine applies.
#include "nki/numerics.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace neuron::nki {

void decode_run(DType d, const uint8_t* p, int64_t stride, int64_t n, float* out) {
  const int64_t step = stride * static_cast<int64_t>(dtype_size(d));
  switch (d) {
    case DType::kFloat32:
    case DType::kTFloat32:
      if (stride == 1) {
        std::memcpy(out, p, n * 4);
      } else {
        for (int64_t i = 0; i < n; ++i) std::memcpy(out + i, p + i * step, 4);
      }
      return;
    case DType::kBFloat16:
      if (stride == 1) {  // a plain loop the compiler vectorizes
        const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
        uint32_t* o = reinterpret_cast<uint32_t*>(out);
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<uint32_t>(h[i]) << 16;
        return;
      }
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + i * step, 2);
        out[i] = bf16_to_float(h);
      }
      return;
    case DType::kFloat16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + i * step, 2);
        out[i] = decode_minifloat(h, kF16);
      }
      return;
    case DType::kFloat8E4M3: case DType::kFloat8E4M3FN: case DType::kFloat8E5M2: {
      static const auto table = [] {
        struct T { float v[3][256]; } t{};
        for (int c = 0; c < 256; ++c) {
          t.v[0][c] = decode_minifloat(c, kE4M3);
          t.v[1][c] = decode_minifloat(c, kE4M3FN);
          t.v[2][c] = decode_minifloat(c, kE5M2);
        }
        return t;
      }();
      const float* tab = table.v[d == DType::kFloat8E4M3 ? 0 : d == DType::kFloat8E4M3FN ? 1 : 2];
      for (int64_t i = 0; i < n; ++i) out[i] = tab[p[i * step]];
      return;
    }
    case DType::kInt8: for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int8_t>(p[i * step]); return;
    case DType::kUInt8: case DType::kBool: for (int64_t i = 0; i < n; ++i) out[i] = p[i * step]; return;
    case DType::kInt16:
      for (int64_t i = 0; i < n; ++i) { int16_t v; std::memcpy(&v, p + i * step, 2); out[i] = v; }
      return;
    case DType::kUInt16:
      for (int64_t i = 0; i < n; ++i) { uint16_t v; std::memcpy(&v, p + i * step, 2); out[i] = v; }
      return;
    case DType::kInt32:
      for (int64_t i = 0; i < n; ++i) { int32_t v; std::memcpy(&v, p + i * step, 4); out[i] = static_cast<float>(v); }
      return;
    case DType::kUInt32:
      for (int64_t i = 0; i < n; ++i) { uint32_t v; std::memcpy(&v, p + i * step, 4); out[i] = static_cast<float>(v); }
      return;
  }
}

void encode_run(DType d, const float* in, int64_t n, uint8_t* p, int64_t stride) {
  const int64_t step = stride * static_cast<int64_t>(dtype_size(d));
  switch (d) {
    case DType::kFloat32:
      if (stride == 1) {
        std::memcpy(p, in, n * 4);
      } else {
        for (int64_t i = 0; i < n; ++i) std::memcpy(p + i * step, in + i, 4);
      }
      return;
    case DType::kTFloat32:
      for (int64_t i = 0; i < n; ++i) { float v = tf32_round(in[i]); std::memcpy(p + i * step, &v, 4); }
      return;
    case DType::kBFloat16:
      if (stride == 1) {  // branch-free, so the compiler vectorizes it
        uint16_t* o = reinterpret_cast<uint16_t*>(p);
        const uint32_t* b = reinterpret_cast<const uint32_t*>(in);
        for (int64_t i = 0; i < n; ++i) {
          const uint32_t x = b[i];
          const uint16_t rounded = static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
          const uint16_t nan = static_cast<uint16_t>((x >> 16) | 0x40u);
          o[i] = (x & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
        }
        return;
      }
      for (int64_t i = 0; i < n; ++i) { uint16_t h = float_to_bf16(in[i]); std::memcpy(p + i * step, &h, 2); }
      return;
    case DType::kFloat16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h = static_cast<uint16_t>(encode_minifloat(in[i], kF16));
        std::memcpy(p + i * step, &h, 2);
      }
      return;
    case DType::kFloat8E4M3: for (int64_t i = 0; i < n; ++i) p[i * step] = encode_minifloat(in[i], kE4M3); return;
    case DType::kFloat8E4M3FN: for (int64_t i = 0; i < n; ++i) p[i * step] = encode_minifloat(in[i], kE4M3FN); return;
    case DType::kFloat8E5M2: for (int64_t i = 0; i < n; ++i) p[i * step] = encode_minifloat(in[i], kE5M2); return;
    case DType::kInt8: for (int64_t i = 0; i < n; ++i) p[i * step] = static_cast<uint8_t>(saturate_round<int8_t>(in[i])); return;
    case DType::kUInt8: for (int64_t i = 0; i < n; ++i) p[i * step] = saturate_round<uint8_t>(in[i]); return;
    case DType::kBool: for (int64_t i = 0; i < n; ++i) p[i * step] = in[i] != 0.0f; return;
    case DType::kInt16:
      for (int64_t i = 0; i < n; ++i) { int16_t v = saturate_round<int16_t>(in[i]); std::memcpy(p + i * step, &v, 2); }
      return;
    case DType::kUInt16:
      for (int64_t i = 0; i < n; ++i) { uint16_t v = saturate_round<uint16_t>(in[i]); std::memcpy(p + i * step, &v, 2); }
      return;
    case DType::kInt32:
      for (int64_t i = 0; i < n; ++i) { int32_t v = saturate_round<int32_t>(in[i]); std::memcpy(p + i * step, &v, 4); }
      return;
    case DType::kUInt32:
      for (int64_t i = 0; i < n; ++i) { uint32_t v = saturate_round<uint32_t>(in[i]); std::memcpy(p + i * step, &v, 4); }
      return;
  }
}

void decode_int_run(DType d, const uint8_t* p, int64_t stride, int64_t n, int64_t* out) {
  const int64_t step = stride * static_cast<int64_t>(dtype_size(d));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* e = p + i * step;
    switch (d) {
      case DType::kInt8: out[i] = static_cast<int8_t>(*e); break;
      case DType::kUInt8: case DType::kBool: out[i] = *e; break;
      case DType::kInt16: { int16_t v; std::memcpy(&v, e, 2); out[i] = v; break; }
      case DType::kUInt16: { uint16_t v; std::memcpy(&v, e, 2); out[i] = v; break; }
      case DType::kInt32: { int32_t v; std::memcpy(&v, e, 4); out[i] = v; break; }
      case DType::kUInt32: { uint32_t v; std::memcpy(&v, e, 4); out[i] = v; break; }
      default: { float f; decode_run(d, e, 1, 1, &f); out[i] = static_cast<int64_t>(std::nearbyint(f)); }
    }
  }
}

void encode_int_run(DType d, const int64_t* in, int64_t n, uint8_t* p, int64_t stride, bool wrap) {
  const int64_t step = stride * static_cast<int64_t>(dtype_size(d));
  auto put = [&](auto tag, int64_t v, uint8_t* e) {
    using T = decltype(tag);
    T x;
    if (wrap) {
      x = static_cast<T>(v);
    } else {
      x = static_cast<T>(std::clamp<int64_t>(v, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
    }
    std::memcpy(e, &x, sizeof(T));
  };
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* e = p + i * step;
    switch (d) {
      case DType::kInt8: put(int8_t{}, in[i], e); break;
      case DType::kUInt8: put(uint8_t{}, in[i], e); break;
      case DType::kBool: *e = in[i] != 0; break;
      case DType::kInt16: put(int16_t{}, in[i], e); break;
      case DType::kUInt16: put(uint16_t{}, in[i], e); break;
      case DType::kInt32: put(int32_t{}, in[i], e); break;
      case DType::kUInt32: put(uint32_t{}, in[i], e); break;
      default: { float f = static_cast<float>(in[i]); encode_run(d, &f, 1, e, 1); }
    }
  }
}

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

namespace {
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }
}  // namespace

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

}  // namespace neuron::nki
