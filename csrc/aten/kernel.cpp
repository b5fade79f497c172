// KernelCall (see kernel.h), op tracking and the fallback policy.
#include "aten/kernel.h"

#include <ATen/core/dispatch/Dispatcher.h>
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
                                                  kNeuronKeys, impl->dtype());
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

// Dispatch keys are protected in TensorImpl; a derived class may name the member.
struct KeySetAccess : c10::TensorImpl {
  static constexpr c10::DispatchKeySet c10::TensorImpl::*member = &KeySetAccess::key_set_;
};

// A neuron tensor over `storage` with t's view metadata. A result the kernel just made
// (we hold the only reference) is turned into a neuron tensor in place: one TensorImpl
// less per op than building a new one.
at::Tensor to_neuron(at::Tensor t, c10::Storage storage) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (t.use_count() != 1 || t.weak_use_count() != 1 || !impl->allow_tensor_metadata_change()) {
    return neuron_view(t, std::move(storage));
  }
  impl->set_storage_keep_dtype(std::move(storage));  // the device follows the storage
  c10::DispatchKeySet& ks = impl->*KeySetAccess::member;
  constexpr auto cpu_autocast = c10::DispatchKeySet(c10::DispatchKey::AutocastCPU);
  if (ks.has_any(cpu_autocast)) ks = (ks - cpu_autocast) | c10::DispatchKeySet(c10::DispatchKey::AutocastPrivateUse1);
  ks = ks | kNeuronKeys;  // autograd keys (if any: not in inference mode) follow the backend bits
  return t;
}

// What a neuron tensor cannot be: non-strided layouts, quantized and nested tensors
// (found by the result itself, so no op list can miss one). nullptr when it is fine.
const char* unsupported_kind(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (impl->is_quantized() || c10::isQIntType(t.scalar_type())) return "quantized";
  if (impl->is_nested()) return "nested";
  switch (t.layout()) {
    case c10::kStrided: break;
    case c10::kSparse: return "sparse";
    case c10::kMkldnn: return "mkldnn";
    default: return "sparse compressed";
  }
  if (!impl->has_storage()) return "storage-less";
  return nullptr;
}

}  // namespace

void refuse_non_dense(const std::string& op_name, const char* kind) {
  bool nested = std::string(kind) == "nested";
  TORCH_CHECK_NOT_IMPLEMENTED(false, op_name, " would return a ", kind, " tensor, but the neuron device supports only "
                              "dense (strided, non-quantized) tensors. ",
                              nested ? "Nested tensors with layout=torch.jagged work on neuron; use those, or run "
                                       "this op on CPU tensors (x.cpu())."
                                     : "Run this op on CPU tensors (x.cpu()) and move a dense result back with "
                                       ".to('neuron').");
}

namespace {

at::Tensor alias_over(const c10::TensorImpl* src, c10::Storage storage) {
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), c10::DispatchKeySet(c10::DispatchKey::CPU),
                                                   src->dtype());
  copy_view_bits(src, impl.get());
  return at::Tensor(std::move(impl));
}

// Aliases made for kernel calls are reused by the next call on the same thread (when
// nothing else kept a reference): allocating and constructing a TensorImpl and a
// StorageImpl per argument is a measurable part of a small op's cost. A parked alias
// keeps its own alias storage, which the next call points at its argument's bytes.
thread_local std::vector<c10::intrusive_ptr<c10::TensorImpl>> tls_pool;
constexpr size_t kPoolMax = 32;

void point_at(c10::StorageImpl* alias, const c10::StorageImpl* s) {
  alias->set_data_ptr_noswap(c10::DataPtr(const_cast<void*>(s->data()), c10::Device(c10::kCPU)));
  alias->set_nbytes(s->nbytes());
}

// Takes back an alias nobody else holds; anything unusual is simply not reused. (An
// alias is always a plain CPU TensorImpl we made; inference-mode ones are not pooled,
// and a pooled one used in inference mode only differs in that its inner calls may
// count a version bump nobody reads.)
void park_alias(at::Tensor& t) {
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  if (tls_pool.size() >= kPoolMax || t.use_count() != 1 || t.weak_use_count() != 1 ||
      impl->autograd_meta() != nullptr || impl->is_inference() || !impl->allow_tensor_metadata_change()) {
    return;
  }
  tls_pool.push_back(t.unsafeReleaseIntrusivePtr());
}

