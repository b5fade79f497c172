// Zero-copy execution of ATen's CPU kernels on neuron device memory.
//
// Device memory is host memory, so a neuron tensor can be viewed as a CPU tensor that
// shares its StorageImpl (a "CPU alias"). A neuron op then runs as: alias the inputs,
// redispatch to the CPU kernel with tls_kernel_device set (so every tensor the kernel
// allocates is device memory), and re-label the outputs as neuron tensors. Nothing is
// copied. KernelCall holds the per-call state; NeuronKernel<Op> is the typed (unboxed)
// wrapper used for explicitly registered ops, fallback.cpp the boxed one for the rest.
#pragma once

#include <ATen/Tensor.h>
#include <ATen/core/IListRef.h>
#include <ATen/core/List.h>
#include <ATen/core/function_schema.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/SmallVector.h>

#include <initializer_list>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "aten/neuron.h"

namespace torch_neuronx {

// CPU view of a neuron tensor: a CPU StorageImpl over the same bytes (no copy). Views
// a kernel derives from it are CPU tensors too, as the kernel expects.
at::Tensor cpu_alias(const at::Tensor& t);

// Raises NotImplementedError: `op_name` would produce a `kind` ("quantized", "sparse",
// "nested", ...) tensor, which neuron does not support.
[[noreturn]] void refuse_non_dense(const std::string& op_name, const char* kind);

// Raises the RuntimeError CUDA gives for an op whose tensors are on devices `a` and `b`.
[[noreturn]] void device_mismatch(const char* op_name, c10::Device a, c10::Device b);

class KernelCall {
 public:
  // `write_mask`: bit i set when the op's schema lets it write argument i (a!); only
  // those arguments can change shape or storage, so only they are checked in finish().
  explicit KernelCall(const char* op_name, bool allow_cpu_tensors = false, uint64_t write_mask = ~uint64_t(0))
      : op_name_(op_name), allow_cpu_(allow_cpu_tensors), write_mask_(write_mask), activity_(op_name) {}
  ~KernelCall();
  KernelCall(const KernelCall&) = delete;
  KernelCall& operator=(const KernelCall&) = delete;

  // Moves to the next schema argument; arguments are converted in schema order.
  KernelCall& next_arg() {
    ++arg_;
    return *this;
  }

  // Converts an argument tensor: neuron → CPU alias (remembered), CPU passes through.
  at::Tensor input(const at::Tensor& t, bool stable_ref = true);
  // A Device argument of a factory op: neuron → cpu (the device is remembered).
  std::optional<c10::Device> device_arg(std::optional<c10::Device> d);
  // A generator argument: the CPU generator behind the neuron one (default when absent).
  std::optional<at::Generator> generator_arg(const std::optional<at::Generator>& g);

  // Fixes the device the op runs for and checks that the arguments agree on it.
  void begin();
  c10::DeviceIndex device() const { return device_; }

  // Converts a tensor the CPU kernel returned into a neuron tensor.
  at::Tensor output(at::Tensor t);
  // Maps a returned reference to a mutable argument's alias back to the argument.
  at::Tensor& output_ref(const at::Tensor& t);
  // Propagates size/stride/storage changes made through aliases (in-place and out=
  // arguments) to the neuron tensors, and ends the kernel-allocation scope.
  void finish();

 private:
  void note_device(c10::Device d);
  [[noreturn]] void mismatch(c10::Device a, c10::Device b) const;

  struct StoragePair;
  // The entry of a neuron storage already aliased in this call, or nullptr.
  StoragePair* find_storage(const c10::StorageImpl* neuron_storage);
  // The CPU storage standing in for a neuron storage during this call.
  const c10::Storage& alias_storage(c10::StorageImpl* neuron_storage, bool written);
  // A CPU alias of a neuron argument, reusing one this thread parked when possible.
  at::Tensor make_alias(const c10::TensorImpl* src, bool written);
  // The neuron storage an alias storage stands in for, or nullptr.
  c10::StorageImpl* neuron_storage_of(const c10::StorageImpl* alias) const;

  bool arg_written() const { return arg_ < 0 || arg_ >= 64 || ((write_mask_ >> arg_) & 1); }

