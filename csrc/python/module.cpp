// torch_neuronx._C: the Python surface of the runtime and the ATen layer. The
// torch.neuron module (torch_neuronx/neuron) is a thin Python layer over these.
#include <ATen/Parallel.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>

#include <exception>
#include <thread>

#include "aten/neuron.h"
#include "python/chip_facts.h"
#include "runtime/memory.h"
#include "runtime/platform.h"
#include "runtime/stream.h"

namespace py = pybind11;
namespace rt = neuron::rt;
using namespace torch_neuronx;

namespace torch_neuronx {
void register_distributed(py::module_& parent);
}

namespace {

py::dict platform_dict() {
  const rt::Platform& p = rt_call([] { return std::cref(rt::platform()); }).get();
  py::dict d = chip_facts_dict(*p.chip);
  d["lnc"] = p.lnc;
  d["logical_cores_per_chip"] = p.logical_cores;
  d["launch_blocking"] = p.launch_blocking;
  d["memory_source"] = p.memory_source;
  d["device_count"] = p.devices.size();
  return d;
}

py::dict device_dict(int index) {
  const rt::Platform& p = rt_call([] { return std::cref(rt::platform()); }).get();
  check_device_index(static_cast<c10::DeviceIndex>(index));
  const rt::DeviceInfo& dev = p.devices[static_cast<size_t>(index)];
  auto mem = rt_call([&] { return rt::memory_info(index); });
  py::dict d;
  d["index"] = dev.index;
  d["logical_core"] = dev.logical_core;
  d["physical_cores"] = dev.physical_cores;
  d["total_memory"] = mem.capacity;
  d["platform"] = p.chip->name;
  d["product"] = p.chip->product;
  d["core"] = p.chip->core_name;
  d["nc_version"] = p.chip->nc_version;
  d["lnc"] = p.lnc;
  return d;
}

py::list pairs(const std::vector<std::pair<std::string, uint64_t>>& v) {
  py::list out;
  for (const auto& [name, n] : v) out.append(py::make_tuple(name, n));
  return out;
}

// A no-op backward on each device, from a fresh C++ thread while the caller waits without the GIL.
// An autograd worker can hold the last reference to a finished backward's graph task, whose
// captured thread-local state may own Python objects (Inductor stashes some in the importing
// thread's state); released while the interpreter finalizes, it cannot take the GIL and the
// process aborts. The no-op task is queued behind earlier work, so when it returns each worker
// has released earlier tasks (taking the GIL this thread gave up), and the worker's last task,
// made on a thread whose state owns no Python objects, needs no GIL to release.
void drain_autograd_workers(int count) {
  py::gil_scoped_release nogil;
  std::exception_ptr err;
  std::thread worker([&] {
    try {
      for (int i = 0; i < count; ++i) {
        auto opts = at::TensorOptions().device(c10::Device(c10::DeviceType::PrivateUse1, static_cast<c10::DeviceIndex>(i)));
        auto x = at::zeros({}, opts).requires_grad_(true);
        torch::autograd::backward({x.mul(1)});
      }
    } catch (...) {
      err = std::current_exception();
    }
  });
  worker.join();
  if (err) std::rethrow_exception(err);
}

// torch's intra-op pool as a C function for the NKI core (nki._core links no torch): it calls
// body(ctx, begin, end) on ranges covering [0, n). Handed over as a capsule (_parallel_for).
void intra_op_parallel_for(int64_t n, void (*body)(void*, int64_t, int64_t), void* ctx) {
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) { body(ctx, begin, end); });
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  register_distributed(m);
  m.attr("_parallel_for") = py::capsule(reinterpret_cast<void*>(&intra_op_parallel_for), "neuron.parallel_for");
  static const int cpu_preferred_ops = register_cpu_kernel_preference();
  m.attr("_cpu_preferred_ops") = cpu_preferred_ops;
  m.doc() = "torch-neuronx native core";
  m.def("_built_with_torch", [] { return std::string(TORCH_VERSION); });
  m.def("_device_count", [] { return static_cast<int>(device_count()); });
  m.def("_config_error", [] { return rt::config_error(); });
  m.def("_lazy_init", [] { lazy_init(); });
  m.def("_drain_autograd_workers", &drain_autograd_workers);
  m.def("_is_initialized", [] { return rt::is_initialized(); });
  m.def("_is_in_bad_fork", [] { return rt::in_bad_fork(); });
  m.def("_current_device", [] { return static_cast<int>(current_device()); });
  m.def("_set_device", [](int d) { set_current_device(static_cast<c10::DeviceIndex>(d)); });
  m.def("_check_device", [](int d) { check_device_index(static_cast<c10::DeviceIndex>(d)); });
  m.def("_platform", &platform_dict);
  m.def("_check_fp8_platform", [](const std::string& op) { check_fp8_platform(op.c_str()); });
  m.def("_device_properties", &device_dict);

  m.def("_device_memory_info", [](int d) {
    auto i = rt_call([&] { return rt::memory_info(d); });
    py::dict out;
    out["capacity"] = i.capacity;
    out["used"] = i.used;
    out["peak"] = i.peak;
    out["num_allocs"] = i.num_allocs;
    out["num_frees"] = i.num_frees;
    return out;
  });
  m.def("_set_memory_fraction", [](double f, int d) { set_memory_fraction(f, static_cast<c10::DeviceIndex>(d)); });
  m.def("_allocator_limit", [](int d) { return allocator_limit(static_cast<c10::DeviceIndex>(d)); });
  m.def("_set_device_capacity", [](int d, uint64_t bytes) { rt_call([&] { rt::set_memory_capacity(d, bytes); }); });

  m.def("_default_generator", [](int d) {
    return py::reinterpret_steal<py::object>(
        THPGenerator_initDefaultGenerator(default_generator(static_cast<c10::DeviceIndex>(d))));
  });

  m.def("_stream_priority", [](int d, int64_t id) { return rt_call([&] { return rt::stream_priority(d, id); }); });
  m.def("_stream_launch_count", [](int d, int64_t id) { return rt_call([&] { return rt::stream_launch_count(d, id); }); });
  m.def(
      "_sleep",
      [](int64_t cycles) {
        c10::Device d(kNeuron, current_device());
        const int64_t stream = c10::impl::getDeviceGuardImpl(kNeuron)->getStream(d).id();
        rt_call([&] { rt::sleep_cycles(d.index(), stream, cycles); });
      },
      py::call_guard<py::gil_scoped_release>());
  m.def("_stream_priority_range", [] { return py::make_tuple(rt::kLowestPriority, rt::kHighestPriority); });

  m.def("_executed_ops", [] { return pairs(executed_ops()); });
  m.def("_fallback_ops", [] { return pairs(fallback_ops()); });
  m.def("_clear_op_tracking", &clear_op_tracking);
  m.def("_set_fallback_policy", [](const std::string& p) { set_fallback_policy(parse_fallback_policy(p)); });
  m.def("_get_fallback_policy", [] { return std::string(fallback_policy_name(fallback_policy())); });

  m.def("_share_storage_fd", [](const at::Tensor& t) { return share_storage_fd(t); });
  m.def("_tensor_from_shared_fd", [](int fd, size_t nbytes, int device, py::object dtype, std::vector<int64_t> sizes,
                                     std::vector<int64_t> strides, int64_t offset) {
    TORCH_CHECK_TYPE(THPDtype_Check(dtype.ptr()), "dtype must be a torch.dtype");
    auto st = reinterpret_cast<THPDtype*>(dtype.ptr())->scalar_type;
    return tensor_from_shared_fd(fd, nbytes, static_cast<c10::DeviceIndex>(device), st, sizes, strides, offset);
  });

  m.def("_parse_bytes", [](const std::string& s) { return rt_call([&] { return rt::parse_bytes(s, "size"); }); });
}
