#include "nki/ir.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <stdexcept>
#include <string>

#include "nki/numerics.h"
#include "runtime/platform.h"

namespace neuron::nki {

size_t dtype_size(DType d) {
  switch (d) {
    case DType::kFloat32: case DType::kTFloat32: case DType::kInt32: case DType::kUInt32: return 4;
    case DType::kBFloat16: case DType::kFloat16: case DType::kInt16: case DType::kUInt16: return 2;
    default: return 1;
  }
}

namespace {

// Name tables, one name per enum value in enum order (ir.h).
constexpr const char* kDTypeNames[] = {"float32", "bfloat16", "float16", "tfloat32", "float8_e4m3", "float8_e4m3fn",
                                       "float8_e5m2", "int8", "uint8", "int16", "uint16", "int32", "uint32", "bool_"};
static_assert(std::size(kDTypeNames) == kNumDTypes, "one name per DType");

constexpr const char* kAluNames[] = {
    "add", "subtract", "multiply", "divide", "maximum", "minimum", "power", "abs_max", "abs_min", "equal",
    "not_equal", "greater", "greater_equal", "less", "less_equal", "logical_and", "logical_or", "logical_xor",
    "bitwise_and", "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "abs", "square", "relu", "rsqrt",
    "reciprocal", "bypass", "average"};
static_assert(std::size(kAluNames) == kNumAlu, "one name per Alu");

constexpr const char* kActNames[] = {
    "copy", "exp", "log", "tanh", "sigmoid", "relu", "gelu", "gelu_apprx_tanh", "gelu_apprx_sigmoid", "silu",
    "sqrt", "rsqrt", "reciprocal", "square", "abs", "sign", "sin", "cos", "arctan", "softplus", "mish", "erf",
    "gelu_dx", "silu_dx", "erf_dx", "negative"};
static_assert(std::size(kActNames) == kNumAct, "one name per Act");

constexpr const char* kEngineNames[] = {"unknown", "tensor", "scalar", "gpsimd", "dma", "vector", "sync"};
static_assert(std::size(kEngineNames) == kNumEngines, "one name per Engine");

constexpr const char* kReduceCmdNames[] = {"idle", "reset", "reduce", "reset_reduce", "load_reduce"};
static_assert(std::size(kReduceCmdNames) == kNumReduceCmds, "one name per ReduceCmd");

constexpr const char* kDgeModeNames[] = {"unknown", "swdge", "hwdge", "none"};
static_assert(std::size(kDgeModeNames) == kNumDgeModes, "one name per DgeMode");

constexpr const char* kOobModeNames[] = {"error", "skip"};
static_assert(std::size(kOobModeNames) == kNumOobModes, "one name per OobMode");

template <class E, size_t N>
std::optional<E> find_name(const char* const (&names)[N], std::string_view name) {
  for (size_t i = 0; i < N; ++i)
    if (name == names[i]) return static_cast<E>(i);
  return std::nullopt;
}

constexpr Arity kOpt = Arity::kOptional;
constexpr Arity kVar = Arity::kVariadic;
using C = Code;
// An int attribute that holds a code of enum `c`.
constexpr Param coded(const char* name, Code c, Arity arity = Arity::kOne) { return {name, arity, 1, c}; }

// The op table, one row per Op in enum order (checked in op_info).
const std::vector<OpInfo>& op_table() {
  using E = Engine;
  static const std::vector<OpInfo> table = {
      {Op::kDmaCopy, "dma_copy", E::kDma, {{"dst"}, {"src"}}, {coded("oob_mode", C::kOobMode, kOpt)}, {}},
      {Op::kTensorCopy, "tensor_copy", E::kVector, {{"dst"}, {"src"}}, {coded("engine", C::kEngine, kOpt)}, {}},
      {Op::kMemset, "memset", E::kVector, {{"dst"}}, {}, {{"value"}}},
      {Op::kIota, "iota", E::kGpSimd, {{"dst"}}, {{"offset"}, {"channel_multiplier"}, {"pattern", kVar, 2}}, {}},
      {Op::kMatmul, "nc_matmul", E::kTensor, {{"dst"}, {"stationary"}, {"moving"}},
       {{"accumulate", kOpt}, {"is_transpose", kOpt}}, {}},
      {Op::kTranspose, "nc_transpose", E::kTensor, {{"dst"}, {"data"}}, {coded("engine", C::kEngine, kOpt)}, {}},
      {Op::kTensorTensor, "tensor_tensor", E::kVector, {{"dst"}, {"data1"}, {"data2"}},
       {coded("op", C::kAlu), coded("engine", C::kEngine, kOpt)}, {}},
      {Op::kTensorScalar, "tensor_scalar", E::kVector, {{"dst"}, {"data"}, {"operand0", kOpt}, {"operand1", kOpt}},
       {coded("op0", C::kAlu), {"reverse0"}, coded("op1", C::kAluOrNone), {"reverse1"}}, {{"operand0"}, {"operand1"}}},
      {Op::kActivation, "activation", E::kScalar,
       {{"dst"}, {"data"}, {"bias", kOpt}, {"scale", kOpt}, {"reduce_res", kOpt}},
       {coded("op", C::kAct), coded("reduce_cmd", C::kReduceCmd)},
       {{"scale"}, {"bias"}}},
      {Op::kTensorReduce, "tensor_reduce", E::kVector, {{"dst"}, {"data"}},
       {coded("op", C::kAlu), {"negate"}, {"axis", kVar}}, {}},
      {Op::kTensorTensorScan, "tensor_tensor_scan", E::kVector, {{"dst"}, {"data0"}, {"data1"}, {"initial", kOpt}},
       {coded("op0", C::kAlu), coded("op1", C::kAlu), {"reverse0"}, {"reverse1"}}, {{"initial"}}},
      {Op::kAffineSelect, "affine_select", E::kGpSimd, {{"dst"}, {"on_true_tile"}},
       {coded("cmp_op", C::kAlu), {"offset"}, {"channel_multiplier"}, {"pattern", kVar, 2}}, {{"on_false_value"}}},
      {Op::kBnStats, "bn_stats", E::kVector, {{"dst"}, {"data"}}, {}, {}},
      {Op::kBnAggr, "bn_aggr", E::kVector, {{"dst"}, {"data"}}, {}, {}},
      {Op::kMax8, "max8", E::kVector, {{"dst"}, {"src"}}, {}, {}},
      {Op::kFindIndex8, "nc_find_index8", E::kVector, {{"dst"}, {"data"}, {"vals"}}, {}, {}},
      {Op::kReciprocal, "reciprocal", E::kVector, {{"dst"}, {"data"}}, {}, {}},
      {Op::kPartitionReduce, "tensor_partition_reduce", E::kGpSimd, {{"dst"}, {"data"}}, {coded("op", C::kAlu)}, {}},
      {Op::kScalarTensorTensor, "scalar_tensor_tensor", E::kVector,
       {{"dst"}, {"data"}, {"operand0", kOpt}, {"operand1"}},
       {coded("op0", C::kAlu), coded("op1", C::kAlu), {"reverse0"}, {"reverse1"}},
       {{"operand0"}}},
      {Op::kSelect, "select", E::kVector, {{"dst"}, {"predicate"}, {"on_true"}, {"on_false", kOpt}}, {},
       {{"on_false"}}},
      {Op::kCopyPredicated, "tensor_copy_predicated", E::kVector, {{"dst"}, {"src", kOpt}, {"predicate"}},
       {{"reverse_pred"}}, {{"src"}}},
      {Op::kSelectReduce, "select_reduce", E::kVector,
       {{"dst"}, {"predicate"}, {"on_true"}, {"on_false", kOpt}, {"reduce_res", kOpt}},
       {coded("reduce_cmd", C::kReduceCmd), {"reverse_pred"}}, {{"on_false"}}},
      {Op::kRangeSelect, "range_select", E::kVector,
       {{"dst"}, {"on_true_tile"}, {"bound0"}, {"bound1"}, {"reduce_res", kOpt}},
       {coded("comp_op0", C::kAlu), coded("comp_op1", C::kAlu), coded("reduce_cmd", C::kReduceCmd), {"range_start"}},
       {{"on_false_value"}}},
      {Op::kTensorScalarReduce, "tensor_scalar_reduce", E::kVector,
       {{"dst"}, {"data"}, {"operand0", kOpt}, {"reduce_res", kOpt}, {"reduce_init", kOpt}},
       {coded("op0", C::kAlu), coded("reduce_op", C::kAlu), coded("reduce_cmd", C::kReduceCmd), {"reduce_res_negate"}},
       {{"operand0"}, {"reduce_init"}}},
      {Op::kTensorScalarCumulative, "tensor_scalar_cumulative", E::kVector,
       {{"dst"}, {"src"}, {"imm0", kOpt}, {"imm1", kOpt}},
       {coded("op0", C::kAlu), coded("op1", C::kAlu), coded("reduce_cmd", C::kReduceCmd)},
       {{"imm0"}, {"imm1"}}},
      {Op::kExponential, "exponential", E::kVector,
       {{"dst"}, {"src"}, {"max_value", kOpt}, {"reduce_res", kOpt}, {"reduce_init", kOpt}},
       {coded("reduce_cmd", C::kReduceCmd)},
       {{"max_value"}, {"reduce_init"}}},
      {Op::kActivate2, "activate2", E::kScalar,
       {{"dst"}, {"data"}, {"imm0", kOpt}, {"imm1", kOpt}, {"relu_param", kOpt}, {"reduce_res", kOpt}},
       {coded("op", C::kAct), coded("op0", C::kAlu), coded("op1", C::kAlu), {"reverse0"}, {"reverse1"},
        coded("reduce_op", C::kAluOrNone), coded("reduce_cmd", C::kReduceCmd)},
       {{"imm0"}, {"imm1"}, {"relu_param"}}},
      {Op::kMatchReplace8, "nc_match_replace8", E::kVector, {{"dst"}, {"data"}, {"vals"}, {"dst_idx", kOpt}}, {},
       {{"imm"}}},
      {Op::kStreamShuffle, "nc_stream_shuffle", E::kVector, {{"dst"}, {"src"}}, {{"shuffle_mask", kVar}}, {}},
      {Op::kDmaTranspose, "dma_transpose", E::kDma, {{"dst"}, {"src"}},
       {coded("dge_mode", C::kDgeMode), {"axes", kVar}}, {}},
      {Op::kNGather, "nc_n_gather", E::kGpSimd, {{"dst"}, {"data"}, {"indices"}}, {}, {}},
      {Op::kLocalGather, "local_gather", E::kGpSimd, {{"dst"}, {"src_buffer"}, {"index"}},
       {{"num_elem_per_idx"}, {"num_valid_indices"}}, {}},
      {Op::kNonzeroWithCount, "nonzero_with_count", E::kGpSimd, {{"dst"}, {"src"}},
       {{"index_offset"}, {"padding_val"}}, {}},
      {Op::kDmaCompute, "dma_compute", E::kDma, {{"dst"}, {"srcs", kVar}}, {coded("oob_mode", C::kOobMode, kOpt)},
       {{"scales", kVar}}},
      {Op::kSendRecv, "sendrecv", E::kDma, {{"dst"}, {"src"}}, {{"send_to_rank"}, {"recv_from_rank"}, {"pipe_id"}},
       {}},
      {Op::kCoreBarrier, "core_barrier", E::kSync, {{"data"}}, {{"cores", kVar}}, {}},
      {Op::kDevicePrint, "device_print", E::kSync, {{"tensor"}}, {}, {}},
  };
  return table;
}

int index_of(const OpInfo& info, const std::vector<Param>& params, std::string_view name, const char* what) {
  for (size_t i = 0; i < params.size(); ++i)
    if (name == params[i].name) return static_cast<int>(i);
  throw std::logic_error(std::string("nki: ") + info.name + " has no " + what + " '" + std::string(name) + "'");
}

// Whether `n` values fit a parameter list: every kOne before the first absent one, optional
// ones only at the end, a variadic tail in whole groups.
std::string count_problem(const std::vector<Param>& params, size_t n, const char* what) {
  size_t required = 0, fixed = 0;
  const Param* tail = nullptr;
  for (const Param& p : params) {
    if (p.arity == Arity::kVariadic) {
      tail = &p;
      break;
    }
    ++fixed;
    if (p.arity == Arity::kOne) required = fixed;
  }
  auto names = [&] {
    std::string s;
    for (const Param& p : params) {
      s += (s.empty() ? "" : ", ") + std::string(p.name) + (p.arity == Arity::kOptional ? "?" : "") +
           (p.arity == Arity::kVariadic ? "..." : "");
    }
    return s.empty() ? std::string("none") : s;
  };
  if (n < required || (!tail && n > fixed) || (tail && n > fixed && (n - fixed) % tail->group != 0)) {
    return std::to_string(n) + " " + what + "; expected " + names();
  }
  return "";
}

}  // namespace

const char* dtype_name(DType d) { return kDTypeNames[static_cast<int>(d)]; }
std::optional<DType> dtype_from_name(std::string_view name) { return find_name<DType>(kDTypeNames, name); }
const char* alu_name(Alu a) { return kAluNames[static_cast<int>(a)]; }
std::optional<Alu> alu_from_name(std::string_view name) { return find_name<Alu>(kAluNames, name); }
const char* act_name(Act a) { return kActNames[static_cast<int>(a)]; }
std::optional<Act> act_from_name(std::string_view name) { return find_name<Act>(kActNames, name); }
const char* engine_name(Engine e) { return kEngineNames[static_cast<int>(e)]; }
std::optional<Engine> engine_from_name(std::string_view name) { return find_name<Engine>(kEngineNames, name); }
const char* reduce_cmd_name(ReduceCmd c) { return kReduceCmdNames[static_cast<int>(c)]; }
std::optional<ReduceCmd> reduce_cmd_from_name(std::string_view name) {
  return find_name<ReduceCmd>(kReduceCmdNames, name);
}
const char* dge_mode_name(DgeMode m) { return kDgeModeNames[static_cast<int>(m)]; }
std::optional<DgeMode> dge_mode_from_name(std::string_view name) { return find_name<DgeMode>(kDgeModeNames, name); }
const char* oob_mode_name(OobMode m) { return kOobModeNames[static_cast<int>(m)]; }
std::optional<OobMode> oob_mode_from_name(std::string_view name) { return find_name<OobMode>(kOobModeNames, name); }

const OpInfo& op_info(Op op) {
  static const bool complete = [] {  // one row per Op, in enum order
    const auto& t = op_table();
    if (t.size() != static_cast<size_t>(kNumOps)) throw std::logic_error("nki: the op table needs one row per Op");
    for (int i = 0; i < kNumOps; ++i)
      if (static_cast<int>(t[i].op) != i) throw std::logic_error(std::string("nki: op table row ") + t[i].name);
    return true;
  }();
  (void)complete;
  return op_table()[static_cast<int>(op)];
}

std::optional<Op> op_from_name(std::string_view name) {
  for (const OpInfo& o : op_table())
    if (name == o.name) return o.op;
  return std::nullopt;
}

int int_index(Op op, std::string_view name) { return index_of(op_info(op), op_info(op).ints, name, "int attribute"); }
int float_index(Op op, std::string_view name) {
  return index_of(op_info(op), op_info(op).floats, name, "float attribute");
}
int operand_index(Op op, std::string_view name) {
  return index_of(op_info(op), op_info(op).operands, name, "operand");
}

int64_t int_attr(const Instr& in, std::string_view name) {
  const size_t i = int_index(in.op, name);
  if (i >= in.ints.size()) {
    throw std::invalid_argument(std::string("nki: ") + op_name(in.op) + " has no value for '" + std::string(name) +
                                "'");
  }
  return in.ints[i];
}

int64_t int_attr(const Instr& in, std::string_view name, int64_t fallback) {
  const size_t i = int_index(in.op, name);
  return i < in.ints.size() ? in.ints[i] : fallback;
}

double float_attr(const Instr& in, std::string_view name) {
  const size_t i = float_index(in.op, name);
  if (i >= in.floats.size()) {
    throw std::invalid_argument(std::string("nki: ") + op_name(in.op) + " has no value for '" + std::string(name) +
                                "'");
  }
  return in.floats[i];
}

std::vector<int64_t> int_tail(const Instr& in, std::string_view name) {
  const size_t i = std::min<size_t>(int_index(in.op, name), in.ints.size());
  return {in.ints.begin() + i, in.ints.end()};
}

std::vector<double> float_tail(const Instr& in, std::string_view name) {
  const size_t i = std::min<size_t>(float_index(in.op, name), in.floats.size());
  return {in.floats.begin() + i, in.floats.end()};
}

std::string layout_problem(const Instr& in) {
  const OpInfo& info = op_info(in.op);
  std::string p = count_problem(info.operands, in.args.size(), "operands");
  for (size_t i = 0; p.empty() && i < in.args.size() && i < info.operands.size(); ++i) {
    if (info.operands[i].arity == Arity::kOne && !in.args[i].present()) {
      p = std::string("operand '") + info.operands[i].name + "' is absent";
    }
  }
  if (p.empty()) p = count_problem(info.ints, in.ints.size(), "int attributes");
  if (p.empty()) p = count_problem(info.floats, in.floats.size(), "float attributes");
  return p;
}

std::string code_problem(const Instr& in) {
  const std::vector<Param>& params = op_info(in.op).ints;
  for (size_t i = 0; i < in.ints.size() && i < params.size(); ++i) {
    const Param& p = params[i];
    const int64_t v = in.ints[i];
    int count = 0;
    const char* what = "";
    switch (p.code) {
      case Code::kInt: continue;
      case Code::kAlu:
      case Code::kAluOrNone: count = kNumAlu; what = "an ALU operator (nki.language's add, ...)"; break;
      case Code::kAct: count = kNumAct; what = "an activation function (nki.language's exp, ...)"; break;
      case Code::kEngine: count = kNumEngines; what = "an engine (nki.isa.engine)"; break;
      case Code::kReduceCmd: count = kNumReduceCmds; what = "a reduce command (nki.isa.reduce_cmd)"; break;
      case Code::kDgeMode: count = kNumDgeModes; what = "a DGE mode (nki.isa.dge_mode)"; break;
      case Code::kOobMode: count = kNumOobModes; what = "an out-of-bounds mode (nki.isa.oob_mode)"; break;
    }
    if ((v >= 0 && v < count) || (p.code == Code::kAluOrNone && v == -1)) continue;
    return std::string("attribute '") + p.name + "' is " + std::to_string(v) + ", which is not " + what +
           ": codes are 0.." + std::to_string(count - 1) + (p.code == Code::kAluOrNone ? " (-1: none)" : "");
  }
  return "";
}

bool is_float(DType d) { return static_cast<int>(d) <= static_cast<int>(DType::kFloat8E5M2); }
bool is_fp8(DType d) { return d == DType::kFloat8E4M3 || d == DType::kFloat8E4M3FN || d == DType::kFloat8E5M2; }

const char* buffer_name(Buffer b) {
  switch (b) {
    case Buffer::kPrivateHbm: return "hbm";
    case Buffer::kSharedHbm: return "shared_hbm";
    case Buffer::kSbuf: return "sbuf";
    case Buffer::kPsum: return "psum";
  }
  return "?";
}

bool alu_is_bitvec(Alu a) {
  return a == Alu::kBitwiseAnd || a == Alu::kBitwiseOr || a == Alu::kBitwiseXor || a == Alu::kLeftShift ||
         a == Alu::kRightShift;
}

int64_t TensorDecl::elements() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t TensorDecl::partition_elements() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

int64_t Access::elements() const {
  int64_t n = 1;
  for (const Dim& d : dims) n *= d.size;
  return n;
}

int64_t Access::free_elements() const {
  int64_t n = 1;
  for (size_t i = 1; i < dims.size(); ++i) n *= dims[i].size;
  return n;
}

std::pair<int64_t, int64_t> Access::span() const {
  int64_t lo = offset, hi = offset;
  for (const Dim& d : dims) (d.stride < 0 ? lo : hi) += (d.size - 1) * d.stride;
  return {lo, hi};
}

LiveRanges live_ranges(const Kernel& k) {
  LiveRanges r{std::vector<int>(k.tensors.size(), -1), std::vector<int>(k.tensors.size(), -1)};
  for (size_t i = 0; i < k.instrs.size(); ++i) {
    for (const Access& a : k.instrs[i].args) {
      if (!a.present()) continue;
      // A run-time index is read by the instruction too; an alias uses its base's memory.
      for (int t : {a.tensor, a.index.tensor, k.tensors[a.tensor].alias}) {
        if (t < 0) continue;
        if (r.first[t] < 0) r.first[t] = static_cast<int>(i);
        r.last[t] = static_cast<int>(i);
      }
    }
  }
  return r;
}

Target target_for(const std::string& name) {
  const rt::ChipFacts* c = rt::find_chip(name);
  if (c == nullptr) throw std::invalid_argument("unknown NKI target '" + name + "': expected trn1, inf2, trn2 or trn3");
  return Target{c->name,
                c->nc_version,
                static_cast<int64_t>(c->sbuf_partition_bytes),
                static_cast<int64_t>(c->psum_partition_bytes),
                static_cast<int64_t>(c->psum_bank_bytes),
                c->partitions,
                c->pe_rows,
                c->pe_cols,
                c->gemm_moving_fmax,
                c->gemm_moving_fmax_bf16};
}

}  // namespace neuron::nki
