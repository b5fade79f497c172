// How the `neuron` c10d backend takes hold of neuron tensors: the checks every op makes of its
// arguments, and contiguous CPU views of their memory (device memory is host memory).
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <sstream>
#include <string>
#include <vector>

#include "aten/kernel.h"
#include "aten/neuron.h"

namespace torch_neuronx::dist {

inline void check_dense_neuron(const at::Tensor& t, const char* op) {
  TORCH_CHECK_VALUE(t.defined() && t.device().type() == kNeuron && t.layout() == at::kStrided,
                    "Tensors must be neuron and dense: ", op, " got ",
                    t.defined() ? t.device().str() + " " + c10::str(t.layout()) : std::string("an undefined"),
                    " tensor. Move it with .to(\"neuron\"), or run CPU tensors on a gloo group "
                    "(init_process_group(\"cpu:gloo,neuron:neuron\")).");
}

inline void check_single(const std::vector<at::Tensor>& v, const char* op) {
  TORCH_CHECK_VALUE(v.size() == 1, op, ": the neuron backend takes one tensor per process, got ", v.size());
  check_dense_neuron(v[0], op);
}

inline std::string shape_str(const at::Tensor& t) {
  std::ostringstream s;
  s << c10::getDtypeNames(t.scalar_type()).first << t.sizes();  // torch's name: float32[4, 8]
  return s.str();
}

// A contiguous CPU view of a neuron tensor's memory (copied when the tensor is not
// contiguous; `writeback` then copies results back).
struct Flat {
  at::Tensor alias;  // CPU alias of the user's tensor
  at::Tensor flat;   // 1-D contiguous; shares memory with alias when possible
  bool copied = false;
  static Flat of(const at::Tensor& t, bool read) {
    Flat f;
    f.alias = cpu_alias(t);
    if (f.alias.is_contiguous()) {
      f.flat = f.alias.view({-1});
    } else {
      f.copied = true;
      f.flat = read ? f.alias.contiguous().view({-1}) : at::empty({f.alias.numel()}, f.alias.options());
    }
    return f;
  }
  void writeback() {
    if (copied) alias.copy_(flat.view(alias.sizes()));
  }
  char* ptr() const { return static_cast<char*>(flat.data_ptr()); }
  size_t bytes() const { return flat.nbytes(); }
};

// Flat views of a list of tensors (the outputs of a gather, the inputs of a scatter).
struct FlatList {
  std::vector<Flat> all;
  std::vector<at::Tensor> flats;
  static FlatList of(const std::vector<at::Tensor>& ts, bool read) {
    FlatList l;
    for (const auto& t : ts) {
      l.all.push_back(Flat::of(t, read));
      l.flats.push_back(l.all.back().flat);
    }
    return l;
  }
  void writeback() {
    for (auto& f : all) f.writeback();
  }
};

inline at::Tensor view_of(void* p, int64_t numel, at::ScalarType dt) {
  return at::from_blob(p, {numel}, at::TensorOptions().dtype(dt).device(at::kCPU));
}

}  // namespace torch_neuronx::dist
