// Shared declarations of the ATen integration layer (the `neuron` PrivateUse1 backend).
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/record_function.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/Device.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <initializer_list>
#include <optional>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/errors.h"

namespace torch_neuronx {

constexpr c10::DeviceType kNeuron = c10::DeviceType::PrivateUse1;

// Dispatch keys of a dense neuron tensor. Besides PrivateUse1 they carry the CPU backend
// bit: dispatch still picks PrivateUse1 (the higher-priority backend), but PyTorch then
// counts neuron tensors among the dense backends whose TensorImpls are interchangeable,
// as it does for CUDA, so `param.data = neuron_tensor` and Module.to() keep the
// Parameter objects (and tied weights) without swapping tensors.
constexpr c10::DispatchKeySet kNeuronKeys =
    c10::DispatchKeySet(c10::DispatchKey::PrivateUse1) | c10::DispatchKeySet(c10::BackendComponent::CPUBit);

// ---- errors -----------------------------------------------------------------
// Re-raises a runtime error as the PyTorch exception a CUDA user would get.
[[noreturn]] void rethrow_runtime_error(const neuron::rt::Error& e);

template <class F>
auto rt_call(F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const neuron::rt::Error& e) {
    rethrow_runtime_error(e);
  }
}

// ---- devices ----------------------------------------------------------------
c10::DeviceIndex device_count() noexcept;
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);  // validates
void check_device_index(c10::DeviceIndex index);   // TORCH_CHECK-style error for bad index
// Initializes the runtime on first use; refuses in a forked child. Inline: it runs on
// every op, and after the first it is one relaxed load.
extern std::atomic<bool> g_runtime_ready;  // cleared in a forked child
void lazy_init_slow();
inline void lazy_init() {
  if (C10_UNLIKELY(!g_runtime_ready.load(std::memory_order_relaxed))) lazy_init_slow();
}

// ---- allocation -------------------------------------------------------------
// While >= 0 on a thread, CPU kernels running for a neuron op allocate their
// tensors in that device's memory (see allocator.cpp, "kernel CPU allocator").
extern thread_local c10::DeviceIndex tls_kernel_device;

struct KernelDeviceScope {
  explicit KernelDeviceScope(c10::DeviceIndex d) : prev_(tls_kernel_device) { tls_kernel_device = d; }
  ~KernelDeviceScope() { tls_kernel_device = prev_; }
  KernelDeviceScope(const KernelDeviceScope&) = delete;
  KernelDeviceScope& operator=(const KernelDeviceScope&) = delete;

 private:
  c10::DeviceIndex prev_;
};

c10::DeviceAllocator* neuron_allocator();
// Device memory on `device`; the DataPtr claims device `as_device` (neuron, or CPU for
// memory handed to a CPU kernel that is adopted as neuron memory afterwards).
c10::DataPtr allocate_device_memory(c10::DeviceIndex device, size_t nbytes, c10::Device as_device);
// True when the DataPtr's memory came from the neuron allocator.
bool is_device_memory(const c10::DataPtr& p);
// Re-labels a storage whose memory is device memory as a neuron storage.
void adopt_storage(c10::StorageImpl* s, c10::DeviceIndex device);
void set_memory_fraction(double fraction, c10::DeviceIndex device);
std::pair<uint64_t, uint64_t> allocator_limit(c10::DeviceIndex device);  // (limit bytes, capacity)
c10::Allocator* pinned_allocator();
bool is_pinned_ptr(const void* p);
c10::Device device_of_ptr(void* p);
void install_kernel_cpu_allocator();

// ---- profiling (profiler.cpp) -------------------------------------------------
// While a profiler listens, kernels report their spans on the device timeline.
extern std::atomic<bool> g_device_activity_on;
int64_t device_clock_ns();
void record_device_activity(const char* name, c10::DeviceIndex device, int64_t start_ns, int64_t end_ns);

