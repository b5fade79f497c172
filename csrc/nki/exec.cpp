// One instruction: its run-time offsets resolved (exec_dynamic), then the engine that runs it
// (engine_*.cpp).
#include <stdexcept>
#include <utility>

#include "nki/executor.h"

namespace neuron::nki {
namespace {

ParallelFor& parallel_hook() {
  static ParallelFor hook;
  return hook;
}

}  // namespace

void set_parallel_for(ParallelFor f) { parallel_hook() = std::move(f); }
const ParallelFor& host_parallel_for() { return parallel_hook(); }

void Program::State::exec_dynamic(const Instr& in) {
  const bool skip = (in.op == Op::kDmaCopy || in.op == Op::kDmaCompute) && 
                    static_cast<OobMode>(int_attr(in, "oob_mode", 0)) == OobMode::kSkip;
  Instr r = in;
  std::vector<size_t> vec;  // operands with a vector index (a read-modify-write has two)
  int64_t v = 0;
  for (size_t i = 0; i < r.args.size(); ++i) {
    Access& a = r.args[i];
    if (!a.present() || !a.index.present()) continue;
    if (a.index.vector) {
      vec.push_back(i);
      continue;
    }
    a = resolved(a, 0, &v);
    if (!in_bounds(a)) {
      if (skip) return;
      out_of_bounds(in, a, v);
    }
  }
  if (vec.empty()) return exec(r);
  const int64_t n = r.args[vec[0]].dims[0].size;  // the verifier made every operand's dims[0] n long
  if (in.op == Op::kDmaTranspose) {  // its source is gathered row by row (gather_raw), then transposed
    for (int64_t w = 0; w < n; ++w) {
      const Access row = resolved(r.args[vec[0]], w, &v);
      if (!in_bounds(row)) out_of_bounds(in, row, v);
    }
    return exec(r);
  }
  for (int64_t w = 0; w < n; ++w) {
    Instr row = r;
    bool outside = false;
    for (size_t i = 0; i < row.args.size(); ++i) {
      Access& a = row.args[i];
      if (!a.present()) continue;
      if (a.index.present()) {
        a = resolved(a, w, &v);
        if (!in_bounds(a)) {
          if (!skip) out_of_bounds(in, a, v);
          outside = true;
        }
      } else {
        a.offset += w * a.dims[0].stride;
        a.dims[0].size = 1;
      }
    }
    if (!outside) exec(row);
  }
}

void Program::State::run(const Instr& in) {
  for (const Access& a : in.args) {
    if (a.present() && a.index.present()) return exec_dynamic(in);
  }
  exec(in);
}

void Program::State::exec(const Instr& in) {
  const auto& a = in.args;
  // Whatever an instruction may write gets a new version (matmul writes only PSUM), so a
  // packed copy of an operand is reused only while its tensor is unchanged.
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].present() && (in.op != Op::kMatmul || i == 0) && in.op != Op::kDevicePrint) ++version_[a[i].tensor];
  }
  if (synchronizes(in.op)) throw std::logic_error("nki executor: sendrecv / core_barrier run through run_launch");
  switch (engine_of(in.op)) {
    case Engine::kTensor: return exec_tensor(in);
    case Engine::kVector: return exec_vector(in);
    case Engine::kScalar: return exec_scalar(in);
    case Engine::kGpSimd: return exec_gpsimd(in);
    case Engine::kDma: return exec_dma(in);
    case Engine::kSync: return exec_sync(in);
    case Engine::kUnknown: break;
  }
  throw std::logic_error(std::string("nki executor: no engine runs ") + op_name(in.op));
}

}  // namespace neuron::nki
