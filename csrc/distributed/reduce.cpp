#include "distributed/reduce.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

namespace torch_neuronx::dist {

using RO = c10d::ReduceOp;

const char* red_name(RO::RedOpType op) {
  switch (op) {
    case RO::SUM: return "SUM";
    case RO::AVG: return "AVG";
    case RO::PRODUCT: return "PRODUCT";
    case RO::MIN: return "MIN";
    case RO::MAX: return "MAX";
    case RO::BAND: return "BAND";
    case RO::BOR: return "BOR";
    case RO::BXOR: return "BXOR";
    case RO::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

namespace {
bool is_low_precision(at::ScalarType dt) {
  return dt == at::kHalf || dt == at::kBFloat16 || at::isFloat8Type(dt);
}
}  // namespace

Reduction make_reduction(const RO& rop, at::ScalarType dt, int n, const char* opname) {
  Reduction r;
  r.op = rop.op_;
  r.n = n;
  bool fp = at::isFloatingType(dt), cx = at::isComplexType(dt);
  switch (r.op) {
    case RO::BAND:
    case RO::BOR:
    case RO::BXOR:
      TORCH_CHECK_VALUE(!fp && !cx, opname, ": ", red_name(r.op), " needs an integer or bool tensor, got ", dt);
      break;
    case RO::MIN:
    case RO::MAX:
      TORCH_CHECK_VALUE(!cx, opname, ": ", red_name(r.op), " is not defined for complex tensors (", dt, ")");
      break;
    case RO::AVG:
      TORCH_CHECK_VALUE(dt != at::kBool, opname, ": AVG of bool tensors is undefined; use SUM (logical or)");
      break;
    case RO::PREMUL_SUM: {
      TORCH_CHECK_VALUE(fp || cx, opname, ": PREMUL_SUM needs a floating-point tensor, got ", dt);
      auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(rop.supplement_.get());
      TORCH_CHECK_VALUE(s, opname, ": PREMUL_SUM without a factor; make it with "
                        "torch.distributed._make_nccl_premul_sum(factor)");
      r.factor = s->tensor_factor.defined() ? s->tensor_factor.to(at::kCPU).item<double>() : s->double_factor;
      break;
    }
    case RO::SUM:
    case RO::PRODUCT:
      break;
    default:
      TORCH_CHECK_VALUE(false, opname, ": unsupported reduce op ", static_cast<int>(r.op));
  }
  return r;
}

// AVG's final step: floating and complex divide, integers truncate (as NCCL).
void divide_for_avg(const at::Tensor& t, int n) {
  if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type())) t.div_(n);
  else t.div_(n, "trunc");
}

namespace {
// dst = a (op) b, elementwise; dst may alias a.
void combine(const at::Tensor& dst, const at::Tensor& a, const at::Tensor& b, const Reduction& r, bool is_bool) {
  switch (r.op) {
    case RO::SUM:
    case RO::AVG:
      if (is_bool) at::logical_or_out(const_cast<at::Tensor&>(dst), a, b);
      else at::add_out(const_cast<at::Tensor&>(dst), a, b);
      break;
    case RO::PREMUL_SUM:
      at::add_out(const_cast<at::Tensor&>(dst), a, b, r.factor);
      break;
    case RO::PRODUCT:
      if (is_bool) at::logical_and_out(const_cast<at::Tensor&>(dst), a, b);
      else at::mul_out(const_cast<at::Tensor&>(dst), a, b);
      break;
    case RO::MIN:
      if (is_bool) at::logical_and_out(const_cast<at::Tensor&>(dst), a, b);
      else at::minimum_out(const_cast<at::Tensor&>(dst), a, b);
      break;
    case RO::MAX:
      if (is_bool) at::logical_or_out(const_cast<at::Tensor&>(dst), a, b);
      else at::maximum_out(const_cast<at::Tensor&>(dst), a, b);
      break;
    case RO::BAND: at::bitwise_and_out(const_cast<at::Tensor&>(dst), a, b); break;
    case RO::BOR: at::bitwise_or_out(const_cast<at::Tensor&>(dst), a, b); break;
    case RO::BXOR: at::bitwise_xor_out(const_cast<at::Tensor&>(dst), a, b); break;
    default: TORCH_CHECK(false, "unsupported reduce op");
  }
}
}  // namespace

// out = reduce(ins) in the order given (so every rank that reduces the same inputs gets
// the same bits). Half, bfloat16 and fp8 accumulate in float32 and round once.
void reduce_into(const at::Tensor& out, const std::vector<at::Tensor>& ins, const Reduction& r) {
  at::ScalarType dt = out.scalar_type();
  bool is_bool = dt == at::kBool;
  bool low = is_low_precision(dt);
  bool alias = false;
  for (size_t i = 1; i < ins.size(); ++i) alias |= ins[i].data_ptr() == out.data_ptr();
  at::Tensor acc = low ? at::empty(out.sizes(), out.options().dtype(at::kFloat)) : (alias ? at::empty_like(out) : out);
  acc.copy_(ins[0]);
  if (r.op == RO::PREMUL_SUM) acc.mul_(r.factor);
  // TensorIterator does not promote float8 with float: widen those inputs explicitly.
  bool fp8 = at::isFloat8Type(dt);
  for (size_t i = 1; i < ins.size(); ++i) combine(acc, acc, fp8 ? ins[i].to(at::kFloat) : ins[i], r, is_bool);
  if (r.op == RO::AVG) divide_for_avg(acc, r.n);
  if (!acc.is_same(out)) out.copy_(acc);
}

}  // namespace torch_neuronx::dist
