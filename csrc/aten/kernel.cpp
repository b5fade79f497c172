// KernelCall (see kernel.h), op tracking and the fallback policy.
#include "aten/kernel.h"

#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>

namespace torch_neuronx {

namespace {

void copy_view_bits(const c10::TensorImpl* from, c10::TensorImpl* to) {
  to->set_sizes_and_strides(from->sizes(), from->strides(), from->storage_offset());
  if (from->is_conj()) to->_set_conj(true);
  if (from->is_neg()) to->_set_neg(true);
}

// A new owning reference to `s`.
c10::Storage storage_ref(c10::StorageImpl* s) {
  return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(s));
}

// A neuron tensor over `storage` with t's view metadata.
at::Tensor neuron_view(const at::Tensor& t, c10::Storage storage) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  auto out = c10::make_intrusive<c10::TensorImpl>(std::move(storage),
                                                  c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), impl->dtype());
  copy_view_bits(impl, out.get());
  return at::Tensor(std::move(out));
}

// Non-owning CPU storage over a neuron storage's bytes. Resizable through the CPU
// allocator, which hands out device memory inside a kernel call (finish() moves it over).
c10::Storage make_alias_storage(const c10::StorageImpl* s) {
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), s->nbytes(),
      c10::DataPtr(const_cast<void*>(s->data()), c10::Device(c10::kCPU)), c10::GetCPUAllocator(), true));
}

at::Tensor alias_over(const c10::TensorImpl* src, c10::Storage storage) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                   src->dtype());
  copy_view_bits(src, impl.get());
  return at::Tensor(std::move(impl));
}

}  // namespace

at::Tensor cpu_alias(const at::Tensor& t) {
  const c10::TensorImpl* src = t.unsafeGetTensorImpl();
  return alias_over(src, make_alias_storage(src->storage().unsafeGetStorageImpl()));
}

const c10::DispatchKeySet& cpu_keyset() {
  static const c10::DispatchKeySet ks(c10::DispatchKey::CPU);
  return ks;
}

const c10::Storage& KernelCall::alias_storage(c10::StorageImpl* neuron_storage) {
  for (const auto& p : storages_) {
    if (p.neuron == neuron_storage) return p.alias;
  }
  storages_.push_back({neuron_storage, make_alias_storage(neuron_storage)});
  return storages_.back().alias;
}

c10::StorageImpl* KernelCall::neuron_storage_of(const c10::StorageImpl* alias) const {
  for (const auto& p : storages_) {
    if (p.alias.unsafeGetStorageImpl() == alias) return p.neuron;
  }
  return nullptr;
}

at::Tensor KernelCall::input(const at::Tensor& t, bool stable_ref) {
  if (!t.defined()) return t;
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  c10::Device d = impl->device();
  if (d.type() == kNeuron) {
    note_device(d);
    saw_neuron_tensor_ = true;
    at::Tensor a = alias_over(impl, alias_storage(impl->storage().unsafeGetStorageImpl()));
    aliases_.push_back({a.unsafeGetTensorImpl(), stable_ref ? &t : nullptr, impl, a});
    return a;
  }
  // CPU scalars mix with device tensors, as they do with CUDA.
  if (!(d.is_cpu() && (allow_cpu_ || impl->dim() == 0)) && !foreign_) foreign_ = d;
  return t;
}

std::optional<c10::Device> KernelCall::device_arg(std::optional<c10::Device> d) {
  if (!d.has_value()) return d;
  if (d->type() == kNeuron) {
    c10::DeviceIndex idx = d->has_index() ? d->index() : current_device();
    check_device_index(idx);
    explicit_device_ = idx;
    return c10::Device(c10::kCPU);
  }
  if (d->is_cpu()) cpu_output_ = true;
  return d;
}

std::optional<at::Generator> KernelCall::generator_arg(const std::optional<at::Generator>& g) {
  if (!g.has_value() || !g->defined()) return cpu_generator_of(default_generator(device_));
  TORCH_CHECK(g->device().type() == kNeuron, "Expected a 'neuron' device type for generator but found '",
              g->device().type(), "'");
  return cpu_generator_of(*g);
}

void KernelCall::note_device(c10::Device d) {
  if (device_ < 0) device_ = d.index();
  else if (d.index() != device_ && !other_neuron_) other_neuron_ = d;
}

