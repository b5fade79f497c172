// Reductions of the `neuron` c10d backend: c10d's ReduceOp checked against a tensor's dtype,
// and the elementwise reduction every transport (self, shared memory, gloo's AVG) ends with.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <vector>

namespace torch_neuronx::dist {

struct Reduction {
  c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM;
  double factor = 1.0;  // PREMUL_SUM
  int n = 1;            // AVG divides by this
};

// "SUM", "AVG", ...: how op descriptions and errors name a reduce op.
const char* red_name(c10d::ReduceOp::RedOpType op);
// The reduction `rop` over `n` ranks; a clear error when it is not defined for `dt`.
Reduction make_reduction(const c10d::ReduceOp& rop, at::ScalarType dt, int n, const char* opname);
void divide_for_avg(const at::Tensor& t, int n);
void reduce_into(const at::Tensor& out, const std::vector<at::Tensor>& ins, const Reduction& r);

}  // namespace torch_neuronx::dist
