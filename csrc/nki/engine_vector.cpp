// The Vector engine: element-wise, reducing and selecting instructions, and its per-partition
// accumulator registers (reduce_cmd), shared with the Scalar engine's reducing instructions.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>

#include "nki/executor.h"
#include "nki/numerics.h"

namespace neuron::nki {

void Program::State::acc_start(float* regs, ReduceCmd cmd, Alu op, const std::vector<float>& init, int64_t P) {
  if (resets(cmd)) std::fill(regs, regs + P, identity_of(op));
  if (cmd == ReduceCmd::kLoadReduce) {
    if (static_cast<int64_t>(init.size()) >= P) std::copy(init.begin(), init.begin() + P, regs);
    else std::fill(regs, regs + P, identity_of(op));
  }
}

void Program::State::acc_write(const Access& res, const float* regs, int64_t P, bool negate) {
  if (!res.present()) return;
  std::vector<float>& v = buf[5];
  v.assign(regs, regs + P);
  if (negate) for (float& x : v) x = -x;
  scatter(res, v.data());
}

void Program::State::exec_vector(const Instr& in) {
  const auto& a = in.args;
  switch (in.op) {
    case Op::kTensorCopy:
      copy(a[0], a[1]);
      return;
    case Op::kMemset: {
      if (!is_float(dt(a[0]))) {  // integers exactly (a float would round above 2**24)
        std::vector<int64_t>& v = ibuf[0];
        v.assign(a[0].elements(), static_cast<int64_t>(std::nearbyint(float_attr(in, "value"))));
        scatter_int(a[0], v.data(), false);
        return;
      }
      std::vector<float>& v = buf[0];
      v.assign(a[0].elements(), static_cast<float>(float_attr(in, "value")));
      scatter(a[0], v.data());
      return;
    }
    case Op::kTensorTensor: {
      const Alu op = static_cast<Alu>(int_attr(in, "op"));
      if (!is_float(dt(a[0])) && !is_float(dt(a[1])) && !is_float(dt(a[2]))) {  // integers: exact
        int64_t* x = gather_int(a[1], ibuf[0]);
        const int64_t* y = gather_int(a[2], ibuf[1]);
        for (int64_t i = 0, n = a[0].elements(); i < n; ++i) x[i] = alu_int(op, x[i], y[i]);
        scatter_int(a[0], x, alu_wraps(op));
        return;
      }
      float* x = gather(a[1], 0);
      const float* y = gather(a[2], 1);
      const int64_t n = a[0].elements();
      switch (op) {  // the hot ones without the switch per element
        case Alu::kAdd: for (int64_t i = 0; i < n; ++i) x[i] += y[i]; break;
        case Alu::kSubtract: for (int64_t i = 0; i < n; ++i) x[i] -= y[i]; break;
        case Alu::kMultiply: for (int64_t i = 0; i < n; ++i) x[i] *= y[i]; break;
        default: for (int64_t i = 0; i < n; ++i) x[i] = alu(op, x[i], y[i]);
      }
      scatter(a[0], x);
      return;
    }
    case Op::kTensorScalar: {
      const int64_t P = a[1].partitions(), F = a[1].free_elements();
      if (!is_float(dt(a[0])) && !is_float(dt(a[1])) && !a[2].present() && !a[3].present()) {
        const Alu op0 = static_cast<Alu>(int_attr(in, "op0"));
        const bool rev0 = int_attr(in, "reverse0"), has1 = int_attr(in, "op1") >= 0, rev1 = int_attr(in, "reverse1");
        const Alu op1 = has1 ? static_cast<Alu>(int_attr(in, "op1")) : Alu::kBypass;
        const int64_t v0 = static_cast<int64_t>(std::nearbyint(float_attr(in, "operand0")));
        const int64_t v1 = static_cast<int64_t>(std::nearbyint(float_attr(in, "operand1")));
        int64_t* x = gather_int(a[1], ibuf[0]);
        for (int64_t i = 0; i < P * F; ++i) {
          int64_t t = alu_unary(op0) ? alu_int(op0, x[i], 0) : rev0 ? alu_int(op0, v0, x[i]) : alu_int(op0, x[i], v0);
          if (has1) t = alu_unary(op1) ? alu_int(op1, t, 0) : rev1 ? alu_int(op1, v1, t) : alu_int(op1, t, v1);
          x[i] = t;
        }
        scatter_int(a[0], x, alu_wraps(op0) || (has1 && alu_wraps(op1)));
        return;
      }
      float* x = gather(a[1], 0);
      const Alu op0 = static_cast<Alu>(int_attr(in, "op0"));
      const bool rev0 = int_attr(in, "reverse0");
      const std::vector<float> c0 = column(a[2], float_attr(in, "operand0"), P, 1);
      const bool has1 = int_attr(in, "op1") >= 0;
      const Alu op1 = has1 ? static_cast<Alu>(int_attr(in, "op1")) : Alu::kBypass;
      const bool rev1 = int_attr(in, "reverse1");
      const std::vector<float> c1 = column(a[3], float_attr(in, "operand1"), P, 1);
      for (int64_t p = 0; p < P; ++p) {
        float* r = x + p * F;
        const float v0 = c0[p], v1 = c1[p];
        for (int64_t f = 0; f < F; ++f) {
          float t = alu_unary(op0) ? alu(op0, r[f], 0) : rev0 ? alu(op0, v0, r[f]) : alu(op0, r[f], v0);
          if (has1) t = alu_unary(op1) ? alu(op1, t, 0) : rev1 ? alu(op1, v1, t) : alu(op1, t, v1);
          r[f] = t;
        }
      }
      scatter(a[0], x);
      return;
    }
    case Op::kTensorReduce: {
      const Alu op = static_cast<Alu>(int_attr(in, "op"));
      const bool negate = int_attr(in, "negate");
      const int64_t naxes = static_cast<int64_t>(int_tail(in, "axis").size());
      int64_t R = 1;
      for (int64_t i = 0; i < naxes; ++i) R *= a[1].dims[a[1].dims.size() - 1 - i].size;
      const float* x = gather(a[1], 0);
      const int64_t groups = a[1].elements() / R;
      std::vector<float>& out = buf[1];
      out.resize(groups);
      for (int64_t g = 0; g < groups; ++g) {
        float acc = identity_of(op);
        const float* r = x + g * R;
        if (op == Alu::kAdd) {
          for (int64_t j = 0; j < R; ++j) acc += r[j];
        } else {
          for (int64_t j = 0; j < R; ++j) acc = alu(op, acc, r[j]);
        }
        out[g] = negate ? -acc : acc;
      }
      scatter(a[0], out.data());
      return;
    }
    case Op::kTensorTensorScan: {
      const int64_t P = a[1].partitions(), F = a[1].free_elements();
      float* x = gather(a[1], 0);
      const float* y = gather(a[2], 1);
      const Alu op0 = static_cast<Alu>(int_attr(in, "op0")), op1 = static_cast<Alu>(int_attr(in, "op1"));
      const bool rev0 = int_attr(in, "reverse0"), rev1 = int_attr(in, "reverse1");
      const std::vector<float> init = column(a[3], float_attr(in, "initial"), P, 2);
      for (int64_t p = 0; p < P; ++p) {
        float prev = init[p];
        for (int64_t f = 0; f < F; ++f) {
          const int64_t i = p * F + f;
          float t = rev0 ? alu(op0, prev, x[i]) : alu(op0, x[i], prev);
          prev = rev1 ? alu(op1, y[i], t) : alu(op1, t, y[i]);
          x[i] = prev;
        }
      }
      scatter(a[0], x);
      return;
    }
    case Op::kBnStats: {
      const int64_t P = a[1].partitions(), F = a[1].free_elements();
      const float* x = gather(a[1], 0);
      std::vector<float>& out = buf[1];
      out.assign(P * 6, 0.0f);
      for (int64_t p = 0; p < P; ++p) {
        for (int par = 0; par < 2; ++par) {
          double n = 0, mean = 0, m2 = 0;
          for (int64_t f = par; f < F; f += 2) {
            n += 1;
            double d = x[p * F + f] - mean;
            mean += d / n;
            m2 += d * (x[p * F + f] - mean);
          }
          out[p * 6 + par * 3 + 0] = static_cast<float>(n);
          out[p * 6 + par * 3 + 1] = static_cast<float>(mean);
          out[p * 6 + par * 3 + 2] = static_cast<float>(m2);
        }
      }
      scatter(a[0], out.data());
      return;
    }
    case Op::kBnAggr: {
      const int64_t P = a[1].partitions(), F = a[1].free_elements();
      const float* x = gather(a[1], 0);
      std::vector<float>& out = buf[1];
      out.assign(P * 2, 0.0f);
      for (int64_t p = 0; p < P; ++p) {
        double n = 0, mean = 0, m2 = 0;
        for (int64_t t = 0; t + 3 <= F; t += 3) {
          const double nb = x[p * F + t], mb = x[p * F + t + 1], m2b = x[p * F + t + 2];
          if (nb == 0) continue;
          const double tot = n + nb, d = mb - mean;
          mean += d * nb / tot;
          m2 += m2b + d * d * n * nb / tot;
          n = tot;
        }
        out[p * 2] = static_cast<float>(mean);
        out[p * 2 + 1] = static_cast<float>(n > 0 ? m2 / n : 0.0);
      }
      scatter(a[0], out.data());
      return;
    }
    case Op::kMax8: {
      const int64_t P = a[1].partitions(), F = a[1].free_elements();
      float* x = gather(a[1], 0);
      std::vector<float>& out = buf[1];
      out.resize(P * 8);
      for (int64_t p = 0; p < P; ++p) {
        std::partial_sort(x + p * F, x + p * F + 8, x + (p + 1) * F, std::greater<float>());
        std::copy(x + p * F, x + p * F + 8, out.data() + p * 8);
      }
      scatter(a[0], out.data());
      return;
    }
    case Op::kFindIndex8: {
      const int64_t P = a[1].partitions(), F = a[1].free_elements();
      const float* x = gather(a[1], 0);
      const float* vals = gather(a[2], 1);
      std::vector<float>& out = buf[2];
      out.resize(P * 8);
      for (int64_t p = 0; p < P; ++p) {
        std::map<float, int64_t> next;  // duplicates find successive occurrences
        for (int j = 0; j < 8; ++j) {
          const float v = vals[p * 8 + j];
          int64_t start = next.count(v) ? next[v] : 0, found = -1;
          for (int64_t f = start; f < F; ++f) {
            if (x[p * F + f] == v) { found = f; break; }
          }
          next[v] = found < 0 ? F : found + 1;
          out[p * 8 + j] = found < 0 ? 4294967295.0f : static_cast<float>(found);
        }
      }
      scatter(a[0], out.data());
      return;
    }
    case Op::kReciprocal: {
      float* x = gather(a[1], 0);
      for (int64_t i = 0, n = a[1].elements(); i < n; ++i) x[i] = 1.0f / x[i];
      scatter(a[0], x);
      return;
    }
    case Op::kScalarTensorTensor: {
      const int64_t P = a[1].partitions(), F = a[1].free_elements();
      float* x = gather(a[1], 0);
      const float* y = gather(a[3], 1);
      const Alu op0 = static_cast<Alu>(int_attr(in, "op0")), op1 = static_cast<Alu>(int_attr(in, "op1"));
      const bool rev0 = int_attr(in, "reverse0"), rev1 = int_attr(in, "reverse1");
      const std::vector<float> c0 = column(a[2], float_attr(in, "operand0"), P, 2);
      for (int64_t p = 0; p < P; ++p) {
        for (int64_t f = 0; f < F; ++f) {
          const int64_t i = p * F + f;
          float t = rev0 ? alu(op0, c0[p], x[i]) : alu(op0, x[i], c0[p]);
          x[i] = rev1 ? alu(op1, y[i], t) : alu(op1, t, y[i]);
        }
      }
      scatter(a[0], x);
      return;
    }
    case Op::kSelect: {
      const int64_t P = a[1].partitions(), F = a[1].free_elements();
      const float* pred = gather(a[1], 0);
      float* t = gather(a[2], 1);
      const std::vector<float> f = column(a[3], float_attr(in, "on_false"), P, 2);
      for (int64_t p = 0; p < P; ++p)
        for (int64_t j = 0; j < F; ++j) t[p * F + j] = pred[p * F + j] != 0 ? t[p * F + j] : f[p];
      scatter(a[0], t);
      return;
    }
    case Op::kCopyPredicated: {
      const int64_t n = a[0].elements();
      const bool rev = int_attr(in, "reverse_pred");
      std::vector<int64_t>& pred = ibuf[1];
      gather_int(a[2], pred);
      gather_raw(a[0], raw_[0]);
      const size_t es = dtype_size(dt(a[0]));
      if (a[1].present()) {
        gather_raw(a[1], raw_[1]);  // same dtype: bits move unchanged
      } else {
        std::vector<float> imm(n, static_cast<float>(float_attr(in, "src")));
        raw_[1].resize(n * es);
        if (is_float(dt(a[0]))) {
          encode_run(dt(a[0]), imm.data(), n, raw_[1].data(), 1);
        } else {
          std::vector<int64_t> iv(n, static_cast<int64_t>(std::nearbyint(float_attr(in, "src"))));
          encode_int_run(dt(a[0]), iv.data(), n, raw_[1].data(), 1, false);
        }
      }
      for (int64_t i = 0; i < n; ++i) {
        if ((pred[i] != 0) != rev) std::memcpy(raw_[0].data() + i * es, raw_[1].data() + i * es, es);
      }
      scatter_raw(a[0], raw_[0]);
      return;
    }
    case Op::kSelectReduce: {
      const int64_t P = a[2].partitions(), F = a[2].free_elements();
      const ReduceCmd cmd = static_cast<ReduceCmd>(int_attr(in, "reduce_cmd"));
      const bool rev = int_attr(in, "reverse_pred");
      const float* pred = gather(a[1], 0);
      float* t = gather(a[2], 1);
      const std::vector<float> f = column(a[3], float_attr(in, "on_false"), P, 2);
      acc_start(vec_regs, cmd, Alu::kMaximum, {}, P);
      for (int64_t p = 0; p < P; ++p) {
        for (int64_t j = 0; j < F; ++j) {
          float& v = t[p * F + j];
          v = ((pred[p * F + j] != 0) != rev) ? v : f[p];
          if (accumulates(cmd)) vec_regs[p] = std::fmax(vec_regs[p], v);
        }
      }
      scatter(a[0], t);
      acc_write(a[4], vec_regs, P);
      return;
    }
    case Op::kRangeSelect: {
      const int64_t P = a[1].partitions(), F = a[1].free_elements();
      const Alu c0 = static_cast<Alu>(int_attr(in, "comp_op0")), c1 = static_cast<Alu>(int_attr(in, "comp_op1"));
      const ReduceCmd cmd = static_cast<ReduceCmd>(int_attr(in, "reduce_cmd"));
      const int64_t start = int_attr(in, "range_start");
      float* t = gather(a[1], 0);
      const std::vector<float> b0 = column(a[2], 0.0, P, 1), b1 = column(a[3], 0.0, P, 2);
      const float fill = static_cast<float>(float_attr(in, "on_false_value"));
      acc_start(vec_regs, cmd, Alu::kMaximum, {}, P);
      for (int64_t p = 0; p < P; ++p) {
        for (int64_t j = 0; j < F; ++j) {
          const float idx = static_cast<float>(start + j);
          float& v = t[p * F + j];
          if (!(alu(c0, idx, b0[p]) != 0 && alu(c1, idx, b1[p]) != 0)) v = fill;
          if (accumulates(cmd)) vec_regs[p] = std::fmax(vec_regs[p], v);
        }
      }
      scatter(a[0], t);
      acc_write(a[4], vec_regs, P);
      return;
    }
    case Op::kTensorScalarReduce: {
      const int64_t P = a[1].partitions(), F = a[1].free_elements();
      const Alu op0 = static_cast<Alu>(int_attr(in, "op0")), rop = static_cast<Alu>(int_attr(in, "reduce_op"));
      const ReduceCmd cmd = static_cast<ReduceCmd>(int_attr(in, "reduce_cmd"));
      float* x = gather(a[1], 0);
      const std::vector<float> c0 = column(a[2], float_attr(in, "operand0"), P, 1);
      acc_start(vec_regs, cmd, rop, column(a[4], float_attr(in, "reduce_init"), P, 2), P);
      for (int64_t p = 0; p < P; ++p) {
        for (int64_t j = 0; j < F; ++j) {
          float& v = x[p * F + j];
          v = alu_unary(op0) ? alu(op0, v, 0) : alu(op0, v, c0[p]);
          if (accumulates(cmd)) vec_regs[p] = alu(rop, vec_regs[p], v);
        }
      }
      scatter(a[0], x);
      acc_write(a[3], vec_regs, P, int_attr(in, "reduce_res_negate") != 0);
      return;
    }
    case Op::kTensorScalarCumulative: {
      const int64_t P = a[1].partitions(), F = a[1].free_elements();
      const Alu op0 = static_cast<Alu>(int_attr(in, "op0")), op1 = static_cast<Alu>(int_attr(in, "op1"));
      const ReduceCmd cmd = static_cast<ReduceCmd>(int_attr(in, "reduce_cmd"));
      float* x = gather(a[1], 0);
      const std::vector<float> c0 = column(a[2], float_attr(in, "imm0"), P, 1);
      acc_start(vec_regs, cmd, op1 == Alu::kSubtract ? Alu::kAdd : op1, column(a[3], float_attr(in, "imm1"), P, 2),
                P);
      for (int64_t p = 0; p < P; ++p) {
        float reg = vec_regs[p];
        for (int64_t j = 0; j < F; ++j) {
          float& v = x[p * F + j];
          reg = alu(op1, alu_unary(op0) ? alu(op0, v, 0) : alu(op0, v, c0[p]), reg);
          v = reg;
        }
        vec_regs[p] = reg;
      }
      scatter(a[0], x);
      return;
    }
    case Op::kExponential: {
      const int64_t P = a[1].partitions(), F = a[1].free_elements();
      const ReduceCmd cmd = static_cast<ReduceCmd>(int_attr(in, "reduce_cmd"));
      float* x = gather(a[1], 0);
      const std::vector<float> m = column(a[2], float_attr(in, "max_value"), P, 1);
      acc_start(vec_regs, cmd, Alu::kAdd, column(a[4], float_attr(in, "reduce_init"), P, 2), P);
      for (int64_t p = 0; p < P; ++p) {
        for (int64_t j = 0; j < F; ++j) {
          float& v = x[p * F + j];
          v = std::exp(v - m[p]);
          if (accumulates(cmd)) vec_regs[p] += v;
        }
      }
      scatter(a[0], x);
      acc_write(a[3], vec_regs, P);
      return;
    }
    case Op::kMatchReplace8: {
      const int64_t P = a[1].partitions(), F = a[1].free_elements();
      float* x = gather(a[1], 0);
      const float* vals = gather(a[2], 1);
      const float imm = static_cast<float>(float_attr(in, "imm"));
      std::vector<float>& idx = buf[2];
      idx.assign(P * 8, 4294967295.0f);
      std::vector<uint8_t> replaced(F);
      for (int64_t p = 0; p < P; ++p) {
        std::fill(replaced.begin(), replaced.end(), 0);
        for (int j = 7; j >= 0; --j) {  // duplicates: the last val takes the first match
          const float v = vals[p * 8 + j];
          for (int64_t f = 0; f < F; ++f) {
            if (!replaced[f] && x[p * F + f] == v) {
              replaced[f] = 1;
              idx[p * 8 + j] = static_cast<float>(f);
              break;
            }
          }
        }
        for (int64_t f = 0; f < F; ++f) if (replaced[f]) x[p * F + f] = imm;
      }
      scatter(a[0], x);
      if (a.size() > 3 && a[3].present()) scatter(a[3], idx.data());
      return;
    }
    case Op::kStreamShuffle: {
      const int64_t Pd = a[0].partitions(), Ps = a[1].partitions();
      const size_t es = dtype_size(dt(a[0]));
      const int64_t row = a[0].free_elements() * es;
      const std::vector<int64_t> mask = int_tail(in, "shuffle_mask");
      gather_raw(a[1], raw_[1]);  // before writing: in place is allowed
      gather_raw(a[0], raw_[0]);
      for (int64_t i = 0; i < Pd; ++i) {
        const int64_t m = mask.at(i % 32);
        const int64_t from = i / 32 * 32 + m;
        if (m == 255 || from >= Ps) continue;
        std::memcpy(raw_[0].data() + i * row, raw_[1].data() + from * row, row);
      }
      scatter_raw(a[0], raw_[0]);
      return;
    }
    default:
      break;
  }
  throw std::logic_error(std::string("nki executor: ") + op_name(in.op) + " is not a Vector-engine instruction");
}

}  // namespace neuron::nki
