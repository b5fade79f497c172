// The batch-norm statistics ops of nn.SyncBatchNorm (torch/nn/modules/_functions.py), which
// PyTorch implements only for CUDA: per-rank statistics, their combination across ranks,
// the normalisation, and the two halves of its backward.
//
// Each is a NeuronKernel (kernel.h) whose body runs ATen's CPU ops on the CPU aliases, so
// the device checks, device-memory allocation and output conversion are the ones every
// neuron op gets. Numerics follow CUDA's kernels (aten/src/ATen/native/cuda/Normalization.cu):
// statistics in CUDA's accumulate type (fp32 for fp16/bf16 and fp32, fp64 for fp64), Welford
// variance (var_mean), and the same output dtypes and memory formats.
#include <ATen/ATen.h>
#include <ATen/AccumulateType.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/batch_norm_backward_elemt_ops.h>
#include <ATen/ops/batch_norm_backward_reduce_ops.h>
#include <ATen/ops/batch_norm_elemt_ops.h>
#include <ATen/ops/batch_norm_gather_stats_ops.h>
#include <ATen/ops/batch_norm_gather_stats_with_counts_ops.h>
#include <ATen/ops/batch_norm_stats_ops.h>
#include <ATen/ops/batch_norm_update_stats_ops.h>
#include <torch/library.h>

#include <tuple>

#include "aten/kernel.h"

