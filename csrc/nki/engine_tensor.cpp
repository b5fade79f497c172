// The Tensor engine: matmul into PSUM (accumulating as the hardware does) and the transpose.
// The products themselves run on the host's GEMM (cpu/gemm.h).
#include <cstring>
#include <stdexcept>
#include <string>

#include "cpu/gemm.h"
#include "nki/executor.h"

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

namespace {

bool same_dims(const std::vector<Dim>& x, const std::vector<Dim>& y) {
  if (x.size() != y.size()) return false;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i].stride != y[i].stride || x[i].size != y[i].size) return false;
  }
  return true;
}

}  // namespace

// nc_matmul's operand as the GEMM's: stationary S [K, M] is A transposed (A[m, k] = S[k, m]),
// moving V [K, N] is B. fp32/bf16/fp16 tiles whose partitions hold contiguous elements are read
// in place; anything else is gathered to fp32 into buf[slot] first.
cpu::MatrixRef Program::State::matmul_operand(const Access& a, int64_t X, bool stationary, int slot) {
  const DType d = dt(a);
  int64_t ld = X;
  const void* data = nullptr;
  cpu::Dtype kind = cpu::Dtype::kFloat32;
  if ((d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16) && dense_row(a, &ld) == X) {
    data = base(a.tensor) + a.offset * dtype_size(d);
    kind = d == DType::kFloat32 ? cpu::Dtype::kFloat32 : d == DType::kBFloat16 ? cpu::Dtype::kBFloat16
                                                                                : cpu::Dtype::kFloat16;
  } else {
    data = gather(a, slot);
    ld = X;
  }
  return stationary ? cpu::MatrixRef{data, kind, 1, ld} : cpu::MatrixRef{data, kind, ld, 1};
}

// PSUM[M, N] (+)= S.T @ V on the host's GEMM (cpu/gemm.h): exact products of 16-bit operands,
// fp32 sums, as the PE array computes them.
void Program::State::matmul(const Instr& in) {
  const Access &dst = in.args[0], &st = in.args[1], &mv = in.args[2];
  const int64_t K = st.partitions(), M = st.free_elements(), N = mv.free_elements();
  const cpu::MatrixRef a = matmul_operand(st, M, true, 1);
  // Straight into an fp32 PSUM tile when every element of it is in the same state (all fresh:
  // overwrite; all written, or accumulate=True: add), else through R.
  std::vector<float>& R = buf[3];
  float* out = nullptr;
  int64_t ldo = N;
  bool add = false;
  int64_t ldd = 0;
  if (float* d = const_cast<float*>(dense_f32(dst, &ldd))) {
    const int64_t acc_mode = int_attr(in, "accumulate", -1);
    uint8_t* w = written_flags(dst.tensor) + (d - reinterpret_cast<float*>(base(dst.tensor)));
    bool all = true, none = true;
    for (int64_t m = 0; m < M && (all || none); ++m) {
      all = all && std::memchr(w + m * ldd, 0, N) == nullptr;
      none = none && std::memchr(w + m * ldd, 1, N) == nullptr;
    }
    if (acc_mode == 1 || (acc_mode == -1 && all)) out = d, add = true;
    else if (acc_mode == 0 || (acc_mode == -1 && none)) out = d, add = false;
    if (out) {
      ldo = ldd;
      for (int64_t m = 0; m < M; ++m) std::memset(w + m * ldd, 1, N);
    }
  }
  const bool direct = out != nullptr;
  if (!direct) {
    R.resize(M * N);
    out = R.data();
  }
  // The moving tile is often the same SBUF data for many matmuls (one column block of b against
  // every row block of a): it is packed once per version of its tensor.
  const cpu::GemmOptions options = cpu::default_gemm_options(&host_parallel_for(), add);
  PackedMoving& pm = packed_moving_[(static_cast<int64_t>(mv.tensor) << 40) ^ mv.offset];
  if (pm.version != version_[mv.tensor] || pm.offset != mv.offset || !same_dims(pm.dims, mv.dims) ||
      pm.b.path != options.path || pm.b.a_dtype != a.dtype || pm.b.K != K || pm.b.N != N) {
    cpu::pack_b(K, N, matmul_operand(mv, N, false, 2), a.dtype, options.path, pm.b);
    pm.version = version_[mv.tensor], pm.offset = mv.offset, pm.dims = mv.dims;
  }
  cpu::gemm(M, a, pm.b, out, ldo, options);
  if (!direct) accumulate_psum(in, dst, R, M, N);
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