// Reports [construction, destruction) as device activity `name` when profiling. The
// CPU kernel's own aten calls inside it are hidden from the profiler meanwhile: they are
// how the simulator runs the kernel, not ops the program called (and a nested op of the
// same name would otherwise take over the kernel's device time in key_averages()).
class DeviceActivityScope {
 public:
  explicit DeviceActivityScope(const char* name, c10::DeviceIndex device = -1) : name_(name), device_(device) {
    if (C10_UNLIKELY(g_device_activity_on.load(std::memory_order_relaxed))) {
      start_ = device_clock_ns();
      hide_inner_.emplace(false);
    }
  }
  ~DeviceActivityScope() {
    if (C10_UNLIKELY(start_ != 0)) {
      try {
        record_device_activity(name_, device_, start_, device_clock_ns());
      } catch (...) {  // profiling must never fail the op
      }
    }
  }
  void set_device(c10::DeviceIndex d) { device_ = d; }
  DeviceActivityScope(const DeviceActivityScope&) = delete;
  DeviceActivityScope& operator=(const DeviceActivityScope&) = delete;

 private:
  const char* name_;
  c10::DeviceIndex device_;
  int64_t start_ = 0;
  std::optional<at::RecordFunctionGuard> hide_inner_;
};

// ---- sharing between processes (sharing.cpp) ----------------------------------
// Moves the tensor's storage into shared memory (once) and returns (fd, bytes).
std::pair<int, size_t> share_storage_fd(const at::Tensor& t);
// A neuron tensor over the shared memory behind `fd` (which the caller keeps).
at::Tensor tensor_from_shared_fd(int fd, size_t nbytes, c10::DeviceIndex device, c10::ScalarType dtype,
                                 c10::IntArrayRef sizes, c10::IntArrayRef strides, int64_t offset);

// ---- random -----------------------------------------------------------------
const at::Generator& default_generator(c10::DeviceIndex device);
at::Generator new_generator(c10::DeviceIndex device);
// The CPU generator whose stream a neuron generator draws from. Kernels run on
// CPU code, so they consume exactly this state, whichever path an op takes.
at::Generator cpu_generator_of(const at::Generator& neuron_gen);

// ---- FP8 (scaled_mm.cpp) -----------------------------------------------------
bool is_fp8(c10::ScalarType t);
// Raises, naming the platform and the fix, when an op would compute on FP8 operands and the
// simulated chip (trn2) does not compute in FP8.
void check_fp8_compute(const char* op, std::initializer_list<const at::Tensor*> tensors);
// The same refusal for `op` regardless of operands (e.g. converting a model to FP8 training).
void check_fp8_platform(const char* op);

// ---- stochastic rounding (rounding.cpp) ----------------------------------------
// NEURON_RT_STOCHASTIC_ROUNDING_EN=1: fp32 -> bf16 / fp8 conversions round stochastically.
bool stochastic_rounding_enabled();
// Converts src into dst (CPU views of device memory) stochastically when the dtypes call for
// it, drawing from `device`'s generator; false (nothing done) otherwise.
bool stochastic_round_copy(at::Tensor& dst, const at::Tensor& src, c10::DeviceIndex device);

// ---- op tracking and fallback policy ----------------------------------------
struct OpCounter {
  std::string name;
  std::atomic<uint64_t> executed{0};
  std::atomic<uint64_t> fallback{0};
};
OpCounter& op_counter(const std::string& name);
// Counts one execution of `name` from a kernel that is not a NeuronKernel; the counter
// is looked up once per call site.
#define NEURON_COUNT_EXECUTED(name)                                          \
  do {                                                                       \
    static ::torch_neuronx::OpCounter& neuron_counter_ = ::torch_neuronx::op_counter(name); \
    neuron_counter_.executed.fetch_add(1, std::memory_order_relaxed);        \
  } while (0)
std::vector<std::pair<std::string, uint64_t>> executed_ops();
std::vector<std::pair<std::string, uint64_t>> fallback_ops();
void clear_op_tracking();

enum class FallbackPolicy { kSilent, kWarn, kError };
FallbackPolicy fallback_policy();
void set_fallback_policy(FallbackPolicy p);
FallbackPolicy parse_fallback_policy(const std::string& s);
const char* fallback_policy_name(FallbackPolicy p);
// Raises/warns according to the policy for an op that is about to use the fallback.
void apply_fallback_policy(const std::string& op_name);
// Runs ops that have both a CPU kernel and a CompositeExplicitAutograd kernel as their
// CPU kernel (boxed; counted as executed, not as fallbacks). Called once, after all
// static registrations; returns how many ops it registered.
int register_cpu_kernel_preference();

}  // namespace torch_neuronx