void KernelCall::mismatch(c10::Device a, c10::Device b) const {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", a, " and ", b,
              "! (in ", op_name_, ")");
}

void KernelCall::begin() {
  if (other_neuron_) mismatch(c10::Device(kNeuron, device_), *other_neuron_);
  if (foreign_ && saw_neuron_tensor_) mismatch(c10::Device(kNeuron, device_), *foreign_);
  if (explicit_device_ >= 0) device_ = explicit_device_;
  if (device_ < 0) device_ = current_device();
  lazy_init();
  if (!cpu_output_) scope_.emplace(device_);
}

at::Tensor KernelCall::output(at::Tensor t) {
  if (!t.defined()) return t;
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  for (const auto& e : aliases_) {
    if (e.alias == impl) return at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(e.orig));
  }
  if (cpu_output_ || impl->device_type() != c10::kCPU) return t;
  TORCH_CHECK_NOT_IMPLEMENTED(impl->has_storage() && t.layout() == c10::kStrided, op_name_, " would return a ",
                              t.layout(), " tensor, but the neuron device supports only strided (dense) tensors. "
                              "Run this op on CPU tensors (x.cpu()) and move the dense result back with .to('neuron').");
  c10::StorageImpl* s = impl->storage().unsafeGetStorageImpl();
  if (c10::StorageImpl* input = neuron_storage_of(s)) return neuron_view(t, storage_ref(input));  // a view of an input
  if (s->device_type() == kNeuron) return neuron_view(t, impl->storage());
  if (is_device_memory(s->data_ptr())) {  // born in device memory
    adopt_storage(s, device_);
    return neuron_view(t, impl->storage());
  }
  // Host memory the kernel did not allocate through us (e.g. a cached constant): copy.
  auto opts = t.options().device(c10::Device(kNeuron, device_));
  at::Tensor out = t.is_non_overlapping_and_dense() ? at::empty_strided(t.sizes(), t.strides(), opts)
                                                    : at::empty(t.sizes(), opts);
  cpu_alias(out).copy_(t);
  return out;
}

at::Tensor& KernelCall::output_ref(const at::Tensor& t) {
  for (const auto& e : aliases_) {
    if (e.alias == t.unsafeGetTensorImpl() && e.orig_ptr != nullptr) return const_cast<at::Tensor&>(*e.orig_ptr);
  }
  TORCH_INTERNAL_ASSERT(false, op_name_, ": kernel returned a reference to a tensor that is not an argument");
}

void KernelCall::finish() {
  // A resize inside the kernel reallocated an alias storage: move the new device
  // memory into the neuron storage (the alias keeps a non-owning pointer to it).
  for (auto& p : storages_) {
    c10::StorageImpl* a = p.alias.unsafeGetStorageImpl();
    if (a->data() != p.neuron->data()) {
      c10::DataPtr fresh = a->set_data_ptr(c10::DataPtr(a->mutable_data(), c10::Device(c10::kCPU)));
      TORCH_CHECK(fresh.get() == nullptr || is_device_memory(fresh), op_name_,
                  ": a kernel attached host memory to a neuron tensor");
      fresh.unsafe_set_device(c10::Device(kNeuron, device_));
      p.neuron->set_data_ptr_noswap(std::move(fresh));
    }
    if (a->nbytes() != p.neuron->nbytes()) p.neuron->set_nbytes(a->nbytes());
  }
  for (const auto& e : aliases_) {
    c10::TensorImpl* a = e.alias;
    c10::TensorImpl* o = e.orig;
    c10::StorageImpl* as = a->storage().unsafeGetStorageImpl();
    c10::StorageImpl* target = neuron_storage_of(as);
    if (target != o->storage().unsafeGetStorageImpl()) {
      // the kernel pointed the argument at another storage (set_-like ops)
      if (target != nullptr) {
        o->set_storage_keep_dtype(storage_ref(target));
      } else {
        TORCH_CHECK(is_device_memory(as->data_ptr()), op_name_,
                    ": cannot attach host memory to a neuron tensor; move the storage to the device first.");
        adopt_storage(as, device_);
        o->set_storage_keep_dtype(a->storage());
      }
    }
    if (a->sizes() != o->sizes() || a->strides() != o->strides() || a->storage_offset() != o->storage_offset()) {
      o->set_sizes_and_strides(a->sizes(), a->strides(), a->storage_offset());
    }
    // Kernels may flip these view bits on an argument (linalg_lu_solve with left=False
    // conjugates its result that way).
    if (a->is_conj() != o->is_conj()) o->_set_conj(a->is_conj());
    if (a->is_neg() != o->is_neg()) o->_set_neg(a->is_neg());
  }
  scope_.reset();
}

