// nki._core.estimate: the engine model (csrc/nki/cost_model.h) for nki.estimate / nki.benchmark.
// Models the verified programs of one launch on a platform of the platform model and hands Python
// the schedule, the profiler-named metrics and the Chrome trace.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "nki/cost_model.h"
#include "nki/execute.h"
#include "runtime/platform.h"

namespace py = pybind11;

namespace torch_neuronx {
namespace {

using neuron::nki::Estimate;
using neuron::nki::Program;
using neuron::nki::Track;

struct PyEstimate {
  Estimate e;
  std::vector<std::shared_ptr<Program>> programs;  // the instructions the schedule refers to

  std::vector<const neuron::nki::Kernel*> kernels() const {
    std::vector<const neuron::nki::Kernel*> ks;
    for (const auto& p : programs) ks.push_back(&p->kernel());
    return ks;
  }
};

}  // namespace

void register_nki_estimate(py::module_& m) {
  py::class_<PyEstimate>(m, "Estimate")
      .def_property_readonly("platform", [](const PyEstimate& s) { return s.e.platform; })
      .def_property_readonly("programs", [](const PyEstimate& s) { return s.e.programs; })
      .def_property_readonly("total_ns", [](const PyEstimate& s) { return s.e.total_ns; })
      // Neuron Explorer's summary metrics, under its names (tools/neuron-explorer/overview-summary-page.rst).
      .def("metrics",
           [](const PyEstimate& s) {
             const Estimate& e = s.e;
             py::dict d;
             d["total_time"] = e.total_ns * 1e-9;
             for (int t = 0; t < neuron::nki::kNumTracks; ++t) {
               const auto tr = static_cast<Track>(t);
               const std::string name = neuron::nki::track_name(tr);
               const std::string prefix = tr == Track::kDma ? "dma" : name + "_engine";
               d[py::str(prefix + "_active_time_percent")] = e.active_percent(tr);
               d[py::str(prefix + "_instruction_count")] = e.tracks[t].instructions;
             }
             d["hfu_estimated_percent"] = e.hfu_percent();
             d["mfu_estimated_percent"] = e.mfu_percent();
             d["mbu_estimated_percent"] = e.mbu_percent();
             d["mm_arithmetic_intensity"] = e.mm_arithmetic_intensity();
             d["model_flops"] = e.model_flops;
             d["transpose_flops"] = e.transpose_flops;
             d["throttled_flops"] = e.throttled_flops;
             d["hbm_read_bytes"] = e.hbm_read_bytes;
             d["hbm_write_bytes"] = e.hbm_write_bytes;
             d["spill_save_bytes"] = e.spill_save_bytes;
             d["spill_reload_bytes"] = e.spill_reload_bytes;
             return d;
           })
      // Per instruction: (program, index, engine, start_ns, end_ns, op name, file, line).
      .def("instructions",
           [](const PyEstimate& s) {
             py::list out;
             for (const auto& t : s.e.instrs) {
               const auto& in = s.programs[t.program]->kernel().instrs[t.index];
               out.append(py::make_tuple(t.program, t.index, neuron::nki::track_name(t.track), t.start_ns, t.end_ns,
                                         neuron::nki::op_name(in.op), in.loc.file, in.loc.line));
             }
             return out;
           })
      .def("chrome_trace", [](const PyEstimate& s) {
        std::string j;
        {
          py::gil_scoped_release nogil;
          j = neuron::nki::chrome_trace(s.e, s.kernels());
        }
        return py::bytes(j);
      });
  m.def(
      "estimate",
      [](const std::vector<std::shared_ptr<Program>>& programs, const std::string& platform) {
        const neuron::rt::ChipFacts* chip = neuron::rt::find_chip(platform);
        if (chip == nullptr) {
          throw py::value_error("unknown platform '" + platform +
                                "' for nki.estimate: use trn1 (gen2), inf2, trn2 (gen3) or trn3 (gen4)");
        }
        auto s = std::make_unique<PyEstimate>();
        s->programs = programs;
        const auto ks = s->kernels();
        py::gil_scoped_release nogil;
        s->e = neuron::nki::estimate(ks, *chip);
        return s;
      },
      py::arg("programs"), py::arg("platform"),
      "Models the verified programs of one launch on a platform's NeuronCores (nothing runs).");
}

}  // namespace torch_neuronx
