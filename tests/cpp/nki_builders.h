// Building NKI kernels by hand in the IR (csrc/nki/ir.h), for the GoogleTests of the NKI core:
// tensors, whole-tensor accesses and instructions, written as the Python front end (nki/isa)
// emits them (operands positional, absent optional operands as nk::Access{}).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "nki/ir.h"

namespace nki_test {

namespace nk = neuron::nki;

// Declares a tensor named t<index> at kernel.py:<line>; returns its index.
inline int tensor(nk::Kernel& k, nk::Buffer b, nk::DType d, std::vector<int64_t> shape, int external = -1,
                  int line = 0) {
  k.tensors.push_back({b, d, std::move(shape), "t" + std::to_string(k.tensors.size()), {"kernel.py", line}, external});
  return static_cast<int>(k.tensors.size() - 1);
}

// The whole of a row-major tensor as an access.
inline nk::Access whole(const nk::Kernel& k, int t) {
  const auto& s = k.tensors[t].shape;
  nk::Access a{t, 0, {}};
  int64_t stride = 1;
  for (size_t i = s.size(); i-- > 0;) {
    a.dims.insert(a.dims.begin(), {stride, s[i]});
    stride *= s[i];
  }
  return a;
}

inline void instr(nk::Kernel& k, nk::Op op, std::vector<nk::Access> args, std::vector<int64_t> ints = {},
                  std::vector<double> floats = {}, int line = 0) {
  k.instrs.push_back({op, std::move(args), std::move(ints), std::move(floats), {"kernel.py", line}});
}

}  // namespace nki_test
