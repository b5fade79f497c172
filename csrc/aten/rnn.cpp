// Fused RNN cell ops. ATen's LSTM/GRU cells call these on every accelerator
// (`input.is_privateuseone()` in aten/src/ATen/native/RNN.cpp) but only CUDA has kernels,
// so nn.LSTM, nn.GRU, nn.LSTMCell and nn.GRUCell need them on neuron.
//
// The forward ops take the two gate matmuls without their biases and return the new
// state plus a workspace of activations that the backward ops read; layouts follow the
// CUDA kernels (LSTM: [i, f, g, o] per row; GRU: [r, z, n, hx, hn + b_hn]). The math is
// written in the same order as ATen's unfused CPU cells so results match the CPU module.
// Inner ops run as neuron ops (below autograd, on device memory).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <tuple>

#include "aten/neuron.h"

namespace torch_neuronx {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;


// gates (+ bias), where the bias may be absent.
Tensor with_bias(const Tensor& gates, const OptTensor& bias) {
  return bias.has_value() && bias->defined() ? gates + *bias : gates;
}

void check_gates(const char* op, const Tensor& gates, const Tensor& other, const Tensor& state, int64_t n) {
  TORCH_CHECK(gates.dim() == 2 && gates.sizes() == other.sizes(), op,
              ": input_gates and hidden_gates must be 2-D and of the same shape, got ", gates.sizes(), " and ",
              other.sizes());
  TORCH_CHECK(gates.size(1) % n == 0 && state.numel() * n == gates.numel(), op, ": gates of shape ", gates.sizes(),
              " do not hold ", n, " gates for a state of shape ", state.sizes());
}

Tensor sigmoid_grad(const Tensor& grad, const Tensor& y) { return grad * (1 - y) * y; }
Tensor tanh_grad(const Tensor& grad, const Tensor& y) { return grad * (1 - y * y); }

std::tuple<Tensor, Tensor, Tensor> fused_lstm_cell(const Tensor& input_gates, const Tensor& hidden_gates,
                                                   const Tensor& cx, const OptTensor& input_bias,
                                                   const OptTensor& hidden_bias) {
  static const char* kName = "aten::_thnn_fused_lstm_cell";
  NEURON_COUNT_EXECUTED(kName);
  check_gates(kName, input_gates, hidden_gates, cx, 4);
  Tensor gates = with_bias(hidden_gates, hidden_bias) + with_bias(input_gates, input_bias);
  auto chunks = gates.chunk(4, 1);
  Tensor ingate = chunks[0].sigmoid();
  Tensor forgetgate = chunks[1].sigmoid();
  Tensor cellgate = chunks[2].tanh();
  Tensor outgate = chunks[3].sigmoid();
  Tensor cy = (forgetgate * cx).add_(ingate * cellgate);
  Tensor hy = outgate * cy.tanh();
  Tensor workspace = at::cat({ingate, forgetgate, cellgate, outgate}, 1);
  return {hy, cy, workspace};
}

std::tuple<Tensor, Tensor, Tensor> fused_lstm_cell_backward_impl(const OptTensor& grad_hy, const OptTensor& grad_cy,
                                                                 const Tensor& cx, const Tensor& cy,
                                                                 const Tensor& workspace, bool has_bias) {
  NEURON_COUNT_EXECUTED("aten::_thnn_fused_lstm_cell_backward_impl");
  bool has_hy = grad_hy.has_value() && grad_hy->defined();
  bool has_cy = grad_cy.has_value() && grad_cy->defined();
  if (!has_hy && !has_cy) return {};
  auto w = workspace.chunk(4, 1);
  const Tensor &ingate = w[0], &forgetgate = w[1], &cellgate = w[2], &outgate = w[3];
  Tensor tanh_cy = cy.tanh();
  Tensor grad_c = has_hy ? tanh_grad(*grad_hy * outgate, tanh_cy) : at::zeros_like(cy);
  if (has_cy) grad_c = grad_c + *grad_cy;
  Tensor grad_o = has_hy ? sigmoid_grad(*grad_hy * tanh_cy, outgate) : at::zeros_like(outgate);
  Tensor grad_gates = at::cat({sigmoid_grad(grad_c * cellgate, ingate), sigmoid_grad(grad_c * cx, forgetgate),
                               tanh_grad(grad_c * ingate, cellgate), grad_o},
                              1);
  Tensor grad_cx = grad_c * forgetgate;
  Tensor grad_bias = has_bias ? grad_gates.sum(0) : Tensor();
  return {grad_gates, grad_cx, grad_bias};
}

std::tuple<Tensor, Tensor> fused_gru_cell(const Tensor& input_gates, const Tensor& hidden_gates, const Tensor& hx,
                                          const OptTensor& input_bias, const OptTensor& hidden_bias) {
  static const char* kName = "aten::_thnn_fused_gru_cell";
  NEURON_COUNT_EXECUTED(kName);
  check_gates(kName, input_gates, hidden_gates, hx, 3);
  auto ig = with_bias(input_gates, input_bias).chunk(3, 1);
  auto hg = with_bias(hidden_gates, hidden_bias).chunk(3, 1);
  Tensor resetgate = (hg[0] + ig[0]).sigmoid();
  Tensor inputgate = (hg[1] + ig[1]).sigmoid();
  Tensor newgate = (ig[2] + hg[2] * resetgate).tanh();
  Tensor hy = (hx - newgate).mul_(inputgate).add_(newgate);
  Tensor workspace = at::cat({resetgate, inputgate, newgate, hx.expand_as(newgate), hg[2]}, 1);
  return {hy, workspace};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> fused_gru_cell_backward(const Tensor& grad_hy,
                                                                            const Tensor& workspace, bool has_bias) {
  NEURON_COUNT_EXECUTED("aten::_thnn_fused_gru_cell_backward");
  auto w = workspace.chunk(5, 1);
  const Tensor &resetgate = w[0], &inputgate = w[1], &newgate = w[2], &hx = w[3], &hn = w[4];
  Tensor grad_n = tanh_grad(grad_hy * (1 - inputgate), newgate);
  Tensor grad_r = sigmoid_grad(grad_n * hn, resetgate);
  Tensor grad_z = sigmoid_grad(grad_hy * (hx - newgate), inputgate);
  Tensor grad_input_gates = at::cat({grad_r, grad_z, grad_n}, 1);
  Tensor grad_hidden_gates = at::cat({grad_r, grad_z, grad_n * resetgate}, 1);
  Tensor grad_hx = grad_hy * inputgate;
  Tensor grad_input_bias = has_bias ? grad_input_gates.sum(0) : Tensor();
  Tensor grad_hidden_bias = has_bias ? grad_hidden_gates.sum(0) : Tensor();
  return {grad_input_gates, grad_hidden_gates, grad_hx, grad_input_bias, grad_hidden_bias};
}

}  // namespace

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_thnn_fused_lstm_cell", TORCH_FN(fused_lstm_cell));
  m.impl("_thnn_fused_lstm_cell_backward_impl", TORCH_FN(fused_lstm_cell_backward_impl));
  m.impl("_thnn_fused_gru_cell", TORCH_FN(fused_gru_cell));
  m.impl("_thnn_fused_gru_cell_backward", TORCH_FN(fused_gru_cell_backward));
}

}  // namespace torch_neuronx
