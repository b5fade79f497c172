// nki._core's name tables: the op table and the name -> code maps of dtypes, memories, ALU
// operators, activation functions, engines, reduce commands, DGE and out-of-bounds modes
// (csrc/nki/ir.h owns them all). The Python front end reads
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

// Which name map an int attribute's values are codes of (None: plain integers).
py::object code_name(neuron::nki::Code c) {
  using C = neuron::nki::Code;
  switch (c) {
    case C::kInt: return py::none();
    case C::kAlu: return py::str("ALU_OPS");
    case C::kAluOrNone: return py::str("ALU_OPS or -1");
    case C::kAct: return py::str("ACTIVATIONS");
    case C::kEngine: return py::str("ENGINES");
    case C::kReduceCmd: return py::str("REDUCE_CMDS");
    case C::kDgeMode: return py::str("DGE_MODES");
    case C::kOobMode: return py::str("OOB_MODES");
  }
  return py::none();
}

// [{"name", "arity" ("one" / "optional" / "variadic"), "group", "code"}, ...]
py::list params(const std::vector<neuron::nki::Param>& ps) {
  py::list out;
  for (const auto& p : ps) {
    const char* arity = p.arity == neuron::nki::Arity::kOne        ? "one"
                        : p.arity == neuron::nki::Arity::kOptional ? "optional"
                                                                   : "variadic";
    out.append(py::dict(py::arg("name") = p.name, py::arg("arity") = arity, py::arg("group") = p.group,
                        py::arg("code") = code_name(p.code)));
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
  m.attr("BUFFERS") = name_map<nk::Buffer>(nk::kNumBuffers, &nk::buffer_name);
  m.attr("REDUCE_CMDS") = name_map<nk::ReduceCmd>(nk::kNumReduceCmds, &nk::reduce_cmd_name);
  m.attr("DGE_MODES") = name_map<nk::DgeMode>(nk::kNumDgeModes, &nk::dge_mode_name);
  m.attr("OOB_MODES") = name_map<nk::OobMode>(nk::kNumOobModes, &nk::oob_mode_name);
  py::dict sizes;
  for (int i = 0; i < nk::kNumDTypes; ++i) {
    sizes[nk::dtype_name(static_cast<nk::DType>(i))] = nk::dtype_size(static_cast<nk::DType>(i));
  }
  m.attr("DTYPE_SIZES") = sizes;
  m.attr("BN_STATS_FMAX") = nk::kBnStatsFmax;
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
