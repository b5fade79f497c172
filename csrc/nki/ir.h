// The NKI kernel IR: what one traced kernel instance is, in C++.
//
// The Python front-end (nki/) runs a kernel's body once per signature and records every
// instruction here: tensors (HBM, SBUF, PSUM declarations) and instructions over strided
// access patterns into them. verify() checks the program against the NeuronCore's limits
// before anything runs; Program (execute.h) runs it on simulated memories. Nothing here
// knows about torch or Python.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace neuron::nki {

// Element types. Names (dtype_name: nki.language's) and codes reach Python through the binding.
enum class DType : uint8_t {
  kFloat32, kBFloat16, kFloat16, kTFloat32, kFloat8E4M3, kFloat8E4M3FN, kFloat8E5M2,
  kInt8, kUInt8, kInt16, kUInt16, kInt32, kUInt32, kBool,
};
constexpr int kNumDTypes = static_cast<int>(DType::kBool) + 1;
size_t dtype_size(DType d);
const char* dtype_name(DType d);
std::optional<DType> dtype_from_name(std::string_view name);
bool is_float(DType d);
bool is_fp8(DType d);

// Elements per partition one bn_stats reads (nl.tile_size.bn_stats_fmax), on every generation.
constexpr int64_t kBnStatsFmax = 512;

// Memories (nki.language's memory regions; buffer_name: "hbm" is nl.hbm, private HBM).
enum class Buffer : uint8_t { kPrivateHbm, kSharedHbm, kSbuf, kPsum };
constexpr int kNumBuffers = static_cast<int>(Buffer::kPsum) + 1;
const char* buffer_name(Buffer b);
inline bool on_chip(Buffer b) { return b == Buffer::kSbuf || b == Buffer::kPsum; }

// Where in the kernel's source an instruction or tensor comes from.
struct Loc {
  std::string file;
  int line = 0;
};

struct TensorDecl {
  Buffer buffer;
  DType dtype;
  std::vector<int64_t> shape;
  std::string name;
  Loc loc;
  int external = -1;  // slot in the pointer list given to Program::run; -1 = simulator memory
  // Another tensor whose bytes this one reinterprets (view(dtype), ap(dtype=)); -1 = its own.
  // An alias has no memory of its own: it keeps its base alive and shares its bytes. Aliases
  // never chain: the base is always a tensor with memory of its own.
  int alias = -1;

  int64_t elements() const;
  // Elements per partition of an on-chip tensor (the product of its free dims).
  int64_t partition_elements() const;
};

// A strided view of a tensor's storage (in elements): element (i0, .., in) of the view is
// storage[offset + sum(dims[k].stride * ik)]. For on-chip tensors dims[0] walks partitions.
struct Dim {
  int64_t stride;
  int64_t size;
};

// A run-time offset (ap()'s scalar_offset / vector_offset, select / vector_select with an SBUF
// index): integers read from an SBUF tensor when the instruction runs, each times `stride`
// elements, are added to the access's offset. A scalar index is one value; a vector index holds
// one value per element of the access's dims[0], whose static stride it replaces.
struct DynamicIndex {
  int32_t tensor = -1;  // -1: the offset is static
  int64_t offset = 0;   // of the (first) value in that tensor
  int64_t step = 0;     // between consecutive values of a vector index
  int64_t stride = 0;   // elements of the accessed tensor per index unit
  bool vector = false;

  bool present() const { return tensor >= 0; }
};

struct Access {
  int32_t tensor = -1;  // -1: operand absent
  int64_t offset = 0;
  std::vector<Dim> dims;
  DynamicIndex index;

  bool present() const { return tensor >= 0; }
  int64_t elements() const;
  int64_t partitions() const { return dims.empty() ? 1 : dims[0].size; }
  int64_t free_elements() const;  // elements per partition
  // The lowest and highest storage element the access touches (its static offset).
  std::pair<int64_t, int64_t> span() const;
};

