// Scaled dot-product attention on neuron through PyTorch's "memory-efficient" entry points.
//
// Why: for a non-CUDA device, SDPA's flash branch calls a CPU-only op
// (_scaled_dot_product_flash_attention_for_cpu), which context parallelism and DTensor's
// sharding rules do not know, while the efficient branch calls device-generic ops that
// they do (ring attention, sequence sharding). So where the CPU would pick flash, neuron
// picks "efficient", and implements it with the same CPU flash kernel: identical numbers.
#include <ATen/ATen.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/native/transformers/sdp_utils_cpp.h>
#include <ATen/ops/_fused_sdp_choice_native.h>
#include <torch/library.h>

#include <tuple>

#include "aten/kernel.h"
#include "aten/neuron.h"

namespace torch_neuronx {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using sdp::SDPBackend;

// scaled_dot_product_attention asks the _fused_sdp_choice stub which kernel to use (and
// other code asks the op). Answer as the CPU does, with "efficient" in place of "flash".
// The CPU's choice reads only metadata (shapes, strides, dtypes, requires_grad), so it is
// asked with the neuron tensors themselves: they may be fake or meta-backed (Dynamo and
// AOTAutograd trace with FakeTensorMode), and their shapes may be symbolic.
int64_t fused_sdp_choice(const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& mask, double dropout_p,
                         bool is_causal, std::optional<double> scale, bool enable_gqa) {
  int64_t cpu = at::native::_fused_sdp_choice_cpp(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa);
  // Dropout (its RNG replay) and grouped-query heads stay on the CPU's own kernels.
  bool grouped = enable_gqa && q.dim() == 4 && k.dim() == 4 && q.sym_size(1) != k.sym_size(1);
  if (cpu == static_cast<int64_t>(SDPBackend::flash_attention) && dropout_p == 0.0 && !grouped)
    return static_cast<int64_t>(SDPBackend::efficient_attention);
  return cpu;
}

int64_t fused_sdp_choice_op(const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& mask, double dropout_p,
                            bool is_causal, std::optional<double> scale, bool enable_gqa) {
  NEURON_COUNT_EXECUTED("aten::_fused_sdp_choice");
  return fused_sdp_choice(q, k, v, mask, dropout_p, is_causal, scale, enable_gqa);
}

std::tuple<Tensor, Tensor, Tensor, Tensor> efficient_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                                               const OptTensor& bias, bool compute_log_sumexp,
                                                               double dropout_p, bool is_causal,
                                                               std::optional<double> scale) {
  NEURON_COUNT_EXECUTED("aten::_scaled_dot_product_efficient_attention");
  TORCH_CHECK_NOT_IMPLEMENTED(dropout_p == 0.0, "_scaled_dot_product_efficient_attention on neuron: dropout_p must be 0 "
                              "(got ", dropout_p, "); scaled_dot_product_attention picks another kernel for dropout");
  auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, dropout_p, is_causal, bias, scale);
  // [B, H, L] float, as the flash kernels return it. (CUDA's efficient kernel pads L to a
  // multiple of 32; ring attention merges per-chunk results by logsumexp and needs it
  // unpadded for chunks of any length. PyTorch's meta kernel describes CUDA's, so fake
  // neuron tensors get this one's: torch_neuronx/_device_defaults.py.)
  Tensor log_sumexp = compute_log_sumexp ? lse : at::empty({lse.size(0), lse.size(1), 0}, lse.options());
  // Unused (no dropout); on the device, where FakeTensorMode puts them too.
  auto seed = at::empty({}, q.options().dtype(at::kLong));
  auto offset = at::empty({}, q.options().dtype(at::kLong));
  return {out, log_sumexp, seed, offset};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> efficient_attention_backward(
    const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& bias, const Tensor& out,
    const Tensor& logsumexp, const Tensor& /*philox_seed*/, const Tensor& /*philox_offset*/, double dropout_p,
    std::array<bool, 4> grad_input_mask, bool is_causal, std::optional<double> scale) {
  NEURON_COUNT_EXECUTED("aten::_scaled_dot_product_efficient_attention_backward");
  TORCH_CHECK_NOT_IMPLEMENTED(!grad_input_mask[3], "_scaled_dot_product_efficient_attention_backward on neuron: the "
                              "gradient of attn_bias is not computed; scaled_dot_product_attention picks another "
                              "kernel when the mask requires grad");
  TORCH_CHECK(logsumexp.dim() == 3 && logsumexp.size(2) >= q.size(2), "_scaled_dot_product_efficient_attention_backward"
              ": logsumexp of shape ", logsumexp.sizes(), " does not cover ", q.size(2), " queries");
  Tensor lse = logsumexp.narrow(2, 0, q.size(2));
  OptTensor mask = bias.defined() ? OptTensor(bias) : std::nullopt;
  auto [gq, gk, gv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
      grad_out.contiguous(), q, k, v, out, lse.contiguous(), dropout_p, is_causal, mask, scale);
  return {gq, gk, gv, Tensor()};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_fused_sdp_choice", TORCH_FN(fused_sdp_choice_op));
  m.impl("_scaled_dot_product_efficient_attention", TORCH_FN(efficient_attention));
  m.impl("_scaled_dot_product_efficient_attention_backward", TORCH_FN(efficient_attention_backward));
}

}  // namespace torch_neuronx

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &torch_neuronx::fused_sdp_choice)
}  // namespace at::native
