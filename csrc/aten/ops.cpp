// Explicit PrivateUse1 registrations: the tensor basics (allocation, copies, views)
// and the hot ops, each a typed NeuronKernel (no boxing) over ATen's CPU kernel.
// Ops not listed here reach the boxed fallback (fallback.cpp), which runs the same
// CPU kernels on device memory but is tracked as a fallback.
#include <ATen/EmptyTensor.h>
#include <ATen/native/Resize.h>
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_as_complex_native.h>
#include <ATen/ops/view_as_real_native.h>
#include <ATen/ops/view_native.h>
#include <torch/library.h>

#include <ATen/ops/_amp_foreach_non_finite_check_and_unscale_ops.h>
#include <ATen/ops/_amp_update_scale_ops.h>
#include <ATen/ops/_conj_physical_ops.h>
#include <ATen/ops/_foreach_add_ops.h>
#include <ATen/ops/_foreach_addcdiv_ops.h>
#include <ATen/ops/_foreach_addcmul_ops.h>
#include <ATen/ops/_foreach_div_ops.h>
#include <ATen/ops/_foreach_lerp_ops.h>
#include <ATen/ops/_foreach_maximum_ops.h>
#include <ATen/ops/_foreach_mul_ops.h>
#include <ATen/ops/_foreach_norm_ops.h>
#include <ATen/ops/_foreach_sqrt_ops.h>
#include <ATen/ops/_fused_adamw_ops.h>
#include <ATen/ops/_index_put_impl_ops.h>
#include <ATen/ops/_local_scalar_dense_ops.h>
#include <ATen/ops/_log_softmax_backward_data_ops.h>
#include <ATen/ops/_log_softmax_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward_ops.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_ops.h>
#include <ATen/ops/_softmax_backward_data_ops.h>
#include <ATen/ops/_softmax_ops.h>
#include <ATen/ops/abs_ops.h>
#include <ATen/ops/add_ops.h>
#include <ATen/ops/addcdiv_ops.h>
#include <ATen/ops/addcmul_ops.h>
#include <ATen/ops/addmm_ops.h>
#include <ATen/ops/addmv_ops.h>
#include <ATen/ops/all_ops.h>
#include <ATen/ops/amax_ops.h>
#include <ATen/ops/amin_ops.h>
#include <ATen/ops/any_ops.h>
#include <ATen/ops/arange_ops.h>
#include <ATen/ops/argmax_ops.h>
#include <ATen/ops/argmin_ops.h>
#include <ATen/ops/baddbmm_ops.h>
#include <ATen/ops/bernoulli_ops.h>
#include <ATen/ops/bitwise_and_ops.h>
#include <ATen/ops/bitwise_not_ops.h>
#include <ATen/ops/bitwise_or_ops.h>
#include <ATen/ops/bmm_ops.h>
#include <ATen/ops/cat_ops.h>
#include <ATen/ops/clamp_max_ops.h>
#include <ATen/ops/clamp_min_ops.h>
#include <ATen/ops/clamp_ops.h>
#include <ATen/ops/conj_physical_ops.h>
#include <ATen/ops/convolution_backward_ops.h>
#include <ATen/ops/convolution_ops.h>
#include <ATen/ops/cos_ops.h>
#include <ATen/ops/cumsum_ops.h>
#include <ATen/ops/div_ops.h>
#include <ATen/ops/dot_ops.h>
#include <ATen/ops/embedding_dense_backward_ops.h>
#include <ATen/ops/embedding_ops.h>
#include <ATen/ops/eq_ops.h>
#include <ATen/ops/equal_ops.h>
#include <ATen/ops/erf_ops.h>
#include <ATen/ops/erfinv_ops.h>
#include <ATen/ops/exp_ops.h>
#include <ATen/ops/expm1_ops.h>
#include <ATen/ops/exponential_ops.h>
#include <ATen/ops/eye_ops.h>
#include <ATen/ops/fill_ops.h>
#include <ATen/ops/flip_ops.h>
#include <ATen/ops/floor_divide_ops.h>
#include <ATen/ops/floor_ops.h>
#include <ATen/ops/gather_ops.h>
#include <ATen/ops/ge_ops.h>
#include <ATen/ops/gelu_backward_ops.h>
#include <ATen/ops/gelu_ops.h>
#include <ATen/ops/gt_ops.h>
#include <ATen/ops/histc_ops.h>
#include <ATen/ops/_upsample_bicubic2d_aa_backward_ops.h>
#include <ATen/ops/_upsample_bicubic2d_aa_ops.h>
#include <ATen/ops/_upsample_bilinear2d_aa_backward_ops.h>
#include <ATen/ops/_upsample_bilinear2d_aa_ops.h>
#include <ATen/ops/index_add_ops.h>
#include <ATen/ops/index_fill_ops.h>
#include <ATen/ops/index_ops.h>
#include <ATen/ops/index_put_ops.h>
#include <ATen/ops/index_select_ops.h>
#include <ATen/ops/isin_ops.h>
#include <ATen/ops/isnan_ops.h>
#include <ATen/ops/isneginf_ops.h>
#include <ATen/ops/le_ops.h>
#include <ATen/ops/lerp_ops.h>
#include <ATen/ops/linalg_solve_triangular_ops.h>
#include <ATen/ops/linalg_vector_norm_ops.h>
#include <ATen/ops/log1p_ops.h>
#include <ATen/ops/log_ops.h>
#include <ATen/ops/log_sigmoid_backward_ops.h>
#include <ATen/ops/log_sigmoid_forward_ops.h>
#include <ATen/ops/logical_and_ops.h>
#include <ATen/ops/logical_not_ops.h>
#include <ATen/ops/logical_or_ops.h>
#include <ATen/ops/logsumexp_ops.h>
#include <ATen/ops/lt_ops.h>
#include <ATen/ops/masked_fill_ops.h>
#include <ATen/ops/max_ops.h>
#include <ATen/ops/maximum_ops.h>
#include <ATen/ops/mean_ops.h>
#include <ATen/ops/min_ops.h>
#include <ATen/ops/minimum_ops.h>
#include <ATen/ops/mode_ops.h>
#include <ATen/ops/mse_loss_backward_ops.h>
#include <ATen/ops/mse_loss_ops.h>
#include <ATen/ops/mul_ops.h>
#include <ATen/ops/multinomial_ops.h>
#include <ATen/ops/native_batch_norm_backward_ops.h>
#include <ATen/ops/native_batch_norm_ops.h>
#include <ATen/ops/native_dropout_backward_ops.h>
#include <ATen/ops/native_dropout_ops.h>
#include <ATen/ops/native_group_norm_backward_ops.h>
#include <ATen/ops/native_group_norm_ops.h>
#include <ATen/ops/native_layer_norm_backward_ops.h>
#include <ATen/ops/native_layer_norm_ops.h>
#include <ATen/ops/ne_ops.h>
#include <ATen/ops/neg_ops.h>
#include <ATen/ops/nll_loss_backward_ops.h>
#include <ATen/ops/nll_loss_forward_ops.h>
#include <ATen/ops/nonzero_ops.h>
#include <ATen/ops/normal_ops.h>
#include <ATen/ops/polar_ops.h>
#include <ATen/ops/pow_ops.h>
#include <ATen/ops/prod_ops.h>
#include <ATen/ops/random_ops.h>
#include <ATen/ops/reciprocal_ops.h>
#include <ATen/ops/relu_ops.h>
#include <ATen/ops/remainder_ops.h>
#include <ATen/ops/resize_ops.h>
#include <ATen/ops/rsqrt_ops.h>
#include <ATen/ops/rsub_ops.h>
#include <ATen/ops/scatter_add_ops.h>
#include <ATen/ops/scatter_ops.h>
#include <ATen/ops/scatter_reduce_ops.h>
#include <ATen/ops/sgn_ops.h>
#include <ATen/ops/sigmoid_backward_ops.h>
#include <ATen/ops/sigmoid_ops.h>
#include <ATen/ops/silu_backward_ops.h>
#include <ATen/ops/silu_ops.h>
#include <ATen/ops/sin_ops.h>
#include <ATen/ops/softplus_backward_ops.h>
#include <ATen/ops/softplus_ops.h>
#include <ATen/ops/sort_ops.h>
#include <ATen/ops/sqrt_ops.h>
#include <ATen/ops/stack_ops.h>
#include <ATen/ops/std_ops.h>
#include <ATen/ops/sub_ops.h>
#include <ATen/ops/sum_ops.h>
#include <ATen/ops/tanh_backward_ops.h>
#include <ATen/ops/tanh_ops.h>
#include <ATen/ops/threshold_backward_ops.h>
#include <ATen/ops/topk_ops.h>
#include <ATen/ops/tril_ops.h>
#include <ATen/ops/triu_ops.h>
#include <ATen/ops/unfold_backward_ops.h>
#include <ATen/ops/uniform_ops.h>
#include <ATen/ops/var_mean_ops.h>
#include <ATen/ops/var_ops.h>
#include <ATen/ops/where_ops.h>
#include <ATen/ops/zero_ops.h>