// Operations. What each one takes (operands, attributes) is in its row of the op table below.
enum class Op : uint8_t {
  kDmaCopy,
  kTensorCopy,
  kMemset,
  kIota,
  kMatmul,
  kTranspose,
  kTensorTensor,
  kTensorScalar,
  kActivation,
  kTensorReduce,
  kTensorTensorScan,
  kAffineSelect,
  kBnStats,
  kBnAggr,
  kMax8,
  kFindIndex8,
  kReciprocal,
  kPartitionReduce,
  kScalarTensorTensor,
  kSelect,
  // Vector-engine instructions that use the engine's per-partition accumulator registers.
  kCopyPredicated,
  kSelectReduce,
  kRangeSelect,
  kTensorScalarReduce,
  kTensorScalarCumulative,
  kExponential,
  kActivate2,
  kMatchReplace8,
  kStreamShuffle,
  kDmaTranspose,
  kNGather,
  kLocalGather,
  kNonzeroWithCount,
  kDmaCompute,
  // Between the programs of one SPMD launch (the cores of a logical NeuronCore): run_launch runs them.
  kSendRecv,
  kCoreBarrier,
  // nl.device_print: hands the host the values of its operand when it runs (execute.h, PrintSink);
  // its label is Instr::text.
  kDevicePrint,
};
constexpr int kNumOps = static_cast<int>(Op::kDevicePrint) + 1;
inline bool synchronizes(Op op) { return op == Op::kSendRecv || op == Op::kCoreBarrier; }

// ALU operators (nki.isa's `op` arguments; names: nki.language's).
enum class Alu : int8_t {
  kAdd, kSubtract, kMultiply, kDivide, kMaximum, kMinimum, kPower, kAbsMax, kAbsMin,
  kEqual, kNotEqual, kGreater, kGreaterEqual, kLess, kLessEqual,
  kLogicalAnd, kLogicalOr, kLogicalXor,
  kBitwiseAnd, kBitwiseOr, kBitwiseXor, kLeftShift, kRightShift,
  // unary (tensor_scalar op0 with no operand)
  kAbs, kSquare, kRelu, kRsqrt, kReciprocal, kBypass,
  kAverage,  // tensor_partition_reduce only
};
constexpr int kNumAlu = static_cast<int>(Alu::kAverage) + 1;
bool alu_is_bitvec(Alu a);
const char* alu_name(Alu a);
std::optional<Alu> alu_from_name(std::string_view name);

// Activation functions (nisa.activation's `op`; names: nki.language's).
enum class Act : int8_t {
  kCopy, kExp, kLog, kTanh, kSigmoid, kRelu, kGelu, kGeluApprxTanh, kGeluApprxSigmoid, kSilu,
  kSqrt, kRsqrt, kReciprocal, kSquare, kAbs, kSign, kSin, kCos, kArctan, kSoftplus, kMish, kErf,
  kGeluDx, kSiluDx, kErfDx, kNegative,
};
constexpr int kNumAct = static_cast<int>(Act::kNegative) + 1;
const char* act_name(Act a);
std::optional<Act> act_from_name(std::string_view name);

// The engines of a NeuronCore (nki.isa.engine's values). kSync: no compute engine (barriers,
// device_print).
enum class Engine : int8_t { kUnknown = 0, kTensor = 1, kScalar = 2, kGpSimd = 3, kDma = 4, kVector = 5, kSync = 6 };
constexpr int kNumEngines = static_cast<int>(Engine::kSync) + 1;
const char* engine_name(Engine e);  // "tensor", "vector", ... as nki.isa.engine names them
std::optional<Engine> engine_from_name(std::string_view name);

// What an instruction with accumulator registers (the Vector / Scalar engines' per-partition
// reduce registers) does with them (nki.isa.reduce_cmd): idle leaves them alone, reset sets them
// to the reduce operator's identity, load_reduce to given initial values; reduce and
// reset_reduce / load_reduce accumulate the instruction's results.
enum class ReduceCmd : int8_t { kIdle, kReset, kReduce, kResetReduce, kLoadReduce };
constexpr int kNumReduceCmds = static_cast<int>(ReduceCmd::kLoadReduce) + 1;
const char* reduce_cmd_name(ReduceCmd c);
std::optional<ReduceCmd> reduce_cmd_from_name(std::string_view name);
inline bool resets(ReduceCmd c) { return c == ReduceCmd::kReset || c == ReduceCmd::kResetReduce; }
inline bool accumulates(ReduceCmd c) { return static_cast<int>(c) >= static_cast<int>(ReduceCmd::kReduce); }

// How a DMA's descriptors are generated (nki.isa.dge_mode): swdge is the indirect (vector
// offset) form, hwdge the hardware DGE with its own transpose limits.
enum class DgeMode : int8_t { kUnknown, kSwdge, kHwdge, kNone };
constexpr int kNumDgeModes = static_cast<int>(DgeMode::kNone) + 1;
const char* dge_mode_name(DgeMode m);
std::optional<DgeMode> dge_mode_from_name(std::string_view name);

// What an indirect DMA does with a row whose run-time offset falls outside its tensor
// (nki.isa.oob_mode): raise, or skip the row.
enum class OobMode : int8_t { kError, kSkip };
constexpr int kNumOobModes = static_cast<int>(OobMode::kSkip) + 1;
const char* oob_mode_name(OobMode m);
std::optional<OobMode> oob_mode_from_name(std::string_view name);

