// The boxed fallback: every aten op without an explicit neuron kernel runs here, as
// ATen's CPU kernel over CPU aliases of the device tensors (see kernel.h). It is
// counted per op (torch.neuron.get_fallback_ops()) and obeys the fallback policy.
// The same boxed path also serves the ops routed to their CPU kernel on purpose
// (register_cpu_kernel_preference), which are not fallbacks.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/ivalue.h>
#include <ATen/core/stack.h>
#include <torch/library.h>

#include <deque>
#include <mutex>
#include <unordered_map>

#include "aten/kernel.h"

namespace torch_neuronx {
namespace {

struct OpInfo {
  OpCounter* counter;
  std::string name;
  bool allow_cpu;          // indexing ops accept CPU index tensors, as on CUDA
  uint64_t write_mask;     // arguments the schema lets the op write
  std::vector<bool> is_generator;  // per argument: Generator or Generator?
};

const OpInfo& info_for(const c10::OperatorHandle& op) {
  static std::mutex mu;
  static std::unordered_map<const void*, std::unique_ptr<OpInfo>> cache;
  const void* key = &op.schema();
  std::lock_guard<std::mutex> lock(mu);
  auto it = cache.find(key);
  if (it != cache.end()) return *it->second;
  auto info = std::make_unique<OpInfo>();
  const auto& name = op.operator_name();
  info->name = name.name + (name.overload_name.empty() ? "" : "." + name.overload_name);
  info->counter = &op_counter(info->name);
  info->allow_cpu = name.name == "aten::index" || name.name == "aten::index_put_" ||
                    name.name == "aten::index_put" || name.name == "aten::_index_put_impl_" ||
                    name.name == "aten::_unsafe_index" || name.name == "aten::_unsafe_index_put";
  info->write_mask = schema_write_mask(op.schema());
  for (const auto& arg : op.schema().arguments()) {
    c10::TypePtr t = arg.type();
    if (auto opt = t->cast<c10::OptionalType>()) t = opt->getElementType();
    info->is_generator.push_back(t->kind() == c10::TypeKind::GeneratorType);
  }
  return *cache.emplace(key, std::move(info)).first->second;
}

bool is_optional_tensor_list(const c10::IValue& v) {
  if (!v.isList()) return false;
  c10::TypePtr elem = v.toList().elementType();
  auto opt = elem->cast<c10::OptionalType>();
  return opt && opt->getElementType()->kind() == c10::TypeKind::TensorType;
}

// Runs `op` as ATen's CPU kernel over CPU aliases of its neuron arguments (boxed).
void run_cpu_kernel_boxed(const c10::OperatorHandle& op, const OpInfo& info, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const size_t num_args = schema.arguments().size();
  const size_t base = stack->size() - num_args;
  KernelCall call(info.name.c_str(), info.allow_cpu, info.write_mask);
  std::deque<at::Tensor> originals;  // stable addresses for returned references

  auto take = [&](const at::Tensor& t) -> at::Tensor {
    originals.push_back(t);
    return call.input(originals.back());
  };
  for (size_t i = 0; i < num_args; ++i) {
    call.next_arg();
    c10::IValue& v = (*stack)[base + i];
    if (v.isTensor()) {
      v = take(v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorVector()) list.push_back(take(t));
      v = std::move(list);
    } else if (is_optional_tensor_list(v)) {
      c10::List<std::optional<at::Tensor>> list;
      for (const c10::IValue& e : v.toListRef()) {
        list.push_back(e.isTensor() ? std::optional<at::Tensor>(take(e.toTensor())) : std::nullopt);
      }
      v = std::move(list);
    } else if (v.isDevice()) {
      auto d = call.device_arg(v.toDevice());
      v = *d;
    }
  }
  call.begin();
  for (size_t i = 0; i < num_args; ++i) {
    if (!info.is_generator[i]) continue;
    c10::IValue& v = (*stack)[base + i];
    std::optional<at::Generator> g;
    if (v.isGenerator()) g = v.toGenerator();
    v = *call.generator_arg(g);
  }

  try {
    op.redispatchBoxed(cpu_keyset(), stack);
  } catch (const c10::NotImplementedError& e) {
    std::string msg = e.what_without_backtrace();
    if (msg.find("'CPU' backend") != std::string::npos && msg.find(op.operator_name().name) != std::string::npos) {
      TORCH_CHECK_NOT_IMPLEMENTED(false, info.name,
                                  " is not supported on the neuron device: it has no CPU kernel for the simulated "
                                  "NeuronCore to run. Move the inputs to CPU for this op. (", msg, ")");
    }
    throw;
  }
  call.finish();

  const size_t num_returns = schema.returns().size();
  const size_t rbase = stack->size() - num_returns;
  for (size_t i = 0; i < num_returns; ++i) {
    c10::IValue& v = (*stack)[rbase + i];
    if (v.isTensor()) {
      v = call.output(v.toTensor());
    } else if (v.isTensorList()) {
      c10::List<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorVector()) list.push_back(call.output(t));
      v = std::move(list);
    }
  }
}

// Ops without a neuron kernel: tracked as fallback ops and subject to the fallback policy.
void neuron_fallback(const c10::OperatorHandle& op, c10::DispatchKeySet /*ks*/, torch::jit::Stack* stack) {
  const OpInfo& info = info_for(op);
  apply_fallback_policy(info.name);  // first: an op the policy refuses has not run
  info.counter->executed.fetch_add(1, std::memory_order_relaxed);
  info.counter->fallback.fetch_add(1, std::memory_order_relaxed);
  run_cpu_kernel_boxed(op, info, stack);
}

// Ops deliberately routed to their CPU kernel (register_cpu_kernel_preference): the
// device's chosen implementation, so neither a fallback nor subject to its policy.
void neuron_cpu_kernel(const c10::OperatorHandle& op, c10::DispatchKeySet /*ks*/, torch::jit::Stack* stack) {
  const OpInfo& info = info_for(op);
  info.counter->executed.fetch_add(1, std::memory_order_relaxed);
  run_cpu_kernel_boxed(op, info, stack);
}

// Strided nested tensors (NestedTensorImpl) are not supported. Their one composite
// constructor is refused below; any that is made anyway reaches this for every op.
void refuse_nested(const c10::OperatorHandle& op, c10::DispatchKeySet /*ks*/, torch::jit::Stack* /*stack*/) {
  TORCH_CHECK_NOT_IMPLEMENTED(false, op.operator_name().name, " was given a nested tensor of layout torch.strided on "
                              "neuron, which the device does not support. Nested tensors with layout=torch.jagged work "
                              "on neuron; use those, or run on CPU tensors.");
}

// Quantized and sparse (COO) tensors are not supported. A quantized dtype or the sparse layout
// makes the dispatcher pick the QuantizedPrivateUse1 or SparsePrivateUse1 key (a factory given
// dtype=torch.qint8 or layout=torch.sparse_coo, .to('neuron') of such a tensor), where ops
// have no kernels: instead of the dispatcher's "Could not run" they refuse here, by name.
template <const char* kind>
void refuse_layout(const c10::OperatorHandle& op, c10::DispatchKeySet /*ks*/, torch::jit::Stack* /*stack*/) {
  refuse_non_dense(op.operator_name().name, kind);
}
constexpr char kQuantized[] = "quantized";
constexpr char kSparse[] = "sparse";

at::Tensor refuse_nested_from_list(at::TensorList, std::optional<c10::ScalarType>, std::optional<c10::Layout>,
                                   std::optional<c10::Device>, std::optional<bool>) {
  refuse_non_dense("aten::_nested_tensor_from_tensor_list", "nested");
}

}  // namespace

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&neuron_fallback>());
}

