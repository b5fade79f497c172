// nki._core's name tables: the op table and the name -> code maps of dtypes, ALU operators,
// activation functions and engines (csrc/nki/ir.h owns them all). The Python front end reads
// every code from here and lays out each instruction's attributes by the op table's names.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "nki/ir.h"

namespace py = pybind11;

namespace torch_neuronx {
namespace {

template <class E>
py::dict name_map(int count, const char* (*name)(E)) {
  py::dict d;
  for (int i = 0; i < count; ++i) d[name(static_cast<E>(i))] = i;
  return d;
}

// [{"name", "arity" ("one" / "optional" / "variadic"), "group"}, ...]
py::list params(const std::vector<neuron::nki::Param>& ps) {
  py::list out;
  for (const auto& p : ps) {
    const char* arity = p.arity == neuron::nki::Arity::kOne        ? "one"
                        : p.arity == neuron::nki::Arity::kOptional ? "optional"
                                                                   : "variadic";
    out.append(py::dict(py::arg("name") = p.name, py::arg("arity") = arity, py::arg("group") = p.group));
  }
  return out;
}

}  // namespace

void register_nki_tables(py::module_& m) {
  namespace nk = neuron::nki;
  m.attr("OPS") = name_map<nk::Op>(nk::kNumOps, &nk::op_name);
  m.attr("DTYPES") = name_map<nk::DType>(nk::kNumDTypes, &nk::dtype_name);
  m.attr("ALU_OPS") = name_map<nk::Alu>(nk::kNumAlu, &nk::alu_name);
  m.attr("ACTIVATIONS") = name_map<nk::Act>(nk::kNumAct, &nk::act_name);
  m.attr("ENGINES") = name_map<nk::Engine>(nk::kNumEngines, &nk::engine_name);
  py::dict sizes;
  for (int i = 0; i < nk::kNumDTypes; ++i) {
    sizes[nk::dtype_name(static_cast<nk::DType>(i))] = nk::dtype_size(static_cast<nk::DType>(i));
  }
  m.attr("DTYPE_SIZES") = sizes;
  // One row per op, by code: name, engine, operands, int and float attributes in storage order.
  py::list table;
  for (int i = 0; i < nk::kNumOps; ++i) {
    const nk::OpInfo& o = nk::op_info(static_cast<nk::Op>(i));
    table.append(py::dict(py::arg("name") = o.name, py::arg("code") = i,
                          py::arg("engine") = nk::engine_name(o.engine), py::arg("operands") = params(o.operands),
                          py::arg("ints") = params(o.ints), py::arg("floats") = params(o.floats)));
  }
  m.attr("OP_TABLE") = table;
}

}  // namespace torch_neuronx