namespace torch_neuronx {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

c10::ScalarType acc_type(c10::ScalarType t) { return at::toAccumulateType(t, c10::DeviceType::CUDA); }

const Tensor* defined(const OptTensor& t) { return t.has_value() && t->defined() ? &*t : nullptr; }

void check_input(const char* op, const Tensor& input) {
  TORCH_CHECK(input.dim() >= 2, op, ": expected an input of at least 2 dimensions (N, C, ...), got shape ",
              input.sizes());
  TORCH_CHECK(at::isFloatingType(input.scalar_type()), op, ": expected a floating-point input, got ",
              input.scalar_type());
}

// A per-channel tensor (`what`) must hold one value per channel.
void check_channels(const char* op, const char* what, const Tensor& t, int64_t channels) {
  TORCH_CHECK(t.numel() == channels, op, ": expected ", what, " to have ", channels,
              " elements (one per channel of the input), got shape ", t.sizes());
}

// The dimensions statistics reduce over: all but the channel dimension 1.
std::vector<int64_t> reduce_dims(const Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// A per-channel vector in `dtype`, shaped to broadcast over the input ([1, C, 1, ...]).
Tensor per_channel(const Tensor& t, const Tensor& input, c10::ScalarType dtype) {
  std::vector<int64_t> shape(input.dim(), 1);
  shape[1] = input.size(1);
  return t.to(dtype).reshape(shape);
}

// `t` as a tensor of `like`'s dtype in `format` (what CUDA allocates for these results).
Tensor as_result(const Tensor& t, const Tensor& like, at::MemoryFormat format) {
  if (t.scalar_type() == like.scalar_type() && t.is_contiguous(format)) return t;
  Tensor out = at::empty_like(like, format);
  out.copy_(t);
  return out;
}

// Mean and biased variance per channel, in the accumulate type.
std::tuple<Tensor, Tensor> mean_var(const Tensor& input) {
  const c10::ScalarType acc = acc_type(input.scalar_type());
  auto [var, mean] = at::var_mean(input.to(acc), reduce_dims(input), /*correction=*/0, /*keepdim=*/false);
  return {mean, var};
}

// 1 / sqrt(var + eps); 0 where both are 0 (CUDA's InvStd).
Tensor inv_std(const Tensor& var, double eps) {
  Tensor invstd = (var + eps).sqrt_().reciprocal_();
  if (eps == 0) invstd.masked_fill_(var == 0, 0);
  return invstd;
}

struct BatchNormStats : at::_ops::batch_norm_stats {
  static std::tuple<Tensor, Tensor> redispatch(c10::DispatchKeySet, const Tensor& input, double eps) {
    check_input("batch_norm_stats", input);
    auto [mean, var] = mean_var(input);
    return {mean, inv_std(var, eps)};
  }
};

struct BatchNormUpdateStats : at::_ops::batch_norm_update_stats {
  static std::tuple<Tensor, Tensor> redispatch(c10::DispatchKeySet, const Tensor& input, const OptTensor& running_mean,
                                               const OptTensor& running_var, double momentum) {
    const char* op = "batch_norm_update_stats";
    check_input(op, input);
    const Tensor* rm = defined(running_mean);
    const Tensor* rv = defined(running_var);
    TORCH_CHECK((rm == nullptr) == (rv == nullptr), op, ": running_mean and running_var must both be given or both "
                "be None");
    auto [mean, var] = mean_var(input);
    if (rm != nullptr) {
      check_channels(op, "running_mean", *rm, input.size(1));
      check_channels(op, "running_var", *rv, input.size(1));
      const double n = static_cast<double>(input.numel() / input.size(1));
      const c10::ScalarType acc = acc_type(rm->scalar_type());
      rm->copy_(mean * momentum + rm->to(acc) * (1 - momentum));
      rv->copy_(var * (n / (n - 1)) * momentum + rv->to(acc) * (1 - momentum));
    }
    return {mean, var};
  }
};

// Combines per-rank statistics (rows of mean and invstd, with element counts) into the global
// mean and invstd, rank by rank as CUDA's batch_norm_reduce_statistics_kernel does, and
// updates the running statistics (with the unbiased variance).
std::tuple<Tensor, Tensor> gather_stats(const char* op, const Tensor& input, const Tensor& mean, const Tensor& invstd,
                                        const OptTensor& running_mean, const OptTensor& running_var, double momentum,
                                        double eps, const Tensor& counts) {
  TORCH_CHECK(mean.dim() == 2, op, ": expected mean of shape (world_size, channels), got ", mean.sizes());
  TORCH_CHECK(invstd.sizes() == mean.sizes(), op, ": expected invstd of the shape of mean ", mean.sizes(), ", got ",
              invstd.sizes());
  const int64_t world = mean.size(0);
  const int64_t channels = mean.size(1);
  TORCH_CHECK(counts.numel() == world, op, ": expected one count per row of mean (", world, "), got ",
              counts.numel());
  TORCH_CHECK(!counts.is_complex(), op, ": counts must be real numbers, got ", counts.scalar_type());
  const Tensor* rm = defined(running_mean);
  const Tensor* rv = defined(running_var);
  if (rm != nullptr) check_channels(op, "running_mean", *rm, channels);
  if (rv != nullptr) check_channels(op, "running_var", *rv, channels);

  const c10::ScalarType acc = acc_type(rm != nullptr ? rm->scalar_type() : input.scalar_type());
  const c10::ScalarType result = at::isReducedFloatingType(mean.scalar_type()) ? at::kFloat : mean.scalar_type();
  Tensor means = mean.to(acc);
  Tensor vars = invstd.to(acc).reciprocal().square_().sub_(eps);  // each rank's biased variance
  Tensor count = counts.to(at::kDouble).contiguous();
  const double* c = count.const_data_ptr<double>();

  Tensor avg = at::zeros({channels}, means.options());
  Tensor var_n = at::zeros({channels}, means.options());  // sum of squared deviations so far
  double n = 0;
  for (int64_t j = 0; j < world; ++j) {
    const double factor = 1.0 / (n + c[j]);
    Tensor m = means[j];
    var_n.add_(vars[j] * c[j]).add_((avg - m).square_() * (n * c[j] * factor));
    avg = avg * (n * factor) + m * (c[j] * factor);
    n += c[j];
  }
  Tensor global_invstd = (var_n / n + eps).sqrt_().reciprocal_();
  if (rm != nullptr) rm->copy_(rm->to(acc) * (1 - momentum) + avg * momentum);
  if (rv != nullptr) rv->copy_(rv->to(acc) * (1 - momentum) + var_n / (n - 1) * momentum);
  return {avg.to(result), global_invstd.to(result)};
}

struct BatchNormGatherStatsWithCounts : at::_ops::batch_norm_gather_stats_with_counts {
  static std::tuple<Tensor, Tensor> redispatch(c10::DispatchKeySet, const Tensor& input, const Tensor& mean,
                                               const Tensor& invstd, const OptTensor& running_mean,
                                               const OptTensor& running_var, double momentum, double eps,
                                               const Tensor& counts) {
    return gather_stats("batch_norm_gather_stats_with_counts", input, mean, invstd, running_mean, running_var,
                        momentum, eps, counts);
  }
};

struct BatchNormGatherStats : at::_ops::batch_norm_gather_stats {
  static std::tuple<Tensor, Tensor> redispatch(c10::DispatchKeySet, const Tensor& input, const Tensor& mean,
                                               const Tensor& invstd, const OptTensor& running_mean,
                                               const OptTensor& running_var, double momentum, double eps,
                                               int64_t count) {
    // The same count for every rank, in the dtype CUDA gives it (the running statistics' or the input's).
    const Tensor* rm = defined(running_mean);
    Tensor counts = at::full({mean.dim() > 0 ? mean.size(0) : 1}, count,
                             mean.options().dtype(rm != nullptr ? rm->scalar_type() : input.scalar_type()));
    return gather_stats("batch_norm_gather_stats", input, mean, invstd, running_mean, running_var, momentum, eps,
                        counts);
  }
};

// ((x - mean) * invstd) * weight + bias, in the accumulate type.
Tensor normalize(const char* op, const Tensor& input, const OptTensor& weight, const OptTensor& bias,
                 const Tensor& mean, const Tensor& invstd) {
  check_input(op, input);
  const int64_t channels = input.size(1);
  check_channels(op, "mean", mean, channels);
  check_channels(op, "invstd", invstd, channels);
  const c10::ScalarType acc = acc_type(input.scalar_type());
  Tensor y = at::sub(input, per_channel(mean, input, acc));  // promotes fp16/bf16 input to fp32
  y.mul_(per_channel(invstd, input, acc));
  if (const Tensor* w = defined(weight)) {
    check_channels(op, "weight", *w, channels);
    y.mul_(per_channel(*w, input, acc));
  }
  if (const Tensor* b = defined(bias)) {
    check_channels(op, "bias", *b, channels);
    y.add_(per_channel(*b, input, acc));
  }
  return y;
}

struct BatchNormElemt : at::_ops::batch_norm_elemt {
  static Tensor redispatch(c10::DispatchKeySet, const Tensor& input, const OptTensor& weight, const OptTensor& bias,
                           const Tensor& mean, const Tensor& invstd, double /*eps: invstd has it*/) {
    Tensor y = normalize("batch_norm_elemt", input, weight, bias, mean, invstd);
    return as_result(y, input, input.suggest_memory_format());
  }
};

struct BatchNormElemtOut : at::_ops::batch_norm_elemt_out {
  static Tensor& redispatch(c10::DispatchKeySet, const Tensor& input, const OptTensor& weight, const OptTensor& bias,
                            const Tensor& mean, const Tensor& invstd, double /*eps*/, Tensor& out) {
    Tensor y = normalize("batch_norm_elemt", input, weight, bias, mean, invstd);
    TORCH_CHECK(out.scalar_type() == input.scalar_type(), "batch_norm_elemt: expected out to have the input's dtype ",
                input.scalar_type(), ", got ", out.scalar_type());
    at::native::resize_output(out, input.sizes());
    out.copy_(y);
    return out;
  }
};

struct BatchNormBackwardReduce : at::_ops::batch_norm_backward_reduce {
  static std::tuple<Tensor, Tensor, Tensor, Tensor> redispatch(c10::DispatchKeySet, const Tensor& grad_out,
                                                               const Tensor& input, const Tensor& mean,
                                                               const Tensor& invstd, const OptTensor& weight,
                                                               bool input_g, bool weight_g, bool bias_g) {
    const char* op = "batch_norm_backward_reduce";
    check_input(op, input);
    TORCH_CHECK(grad_out.sizes() == input.sizes(), op, ": expected grad_out of the input's shape ", input.sizes(),
                ", got ", grad_out.sizes());
    TORCH_CHECK(mean.scalar_type() == invstd.scalar_type(), op, ": mean and invstd need to have the same data types, "
                "got ", mean.scalar_type(), " and ", invstd.scalar_type());
    const int64_t channels = input.size(1);
    check_channels(op, "mean", mean, channels);
    check_channels(op, "invstd", invstd, channels);
    const Tensor* w = defined(weight);
    if (w != nullptr) check_channels(op, "weight", *w, channels);
    if (!input_g && !weight_g && !bias_g) return {};

    const c10::ScalarType acc = acc_type(input.scalar_type());
    const std::vector<int64_t> dims = reduce_dims(input);
    Tensor sum_dy = grad_out.to(acc).sum(dims);
    Tensor sum_dy_xmu;
    if (input_g || weight_g) {
      Tensor xmu = at::sub(input, per_channel(mean, input, acc));
      sum_dy_xmu = xmu.mul_(grad_out).sum(dims);
    }
    // Gradients of weight and bias in the weight's dtype (CUDA's), the sums in the statistics'.
    const c10::ScalarType param = w != nullptr ? w->scalar_type() : mean.scalar_type();
    Tensor grad_weight = weight_g ? (sum_dy_xmu * invstd.to(acc)).to(param) : Tensor();
    Tensor grad_bias = bias_g ? sum_dy.to(param) : Tensor();
    if (!input_g) return {Tensor(), Tensor(), grad_weight, grad_bias};
    return {sum_dy.to(mean.scalar_type()), sum_dy_xmu.to(mean.scalar_type()), grad_weight, grad_bias};
  }
};

struct BatchNormBackwardElemt : at::_ops::batch_norm_backward_elemt {
  static Tensor redispatch(c10::DispatchKeySet, const Tensor& grad_out, const Tensor& input, const Tensor& mean,
                           const Tensor& invstd, const OptTensor& weight, const Tensor& sum_dy,
                           const Tensor& sum_dy_xmu, const Tensor& count) {
    const char* op = "batch_norm_backward_elemt";
    check_input(op, input);
    TORCH_CHECK(grad_out.sizes() == input.sizes(), op, ": expected grad_out of the input's shape ", input.sizes(),
                ", got ", grad_out.sizes());
    TORCH_CHECK(mean.scalar_type() == invstd.scalar_type(), op, ": mean and invstd need to have the same data types, "
                "got ", mean.scalar_type(), " and ", invstd.scalar_type());
    TORCH_CHECK(!count.is_complex() && !count.is_floating_point(), op,
                ": count holds the element count of every rank and must be an integer tensor, got ",
                count.scalar_type());
    const int64_t channels = input.size(1);
    for (auto [what, t] : {std::pair<const char*, const Tensor*>{"mean", &mean}, {"invstd", &invstd},
                           {"sum_dy", &sum_dy}, {"sum_dy_xmu", &sum_dy_xmu}}) {
      check_channels(op, what, *t, channels);
    }
    const int64_t total = count.sum().item<int64_t>();
    TORCH_CHECK(total > 0, op, ": the counts add up to ", total, "; expected a positive number of elements");

    // grad_input = (dy - sum_dy / N - (x - mean) * invstd^2 * sum_dy_xmu / N) * invstd * weight
    const c10::ScalarType acc = acc_type(input.scalar_type());
    const double norm = 1.0 / static_cast<double>(total);
    Tensor inv = invstd.to(acc);
    Tensor proj = inv * inv * sum_dy_xmu.to(acc) * norm;
    Tensor scale = inv;
    if (const Tensor* w = defined(weight)) {
      check_channels(op, "weight", *w, channels);
      scale = w->to(acc) * inv;
    }
    Tensor grad = at::sub(grad_out, per_channel(sum_dy.to(acc) * norm, input, acc));
    grad.sub_(at::sub(input, per_channel(mean, input, acc)).mul_(per_channel(proj, input, acc)));
    grad.mul_(per_channel(scale, input, acc));
    return as_result(grad, input, input.suggest_memory_format());
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("batch_norm_stats", TORCH_FN((NeuronKernel<BatchNormStats, false>::run)));
  m.impl("batch_norm_update_stats", TORCH_FN((NeuronKernel<BatchNormUpdateStats, false>::run)));
  m.impl("batch_norm_gather_stats", TORCH_FN((NeuronKernel<BatchNormGatherStats, false>::run)));
  m.impl("batch_norm_gather_stats_with_counts", TORCH_FN((NeuronKernel<BatchNormGatherStatsWithCounts, false>::run)));
  m.impl("batch_norm_elemt", TORCH_FN((NeuronKernel<BatchNormElemt, false>::run)));
  m.impl("batch_norm_elemt.out", TORCH_FN((NeuronKernel<BatchNormElemtOut, false>::run)));
  m.impl("batch_norm_backward_reduce", TORCH_FN((NeuronKernel<BatchNormBackwardReduce, false>::run)));
  m.impl("batch_norm_backward_elemt", TORCH_FN((NeuronKernel<BatchNormBackwardElemt, false>::run)));
}

}  // namespace torch_neuronx
