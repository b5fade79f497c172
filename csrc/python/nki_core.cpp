// nki._core: the NKI simulator's C++ core (csrc/nki) for the Python front-end (nki/). The
// front-end records a traced kernel into a KernelBuilder; build() verifies it and returns a
// Program, which runs on raw memory addresses (numpy buffers or neuron tensors). An extension of
// its own that links no torch (CMakeLists.txt), so `import nki` loads neither torch nor the device.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "nki/execute.h"
#include "python/chip_facts.h"
#include "runtime/errors.h"
#include "runtime/platform.h"

namespace py = pybind11;

namespace torch_neuronx {
namespace {

using neuron::nki::Access;
using neuron::nki::Kernel;
using neuron::nki::Program;

int64_t int_of(PyObject* o, const char* what) {
  const long long v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    throw py::type_error(std::string("nki: ") + what + " of an operand access is not an integer");
  }
  return v;
}

// An operand as the front end passes it: (tensor, offset, [(stride, size)...], index tensor, index
// offset, index step, index stride, vector index). Read with the C API: a traced kernel passes
// one per operand of every instruction, and pybind's generic casters were most of the cost of
// recording an instruction.
Access access_of(PyObject* t) {
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 8) {
    throw py::type_error("nki: an operand access is an 8-tuple (tensor, offset, dims, index tensor, index offset, "
                         "index step, index stride, vector index)");
  }
  Access a;
  a.tensor = static_cast<int32_t>(int_of(PyTuple_GET_ITEM(t, 0), "the tensor"));
  a.offset = int_of(PyTuple_GET_ITEM(t, 1), "the offset");
  py::object dims = py::reinterpret_steal<py::object>(
      PySequence_Fast(PyTuple_GET_ITEM(t, 2), "nki: the dims of an operand access are a sequence of (stride, size)"));
  if (!dims) throw py::error_already_set();
  const Py_ssize_t nd = PySequence_Fast_GET_SIZE(dims.ptr());
  a.dims.reserve(nd);
  for (Py_ssize_t i = 0; i < nd; ++i) {
    PyObject* d = PySequence_Fast_GET_ITEM(dims.ptr(), i);
    if (!PyTuple_Check(d) || PyTuple_GET_SIZE(d) != 2) throw py::type_error("nki: a dim of an access is (stride, size)");
    a.dims.push_back({int_of(PyTuple_GET_ITEM(d, 0), "a stride"), int_of(PyTuple_GET_ITEM(d, 1), "a size")});
  }
  a.index = {static_cast<int32_t>(int_of(PyTuple_GET_ITEM(t, 3), "the index tensor")),
             int_of(PyTuple_GET_ITEM(t, 4), "the index offset"), int_of(PyTuple_GET_ITEM(t, 5), "the index step"),
             int_of(PyTuple_GET_ITEM(t, 6), "the index stride"), PyObject_IsTrue(PyTuple_GET_ITEM(t, 7)) == 1};
  return a;
}

struct KernelBuilder {
  Kernel k;
};

// A dtype / memory code from the front end as its enum; a code outside the enum is a ValueError
// here, not a value the verifier and executor would index tables with.
neuron::nki::DType dtype_of_code(int code) {
  if (code < 0 || code >= neuron::nki::kNumDTypes) {
    throw py::value_error("nki: dtype code " + std::to_string(code) + " is not an NKI dtype; the codes are 0.." +
                          std::to_string(neuron::nki::kNumDTypes - 1) + " (nki._core.DTYPES)");
  }
  return static_cast<neuron::nki::DType>(code);
}

neuron::nki::Buffer buffer_of_code(int code) {
  if (code < 0 || code >= neuron::nki::kNumBuffers) {
    throw py::value_error("nki: memory code " + std::to_string(code) + " is not an NKI memory; the codes are 0.." +
                          std::to_string(neuron::nki::kNumBuffers - 1) + " (nki._core.BUFFERS)");
  }
  return static_cast<neuron::nki::Buffer>(code);
}

// A host thread pool as a C function: pool(n, body, ctx) calls body(ctx, begin, end) on ranges
// covering [0, n). torch_neuronx._C._parallel_for is torch's intra-op pool behind a capsule of
// this name; installed, large tiles run there (one pool per process: no oversubscription).
// Without one the executor runs serially.
using HostPool = void (*)(int64_t, void (*)(void*, int64_t, int64_t), void*);
constexpr const char* kPoolCapsule = "neuron.parallel_for";
std::atomic<HostPool> g_pool{nullptr};