// ---- op tracking ---------------------------------------------------------------------

namespace {
std::mutex g_ops_mu;
std::deque<OpCounter>& counters() {
  static std::deque<OpCounter> c;
  return c;
}
std::unordered_map<std::string, OpCounter*>& counter_index() {
  static std::unordered_map<std::string, OpCounter*> m;
  return m;
}

std::vector<std::pair<std::string, uint64_t>> collect(bool fallback) {
  std::lock_guard<std::mutex> lock(g_ops_mu);
  std::map<std::string, uint64_t> out;
  for (auto& c : counters()) {
    uint64_t n = fallback ? c.fallback.load() : c.executed.load();
    if (n > 0) out[c.name] = n;
  }
  return {out.begin(), out.end()};
}

FallbackPolicy initial_policy() {
  const char* env = std::getenv("TORCH_NEURONX_FALLBACK_POLICY");
  if (env == nullptr || *env == '\0') return FallbackPolicy::kSilent;
  try {
    return parse_fallback_policy(env);
  } catch (const c10::Error&) {
    TORCH_WARN("Ignoring TORCH_NEURONX_FALLBACK_POLICY='", env, "': use silent, warn or error.");
    return FallbackPolicy::kSilent;
  }
}

std::atomic<FallbackPolicy>& policy() {
  static std::atomic<FallbackPolicy> p{initial_policy()};
  return p;
}
}  // namespace

OpCounter& op_counter(const std::string& name) {
  std::lock_guard<std::mutex> lock(g_ops_mu);
  auto& idx = counter_index();
  auto it = idx.find(name);
  if (it != idx.end()) return *it->second;
  OpCounter& c = counters().emplace_back();
  c.name = name;
  idx.emplace(name, &c);
  return c;
}

std::vector<std::pair<std::string, uint64_t>> executed_ops() { return collect(false); }
std::vector<std::pair<std::string, uint64_t>> fallback_ops() { return collect(true); }

void clear_op_tracking() {
  std::lock_guard<std::mutex> lock(g_ops_mu);
  for (auto& c : counters()) {
    c.executed = 0;
    c.fallback = 0;
  }
}

FallbackPolicy fallback_policy() { return policy().load(std::memory_order_relaxed); }
void set_fallback_policy(FallbackPolicy p) { policy().store(p); }

FallbackPolicy parse_fallback_policy(const std::string& s) {
  if (s == "silent") return FallbackPolicy::kSilent;
  if (s == "warn") return FallbackPolicy::kWarn;
  if (s == "error") return FallbackPolicy::kError;
  TORCH_CHECK_VALUE(false, "Unknown fallback policy '", s, "'; use 'silent', 'warn' or 'error'.");
}

const char* fallback_policy_name(FallbackPolicy p) {
  switch (p) {
    case FallbackPolicy::kSilent: return "silent";
    case FallbackPolicy::kWarn: return "warn";
    case FallbackPolicy::kError: return "error";
  }
  return "silent";
}

void apply_fallback_policy(const std::string& op_name) {
  FallbackPolicy p = fallback_policy();
  if (p == FallbackPolicy::kSilent) return;
  if (p == FallbackPolicy::kError) {
    TORCH_CHECK_NOT_IMPLEMENTED(false, op_name,
                                " has no native neuron kernel and would run through the generic fallback, which the "
                                "fallback policy 'error' forbids. Allow it with torch.neuron.set_fallback_policy('warn') "
                                "or TORCH_NEURONX_FALLBACK_POLICY=warn.");
  }
  static std::mutex mu;
  static std::unordered_map<std::string, bool> warned;
  std::lock_guard<std::mutex> lock(mu);
  if (!warned[op_name]) {
    warned[op_name] = true;
    TORCH_WARN(op_name, " has no native neuron kernel and runs through the generic fallback (on device memory, "
               "no copies). See torch.neuron.get_fallback_ops().");
  }
}

}  // namespace torch_neuronx
