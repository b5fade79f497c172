// Autocast for `neuron`: torch.autocast("neuron", dtype=torch.bfloat16). The op lists
// are PyTorch's own (the ones CUDA uses): matmuls and convolutions run in the lower
// precision, numerically sensitive ops in float32, mixed-input ops at the widest type,
// and binary_cross_entropy is refused. CUDA's only other entries are cuDNN convolutions,
// which neuron never calls.
#include <ATen/autocast_mode.h>
#include <torch/library.h>

namespace {

using at::Tensor;
using c10::IntArrayRef;
using c10::Scalar;
using c10::ScalarType;

// Trainium's native matmul type is bfloat16, so it is the default autocast dtype.
struct SetDefaultDtype {
  SetDefaultDtype() { at::autocast::set_autocast_dtype(c10::DeviceType::PrivateUse1, at::kBFloat16); }
} g_set_default_dtype;

// As on CUDA: binary_cross_entropy is not safe in lower precision (its input is usually a
// sigmoid's output, whose log saturates), and autocast refuses it rather than run it in
// bfloat16 or silently in float32.
Tensor binary_cross_entropy_banned(const Tensor&, const Tensor&, const std::optional<Tensor>&, int64_t) {
  TORCH_CHECK(false,
              "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
              "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
              "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
              "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
              "safe to autocast.");
}

TORCH_LIBRARY_IMPL(_, AutocastPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}

TORCH_LIBRARY_IMPL(aten, AutocastPrivateUse1, m) {
#define NEURON_LOWER(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, lower_precision_fp)
#define NEURON_FP32(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32)
#define NEURON_FP32_OPT(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, fp32_set_opt_dtype)
#define NEURON_PROMOTE(...) KERNEL_PRIVATEUSEONE(__VA_ARGS__, promote)
#define NEURON_DIFF(REDISPATCH_FUNC, REGISTER_NAME, REGISTER_SIGNATURE, REDISPATCH_SIGNATURE, POLICY) \
  KERNEL_DIFFERENT_REDISPATCH_SIGNATURE_PRIVATEUSEONE(REDISPATCH_FUNC, REGISTER_NAME, REGISTER_SIGNATURE,     \
                                                      REDISPATCH_SIGNATURE, POLICY)
  AT_FORALL_LOWER_PRECISION_FP(NEURON_LOWER)
  AT_FORALL_FP32(NEURON_FP32)
  AT_FORALL_FP32_SET_OPT_DTYPE(NEURON_FP32_OPT)
  AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE(NEURON_DIFF)
  AT_FORALL_PROMOTE(NEURON_PROMOTE)
  m.impl(TORCH_SELECTIVE_NAME("aten::binary_cross_entropy"), TORCH_FN(binary_cross_entropy_banned));
#undef NEURON_LOWER
#undef NEURON_FP32
#undef NEURON_FP32_OPT
#undef NEURON_PROMOTE
#undef NEURON_DIFF
}

}  // namespace
