// Inside the executor (not part of its API): the state of one program while it runs, shared by
// the files that make it up.
//
//   access.cpp          gather/scatter: an access's elements between simulated memory and dense
//                       fp32 / int64 / raw buffers; copies; run-time (dynamic) offsets
//   exec.cpp            one instruction: run-time offsets resolved, then the op table's engine runs it
//   engine_*.cpp        per engine (Tensor, Vector, Scalar, GpSimd, DMA): what each instruction computes
//   memory_plan.cpp     the arena: where each on-chip tensor lives, fresh memory per live range
//   launch.cpp          the SPMD scheduler: the programs of a launch, sendrecv and core_barrier
//   print.cpp           nl.device_print: formatting and the host's sink
//
// Every engine decodes its inputs to fp32, computes in fp32 and encodes the result to the
// destination's dtype (numerics.h); copies between tensors of one dtype move bits. Tiles are
// processed whole: an access is gathered into a dense [partitions, free] buffer, the operation
// runs over it, and the result is scattered back.
#pragma once

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "cpu/gemm.h"
#include "nki/execute.h"

namespace neuron::nki {

// The host's thread pool (set_parallel_for); empty: serial.
const ParallelFor& host_parallel_for();
// Hands a device_print's values to the host's sink, or writes them to stdout.
void emit_print(const PrintedTensor& t);

// Calls f(element_offset, element_stride, count, dense_index) for each innermost run of a.
template <class F>
void for_runs(const Access& a, F&& f) {
  const size_t nd = a.dims.size();
  if (nd == 0) {
    f(a.offset, 1, 1, 0);
    return;
  }
  const int64_t inner = a.dims[nd - 1].size, inner_stride = a.dims[nd - 1].stride;
  int64_t idx[8] = {0};
  int64_t dense = 0;
  int64_t outer = 1;
  for (size_t i = 0; i + 1 < nd; ++i) outer *= a.dims[i].size;
  for (int64_t r = 0; r < outer; ++r) {
    int64_t off = a.offset;
    for (size_t i = 0; i + 1 < nd; ++i) off += idx[i] * a.dims[i].stride;
    f(off, inner_stride, inner, dense);
    dense += inner;
    for (int64_t i = static_cast<int64_t>(nd) - 2; i >= 0; --i) {
      if (++idx[i] < a.dims[i].size) break;
      idx[i] = 0;
    }
  }
}

struct Program::State {
  State(Program& program, const std::vector<void*>& external) : p(program), ext(external) {
    // Versions count from 0 in each launch: no packed tile of an earlier one is valid.
    for (auto& [key, e] : p.packed_moving_) e.version = -1;
    for (auto& [key, e] : p.packed_stationary_) e.version = -1;
  }
  Program& p;
  const std::vector<void*>& ext;
  float act_regs[128] = {};  // Scalar engine's per-partition reduce registers
  float vec_regs[128] = {};  // Vector engine's accumulator (shared by its reducing instructions)
  std::vector<float> buf[6];
  std::vector<int64_t> ibuf[2];
  std::vector<uint8_t> raw_[3];
  // Per tensor, a count of the instructions that may have written it (see exec).
  std::unordered_map<int, int64_t> version_;

  // ---- one instruction (exec.cpp) ----
  void run(const Instr& in);  // resolves run-time offsets, then exec
  void exec(const Instr& in);
  void exec_dynamic(const Instr& in);
  // Per engine (engine_*.cpp): the instructions the op table assigns to it.
  void exec_tensor(const Instr& in);
  void exec_vector(const Instr& in);
  void exec_scalar(const Instr& in);
  void exec_gpsimd(const Instr& in);
  void exec_dma(const Instr& in);
  void exec_sync(const Instr& in);

  // ---- gather/scatter (access.cpp) ----
  uint8_t* base(int t) const {
    const TensorDecl& d = p.k_.tensors[t];
    if (d.external >= 0) return static_cast<uint8_t*>(ext.at(d.external));
    return p.arena_.data() + p.offset_[t];
  }
  DType dt(const Access& a) const { return p.k_.tensors[a.tensor].dtype; }
  Buffer bufkind(const Access& a) const { return p.k_.tensors[a.tensor].buffer; }