#include "aten/kernel.h"

namespace torch_neuronx {
namespace {

c10::DeviceIndex target_device(std::optional<c10::Device> device) {
  c10::DeviceIndex d = (device.has_value() && device->has_index()) ? device->index() : current_device();
  check_device_index(d);
  return d;
}

void check_factory(std::optional<c10::Layout> layout, std::optional<bool> pin_memory) {
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided, "neuron tensors support only the strided layout, not ",
              *layout, ".");
  TORCH_CHECK(!pin_memory.value_or(false), "Only dense CPU tensors can be pinned; neuron tensors are device memory.");
}

at::Tensor neuron_empty(c10::IntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                        std::optional<c10::Device> device, std::optional<bool> pin_memory,
                        std::optional<c10::MemoryFormat> memory_format) {
  NEURON_COUNT_EXECUTED("aten::empty.memory_format");
  lazy_init();
  check_factory(layout, pin_memory);
  KernelDeviceScope scope(target_device(device));
  return at::detail::empty_generic(size, neuron_allocator(), kNeuronKeys,
                                   dtype.value_or(c10::get_default_dtype_as_scalartype()), memory_format);
}

at::Tensor neuron_empty_strided(c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
                                std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                                std::optional<bool> pin_memory) {
  NEURON_COUNT_EXECUTED("aten::empty_strided");
  lazy_init();
  check_factory(layout, pin_memory);
  KernelDeviceScope scope(target_device(device));
  return at::detail::empty_strided_generic(size, stride, neuron_allocator(),
                                           kNeuronKeys,
                                           dtype.value_or(c10::get_default_dtype_as_scalartype()));
}

// Copies in every direction (host<->device, device<->device, dtype changes,
// broadcasting) are ATen's CPU copy over aliases: one pass, no staging buffer.
at::Tensor& neuron_copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  NEURON_COUNT_EXECUTED("aten::copy_");
  lazy_init();
  DeviceActivityScope activity("aten::copy_", self.device().type() == kNeuron ? self.device().index() : src.device().index());
  auto host_view = [](const at::Tensor& t) -> at::Tensor {
    if (t.device().type() == kNeuron) return cpu_alias(t);
    TORCH_CHECK(t.device().is_cpu(), "copy_ between neuron and ", t.device(), " tensors is not supported; copy through the CPU.");
    return t;
  };
  at::Tensor dst = host_view(self);
  if (C10_UNLIKELY(stochastic_rounding_enabled()) && self.device().type() == kNeuron &&
      stochastic_round_copy(dst, host_view(src), self.device().index())) {
    return self;
  }
  dst.copy_(host_view(src), non_blocking);  // synchronous: data is in place when this returns
  return self;
}

