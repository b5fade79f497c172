// Element encodings of the NeuronCore's dtypes, and the conversions every engine applies:
// inputs are decoded to fp32, results are encoded to the destination dtype with
// round-to-nearest-even (integers: round to nearest even, saturate; NaN -> 0).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "nki/ir.h"

namespace neuron::nki {

inline float bits_to_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t b = float_to_bits(f);
  if (std::isnan(f)) return static_cast<uint16_t>((b >> 16) | 0x40);
  b += 0x7fff + ((b >> 16) & 1);
  return static_cast<uint16_t>(b >> 16);
}
inline float bf16_to_float(uint16_t h) { return bits_to_float(static_cast<uint32_t>(h) << 16); }

inline float tf32_round(float f) {
  if (std::isnan(f) || std::isinf(f)) return f;
  uint32_t b = float_to_bits(f);
  b += 0xfff + ((b >> 13) & 1);
  return bits_to_float(b & 0xffffe000u);
}

// A small IEEE-like binary float: `man` mantissa bits, exponent bias `bias`.
struct MiniFloat {
  int exp_bits, man, bias;
  bool has_inf;       // all-ones exponent is inf/NaN (IEEE); otherwise only NaN codes are special
  float max_finite;
  uint8_t nan_code;
};
// fp16 is handled by the same code with 16-bit codes.
constexpr MiniFloat kF16{5, 10, 15, true, 65504.0f, 0};
constexpr MiniFloat kE5M2{5, 2, 15, true, 57344.0f, 0x7f};
constexpr MiniFloat kE4M3FN{4, 3, 7, false, 448.0f, 0x7f};
constexpr MiniFloat kE4M3{4, 3, 7, true, 240.0f, 0x7f};  // legacy IEEE-style e4m3

inline uint32_t encode_minifloat(float f, const MiniFloat& m) {
  const int total = 1 + m.exp_bits + m.man;
  const uint32_t sign = std::signbit(f) ? (1u << (total - 1)) : 0u;
  const uint32_t exp_all = (1u << m.exp_bits) - 1;
  if (std::isnan(f)) return sign | (exp_all << m.man) | (1u << (m.man - 1));
  float a = std::fabs(f);
  auto overflow = [&]() -> uint32_t {
    if (m.has_inf) return sign | (exp_all << m.man);
    return sign | (exp_all << m.man) | ((1u << m.man) - 1);  // NaN (e4m3fn has no inf)
  };
  if (std::isinf(a)) return overflow();
  if (a == 0.0f) return sign;
  const int emin = 1 - m.bias;
  int e = std::ilogb(a);
  if (e < emin) e = emin;
  // a = q * 2^(e - man) with q rounded to an integer, nearest even.
  float q = std::nearbyint(std::ldexp(a, m.man - e));
  if (q >= static_cast<float>(1u << (m.man + 1))) {
    q *= 0.5f;  // rounding carried into the next binade (q is then exactly 2^man)
    ++e;
  }
  float v = std::ldexp(q, e - m.man);
  if (v > m.max_finite) return overflow();
  uint32_t qi = static_cast<uint32_t>(q);
  if (qi < (1u << m.man)) return sign | qi;  // subnormal (e == emin)
  return sign | (static_cast<uint32_t>(e + m.bias) << m.man) | (qi & ((1u << m.man) - 1));
}

inline float decode_minifloat(uint32_t code, const MiniFloat& m) {
  const int total = 1 + m.exp_bits + m.man;
  const bool neg = (code >> (total - 1)) & 1;
  const uint32_t exp_all = (1u << m.exp_bits) - 1;
  const uint32_t e = (code >> m.man) & exp_all;
  const uint32_t q = code & ((1u << m.man) - 1);
  float v;
  if (m.has_inf && e == exp_all) {
    v = q ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else if (!m.has_inf && e == exp_all && q == ((1u << m.man) - 1)) {
    v = std::numeric_limits<float>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<float>(q), 1 - m.bias - m.man);
  } else {
    v = std::ldexp(static_cast<float>(q | (1u << m.man)), static_cast<int>(e) - m.bias - m.man);
  }
  return neg ? -v : v;
}

template <class I>
inline I saturate_round(float f) {
  if (std::isnan(f)) return 0;
  double r = std::nearbyint(static_cast<double>(f));
  if (r <= static_cast<double>(std::numeric_limits<I>::min())) return std::numeric_limits<I>::min();
  if (r >= static_cast<double>(std::numeric_limits<I>::max())) return std::numeric_limits<I>::max();
  return static_cast<I>(r);
}

// Decode n elements (element stride `stride`) of dtype d starting at p into out.
void decode_run(DType d, const uint8_t* p, int64_t stride, int64_t n, float* out);
// Encode n floats into dtype d at p (element stride `stride`), rounding as the hardware does.
void encode_run(DType d, const float* in, int64_t n, uint8_t* p, int64_t stride);
// Integer dtypes exactly (GpSimd's native integer path): decode to int64; encode saturating to
// the dtype's range, or keeping the low bits (`wrap`, for bitwise and shift results).
void decode_int_run(DType d, const uint8_t* p, int64_t stride, int64_t n, int64_t* out);
void encode_int_run(DType d, const int64_t* in, int64_t n, uint8_t* p, int64_t stride, bool wrap);

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// The ALU operators on fp32 (every engine's arithmetic), and on integers exactly (GpSimd's
// native int32 path). Unary operators ignore b.
float alu(Alu op, float a, float b);
int64_t alu_int(Alu op, int64_t a, int64_t b);
bool alu_unary(Alu op);
// Bitwise and shift results keep their low bits; arithmetic results saturate.
inline bool alu_wraps(Alu op) { return alu_is_bitvec(op); }
// The starting value of a reduction with op (0 for add, 1 for multiply, -inf for max, ...).
float identity_of(Alu op);
// The Scalar engine's activation functions, in fp32.
float act(Act op, float x);

}  // namespace neuron::nki