  // An access's elements decoded to fp32 into buf[slot] (and encoded back).
  float* gather(const Access& a, int slot);
  void scatter(const Access& a, const float* in);
  // Integers exactly (int64), for GpSimd's integer path.
  int64_t* gather_int(const Access& a, std::vector<int64_t>& v);
  void scatter_int(const Access& a, const int64_t* in, bool wrap);
  // An access's elements as raw bytes, densely in access order (and back).
  void gather_raw(const Access& a, std::vector<uint8_t>& out);
  void scatter_raw(const Access& a, const std::vector<uint8_t>& in);
  // dst = src, converting dtypes through fp32; same-dtype copies move bits unchanged.
  void copy(const Access& dst, const Access& src);
  // Whether two accesses' byte ranges intersect (one tensor, or an alias of the other's bytes).
  bool overlap(const Access& a, const Access& b) const;
  void copy_raw(const Access& dst, const Access& src);
  template <class E>
  void copy_raw_as(const Access& dst, const Access& src);
  // Elements per partition row when an access's free elements are contiguous, else -1.
  static int64_t dense_row(const Access& a, int64_t* ld);
  // The per-partition value of an optional (P, 1) operand, or the immediate.
  std::vector<float> column(const Access& a, double imm, int64_t P, int slot);
  // An fp32 access whose free elements are contiguous in every partition: its memory, read in
  // place, with *ld elements between partitions.
  const float* dense_f32(const Access& a, int64_t* ld);

  // Run-time offsets (DynamicIndex): the value an index tensor holds, whether an access with
  // its offset applied stays in its tensor, the access with its run-time index applied.
  int64_t index_value(const DynamicIndex& ix, int64_t i);
  bool in_bounds(const Access& a) const;
  Access resolved(const Access& a, int64_t w, int64_t* value);
  [[noreturn]] void out_of_bounds(const Instr& in, const Access& a, int64_t value) const;

  // ---- engine registers (engine_vector.cpp) ----
  // The accumulator registers as reduce_cmd (ir.h, ReduceCmd) starts them: reset to op's identity,
  // load_reduce from init (a column per partition), otherwise unchanged.
  void acc_start(float* regs, ReduceCmd cmd, Alu op, const std::vector<float>& init, int64_t P);
  void acc_write(const Access& res, const float* regs, int64_t P, bool negate = false);

  // ---- Tensor engine (engine_tensor.cpp) ----
  // Runs the matmul at instruction i and the ones right after it that continue its K sum in
  // one PSUM tile (one host GEMM, worth threading); returns how many instructions ran.
  size_t run_matmuls(size_t i);
  bool continues_matmul_chain(const Instr& first, size_t at) const;
  size_t matmul(const Instr* in, size_t n);
  std::vector<cpu::GemmTerm> terms_;
  void transpose(const Instr& in);
  void accumulate_psum(const Instr& in, const Access& dst, const std::vector<float>& R, int64_t M, int64_t N);
  // Marks/queries "a matmul has written this PSUM element" (first write overwrites).
  uint8_t* written_flags(int t) { return p.psum_written_.data() + p.offset_[t]; }
  // A matmul operand as the host GEMM reads it (in place when dense, else gathered to buf[slot]).
  cpu::MatrixRef matmul_operand(const Access& a, int64_t X, bool stationary, int slot);
  bool in_place_operand(const Access& a, int64_t X, int64_t* ld) const;
  cpu::Dtype operand_dtype(const Access& a, bool in_place) const;
  std::vector<cpu::PackAJob> pack_a_jobs_;
  std::vector<cpu::PackBJob> pack_b_jobs_;

  // ---- GpSimd (engine_gpsimd.cpp) ----
  // iota's / affine_select's affine value per element (offset, channel_multiplier, pattern).
  void affine(const Instr& in, const Access& dst, std::vector<float>& out);
  void affine_int(const Instr& in, const Access& dst, std::vector<int64_t>& out);
};

}  // namespace neuron::nki
