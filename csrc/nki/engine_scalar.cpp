// The Scalar engine: activation functions (numerics.h) with scale, bias and reductions.
#include <algorithm>
#include <stdexcept>
#include <string>

#include "nki/executor.h"
#include "nki/numerics.h"

namespace neuron::nki {

void Program::State::exec_scalar(const Instr& in) {
  const auto& a = in.args;
  switch (in.op) {
    case Op::kActivation: {
      const int64_t P = a[1].partitions(), F = a[1].free_elements();
      float* x = gather(a[1], 0);
      const Act fn = static_cast<Act>(int_attr(in, "op"));
      const ReduceCmd cmd = static_cast<ReduceCmd>(int_attr(in, "reduce_cmd"));
      const std::vector<float> bias = column(a[2], float_attr(in, "bias"), P, 1);
      const std::vector<float> scale = column(a[3], float_attr(in, "scale"), P, 2);
      if (resets(cmd)) std::fill(act_regs, act_regs + 128, 0.0f);
      for (int64_t p = 0; p < P; ++p) {
        float* r = x + p * F;
        float sum = 0.0f;
        for (int64_t f = 0; f < F; ++f) {
          r[f] = act(fn, r[f] * scale[p] + bias[p]);
          sum += r[f];
        }
        if (accumulates(cmd)) act_regs[p] += sum;
      }
      scatter(a[0], x);
      if (a[4].present()) scatter(a[4], act_regs);
      return;
    }
    case Op::kActivate2: {
      const int64_t P = a[1].partitions(), F = a[1].free_elements();
      const Act fn = static_cast<Act>(int_attr(in, "op"));
      const Alu op0 = static_cast<Alu>(int_attr(in, "op0")), op1 = static_cast<Alu>(int_attr(in, "op1"));
      const bool rev0 = int_attr(in, "reverse0"), rev1 = int_attr(in, "reverse1");
      const bool has_reduce = int_attr(in, "reduce_op") >= 0;
      const Alu rop = has_reduce ? static_cast<Alu>(int_attr(in, "reduce_op")) : Alu::kAdd;
      const ReduceCmd cmd = static_cast<ReduceCmd>(int_attr(in, "reduce_cmd"));
      float* x = gather(a[1], 0);
      const std::vector<float> i0 = column(a[2], float_attr(in, "imm0"), P, 1);
      const std::vector<float> i1 = column(a[3], float_attr(in, "imm1"), P, 2);
      acc_start(act_regs, cmd, rop, {}, P);
      auto stage = [](Alu op, float v, float imm, bool rev) {
        return op == Alu::kBypass ? v : rev ? alu(op, imm, v) : alu(op, v, imm);
      };
      for (int64_t p = 0; p < P; ++p) {
        for (int64_t j = 0; j < F; ++j) {
          float& v = x[p * F + j];
          v = act(fn, stage(op1, stage(op0, v, i0[p], rev0), i1[p], rev1));
          if (has_reduce && accumulates(cmd)) act_regs[p] = alu(rop, act_regs[p], v);
        }
      }
      scatter(a[0], x);
      acc_write(a[5], act_regs, P);
      return;
    }
    default:
      break;
  }
  throw std::logic_error(std::string("nki executor: ") + op_name(in.op) + " is not a Scalar-engine instruction");
}

}  // namespace neuron::nki