at::Tensor neuron_copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  at::Tensor d = dst;
  neuron_copy_(d, self, non_blocking);
  return dst;
}

at::Tensor neuron_copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::Tensor d = dst;
  if (!d.sizes().equals(self.sizes())) d.resize_(self.sizes());
  neuron_copy_(d, self, false);
  return dst;
}

// set_(): point a tensor at (part of) a storage. Storage-level, so done here rather
// than through a CPU alias; used by torch.load and UntypedStorage views.
at::Tensor& neuron_set_storage(at::Tensor& self, c10::Storage source, int64_t offset, c10::IntArrayRef size,
                               c10::IntArrayRef stride) {
  TORCH_CHECK(source.device() == self.device(), "Attempted to set the storage of a tensor on device \"",
              self.device(), "\" to a storage on different device \"", source.device(),
              "\".  This is no longer allowed; the devices must match.");
  TORCH_CHECK(offset >= 0, "Tensor: invalid storage offset ", offset);
  std::vector<int64_t> st = stride.vec();
  if (stride.empty()) {
    auto cs = c10::contiguous_strides(size);
    st.assign(cs.begin(), cs.end());
  }
  TORCH_CHECK(st.size() == size.size(), "mismatch in length of strides and shape");
  int64_t needed = 0;
  bool empty = false;
  for (size_t i = 0; i < size.size(); ++i) {
    if (size[i] == 0) empty = true;
    needed += (size[i] - 1) * st[i];
  }
  size_t itemsize = self.dtype().itemsize();
  TORCH_CHECK(empty || static_cast<size_t>(needed + offset + 1) * itemsize <= source.nbytes(),
              "setStorage: sizes ", size, ", strides ", c10::IntArrayRef(st), ", storage offset ", offset,
              ", and itemsize ", itemsize, " requiring a storage size of ", (needed + offset + 1) * itemsize,
              " are out of bounds for storage of size ", source.nbytes());
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (!self.storage().is_alias_of(source)) impl->set_storage_keep_dtype(std::move(source));
  impl->set_sizes_and_strides(size, st, offset);
  return self;
}