  struct StoragePair {
    c10::StorageImpl* neuron;
    c10::Storage alias;
    bool written;
  };
  struct AliasEntry {
    c10::TensorImpl* alias;
    const at::Tensor* orig_ptr;  // the caller's argument (for returned references)
    c10::TensorImpl* orig;
    at::Tensor alias_ref;  // keeps the alias alive for finish()
    bool written;
  };
  const char* op_name_;
  bool allow_cpu_;
  uint64_t write_mask_;
  int arg_ = -1;
  bool saw_neuron_tensor_ = false;
  bool cpu_output_ = false;                    // a factory op asked for device='cpu'
  c10::DeviceIndex device_ = -1;
  c10::DeviceIndex explicit_device_ = -1;      // from a Device argument
  std::optional<c10::Device> foreign_;         // a non-scalar tensor on another device type
  std::optional<c10::Device> other_neuron_;    // a second neuron device, if any
  c10::SmallVector<AliasEntry, 6> aliases_;
  c10::SmallVector<StoragePair, 6> storages_;
  std::optional<KernelDeviceScope> scope_;
  DeviceActivityScope activity_;  // last: reports the span once everything else is done
};

// ---- 16-bit float convolutions (ops.cpp; matrix products: cpu/gemm.h via matmul.cpp) ------
// Trainium's PE array multiplies bf16/fp16 operands exactly and accumulates in fp32 (PSUM);
// the result is rounded once when it leaves. ATen's CPU kernels compute the same numbers, with
// oneDNN where the host has 16-bit GEMMs (AVX-512), and with scalar loops, tens of times slower
// than the fp32 BLAS, where it has not. On such hosts neuron widens the operands to fp32 (exact),
// runs the fp32 kernel and narrows the result: the same rounding, at fp32 speed.

// Whether ATen's CPU kernels have a fast path for `dtype` (bf16 or fp16) on this host.
bool host_has_16bit_gemm(c10::ScalarType dtype);

// True when every defined tensor is bf16, or every one is fp16, and the host has no fast
// kernel for it. Anything else (mixed dtypes included) takes ATen's own kernel, which keeps
// its type checks and messages.
inline bool widens(std::initializer_list<const at::Tensor*> tensors) {
  std::optional<c10::ScalarType> dtype;
  for (const at::Tensor* t : tensors) {
    if (!t->defined()) continue;
    const c10::ScalarType s = t->scalar_type();
    if ((s != at::kBFloat16 && s != at::kHalf) || (dtype && *dtype != s)) return false;
    dtype = s;
  }
  return dtype.has_value() && !host_has_16bit_gemm(*dtype);
}
inline at::Tensor widen(const at::Tensor& t) { return t.defined() ? t.to(at::kFloat) : t; }
inline std::optional<at::Tensor> widen(const std::optional<at::Tensor>& t) {
  if (t.has_value() && t->defined()) return t->to(at::kFloat);
  return t;
}
// The fp32 result rounded to `like`'s dtype.
inline at::Tensor narrow(const at::Tensor& r, const at::Tensor& like) {
  return r.defined() ? r.to(like.scalar_type()) : r;
}

// ---- typed wrapper ---------------------------------------------------------------------

template <class T>
struct KArg {  // pass-through for non-tensor arguments
  T v;
  KArg(KernelCall&, T x) : v(std::forward<T>(x)) {}
  T get(KernelCall&) { return std::forward<T>(v); }
};

template <>
struct KArg<const at::Tensor&> {
  at::Tensor a;
  KArg(KernelCall& c, const at::Tensor& t) : a(c.input(t)) {}
  const at::Tensor& get(KernelCall&) { return a; }
};

template <>
struct KArg<at::Tensor&> {
  at::Tensor a;
  KArg(KernelCall& c, at::Tensor& t) : a(c.input(t)) {}
  at::Tensor& get(KernelCall&) { return a; }
};

template <>
struct KArg<const std::optional<at::Tensor>&> {
  std::optional<at::Tensor> a;
  KArg(KernelCall& c, const std::optional<at::Tensor>& t) {
    if (t.has_value()) a = c.input(*t);
  }
  const std::optional<at::Tensor>& get(KernelCall&) { return a; }
};

template <>
struct KArg<at::TensorList> {
  std::vector<at::Tensor> a;
  KArg(KernelCall& c, at::TensorList ts) {
    a.reserve(ts.size());
    for (const auto& t : ts) a.push_back(c.input(t));
  }
  at::TensorList get(KernelCall&) { return a; }
};

template <>
struct KArg<const at::ITensorListRef&> {
  std::vector<at::Tensor> a;
  at::ITensorListRef ref;
  KArg(KernelCall& c, const at::ITensorListRef& ts) {
    for (const auto& t : ts) a.push_back(c.input(t));
  }
  KArg(KArg&& o) noexcept : a(std::move(o.a)) {}
  const at::ITensorListRef& get(KernelCall&) {
    ref = at::ITensorListRef(at::ArrayRef<at::Tensor>(a));
    return ref;
  }
};

template <>
struct KArg<const c10::List<std::optional<at::Tensor>>&> {
  c10::List<std::optional<at::Tensor>> a;
  KArg(KernelCall& c, const c10::List<std::optional<at::Tensor>>& ts) {
    a.reserve(ts.size());
    for (const std::optional<at::Tensor>& t : ts) {
      a.push_back(t.has_value() ? std::optional<at::Tensor>(c.input(*t, /*stable_ref=*/false)) : std::nullopt);
    }
  }
  const c10::List<std::optional<at::Tensor>>& get(KernelCall&) { return a; }
};

template <>
struct KArg<std::optional<c10::Device>> {
  std::optional<c10::Device> a;
  KArg(KernelCall& c, std::optional<c10::Device> d) : a(c.device_arg(d)) {}
  std::optional<c10::Device> get(KernelCall&) { return a; }
};

template <>
struct KArg<std::optional<at::Generator>> {
  std::optional<at::Generator> g;
  KArg(KernelCall&, std::optional<at::Generator> x) : g(std::move(x)) {}
  // Resolved after begin(): the default generator depends on the op's device.
  std::optional<at::Generator> get(KernelCall& c) { return c.generator_arg(g); }
};

template <class R>
struct KRet {
  static R wrap(KernelCall&, R r) { return r; }
};
template <>
struct KRet<at::Tensor> {
  static at::Tensor wrap(KernelCall& c, at::Tensor r) { return c.output(std::move(r)); }
};
template <>
struct KRet<at::Tensor&> {
  static at::Tensor& wrap(KernelCall& c, at::Tensor& r) { return c.output_ref(r); }
};
template <>
struct KRet<const at::Tensor&> {
  static const at::Tensor& wrap(KernelCall& c, const at::Tensor& r) { return c.output_ref(r); }
};
template <>
struct KRet<std::vector<at::Tensor>> {
  static std::vector<at::Tensor> wrap(KernelCall& c, std::vector<at::Tensor> r) {
    for (auto& t : r) t = c.output(std::move(t));
    return r;
  }
};
template <class... Ts>
struct KRet<std::tuple<Ts...>> {
  static std::tuple<Ts...> wrap(KernelCall& c, std::tuple<Ts...> r) {
    return std::apply([&](auto&&... e) { return std::tuple<Ts...>(KRet<Ts>::wrap(c, std::forward<Ts>(e))...); },
                      std::move(r));
  }
};

const c10::DispatchKeySet& cpu_keyset();

// Registered ops count their executions without locks: one counter per op.
template <class Op>
OpCounter& counter_for() {
  static OpCounter& c = op_counter(std::string(Op::name) + (Op::overload_name[0] ? "." : "") + Op::overload_name);
  return c;
}

// Bit i set when the schema (of name, overload) may write argument i.
uint64_t schema_write_mask(const c10::FunctionSchema& schema);
uint64_t schema_write_mask(const char* name, const char* overload_name);

template <class Op, bool AllowCpu, class Sig = typename Op::schema>
struct NeuronKernel;

template <class Op, bool AllowCpu, class R, class... Args>
struct NeuronKernel<Op, AllowCpu, R(Args...)> {
  static R run(Args... args) {
    counter_for<Op>().executed.fetch_add(1, std::memory_order_relaxed);
    static const uint64_t write_mask = schema_write_mask(Op::name, Op::overload_name);
    KernelCall call(Op::name, AllowCpu, write_mask);
    std::tuple<KArg<Args>...> held{KArg<Args>(call.next_arg(), std::forward<Args>(args))...};
    call.begin();
    return invoke(call, held, std::index_sequence_for<Args...>{});
  }

 private:
  template <size_t... I>
  static R invoke(KernelCall& call, std::tuple<KArg<Args>...>& held, std::index_sequence<I...>) {
    if constexpr (std::is_void_v<R>) {
      Op::redispatch(cpu_keyset(), std::get<I>(held).get(call)...);
      call.finish();
    } else {
      decltype(auto) r = Op::redispatch(cpu_keyset(), std::get<I>(held).get(call)...);
      call.finish();
      return KRet<R>::wrap(call, std::forward<decltype(r)>(r));
    }
  }
};

}  // namespace torch_neuronx
