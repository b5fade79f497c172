// A verified kernel instance, ready to run on simulated memories.
//
// SBUF/PSUM tensors (and HBM scratch the kernel allocates) live in one arena whose layout
// is planned once from the tensors' live ranges, so a kernel that allocates a fresh tile in
// every iteration of an unrolled loop reuses memory as the compiler's allocator would.
// Newly allocated on-chip memory is filled with NaN (float) or 4 (integer), as AWS's
// simulator does, so reading uninitialized data shows (memory wholly written before anything
// reads it is not filled: nothing could see the sentinels). External tensors (kernel inputs and
// outputs, in HBM) are caller memory: run() reads and writes it in place.
#pragma once

#include <functional>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "cpu/gemm.h"
#include "nki/ir.h"

namespace neuron::nki {

// How the executor splits work over threads: parallel_for(n, body) calls body(begin, end) on
// ranges covering [0, n). The host installs its thread pool (torch's, from the bindings);
// without one the executor runs serially.
using ParallelFor = std::function<void(int64_t, const std::function<void(int64_t, int64_t)>&)>;
void set_parallel_for(ParallelFor f);

// What an nl.device_print hands the host when it runs: its label (the prefix, and which program
// of a launch printed) and its tensor's elements at that point of the program, row-major in the
// printed view's shape. Values are widened exactly: float dtypes into `floats` (fp32 holds every
// bf16 / fp16 / fp8 value), integer and bool dtypes into `ints`.
struct PrintedTensor {
  std::string label;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<float> floats;
  std::vector<int64_t> ints;
};
// Where device_print output goes. The host installs one (the Python bindings print through
// sys.stdout with numpy's formatting); without one, format_printed() goes to stdout.
using PrintSink = std::function<void(const PrintedTensor&)>;
void set_print_sink(PrintSink f);
// "label [[v v ...] ...]": nested rows like numpy's, the middle of a tensor of over 1000
// elements elided as "..." (3 items kept at each end of each dimension).
std::string format_printed(const PrintedTensor& t);

class Program {
 public:
  // Verifies the kernel (throws VerifyError) and plans its memory.
  explicit Program(Kernel k);

  // Runs every instruction in program order. `external[i]` is the memory of the tensor
  // whose `external` slot is i. Safe to call from several threads (runs are serialized).
  void run(const std::vector<void*>& external);

  // Runs the programs of one SPMD launch (programs[r] on memory external[r]) together: each
  // runs until a sendrecv or core_barrier, which completes once its partner(s) reach theirs.
  // Programs that wait for each other forever raise std::runtime_error naming where each waits.
  friend void run_launch(const std::vector<Program*>& programs, const std::vector<std::vector<void*>>& external);

  const Kernel& kernel() const { return k_; }
  size_t arena_bytes() const { return arena_.size(); }

 private:
  struct State;
  void plan();
  void prepare(size_t i);  // fresh memory for the tensors that come alive at instruction i
  bool written_before_read(int t, size_t i) const;
  void check_external(const std::vector<void*>& external) const;

  Kernel k_;
  std::vector<int64_t> offset_;             // arena byte offset per tensor (-1: external)
  std::vector<std::vector<int>> alloc_at_;  // tensors that come alive at each instruction
  std::vector<uint8_t> arena_;
  std::vector<uint8_t> psum_written_;       // per arena byte: a matmul wrote this PSUM element
  std::vector<uint8_t> fill_patterns_[16];  // per dtype: 4096 encoded sentinels
  std::vector<int8_t> fill_;                 // per tensor: 1 sentinels, 0 none needed, -1 not known yet
  // Matmul operand tiles packed for the host GEMM, by arena position, valid for (tensor, offset,
  // dims) while the tensor's version in the running launch holds; kept across launches for their
  // storage only.
  template <class Packed>
  struct PackedTile {
    int tensor = -1;
    int64_t version = -1, offset = 0;
    std::vector<Dim> dims;
    Packed packed;
  };
  std::unordered_map<int64_t, PackedTile<cpu::PackedB>> packed_moving_;
  std::unordered_map<int64_t, PackedTile<cpu::PackedA>> packed_stationary_;
  std::mutex mu_;
};

void run_launch(const std::vector<Program*>& programs, const std::vector<std::vector<void*>>& external);

}  // namespace neuron::nki