at::Tensor& neuron_set_storage_offset(at::Tensor& self, c10::Storage source, c10::SymInt offset,
                                      c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return neuron_set_storage(self, std::move(source), offset.expect_int(), C10_AS_INTARRAYREF_SLOW(size),
                            C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& neuron_set_source_storage(at::Tensor& self, c10::Storage source) {
  int64_t n = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return neuron_set_storage(self, std::move(source), 0, {n}, {});
}

at::Tensor& neuron_set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  if (self.is_same(source)) return self;
  return neuron_set_storage(self, source.storage(), source.storage_offset(), source.sizes(), source.strides());
}

at::Tensor& neuron_set_empty(at::Tensor& self) {
  c10::DeviceIndex d = self.device().index();
  c10::Storage fresh(c10::Storage::use_byte_size_t(), 0, allocate_device_memory(d, 0, self.device()),
                     neuron_allocator(), true);
  return neuron_set_storage(self, std::move(fresh), 0, {0}, {});
}

// histc of integer tensors: CUDA computes it and libraries rely on that (MoE routers
// count tokens per expert with torch.histc on int32 ids); ATen's CPU kernel takes only
// floating types. Integers are counted in float64 (exact below 2**53) and the counts
// returned in the input dtype, as CUDA returns them.
at::Tensor neuron_histc(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max) {
  using Kernel = NeuronKernel<at::_ops::histc, false>;
  if (at::isFloatingType(self.scalar_type()) || self.scalar_type() == at::kBool) return Kernel::run(self, bins, min, max);
  return Kernel::run(self.to(at::kDouble), bins, min, max).to(self.scalar_type());
}

at::Tensor& neuron_histc_out(const at::Tensor& self, int64_t bins, const at::Scalar& min, const at::Scalar& max,
                             at::Tensor& out) {
  if (at::isFloatingType(self.scalar_type()) || self.scalar_type() == at::kBool) {
    return NeuronKernel<at::_ops::histc_out, false>::run(self, bins, min, max, out);
  }
  // counted through a temporary: check `out` here as KernelCall checks it on the path above
  if (out.device() != self.device()) device_mismatch("aten::histc.out", self.device(), out.device());
  TORCH_CHECK(out.scalar_type() == self.scalar_type(),
              "torch.histc: input tensor and hist tensor should have the same dtype, but got input ",
              self.scalar_type(), " and hist ", out.scalar_type());
  at::Tensor counts = neuron_histc(self, bins, min, max);
  at::native::resize_output(out, counts.sizes());
  out.copy_(counts);
  return out;
}

// index_fill_: CUDA's kernel walks the index together with `self` (TensorIterator), so an index
// on another device raises, a CPU one of zero dimensions too (only the fill value may be a CPU
// scalar); the generic rule of KernelCall would let that index through as a CPU scalar.
template <class Op, class Value>
at::Tensor& neuron_index_fill_(at::Tensor& self, int64_t dim, const at::Tensor& index, Value value) {
  if (index.device() != self.device()) device_mismatch("aten::index_fill_", self.device(), index.device());
  return NeuronKernel<Op, false>::run(self, dim, index, value);
}

// Antialiased resizes (F.interpolate(..., antialias=True)) in bfloat16 and float16: CUDA
// computes them, accumulating in float32, and models rely on it; ATen's CPU kernels take only
// float32 and float64. Half-precision tensors compute in float32 and round once.
template <class Op, class Signature>
struct HalfInFloat;
template <class Op, class R, class... Args>
struct HalfInFloat<Op, R(const at::Tensor&, Args...)> {
  static at::Tensor run(const at::Tensor& t, Args... args) {
    using Kernel = NeuronKernel<Op, false>;
    if (!at::isReducedFloatingType(t.scalar_type())) return Kernel::run(t, args...);
    return Kernel::run(t.to(at::kFloat), args...).to(t.scalar_type());
  }
};

// Tensor.record_stream: the storage is in use on `stream` too, so its memory must not be
// reused before the work queued there so far is done. The caching allocator keeps that
// promise, as CUDA's does.
void neuron_record_stream(at::Tensor& self, c10::Stream stream) {
  TORCH_CHECK(stream.device_type() == kNeuron, "record_stream: expected a neuron stream for a neuron tensor, got a ",
              stream.device_type(), " stream.");
  TORCH_CHECK(stream.device_index() == self.device().index(), "record_stream: the stream is on neuron:",
              static_cast<int>(stream.device_index()), " but the tensor is on ", self.device(), ".");
  if (self.storage().data() == nullptr) return;
  neuron_allocator()->recordStream(self.storage().data_ptr(), stream);
}

// PyTorch's fake convolution describes a PrivateUse1 result as contiguous (the Overrideable
// backend's memory format), while CPU's kernels keep channels-last inputs channels-last.
// Compiled code lays memory out from the fake result, so the device returns what it describes.
void make_contiguous(at::Tensor& t) {
  if (t.defined() && !t.is_contiguous()) t = t.contiguous();
}

void make_contiguous(std::tuple<at::Tensor, at::Tensor, at::Tensor>& t) {
  std::apply([](auto&... x) { (make_contiguous(x), ...); }, t);
}

template <class Op, class Sig = typename Op::schema>
struct ContiguousResults;

template <class Op, class R, class... Args>
struct ContiguousResults<Op, R(Args...)> {
  static R run(Args... args) {
    R r = NeuronKernel<Op, false>::run(std::forward<Args>(args)...);
    make_contiguous(r);
    return r;
  }
};

// Convolutions of bf16/fp16 tensors compute in fp32 and round once (widens, kernel.h), as the
// PE array does; ATen's 16-bit CPU convolutions are scalar loops on hosts without AVX-512 BF16.
struct Convolution : at::_ops::convolution {
  static at::Tensor redispatch(c10::DispatchKeySet ks, const at::Tensor& input, const at::Tensor& weight,
                               const std::optional<at::Tensor>& bias, c10::SymIntArrayRef stride,
                               c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation, bool transposed,
                               c10::SymIntArrayRef output_padding, c10::SymInt groups) {
    const at::Tensor b = bias.value_or(at::Tensor());
    if (widens({&input, &weight, &b})) {
      return narrow(at::_ops::convolution::redispatch(ks, widen(input), widen(weight), widen(bias), stride, padding,
                                                      dilation, transposed, output_padding, std::move(groups)),
                    input);
    }
    return at::_ops::convolution::redispatch(ks, input, weight, bias, stride, padding, dilation, transposed,
                                             output_padding, std::move(groups));
  }
};

struct ConvolutionBackward : at::_ops::convolution_backward {
  static std::tuple<at::Tensor, at::Tensor, at::Tensor> redispatch(
      c10::DispatchKeySet ks, const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight,
      at::OptionalSymIntArrayRef bias_sizes, c10::SymIntArrayRef stride, c10::SymIntArrayRef padding,
      c10::SymIntArrayRef dilation, bool transposed, c10::SymIntArrayRef output_padding, c10::SymInt groups,
      std::array<bool, 3> output_mask) {
    if (widens({&grad_output, &input, &weight})) {
      auto [gi, gw, gb] = at::_ops::convolution_backward::redispatch(
          ks, widen(grad_output), widen(input), widen(weight), bias_sizes, stride, padding, dilation, transposed,
          output_padding, std::move(groups), output_mask);
      return {narrow(gi, input), narrow(gw, weight), narrow(gb, grad_output)};
    }
    return at::_ops::convolution_backward::redispatch(ks, grad_output, input, weight, bias_sizes, stride, padding,
                                                      dilation, transposed, output_padding, std::move(groups),
                                                      output_mask);
  }
};

}  // namespace

