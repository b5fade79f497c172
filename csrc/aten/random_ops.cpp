// Random ops whose ATen schema has no generator argument.
//
// A random op with a Generator? argument runs its CPU kernel on device memory with the CPU
// generator behind the device's (KernelCall::generator_arg, for typed kernels and the
// fallback alike). An op without one gives the CPU kernel nothing to pass, so the kernel
// draws from the CPU's default generator: torch.neuron.manual_seed, get/set_rng_state and
// fork_rng would not govern it. Each such op with a CPU kernel is implemented here instead,
// drawing from the device's generator in the CPU kernel's order, so after the same seed it
// gives the CPU's numbers. tests/test_random.py lists ATen's generator-less random ops and
// fails on one that is neither here nor known to draw nothing.
#include <ATen/ATen.h>
#include <ATen/ops/native_dropout_ops.h>
#include <torch/library.h>

#include <tuple>

#include "aten/kernel.h"
#include "aten/neuron.h"

namespace torch_neuronx {
namespace {

using at::Tensor;

// native_dropout: the CPU kernel's steps (dropout, nn.Dropout, SDPA's math path and the
// dropout between RNN layers all come here on neuron), with the mask drawn from the device's
// generator. The mask is drawn as F.dropout draws it on CPU (one bernoulli_ over the input's
// shape), so the same seed drops the same elements on both devices.
std::tuple<Tensor, Tensor> native_dropout(const Tensor& input, double p, std::optional<bool> train) {
  counter_for<at::_ops::native_dropout>().executed.fetch_add(1, std::memory_order_relaxed);
  KernelCall call(at::_ops::native_dropout::name, /*allow_cpu_tensors=*/false, /*write_mask=*/0);
  const Tensor x = call.next_arg().input(input);
  call.begin();
  Tensor out;
  Tensor mask;
  if (x.numel() == 0) {
    out = x;
    mask = at::empty_like(x);
  } else if (!train.has_value() || *train) {
    const double keep = 1. - p;
    const double scale = keep == 0 ? 0. : 1. / keep;  // p == 1 drops everything, without NaN
    mask = at::empty_like(x, x.options().dtype(at::kBool));
    mask.bernoulli_(keep, call.generator_arg(std::nullopt));
    out = x.mul(mask).mul_(scale);
  } else {
    mask = at::ones_like(x, x.options().dtype(at::kBool));
    out = x.clone();
  }
  call.finish();
  return {call.output(std::move(out)), call.output(std::move(mask))};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("native_dropout", TORCH_FN(native_dropout)); }

}  // namespace torch_neuronx
