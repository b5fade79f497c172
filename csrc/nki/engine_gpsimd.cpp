// The GpSimd engine: affine patterns (iota, affine_select), cross-partition reductions and
// gathers, with integers computed exactly.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "nki/executor.h"
#include "nki/numerics.h"

namespace neuron::nki {

void Program::State::affine(const Instr& in, const Access& dst, std::vector<float>& out) {
  std::vector<int64_t>& v = ibuf[1];
  affine_int(in, dst, v);
  out.resize(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = static_cast<float>(v[i]);
}

// iota's value per element, computed in int32 (wrapping) as GpSimd does.
void Program::State::affine_int(const Instr& in, const Access& dst, std::vector<int64_t>& out) {
  const int64_t P = dst.partitions(), F = dst.free_elements();
  const int64_t offset = int_attr(in, "offset"), cm = int_attr(in, "channel_multiplier");
  const std::vector<int64_t> flat = int_tail(in, "pattern");
  std::vector<std::pair<int64_t, int64_t>> pat;  // (step, num), outermost first
  for (size_t i = 0; i + 1 < flat.size(); i += 2) pat.emplace_back(flat[i], flat[i + 1]);
  out.resize(P * F);
  for (int64_t p = 0; p < P; ++p) {
    for (int64_t f = 0; f < F; ++f) {
      int64_t v = offset + p * cm, rem = f;
      for (int64_t k = static_cast<int64_t>(pat.size()) - 1; k >= 0; --k) {
        v += (rem % pat[k].second) * pat[k].first;
        rem /= pat[k].second;
      }
      out[p * F + f] = static_cast<int32_t>(static_cast<uint32_t>(v));
    }
  }
}

void Program::State::exec_gpsimd(const Instr& in) {
  const auto& a = in.args;
  switch (in.op) {
    case Op::kIota:
      if (!is_float(dt(a[0]))) {
        affine_int(in, a[0], ibuf[0]);
        scatter_int(a[0], ibuf[0].data(), true);
        return;
      }
      affine(in, a[0], buf[0]);
      scatter(a[0], buf[0].data());
      return;
    case Op::kAffineSelect: {
      affine(in, a[0], buf[4]);
      const Alu cmp = static_cast<Alu>(int_attr(in, "cmp_op"));
      float* t = gather(a[1], 1);
      const float f = static_cast<float>(float_attr(in, "on_false_value"));
      for (size_t i = 0; i < buf[4].size(); ++i) t[i] = alu(cmp, buf[4][i], 0.0f) != 0 ? t[i] : f;
      scatter(a[0], t);
      return;
    }
    case Op::kPartitionReduce: {
      const Alu op = static_cast<Alu>(int_attr(in, "op"));
      const int64_t P = a[1].partitions(), F = a[1].free_elements();
      const float* x = gather(a[1], 0);
      std::vector<float>& out = buf[1];
      out.assign(F, identity_of(op));
      for (int64_t p = 0; p < P; ++p)
        for (int64_t f = 0; f < F; ++f) out[f] = alu(op, out[f], x[p * F + f]);
      if (op == Alu::kAverage)
        for (float& v : out) v /= static_cast<float>(P);
      scatter(a[0], out.data());
      return;
    }
    case Op::kNGather: {
      const int64_t P = a[1].partitions(), Fd = a[1].free_elements(), Fi = a[2].free_elements();
      const size_t es = dtype_size(dt(a[1]));
      gather_raw(a[1], raw_[1]);
      const int64_t* idx = gather_int(a[2], ibuf[0]);
      raw_[0].resize(P * Fi * es);
      for (int64_t p = 0; p < P; ++p) {
        for (int64_t j = 0; j < Fi; ++j) {
          const int64_t i = idx[p * Fi + j];
          if (i < 0 || i >= Fd) {
            throw std::out_of_range("nki: nc_n_gather index " + std::to_string(i) + " at partition " +
                                    std::to_string(p) + " is outside [0, " + std::to_string(Fd) + ") (" +
                                    in.loc.file + ":" + std::to_string(in.loc.line) + ")");
          }
          std::memcpy(raw_[0].data() + (p * Fi + j) * es, raw_[1].data() + (p * Fd + i) * es, es);
        }
      }
      scatter_raw(a[0], raw_[0]);
      return;
    }
    case Op::kLocalGather: {
      const int64_t P = a[1].partitions(), Fs = a[1].free_elements(), Fi = a[2].free_elements();
      const int64_t n_elem = int_attr(in, "num_elem_per_idx"), valid = int_attr(in, "num_valid_indices");
      const size_t es = dtype_size(dt(a[1]));
      gather_raw(a[1], raw_[1]);
      const int64_t* idx = gather_int(a[2], ibuf[0]);
      const int64_t Fo = valid * n_elem;
      raw_[0].resize(P * Fo * es);
      std::vector<int64_t> flat(16 * Fi);
      for (int64_t c = 0; c < P / 16; ++c) {
        for (int64_t col = 0; col < Fi; ++col)  // partition-first (column-major) order
          for (int64_t r = 0; r < 16; ++r) flat[col * 16 + r] = idx[(c * 16 + r) * Fi + col];
        for (int64_t r = c * 16; r < c * 16 + 16; ++r) {
          for (int64_t k = 0; k < valid; ++k) {
            for (int64_t e = 0; e < n_elem; ++e) {
              const int64_t from = flat[k] + e;
              if (from < 0 || from >= Fs) {
                throw std::out_of_range("nki: local_gather index " + std::to_string(flat[k]) + " reads element " +
                                        std::to_string(from) + " of " + std::to_string(Fs) + " per partition (" +
                                        in.loc.file + ":" + std::to_string(in.loc.line) + ")");
              }
              std::memcpy(raw_[0].data() + (r * Fo + k * n_elem + e) * es, raw_[1].data() + (r * Fs + from) * es, es);
            }
          }
        }
      }
      scatter_raw(a[0], raw_[0]);
      return;
    }
    case Op::kNonzeroWithCount: {
      // Only the first partition of each GpSimd core (absolute partitions 0, 16, ..., 112) is
      // read and written; the other partitions of dst keep their values.
      const int64_t P = a[1].partitions(), T = a[1].free_elements();
      const int64_t first = a[1].offset / p.k_.tensors[a[1].tensor].partition_elements();
      const float* src = gather(a[1], 0);
      int64_t* out = gather_int(a[0], ibuf[0]);
      const int64_t index_offset = int_attr(in, "index_offset"), padding = int_attr(in, "padding_val");
      for (int64_t q = 0; q < P; ++q) {
        if ((first + q) % 16 != 0) continue;
        int64_t* row = out + q * (T + 1);
        int64_t n = 0;
        for (int64_t i = 0; i < T; ++i) {
          if (src[q * T + i] != 0.0f) row[n++] = i + index_offset;
        }
        std::fill(row + n, row + T, padding);
        row[T] = n;
      }
      scatter_int(a[0], out, false);
      return;
    }
    default:
      break;
  }
  throw std::logic_error(std::string("nki executor: ") + op_name(in.op) + " is not a GpSimd-engine instruction");
}

}  // namespace neuron::nki