#define NEURON_KERNEL(schema, op, allow_cpu) \
  m.impl(schema, TORCH_FN((NeuronKernel<at::_ops::op, allow_cpu>::run)))

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", TORCH_FN(neuron_empty));
  m.impl("empty_strided", TORCH_FN(neuron_empty_strided));
  m.impl("copy_", TORCH_FN(neuron_copy_));
  m.impl("_copy_from", TORCH_FN(neuron_copy_from));
  m.impl("_copy_from_and_resize", TORCH_FN(neuron_copy_from_and_resize));
  // Views share the storage; these ATen implementations are device-generic.
  m.impl("view", TORCH_FN(at::native::view));
  m.impl("as_strided", TORCH_FN(at::native::as_strided_tensorimpl));
  m.impl("_reshape_alias", TORCH_FN(at::native::_reshape_alias));
  m.impl("unfold", TORCH_FN(at::native::unfold));
  m.impl("view_as_real", TORCH_FN(at::native::view_as_real));
  m.impl("view_as_complex", TORCH_FN(at::native::view_as_complex));
  m.impl("set_.source_Storage_storage_offset", TORCH_FN(neuron_set_storage_offset));
  m.impl("set_.source_Storage", TORCH_FN(neuron_set_source_storage));
  m.impl("set_.source_Tensor", TORCH_FN(neuron_set_source_tensor));
  m.impl("set_", TORCH_FN(neuron_set_empty));
  m.impl("record_stream", TORCH_FN(neuron_record_stream));

  // mm, mm.out, addmm, addmm.out, addmm_, bmm, bmm.out, baddbmm, baddbmm_: matmul.cpp
  NEURON_KERNEL("addmv", addmv, false);
  NEURON_KERNEL("dot", dot, false);
  // conv*d and conv_transpose*d reach these; CPU's own algorithm selection (oneDNN or
  // the native kernels) then runs on the aliases (in fp32 for 16-bit floats), and results are
  // contiguous (see above).
  m.impl("convolution", TORCH_FN((ContiguousResults<Convolution>::run)));
  m.impl("convolution_backward", TORCH_FN((ContiguousResults<ConvolutionBackward>::run)));
  NEURON_KERNEL("_scaled_dot_product_flash_attention_for_cpu", _scaled_dot_product_flash_attention_for_cpu, false);
  NEURON_KERNEL("_scaled_dot_product_flash_attention_for_cpu_backward", _scaled_dot_product_flash_attention_for_cpu_backward, false);
  NEURON_KERNEL("add.Tensor", add_Tensor, false);
  NEURON_KERNEL("add_.Tensor", add__Tensor, false);
  NEURON_KERNEL("add.out", add_out, false);
  NEURON_KERNEL("add.Scalar", add_Scalar, false);
  NEURON_KERNEL("sub.Tensor", sub_Tensor, false);
  NEURON_KERNEL("sub_.Tensor", sub__Tensor, false);
  NEURON_KERNEL("rsub.Scalar", rsub_Scalar, false);
  NEURON_KERNEL("mul.Tensor", mul_Tensor, false);
  NEURON_KERNEL("mul_.Tensor", mul__Tensor, false);
  NEURON_KERNEL("mul.out", mul_out, false);
  NEURON_KERNEL("mul.Scalar", mul_Scalar, false);
  NEURON_KERNEL("mul_.Scalar", mul__Scalar, false);
  NEURON_KERNEL("div.Tensor", div_Tensor, false);
  NEURON_KERNEL("div_.Tensor", div__Tensor, false);
  NEURON_KERNEL("div.Tensor_mode", div_Tensor_mode, false);
  NEURON_KERNEL("div.Scalar", div_Scalar, false);
  NEURON_KERNEL("div_.Scalar", div__Scalar, false);
  NEURON_KERNEL("neg", neg, false);
  NEURON_KERNEL("exp", exp, false);
  NEURON_KERNEL("log", log, false);
  NEURON_KERNEL("sqrt", sqrt, false);
  NEURON_KERNEL("rsqrt", rsqrt, false);
  NEURON_KERNEL("pow.Tensor_Scalar", pow_Tensor_Scalar, false);
  NEURON_KERNEL("pow.Tensor_Tensor", pow_Tensor_Tensor, false);
  NEURON_KERNEL("pow.Scalar", pow_Scalar, false);
  NEURON_KERNEL("tanh", tanh, false);
  NEURON_KERNEL("tanh_backward", tanh_backward, false);
  NEURON_KERNEL("sigmoid", sigmoid, false);
  NEURON_KERNEL("sigmoid_backward", sigmoid_backward, false);
  NEURON_KERNEL("silu", silu, false);
  NEURON_KERNEL("silu_", silu_, false);
  NEURON_KERNEL("silu_backward", silu_backward, false);
  NEURON_KERNEL("gelu", gelu, false);
  NEURON_KERNEL("gelu_backward", gelu_backward, false);
  NEURON_KERNEL("relu", relu, false);
  NEURON_KERNEL("relu_", relu_, false);
  NEURON_KERNEL("threshold_backward", threshold_backward, false);
  NEURON_KERNEL("where.self", where_self, false);
  NEURON_KERNEL("clamp", clamp, false);
  NEURON_KERNEL("clamp_min", clamp_min, false);
  NEURON_KERNEL("clamp_max", clamp_max, false);
  NEURON_KERNEL("abs", abs, false);
  NEURON_KERNEL("masked_fill_.Scalar", masked_fill__Scalar, false);
  NEURON_KERNEL("masked_fill_.Tensor", masked_fill__Tensor, false);
  NEURON_KERNEL("fill_.Scalar", fill__Scalar, false);
  NEURON_KERNEL("fill_.Tensor", fill__Tensor, false);
  NEURON_KERNEL("zero_", zero_, false);
  NEURON_KERNEL("eq.Scalar", eq_Scalar, false);
  NEURON_KERNEL("eq.Tensor", eq_Tensor, false);
  NEURON_KERNEL("ne.Scalar", ne_Scalar, false);
  NEURON_KERNEL("ne.Tensor", ne_Tensor, false);
  NEURON_KERNEL("lt.Scalar", lt_Scalar, false);
  NEURON_KERNEL("lt.Tensor", lt_Tensor, false);
  NEURON_KERNEL("gt.Scalar", gt_Scalar, false);
  NEURON_KERNEL("gt.Tensor", gt_Tensor, false);
  NEURON_KERNEL("ge.Scalar", ge_Scalar, false);
  NEURON_KERNEL("le.Scalar", le_Scalar, false);
  NEURON_KERNEL("logical_not", logical_not, false);
  NEURON_KERNEL("bitwise_and.Tensor", bitwise_and_Tensor, false);
  NEURON_KERNEL("bitwise_or.Tensor", bitwise_or_Tensor, false);
  NEURON_KERNEL("bitwise_not", bitwise_not, false);
  NEURON_KERNEL("reciprocal", reciprocal, false);
  NEURON_KERNEL("cos", cos, false);
  NEURON_KERNEL("sin", sin, false);
  NEURON_KERNEL("erf", erf, false);
  NEURON_KERNEL("log1p", log1p, false);
  NEURON_KERNEL("expm1", expm1, false);
  NEURON_KERNEL("maximum", maximum, false);
  NEURON_KERNEL("minimum", minimum, false);
  NEURON_KERNEL("addcmul_", addcmul_, false);
  NEURON_KERNEL("addcdiv_", addcdiv_, false);
  NEURON_KERNEL("lerp_.Scalar", lerp__Scalar, false);
  NEURON_KERNEL("triu", triu, false);
  NEURON_KERNEL("tril", tril, false);
  NEURON_KERNEL("cumsum", cumsum, false);
  NEURON_KERNEL("sum.dim_IntList", sum_dim_IntList, false);
  NEURON_KERNEL("sum", sum, false);
  NEURON_KERNEL("mean.dim", mean_dim, false);
  NEURON_KERNEL("max.dim", max_dim, false);
  NEURON_KERNEL("min.dim", min_dim, false);
  NEURON_KERNEL("max", max, false);
  NEURON_KERNEL("min", min, false);
  NEURON_KERNEL("amax", amax, false);
  NEURON_KERNEL("amin", amin, false);
  NEURON_KERNEL("argmax", argmax, false);
  NEURON_KERNEL("argmin", argmin, false);
  NEURON_KERNEL("var.correction", var_correction, false);
  NEURON_KERNEL("std.correction", std_correction, false);
  NEURON_KERNEL("var_mean.correction", var_mean_correction, false);
  NEURON_KERNEL("prod.dim_int", prod_dim_int, false);
  NEURON_KERNEL("all", all, false);
  NEURON_KERNEL("any", any, false);
  NEURON_KERNEL("all.dim", all_dim, false);
  NEURON_KERNEL("any.dim", any_dim, false);
  NEURON_KERNEL("linalg_vector_norm", linalg_vector_norm, false);
  NEURON_KERNEL("logsumexp", logsumexp, false);
  NEURON_KERNEL("topk", topk, false);
  NEURON_KERNEL("sort.stable", sort_stable, false);
  NEURON_KERNEL("mode.values", mode_values, false);  // its composite rejects non-CPU/CUDA devices
  // composites that call a CPU/CUDA-only DispatchStub with the tensor's own device type
  NEURON_KERNEL("conj_physical_", conj_physical_, false);
  NEURON_KERNEL("_conj_physical", _conj_physical, false);
  m.impl("histc", TORCH_FN(neuron_histc));  // integer input too, as on CUDA
  m.impl("histc.out", TORCH_FN(neuron_histc_out));
