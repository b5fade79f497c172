// The NKI kernel IR: what one traced kernel instance is, in C++.
//
// The Python front-end (nki/) runs a kernel's body once per signature and records every
// instruction here: tensors (HBM, SBUF, PSUM declarations) and instructions over strided
// access patterns into them. verify() checks the program against the NeuronCore's limits
// before anything runs; Program (execute.h) runs it on simulated memories. Nothing here
// knows about torch or Python.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace neuron::nki {

// Element types, in the order the Python front-end numbers them.
enum class DType : uint8_t {
  kFloat32, kBFloat16, kFloat16, kTFloat32, kFloat8E4M3, kFloat8E4M3FN, kFloat8E5M2,
  kInt8, kUInt8, kInt16, kUInt16, kInt32, kUInt32, kBool,
};
size_t dtype_size(DType d);
const char* dtype_name(DType d);
bool is_float(DType d);
bool is_fp8(DType d);

// Memories. nl.hbm is private HBM.
enum class Buffer : uint8_t { kPrivateHbm, kSharedHbm, kSbuf, kPsum };
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

// Operations. Operand order and attribute layout of each are documented in nki/isa/__init__.py, the
// one place that emits them; the verifier and the executor read them.
enum class Op : uint8_t {
  kDmaCopy,           // [dst, src]                         ints: oob_mode (0 error, 1 skip)
  kTensorCopy,        // [dst, src]                         ints: engine
  kMemset,            // [dst]                              floats: value
  kIota,              // [dst]                              ints: offset, channel_multiplier, (step, num)...
  kMatmul,            // [dst, stationary, moving]          ints: accumulate (-1 auto, 0, 1), is_transpose
  kTranspose,         // [dst, data]                        ints: engine
  kTensorTensor,      // [dst, a, b]                        ints: alu op, engine
  kTensorScalar,      // [dst, data, operand0?, operand1?]  ints: op0, reverse0, op1 (-1 none), reverse1
                      //                                    floats: imm0, imm1
  kActivation,        // [dst, data, bias?, scale?, reduce_res?] ints: act, reduce_cmd  floats: scale, bias
  kTensorReduce,      // [dst, data]                        ints: alu op, negate, axes...
  kTensorTensorScan,  // [dst, data0, data1, initial?]      ints: op0, op1, reverse0, reverse1  floats: initial
  kAffineSelect,      // [dst, on_true]                     ints: cmp op, offset, channel_multiplier, (step, num)...
                      //                                    floats: on_false
  kBnStats,           // [dst, data]
  kBnAggr,            // [dst, data]
  kMax8,              // [dst, src]
  kFindIndex8,        // [dst, data, vals]
  kReciprocal,        // [dst, data]
  kPartitionReduce,   // [dst, data]                        ints: alu op
  kScalarTensorTensor,// [dst, data, operand0?, operand1]   ints: op0, op1, reverse0, reverse1  floats: imm0
  kSelect,            // [dst, predicate, on_true, on_false?] floats: on_false
  // Vector-engine instructions that use the engine's per-partition accumulator registers.
  kCopyPredicated,    // [dst, src?, predicate]             ints: reverse_pred  floats: src immediate
  kSelectReduce,      // [dst, predicate, on_true, on_false?, reduce_res?] ints: reduce_cmd, reverse_pred
                      //                                    floats: on_false
  kRangeSelect,       // [dst, on_true, bound0, bound1, reduce_res?] ints: comp_op0, comp_op1, reduce_cmd,
                      //                                    range_start  floats: on_false_value
  kTensorScalarReduce,// [dst, data, operand0?, reduce_res?, reduce_init?] ints: op0, reduce_op, reduce_cmd,
                      //                                    reduce_res_negate  floats: imm0, reduce_init
  kTensorScalarCumulative, // [dst, src, imm0?, imm1?]      ints: op0, op1, reduce_cmd  floats: imm0, imm1
  kExponential,       // [dst, src, max_value?, reduce_res?, reduce_init?] ints: reduce_cmd
                      //                                    floats: max_value, reduce_init
  kActivate2,         // [dst, data, imm0?, imm1?, relu_param?, reduce_res?] ints: act, op0, op1, reverse0,
                      //                                    reverse1, reduce_op (-1 none), reduce_cmd
                      //                                    floats: imm0, imm1, relu_param
  kMatchReplace8,     // [dst, data, vals, dst_idx?]        floats: imm
  kStreamShuffle,     // [dst, src]                         ints: 32 mask entries (255: keep)
  kDmaTranspose,      // [dst, src]                         ints: dge_mode, axes...
  kNGather,           // [dst, data, indices]
  kLocalGather,       // [dst, src_buffer, index]           ints: num_elem_per_idx, num_valid_indices
  kNonzeroWithCount,  // [dst, src]                         ints: index_offset, padding_val
  kDmaCompute,        // [dst, src0, src1, ...]             ints: oob_mode  floats: one scale per src
  // Between the programs of one SPMD launch (the cores of a logical NeuronCore); run_launch
  // schedules them, never exec.
  kSendRecv,          // [dst, src]                         ints: send_to_rank, recv_from_rank, pipe_id
  kCoreBarrier,       // [data]                             ints: the cores
  // nl.device_print: hands the host the values of its operand when it runs (execute.h, PrintSink).
  kDevicePrint,       // [tensor]                           text: the label (prefix, and which program)
};
constexpr int kNumOps = static_cast<int>(Op::kDevicePrint) + 1;
inline bool synchronizes(Op op) { return op == Op::kSendRecv || op == Op::kCoreBarrier; }
const char* op_name(Op op);