// The parked alias's storage, if it is still a plain non-owning alias that only the
// parked tensor holds (so it can stand in for a new argument's storage).
c10::StorageImpl* reusable_storage(c10::TensorImpl* parked) {
  const c10::Storage& st = parked->unsafe_storage();
  c10::StorageImpl* impl = st.unsafeGetStorageImpl();
  if (impl == nullptr || st.use_count() != 1 || impl->allocator() != c10::GetCPUAllocator() || !impl->resizable() ||
      impl->data_ptr().get_context() != nullptr) {
    return nullptr;  // a kernel replaced its memory or allocator, or someone kept it
  }
  return impl;
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

KernelCall::StoragePair* KernelCall::find_storage(const c10::StorageImpl* neuron_storage) {
  for (auto& p : storages_) {
    if (p.neuron == neuron_storage) return &p;
  }
  return nullptr;
}

const c10::Storage& KernelCall::alias_storage(c10::StorageImpl* neuron_storage, bool written) {
  if (StoragePair* p = find_storage(neuron_storage)) {
    p->written |= written;
    return p->alias;
  }
  storages_.push_back({neuron_storage, make_alias_storage(neuron_storage), written});
  return storages_.back().alias;
}

at::Tensor KernelCall::make_alias(const c10::TensorImpl* src, bool written) {
  c10::StorageImpl* ns = src->storage().unsafeGetStorageImpl();
  if (tls_pool.empty()) return alias_over(src, alias_storage(ns, written));
  c10::intrusive_ptr<c10::TensorImpl> impl = std::move(tls_pool.back());
  tls_pool.pop_back();
  c10::StorageImpl* own = find_storage(ns) ? nullptr : reusable_storage(impl.get());
  if (own != nullptr) {  // the common case: its parked storage becomes this argument's alias storage
    point_at(own, ns);
    storages_.push_back({ns, impl->storage(), written});
    if (impl->dtype() != src->dtype()) impl->set_storage_and_dtype(impl->storage(), src->dtype());
  } else {
    impl->set_storage_and_dtype(alias_storage(ns, written), src->dtype());
  }
  if (impl->sizes() != src->sizes() || impl->strides() != src->strides()) {
    impl->set_sizes_and_strides(src->sizes(), src->strides(), src->storage_offset());
  } else if (impl->storage_offset() != src->storage_offset()) {
    impl->set_storage_offset(src->storage_offset());
  }
  if (impl->is_conj() != src->is_conj()) impl->_set_conj(src->is_conj());
  if (impl->is_neg() != src->is_neg()) impl->_set_neg(src->is_neg());
  return at::Tensor(std::move(impl));
}

KernelCall::~KernelCall() {
  storages_.clear();  // first, so a parked alias is the only holder of its storage
  for (auto& e : aliases_) park_alias(e.alias_ref);
}

uint64_t schema_write_mask(const c10::FunctionSchema& schema) {
  uint64_t mask = 0;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const c10::AliasInfo* a = args[i].alias_info();
    if (i >= 64 || (a != nullptr && a->isWrite())) mask |= uint64_t(1) << std::min<size_t>(i, 63);
  }
  return mask;
}

uint64_t schema_write_mask(const char* name, const char* overload_name) {
  auto op = c10::Dispatcher::singleton().findSchema({name, overload_name});
  return op ? schema_write_mask(op->schema()) : ~uint64_t(0);
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
    bool written = arg_written();
    at::Tensor a = make_alias(impl, written);
    aliases_.push_back({a.unsafeGetTensorImpl(), stable_ref ? &t : nullptr, impl, a, written});
    return a;
  }
  // CPU scalars (and CPU indices of indexing ops) mix with device tensors as inputs, as they do
  // with CUDA; an argument the op writes (out=, self of an in-place op) is never one of them.
  const bool mixes = d.is_cpu() && !arg_written() && (allow_cpu_ || impl->dim() == 0);
  if (!mixes && !foreign_) foreign_ = d;
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

void device_mismatch(const char* op_name, c10::Device a, c10::Device b) {
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ", a, " and ", b,
              "! (in ", op_name, ")");
}

void KernelCall::mismatch(c10::Device a, c10::Device b) const { device_mismatch(op_name_, a, b); }

void KernelCall::begin() {
  if (other_neuron_) mismatch(c10::Device(kNeuron, device_), *other_neuron_);
  if (foreign_ && saw_neuron_tensor_) mismatch(c10::Device(kNeuron, device_), *foreign_);
  if (explicit_device_ >= 0) device_ = explicit_device_;
  if (device_ < 0) device_ = current_device();
  lazy_init();
  if (!cpu_output_) scope_.emplace(device_);
  activity_.set_device(device_);
}

at::Tensor KernelCall::output(at::Tensor t) {
  if (!t.defined()) return t;
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  for (const auto& e : aliases_) {
    if (e.alias == impl) return at::Tensor(c10::intrusive_ptr<c10::TensorImpl>::reclaim_copy(e.orig));
  }
  if (cpu_output_ || impl->device_type() != c10::kCPU) return t;
  if (const char* kind = unsupported_kind(t)) {
    refuse_non_dense(op_name_, kind);
  }
  c10::StorageImpl* s = impl->storage().unsafeGetStorageImpl();
  if (c10::StorageImpl* input = neuron_storage_of(s)) return to_neuron(std::move(t), storage_ref(input));  // a view of an input
  if (s->device_type() == kNeuron) return to_neuron(std::move(t), impl->storage());
  if (is_device_memory(s->data_ptr())) {  // born in device memory
    adopt_storage(s, device_);
    return to_neuron(std::move(t), impl->storage());
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
    if (!p.written) continue;  // read-only arguments cannot have been resized
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
    if (!e.written) continue;
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
