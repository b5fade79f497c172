#include "nki/ir.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

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

const char* dtype_name(DType d) {
  static const char* names[] = {"float32", "bfloat16", "float16", "tfloat32", "float8_e4m3", "float8_e4m3fn",
                                "float8_e5m2", "int8", "uint8", "int16", "uint16", "int32", "uint32", "bool_"};
  return names[static_cast<int>(d)];
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

const char* op_name(Op op) {
  static const char* names[] = {
      "dma_copy", "tensor_copy", "memset", "iota", "nc_matmul", "nc_transpose", "tensor_tensor", "tensor_scalar",
      "activation", "tensor_reduce", "tensor_tensor_scan", "affine_select", "bn_stats", "bn_aggr", "max8",
      "nc_find_index8", "reciprocal", "tensor_partition_reduce", "scalar_tensor_tensor", "select",
      "tensor_copy_predicated", "select_reduce", "range_select", "tensor_scalar_reduce", "tensor_scalar_cumulative",
      "exponential", "activate2", "nc_match_replace8", "nc_stream_shuffle", "dma_transpose", "nc_n_gather",
      "local_gather", "nonzero_with_count", "dma_compute", "sendrecv", "core_barrier",
      "device_print"};
  static_assert(sizeof(names) / sizeof(names[0]) == kNumOps, "one name per Op");
  return names[static_cast<int>(op)];
}

Engine engine_of(Op op) {
  switch (op) {
    case Op::kMatmul: case Op::kTranspose: return Engine::kTensor;
    case Op::kActivation: case Op::kActivate2: return Engine::kScalar;
    case Op::kIota: case Op::kAffineSelect: case Op::kPartitionReduce: case Op::kNGather: case Op::kLocalGather:
    case Op::kNonzeroWithCount: return Engine::kGpSimd;
    case Op::kDmaCopy: case Op::kDmaTranspose: case Op::kDmaCompute: case Op::kSendRecv: return Engine::kDma;
    case Op::kCoreBarrier: case Op::kDevicePrint: return Engine::kSync;
    default: return Engine::kVector;
  }
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
                c->gemm_moving_fmax,
                c->gemm_moving_fmax_bf16};
}

}  // namespace neuron::nki