// ALU operators (nki.isa's `op` arguments), numbered as nki/isa/__init__.py numbers them.
enum class Alu : int8_t {
  kAdd, kSubtract, kMultiply, kDivide, kMaximum, kMinimum, kPower, kAbsMax, kAbsMin,
  kEqual, kNotEqual, kGreater, kGreaterEqual, kLess, kLessEqual,
  kLogicalAnd, kLogicalOr, kLogicalXor,
  kBitwiseAnd, kBitwiseOr, kBitwiseXor, kLeftShift, kRightShift,
  // unary (tensor_scalar op0 with no operand)
  kAbs, kSquare, kRelu, kRsqrt, kReciprocal, kBypass,
  kAverage,  // tensor_partition_reduce only
};
bool alu_is_bitvec(Alu a);

// Activation functions (nisa.activation's `op`).
enum class Act : int8_t {
  kCopy, kExp, kLog, kTanh, kSigmoid, kRelu, kGelu, kGeluApprxTanh, kGeluApprxSigmoid, kSilu,
  kSqrt, kRsqrt, kReciprocal, kSquare, kAbs, kSign, kSin, kCos, kArctan, kSoftplus, kMish, kErf,
  kGeluDx, kSiluDx, kErfDx, kNegative,
};

enum class Engine : int8_t { kUnknown = 0, kTensor = 1, kScalar = 2, kGpSimd = 3, kDma = 4, kVector = 5, kSync = 6 };
// The engine that runs an instruction by default.
Engine engine_of(Op op);

struct Instr {
  Op op;
  std::vector<Access> args;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  Loc loc;
  std::string text = {};  // kDevicePrint's label; empty for every other op
};

// The simulated NeuronCore generation a kernel is traced for: the verifier's view of a chip of
// the platform model (runtime/platform.h), which owns every value; target_for fills it.
struct Target {
  std::string name;          // "trn1" / "inf2" / "trn2" / "trn3"
  int nc_version = 0;        // 2 (trn1, inf2) / 3 (trn2) / 4 (trn3)
  int64_t sbuf_partition_bytes = 0;
  int64_t psum_partition_bytes = 0;
  int64_t psum_bank_bytes = 0;
  int64_t partitions = 0;
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
