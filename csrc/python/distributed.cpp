// torch_neuronx._C._distributed: the `neuron` c10d backend class and its counters.
// torch_neuronx/distributed registers it with torch.distributed.
#include <pybind11/chrono.h>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/utils/pybind.h>

#include "distributed/process_group.h"

namespace py = pybind11;

namespace torch_neuronx {

void register_distributed(py::module_& parent) {
  using dist::ProcessGroupNeuron;
  py::module_ m = parent.def_submodule("_distributed", "The neuron c10d backend");
  // Base class is torch's c10d Backend (registered by torch._C._distributed_c10d), so
  // instances pass straight into ProcessGroup._register_backend.
  py::class_<ProcessGroupNeuron, c10d::Backend, c10::intrusive_ptr<ProcessGroupNeuron>>(m, "ProcessGroupNeuron")
      .def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                       std::chrono::milliseconds timeout, std::string group_name) {
             return c10::make_intrusive<ProcessGroupNeuron>(store, rank, size, timeout, std::move(group_name));
           }),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"), py::arg("group_name") = "",
           py::call_guard<py::gil_scoped_release>())
      .def("_num_hosts", &ProcessGroupNeuron::num_hosts)
      .def("_host_index", &ProcessGroupNeuron::host_index)
      .def("_is_host_leader", &ProcessGroupNeuron::is_host_leader)
      .def("_local_size", &ProcessGroupNeuron::local_size)
      .def("_set_gloo",
           [](ProcessGroupNeuron& self, const c10::intrusive_ptr<c10d::Backend>& flat,
              const std::optional<c10::intrusive_ptr<c10d::Backend>>& leaders) {
             self.set_gloo(flat, leaders.value_or(nullptr));
           },
           py::arg("flat"), py::arg("leaders") = py::none());
  m.def("stats", &dist::stats);
  m.def("reset_stats", &dist::reset_stats);
}

}  // namespace torch_neuronx