#define NEURON_HALF_IN_FLOAT(op) m.impl(#op, TORCH_FN((HalfInFloat<at::_ops::op, at::_ops::op::schema>::run)))
  NEURON_HALF_IN_FLOAT(_upsample_bilinear2d_aa);
  NEURON_HALF_IN_FLOAT(_upsample_bicubic2d_aa);
  NEURON_HALF_IN_FLOAT(_upsample_bilinear2d_aa_backward);
  NEURON_HALF_IN_FLOAT(_upsample_bicubic2d_aa_backward);
#undef NEURON_HALF_IN_FLOAT
  NEURON_KERNEL("_softmax", _softmax, false);
  NEURON_KERNEL("_log_softmax", _log_softmax, false);
  NEURON_KERNEL("_softmax_backward_data", _softmax_backward_data, false);
  NEURON_KERNEL("_log_softmax_backward_data", _log_softmax_backward_data, false);
  NEURON_KERNEL("native_layer_norm", native_layer_norm, false);
  NEURON_KERNEL("native_layer_norm_backward", native_layer_norm_backward, false);
  NEURON_KERNEL("native_batch_norm", native_batch_norm, false);
  NEURON_KERNEL("native_batch_norm_backward", native_batch_norm_backward, false);
  NEURON_KERNEL("native_group_norm", native_group_norm, false);
  NEURON_KERNEL("native_group_norm_backward", native_group_norm_backward, false);
  NEURON_KERNEL("embedding", embedding, false);
  NEURON_KERNEL("embedding_dense_backward", embedding_dense_backward, false);
  NEURON_KERNEL("index_select", index_select, false);
  NEURON_KERNEL("gather", gather, false);
  NEURON_KERNEL("scatter.src", scatter_src, false);
  NEURON_KERNEL("scatter.value", scatter_value, false);
  NEURON_KERNEL("scatter_add", scatter_add, false);
  NEURON_KERNEL("index.Tensor", index_Tensor, true);
  NEURON_KERNEL("index_put_", index_put_, true);
  NEURON_KERNEL("_index_put_impl_", _index_put_impl_, true);
  NEURON_KERNEL("index_add", index_add, false);
  m.impl("index_fill_.int_Scalar", TORCH_FN((neuron_index_fill_<at::_ops::index_fill__int_Scalar, const at::Scalar&>)));
  m.impl("index_fill_.int_Tensor", TORCH_FN((neuron_index_fill_<at::_ops::index_fill__int_Tensor, const at::Tensor&>)));
  NEURON_KERNEL("nonzero", nonzero, false);
  NEURON_KERNEL("cat", cat, false);
  NEURON_KERNEL("cat.out", cat_out, false);
  NEURON_KERNEL("stack", stack, false);
  NEURON_KERNEL("resize_", resize_, false);
  NEURON_KERNEL("_local_scalar_dense", _local_scalar_dense, false);
  NEURON_KERNEL("nll_loss_forward", nll_loss_forward, false);
  NEURON_KERNEL("nll_loss_backward", nll_loss_backward, false);
  NEURON_KERNEL("mse_loss", mse_loss, false);
  NEURON_KERNEL("mse_loss_backward", mse_loss_backward, false);
  NEURON_KERNEL("native_dropout_backward", native_dropout_backward, false);
  NEURON_KERNEL("bernoulli_.float", bernoulli__float, false);
  NEURON_KERNEL("bernoulli_.Tensor", bernoulli__Tensor, false);
  NEURON_KERNEL("normal_", normal_, false);
  NEURON_KERNEL("uniform_", uniform_, false);
  NEURON_KERNEL("random_", random_, false);
  NEURON_KERNEL("random_.from", random__from, false);
  NEURON_KERNEL("random_.to", random__to, false);
  NEURON_KERNEL("exponential_", exponential_, false);
  NEURON_KERNEL("multinomial", multinomial, false);
  NEURON_KERNEL("arange.start_out", arange_start_out, false);
  NEURON_KERNEL("equal", equal, false);
  NEURON_KERNEL("isnan", isnan, false);
  // Out variants: PyTorch's generated functional/in-place wrappers for structured ops
  // (le, scatter_, softplus, ...) call these on backends that lack the functional kernel.
  // Listed from the fallback ops the transformers sweep reported most often.
  NEURON_KERNEL("le.Tensor_out", le_Tensor_out, false);
  NEURON_KERNEL("ge.Tensor_out", ge_Tensor_out, false);
  NEURON_KERNEL("logical_and.out", logical_and_out, false);
  NEURON_KERNEL("logical_or.out", logical_or_out, false);
  NEURON_KERNEL("scatter.src_out", scatter_src_out, false);
  NEURON_KERNEL("scatter.value_out", scatter_value_out, false);
  NEURON_KERNEL("scatter_add.out", scatter_add_out, false);
  NEURON_KERNEL("index_add.out", index_add_out, false);
  NEURON_KERNEL("softplus.out", softplus_out, false);
  NEURON_KERNEL("softplus_backward.grad_input", softplus_backward_grad_input, false);
  NEURON_KERNEL("floor.out", floor_out, false);
  NEURON_KERNEL("clamp.out", clamp_out, false);
  NEURON_KERNEL("clamp.Tensor_out", clamp_Tensor_out, false);
  NEURON_KERNEL("remainder.Tensor_out", remainder_Tensor_out, false);
  NEURON_KERNEL("floor_divide", floor_divide, false);
  NEURON_KERNEL("flip", flip, false);
  NEURON_KERNEL("polar.out", polar_out, false);  // rotary embeddings in complex form
  NEURON_KERNEL("sgn.out", sgn_out, false);
  NEURON_KERNEL("eye.m_out", eye_m_out, false);
  NEURON_KERNEL("erfinv.out", erfinv_out, false);
  NEURON_KERNEL("log_sigmoid_forward", log_sigmoid_forward, false);
  NEURON_KERNEL("log_sigmoid_backward", log_sigmoid_backward, false);
  NEURON_KERNEL("unfold_backward", unfold_backward, false);
  NEURON_KERNEL("scatter_reduce.two_out", scatter_reduce_two_out, false);
  NEURON_KERNEL("linalg_solve_triangular", linalg_solve_triangular, false);  // linear-attention models
  NEURON_KERNEL("linalg_solve_triangular.out", linalg_solve_triangular_out, false);
  // generate() and HF masking utilities
  NEURON_KERNEL("isneginf.out", isneginf_out, false);
  NEURON_KERNEL("isin.Tensor_Tensor_out", isin_Tensor_Tensor_out, false);
  NEURON_KERNEL("where.self_out", where_self_out, false);
  NEURON_KERNEL("_foreach_add_.List", _foreach_add__List, false);
  NEURON_KERNEL("_foreach_add_.Scalar", _foreach_add__Scalar, false);
  NEURON_KERNEL("_foreach_mul_.Scalar", _foreach_mul__Scalar, false);
  NEURON_KERNEL("_foreach_mul_.List", _foreach_mul__List, false);
  NEURON_KERNEL("_foreach_mul_.Tensor", _foreach_mul__Tensor, false);
  NEURON_KERNEL("_foreach_lerp_.Scalar", _foreach_lerp__Scalar, false);
  NEURON_KERNEL("_foreach_addcmul_.Scalar", _foreach_addcmul__Scalar, false);
  NEURON_KERNEL("_foreach_addcdiv_.ScalarList", _foreach_addcdiv__ScalarList, false);
  NEURON_KERNEL("_foreach_addcdiv_.Scalar", _foreach_addcdiv__Scalar, false);
  NEURON_KERNEL("_foreach_sqrt", _foreach_sqrt, false);
  NEURON_KERNEL("_foreach_div_.ScalarList", _foreach_div__ScalarList, false);
  NEURON_KERNEL("_foreach_add.Scalar", _foreach_add_Scalar, false);
  NEURON_KERNEL("_foreach_norm.Scalar", _foreach_norm_Scalar, false);
  NEURON_KERNEL("_foreach_maximum_.List", _foreach_maximum__List, false);
  NEURON_KERNEL("_amp_foreach_non_finite_check_and_unscale_", _amp_foreach_non_finite_check_and_unscale_, false);
  NEURON_KERNEL("_amp_update_scale_", _amp_update_scale_, false);
  NEURON_KERNEL("_fused_adamw_", _fused_adamw_, false);

}

}  // namespace torch_neuronx