// One call of the executor's body through the pool: no exception crosses into the pool's module;
// the first one is rethrown here once every range has run.
struct PoolCall {
  const std::function<void(int64_t, int64_t)>* body;
  std::exception_ptr error;
  std::mutex mu;
};

void pool_body(void* ctx, int64_t begin, int64_t end) noexcept {
  auto* call = static_cast<PoolCall*>(ctx);
  try {
    (*call->body)(begin, end);
  } catch (...) {
    std::lock_guard<std::mutex> lock(call->mu);
    if (!call->error) call->error = std::current_exception();
  }
}

void set_host_pool(py::object capsule) {
  if (capsule.is_none()) return g_pool.store(nullptr);
  if (!PyCapsule_IsValid(capsule.ptr(), kPoolCapsule))
    throw py::type_error(std::string("set_parallel_for takes a '") + kPoolCapsule + "' capsule or None");
  g_pool.store(reinterpret_cast<HostPool>(PyCapsule_GetPointer(capsule.ptr(), kPoolCapsule)));
}

}  // namespace

void register_nki(py::module_& m) {
  neuron::nki::set_parallel_for([](int64_t n, const std::function<void(int64_t, int64_t)>& body) {
    HostPool pool = g_pool.load();
    if (pool == nullptr) return body(0, n);
    PoolCall call{&body, nullptr, {}};
    pool(n, &pool_body, &call);
    if (call.error) std::rethrow_exception(call.error);
  });
  m.def("set_parallel_for", &set_host_pool, py::arg("pool"),
        "Runs large tiles on a host thread pool (a 'neuron.parallel_for' capsule; None: serially). "
        "torch_neuronx installs torch's intra-op pool.");
  m.def("_has_parallel_for", [] { return g_pool.load() != nullptr; });
  // Imported after torch_neuronx: take its pool now (torch_neuronx installs it when imported later).
  py::object tnx = py::module_::import("sys").attr("modules").attr("get")("torch_neuronx._C");
  if (!tnx.is_none() && py::hasattr(tnx, "_parallel_for")) set_host_pool(tnx.attr("_parallel_for"));
  // The target's name from NEURON_PLATFORM_TARGET_OVERRIDE / NEURON_PLATFORM (runtime/platform.h
  // parses them) and a target's facts, which nl.tile_size reads.
  m.def("target_from_env", [] {
    try {
      return std::string(neuron::rt::nki_target_from_env().name);
    } catch (const neuron::rt::Error& e) {
      throw py::value_error(e.what());
    }
  });
  m.def("target_facts", [](const std::string& name) {
    const neuron::rt::ChipFacts* c = neuron::rt::find_chip(name);
    if (c == nullptr) throw py::value_error("unknown NKI target '" + name + "': expected trn1, inf2, trn2 or trn3");
    return chip_facts_dict(*c);
  });
  py::class_<KernelBuilder>(m, "KernelBuilder")
      .def(py::init([](const std::string& target) {
        auto b = std::make_unique<KernelBuilder>();
        try {
          b->k.target = neuron::nki::target_for(target);
        } catch (const std::invalid_argument& e) {
          throw py::value_error(e.what());
        }
        return b;
      }))
      .def("tensor",
           [](KernelBuilder& b, int buffer, int dtype, std::vector<int64_t> shape, std::string name, std::string file,
              int line, int external) {
             neuron::nki::TensorDecl t{buffer_of_code(buffer), dtype_of_code(dtype), std::move(shape), std::move(name),
                                       {std::move(file), line}, external};
             b.k.tensors.push_back(std::move(t));
             return static_cast<int>(b.k.tensors.size() - 1);
           })
      .def("instr",
           [](KernelBuilder& b, int op, const py::list& args, std::vector<int64_t> ints, std::vector<double> floats,
              std::string file, int line, std::string text) {
             if (op < 0 || op >= neuron::nki::kNumOps) throw std::invalid_argument("nki: unknown op code");
             neuron::nki::Instr in{static_cast<neuron::nki::Op>(op), {}, std::move(ints), std::move(floats),
                                   {std::move(file), line}, std::move(text)};
             in.args.reserve(args.size());
             for (const py::handle& a : args) in.args.push_back(access_of(a.ptr()));
             b.k.instrs.push_back(std::move(in));
           },
           py::arg("op"), py::arg("args"), py::arg("ints"), py::arg("floats"), py::arg("file"), py::arg("line"),
           py::arg("text") = "")
      .def("alias",
           [](KernelBuilder& b, int base, int dtype, std::vector<int64_t> shape, std::string name, std::string file,
              int line) {
             if (base < 0 || base >= static_cast<int>(b.k.tensors.size())) {
               throw py::value_error("nki: alias of tensor " + std::to_string(base) + ", which is not declared");
             }
             const neuron::nki::TensorDecl& of = b.k.tensors[base];
             if (of.alias >= 0) base = of.alias;  // an alias of an alias reinterprets the same base
             neuron::nki::TensorDecl t{of.buffer, dtype_of_code(dtype), std::move(shape), std::move(name),
                                       {std::move(file), line}, -1, base};
             b.k.tensors.push_back(std::move(t));
             return static_cast<int>(b.k.tensors.size() - 1);
           })
      .def("set_external", [](KernelBuilder& b, int tensor, int slot) { b.k.tensors.at(tensor).external = slot; })
      .def_property_readonly("num_instructions", [](const KernelBuilder& b) { return b.k.instrs.size(); })
      // Verifies and plans; a broken rule raises error_type(message, rule, filename, lineno).
      .def("build", [](KernelBuilder& b, py::object error_type) {
        try {
          return std::make_shared<Program>(std::move(b.k));
        } catch (const neuron::nki::VerifyError& e) {
          py::object exc = error_type(e.what(), e.rule, e.loc.file, e.loc.line);
          PyErr_SetObject(error_type.ptr(), exc.ptr());
          throw py::error_already_set();
        }
      });
  // nl.device_print output: handler(label, dtype name, shape, values) with the values as the bytes of
  // fp32 (float dtypes) or int64 (integers, bool), called with the GIL from the thread running the kernel.
  m.def("set_print_handler", [](py::object handler) {
    if (handler.is_none()) return neuron::nki::set_print_sink(nullptr);
    // Held for the life of the process: the sink outlives the interpreter's own teardown.
    PyObject* h = handler.inc_ref().ptr();
    neuron::nki::set_print_sink([h](const neuron::nki::PrintedTensor& t) {
      py::gil_scoped_acquire gil;
      const bool fl = neuron::nki::is_float(t.dtype);
      const char* data = fl ? reinterpret_cast<const char*>(t.floats.data())
                            : reinterpret_cast<const char*>(t.ints.data());
      py::bytes values(data, fl ? t.floats.size() * sizeof(float) : t.ints.size() * sizeof(int64_t));
      try {
        py::handle write(h);
        write(t.label, neuron::nki::dtype_name(t.dtype), t.shape, values);
      } catch (py::error_already_set& e) {  // raised to the kernel's caller as a RuntimeError
        throw std::runtime_error("nl.device_print could not write its output: " + std::string(e.what()));
      }
    });
  });
  m.def(
      "run_launch",
      [](const std::vector<std::shared_ptr<Program>>& programs, const std::vector<std::vector<uintptr_t>>& addresses) {
        std::vector<Program*> ps;
        for (const auto& p : programs) ps.push_back(p.get());
        std::vector<std::vector<void*>> ptrs;
        for (const auto& list : addresses) {
          ptrs.emplace_back();
          for (uintptr_t a : list) ptrs.back().push_back(reinterpret_cast<void*>(a));
        }
        py::gil_scoped_release nogil;
        neuron::nki::run_launch(ps, ptrs);
      },
      "Runs the programs of one SPMD launch together (sendrecv / core_barrier between them).");
  py::class_<Program, std::shared_ptr<Program>>(m, "Program")
      .def("run",
           [](Program& p, const std::vector<uintptr_t>& addresses) {
             std::vector<void*> ptrs(addresses.size());
             for (size_t i = 0; i < addresses.size(); ++i) ptrs[i] = reinterpret_cast<void*>(addresses[i]);
             py::gil_scoped_release nogil;
             p.run(ptrs);
           })
      .def_property_readonly("num_instructions", [](const Program& p) { return p.kernel().instrs.size(); })
      .def_property_readonly("arena_bytes", &Program::arena_bytes);
}

}  // namespace torch_neuronx

namespace torch_neuronx {
void register_nki_estimate(py::module_& m);  // nki_estimate.cpp: the engine model
void register_nki_tables(py::module_& m);    // nki_tables.cpp: the op table and name -> code maps
}  // namespace torch_neuronx

PYBIND11_MODULE(_core, m) {
  m.doc() = "The NKI simulator core (no torch)";
  torch_neuronx::register_nki(m);
  torch_neuronx::register_nki_estimate(m);
  torch_neuronx::register_nki_tables(m);
}