// ---- The op table --------------------------------------------------------------------------
// One row per Op: its nki.isa name, the engine that runs it, and what an Instr of it holds: its
// operands (args) and its int and float attributes, in storage order. The Python front end lays
// out what it records by these names, the verifier and the executor read attributes by name
// (int_attr / float_attr), and the binding exports the table.

// kOptional: an operand that may be absent (Access{}); an attribute that may be left off the end
// (a hand-built Instr may stop before it). kVariadic: the rest of the list, `group` values per
// repetition ((step, num) pairs: 2).
enum class Arity : uint8_t { kOne, kOptional, kVariadic };
// Which enum an int attribute holds a code of (kInt: a plain integer); the verifier checks the
// code names a value (kAluOrNone: or -1, no operator).
enum class Code : uint8_t { kInt, kAlu, kAluOrNone, kAct, kEngine, kReduceCmd, kDgeMode, kOobMode };
struct Param {
  const char* name;
  Arity arity = Arity::kOne;
  int group = 1;
  Code code = Code::kInt;
};
struct OpInfo {
  Op op;
  const char* name;
  Engine engine;
  std::vector<Param> operands, ints, floats;
};
const OpInfo& op_info(Op op);
inline const char* op_name(Op op) { return op_info(op).name; }
inline Engine engine_of(Op op) { return op_info(op).engine; }
std::optional<Op> op_from_name(std::string_view name);

struct Instr {
  Op op;
  std::vector<Access> args;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  Loc loc;
  std::string text = {};  // kDevicePrint's label; empty for every other op
};

// Where an attribute (or operand) of `op` is stored, by its name in the op table; a name the op
// does not have is a std::logic_error (a bug in the caller, not in the kernel).
int int_index(Op op, std::string_view name);
int float_index(Op op, std::string_view name);
int operand_index(Op op, std::string_view name);
// An instruction's attribute by name. Past the end of the instruction's list: `fallback` when
// given (optional attributes), else std::invalid_argument naming the op and the attribute.
int64_t int_attr(const Instr& in, std::string_view name);
int64_t int_attr(const Instr& in, std::string_view name, int64_t fallback);
double float_attr(const Instr& in, std::string_view name);
// A variadic tail's values (axes..., (step, num)..., cores...).
std::vector<int64_t> int_tail(const Instr& in, std::string_view name);
std::vector<double> float_tail(const Instr& in, std::string_view name);
// Whether the instruction's operand, attribute counts fit its row; the problem, else "".
std::string layout_problem(const Instr& in);
// Whether every enum code the instruction's int attributes hold (Param::code) names a value of
// its enum; the problem, else "". Checked after layout_problem.
std::string code_problem(const Instr& in);

// The simulated NeuronCore generation a kernel is traced for: the verifier's view of a chip of
// the platform model (runtime/platform.h), which owns every value; target_for fills it.
struct Target {
  std::string name;          // "trn1" / "inf2" / "trn2" / "trn3"
  int nc_version = 0;        // 2 (trn1, inf2) / 3 (trn2) / 4 (trn3)
  int64_t sbuf_partition_bytes = 0;
  int64_t psum_partition_bytes = 0;
  int64_t psum_bank_bytes = 0;
  int64_t partitions = 0;
  int64_t pe_rows = 0, pe_cols = 0;   // TensorE array: contraction and stationary free limits
  int64_t gemm_moving_fmax = 0;       // fp32 result
  int64_t gemm_moving_fmax_bf16 = 0;  // bf16 result
};
// A platform name ("trn2", "gen3", ...: runtime::find_chip); throws std::invalid_argument.
Target target_for(const std::string& name);

struct Kernel {
  Target target;
  std::vector<TensorDecl> tensors;
  std::vector<Instr> instrs;
};

// A kernel that breaks a hardware rule. `rule` is a short stable name (docs/nki.md lists
// them); the message says what is wrong and how to fix it.
class VerifyError : public std::runtime_error {
 public:
  VerifyError(std::string rule, const std::string& message, Loc loc)
      : std::runtime_error(message), rule(std::move(rule)), loc(std::move(loc)) {}
  std::string rule;
  Loc loc;
};

// Per tensor, the first and last instruction that uses it (-1: unused): the live range the
// verifier's capacity rules and the executor's memory plan both follow.
struct LiveRanges {
  std::vector<int> first, last;
};
LiveRanges live_ranges(const Kernel& k);

// Throws VerifyError for the first instruction (in program order) that breaks a rule.
void verify(const Kernel& k);

}  // namespace neuron::nki