TORCH_LIBRARY_IMPL(_, NestedTensorPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_nested>());
}

TORCH_LIBRARY_IMPL(_, QuantizedPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_layout<kQuantized>>());
}

TORCH_LIBRARY_IMPL(_, SparsePrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&refuse_layout<kSparse>>());
}

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_nested_tensor_from_tensor_list", TORCH_FN(refuse_nested_from_list));
}

int register_cpu_kernel_preference() {
  // The dispatcher gives a backend without its own kernel an op's
  // CompositeExplicitAutograd kernel before the backend fallback. Where the op also has
  // a CPU kernel (addr, all.dims, ...), that composite rounds differently from what CPU
  // computes; running the CPU kernel itself makes results match CPU exactly. The same
  // holds for the functional and in-place variants of structured ops, whose generated
  // CompositeExplicitAutogradNonFunctional kernel allocates an output from the meta
  // shape and calls the out= kernel, which CPU's own functional kernel does not (and
  // smooth_l1_loss, whose meta shape is the reduced one, warned about resizing it).
  static torch::Library* lib =
      new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
  int n = 0;
  for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
    if (name.name.rfind("aten::", 0) != 0) continue;
    auto op = c10::Dispatcher::singleton().findOp(name);
    if (!op || !op->hasKernelForDispatchKey(c10::DispatchKey::CPU) ||
        !(op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
          op->hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional)) ||
        op->hasKernelForDispatchKey(c10::DispatchKey::PrivateUse1)) {
      continue;
    }
    std::string full = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
    lib->impl(full.c_str(), torch::CppFunction::makeFromBoxedFunction<&neuron_cpu_kernel>());
    ++n;
  }
  return n;
}

}  // namespace torch_neuronx
