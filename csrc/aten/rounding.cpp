// Stochastic rounding of fp32 -> bf16 / fp8 conversions, as NeuronCores offer it
// (NEURON_RT_STOCHASTIC_ROUNDING_EN=1, AWS's name; off by default).
//
// A value between two neighbouring representable numbers lo < x < hi becomes hi with
// probability (x - lo) / (hi - lo), so the expected result is x: small updates to low-precision
// weights do not vanish on average. The random bits come from the device's generator (the CPU
// generator behind it), so torch.manual_seed makes runs reproducible.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Float8_e4m3fn.h>
#include <c10/util/Float8_e5m2.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <vector>

#include "aten/neuron.h"

namespace torch_neuronx {

bool stochastic_rounding_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("NEURON_RT_STOCHASTIC_ROUNDING_EN");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

namespace {

// bf16: add 16 random bits below the kept ones, then truncate. NaN stays NaN.
uint16_t bf16_stochastic(float x, uint32_t r) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + (r & 0xffffu)) >> 16);
}

// FP8 (sign-magnitude codes, magnitude increasing with the code): round toward zero, then step
// one code away from zero with probability (|x| - |lo|) / (|hi| - |lo|).
template <class F8>
uint8_t fp8_stochastic(float x, uint32_t r, float max_finite) {
  if (std::isnan(x)) return F8(x).x;
  const float a = std::fmin(std::fabs(x), max_finite);  // saturate, as the hardware's converter
  uint8_t code = F8(a).x;                                // round to nearest even
  float lo = static_cast<float>(F8(code, F8::from_bits()));
  if (lo > a) lo = static_cast<float>(F8(--code, F8::from_bits()));
  uint8_t up = code;
  if (lo < a && lo < max_finite) {
    const float hi = static_cast<float>(F8(static_cast<uint8_t>(code + 1), F8::from_bits()));
    const float p = (a - lo) / (hi - lo);
    if (static_cast<float>(r >> 8) * (1.0f / 16777216.0f) < p) up = static_cast<uint8_t>(code + 1);
  }
  return std::signbit(x) ? static_cast<uint8_t>(up | 0x80) : up;
}

}  // namespace

bool stochastic_round_copy(at::Tensor& dst, const at::Tensor& src, c10::DeviceIndex device) {
  const auto dt = dst.scalar_type();
  if (src.scalar_type() != at::kFloat ||
      (dt != at::kBFloat16 && dt != at::kFloat8_e4m3fn && dt != at::kFloat8_e5m2)) {
    return false;
  }
  at::Tensor s = src.expand(dst.sizes()).contiguous();
  const int64_t n = s.numel();
  // Random bits drawn up front, in order, from the device's generator: reproducible under
  // manual_seed whatever the thread count.
  std::vector<uint32_t> rnd(n);
  {
    at::Generator gen = cpu_generator_of(default_generator(device));
    std::lock_guard<std::mutex> lock(gen.mutex());
    auto* impl = at::check_generator<at::CPUGeneratorImpl>(gen);
    for (int64_t i = 0; i < n; ++i) rnd[i] = impl->random();
  }
  at::Tensor out = at::empty(dst.sizes(), dst.options().device(at::kCPU).dtype(dt));
  const float* in = s.const_data_ptr<float>();
  at::parallel_for(0, n, 4096, [&](int64_t b, int64_t e) {
    if (dt == at::kBFloat16) {
      auto* o = reinterpret_cast<uint16_t*>(out.mutable_data_ptr());
      for (int64_t i = b; i < e; ++i) o[i] = bf16_stochastic(in[i], rnd[i]);
    } else if (dt == at::kFloat8_e4m3fn) {
      auto* o = reinterpret_cast<uint8_t*>(out.mutable_data_ptr());
      for (int64_t i = b; i < e; ++i) o[i] = fp8_stochastic<c10::Float8_e4m3fn>(in[i], rnd[i], 448.0f);
    } else {
      auto* o = reinterpret_cast<uint8_t*>(out.mutable_data_ptr());
      for (int64_t i = b; i < e; ++i) o[i] = fp8_stochastic<c10::Float8_e5m2>(in[i], rnd[i], 57344.0f);
    }
  });
  dst.copy_(out);  // same dtype: moves bits
  return true;
}

}  // namespace torch_neuronx
