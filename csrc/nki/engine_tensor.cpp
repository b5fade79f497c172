// The Tensor engine: matmul into PSUM (accumulating as the hardware does) and the transpose.
// The products themselves run in matmul.cpp.
#include <cstring>
#include <stdexcept>
#include <string>

#include "nki/executor.h"
#include "nki/matmul.h"

namespace neuron::nki {

void Program::State::exec_tensor(const Instr& in) {
  switch (in.op) {
    case Op::kMatmul: matmul(in); return;
    case Op::kTranspose: transpose(in); return;
    default:
      break;
  }
  throw std::logic_error(std::string("nki executor: ") + op_name(in.op) + " is not a Tensor-engine instruction");
}

void Program::State::matmul(const Instr& in) {
  const Access &dst = in.args[0], &st = in.args[1], &mv = in.args[2];
  const int64_t K = st.partitions(), M = st.free_elements(), N = mv.free_elements();
  std::vector<float>& R = buf[3];
  R.resize(M * N);
  if (dt(st) == DType::kBFloat16 && dt(mv) == DType::kBFloat16 && has_bf16_pair_matmul()) {
    pack_pairs(st, K, M, packed_s_);
    // The moving tile is often the same SBUF data for many matmuls (one column block of b
    // against every row block): pack it once per version of its tensor.
    const uint32_t* vp;
    PackedOperand& pm = packed_moving_[(static_cast<int64_t>(mv.tensor) << 40) ^ mv.offset];
    if (pm.version == version_[mv.tensor] && pm.offset == mv.offset && same_dims(pm.dims, mv.dims)) {
      vp = pm.data.data();
    } else {
      pack_pairs(mv, K, N, pm.data);
      pm.version = version_[mv.tensor], pm.offset = mv.offset, pm.dims = mv.dims;
      vp = pm.data.data();
    }
    // Straight into an fp32 PSUM tile when every element of it is in the same state (all
    // fresh: overwrite; all written, or accumulate=True: add), else through R.
    float* out = R.data();
    int64_t ldo = N;
    bool add = false, direct = false;
    int64_t ldd = 0;
    if (float* d = const_cast<float*>(dense_f32(dst, &ldd))) {
      const int64_t acc_mode = int_attr(in, "accumulate", -1);
      uint8_t* w = written_flags(dst.tensor) + (d - reinterpret_cast<float*>(base(dst.tensor)));
      bool all = true, none = true;
      for (int64_t m = 0; m < M && (all || none); ++m) {
        all = all && std::memchr(w + m * ldd, 0, N) == nullptr;
        none = none && std::memchr(w + m * ldd, 1, N) == nullptr;
      }
      if (acc_mode == 1 || (acc_mode == -1 && all)) direct = true, add = true;
      else if (acc_mode == 0 || (acc_mode == -1 && none)) direct = true, add = false;
      if (direct) {
        out = d, ldo = ldd;
        for (int64_t m = 0; m < M; ++m) std::memset(w + m * ldd, 1, N);
      }
    }
    matmul_bf16_pairs(packed_s_.data(), vp, out, ldo, add, K, M, N, host_parallel_for());
    if (!direct) accumulate_psum(in, dst, R, M, N);
    return;
  }
  int64_t lds = M, ldv = N;
  const float* S = dense_f32(st, &lds);  // [K, M] rows, read in place when possible
  if (!S) S = gather(st, 1), lds = M;
  const float* V = dense_f32(mv, &ldv);  // [K, N]
  if (!V) V = gather(mv, 2), ldv = N;
  matmul_f32(S, lds, V, ldv, R.data(), K, M, N, host_parallel_for());
  accumulate_psum(in, dst, R, M, N);
}

bool Program::State::same_dims(const std::vector<Dim>& x, const std::vector<Dim>& y) {
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i)
    if (x[i].stride != y[i].stride || x[i].size != y[i].size) return false;
  return true;
}

void Program::State::pack_pairs(const Access& a, int64_t K, int64_t X, std::vector<uint32_t>& out) {
  const uint16_t* rows;
  int64_t ld = 0;
  uint8_t* b = base(a.tensor);
  if (dense_row(a, &ld) == X) {  // partition rows of contiguous elements: read in place
    rows = reinterpret_cast<const uint16_t*>(b) + a.offset;
  } else {
    std::vector<uint16_t>& bits = bits16_;
    bits.resize(K * X);
    for_runs(a, [&](int64_t off, int64_t stride, int64_t n, int64_t at) {
      for (int64_t i = 0; i < n; ++i) std::memcpy(&bits[at + i], b + (off + i * stride) * 2, 2);
    });
    rows = bits.data();
    ld = X;
  }
  const int64_t K2 = (K + 1) / 2;
  out.resize(K2 * X);
  for (int64_t k = 0; k < K2; ++k) {
    const uint16_t* even = rows + 2 * k * ld;
    uint32_t* o = out.data() + k * X;
    if (2 * k + 1 < K) {
      const uint16_t* odd = even + ld;
      for (int64_t x = 0; x < X; ++x) o[x] = even[x] | (static_cast<uint32_t>(odd[x]) << 16);
    } else {
      for (int64_t x = 0; x < X; ++x) o[x] = even[x];
    }
  }
}

void Program::State::accumulate_psum(const Instr& in, const Access& dst, const std::vector<float>& R, int64_t M, int64_t N) {
  // PSUM: accumulate=None -> the first matmul write to an element overwrites it, later
  // ones add; accumulate=False always overwrites, True always adds.
  const int64_t acc = int_attr(in, "accumulate", -1);
  uint8_t* flags = written_flags(dst.tensor);
  int64_t ldd;
  if (float* d = const_cast<float*>(dense_f32(dst, &ldd))) {  // fp32 PSUM: update in place
    const int64_t f0 = d - reinterpret_cast<float*>(base(dst.tensor));
    for (int64_t m = 0; m < M; ++m) {
      float* row = d + m * ldd;
      uint8_t* w = flags + f0 + m * ldd;
      const float* r = R.data() + m * N;
      // A row is usually all written (accumulating) or all fresh (the first matmul).
      const bool all_written = acc == 1 || (acc == -1 && std::memchr(w, 0, N) == nullptr);
      const bool none_written = acc == 0 || (acc == -1 && !all_written && std::memchr(w, 1, N) == nullptr);
      if (all_written) {
        for (int64_t n = 0; n < N; ++n) row[n] += r[n];
      } else if (none_written) {
        std::memcpy(row, r, N * sizeof(float));
      } else {
        for (int64_t n = 0; n < N; ++n) row[n] = w[n] ? row[n] + r[n] : r[n];
      }
      std::memset(w, 1, N);
    }
    return;
  }
  float* old = gather(dst, 0);
  int64_t i = 0;
  for_runs(dst, [&](int64_t off, int64_t stride, int64_t n, int64_t at) {
    for (int64_t j = 0; j < n; ++j, ++i) {
      uint8_t& w = flags[off + j * stride];
      const bool add = acc == 1 || (acc == -1 && w);
      old[at + j] = add ? old[at + j] + R[at + j] : R[at + j];
      w = 1;
    }
  });
  scatter(dst, old);
}

void Program::State::transpose(const Instr& in) {
  const Access &dst = in.args[0], &src = in.args[1];
  const int64_t P = src.partitions(), F = src.free_elements();
  const float* x = gather(src, 0);
  std::vector<float>& y = buf[1];
  y.resize(P * F);
  for (int64_t p = 0; p < P; ++p)
    for (int64_t f = 0; f < F; ++f) y[f * P + p] = x[p * F + f];
  scatter(dst, y.data());
}

}  // namespace neuron::nki
