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
    case Op::kMatmul: matmul(&in, 1); return;
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

// Whether the GEMM reads a matmul operand of X free elements per partition in place (*ld
// elements apart).
bool Program::State::in_place_operand(const Access& a, int64_t X, int64_t* ld) const {
  const DType d = dt(a);
  return (d == DType::kFloat32 || d == DType::kBFloat16 || d == DType::kFloat16) && dense_row(a, ld) == X;
}

// The dtype the GEMM reads a matmul operand in: its own when in place, else fp32 (gathered).
cpu::Dtype Program::State::operand_dtype(const Access& a, bool in_place) const {
  if (!in_place) return cpu::Dtype::kFloat32;
  const DType d = dt(a);
  return d == DType::kFloat32 ? cpu::Dtype::kFloat32 : d == DType::kBFloat16 ? cpu::Dtype::kBFloat16 : cpu::Dtype::kFloat16;
}

// nc_matmul's operand as the GEMM's: stationary S [K, M] is A transposed (A[m, k] = S[k, m]),
// moving V [K, N] is B. fp32/bf16/fp16 tiles whose partitions hold contiguous elements are read
// in place; anything else is gathered to fp32 into buf[slot] first.
cpu::MatrixRef Program::State::matmul_operand(const Access& a, int64_t X, bool stationary, int slot) {
  int64_t ld = X;
  const bool in_place = in_place_operand(a, X, &ld);
  const cpu::Dtype kind = operand_dtype(a, in_place);
  const void* data = nullptr;
  if (in_place) {
    data = base(a.tensor) + a.offset * dtype_size(dt(a));
  } else {
    data = gather(a, slot);
    ld = X;
  }
  return stationary ? cpu::MatrixRef{data, kind, 1, ld} : cpu::MatrixRef{data, kind, ld, 1};
}

namespace {

bool has_dynamic_index(const Instr& in) {
  for (const Access& a : in.args) {
    if (a.present() && a.index.present()) return true;
  }
  return false;
}

bool same_access(const Access& x, const Access& y) {
  return x.tensor == y.tensor && x.offset == y.offset && same_dims(x.dims, y.dims);
}

}  // namespace

// Whether instruction `at`, right after the matmuls first..at-1, adds to first's PSUM tile as
// the next term of one K sum: a matmul into the same access that accumulates (None or True:
// every element is written by then), with operands of first's dtypes and no fresh memory
// coming alive before it (prepare() would fill it after the earlier terms read theirs).
// Only matmuls follow first, and they write PSUM only, so nothing in between changes an operand.
bool Program::State::continues_matmul_chain(const Instr& first, size_t at) const {
  const Instr& in = p.k_.instrs[at];
  if (in.op != Op::kMatmul || has_dynamic_index(in) || !p.alloc_at_[at].empty()) return false;
  if (int_attr(in, "accumulate", -1) == 0 || int_attr(in, "is_transpose", 0) != int_attr(first, "is_transpose", 0)) {
    return false;
  }
  return same_access(in.args[0], first.args[0]) && dt(in.args[1]) == dt(first.args[1]) &&
         dt(in.args[2]) == dt(first.args[2]);
}

size_t Program::State::run_matmuls(size_t i) {
  const std::vector<Instr>& code = p.k_.instrs;
  if (has_dynamic_index(code[i])) {
    run(code[i]);
    return 1;
  }
  size_t n = 1;
  while (i + n < code.size() && continues_matmul_chain(code[i], i + n)) ++n;
  ++version_[code[i].args[0].tensor];  // as exec() counts a write
  const size_t ran = matmul(&code[i], n);
  for (size_t j = 1; j < ran; ++j) ++version_[code[i + j].args[0].tensor];
  return ran;
}

// PSUM[M, N] (+)= S.T @ V on the host's GEMM (cpu/gemm.h): exact products of 16-bit operands,
// fp32 sums, as the PE array computes them. in[1..n) may continue in[0]'s K sum
// (continues_matmul_chain); they run with it as one GEMM while PSUM is updated in place, and as
// many as ran is returned (at least 1).
size_t Program::State::matmul(const Instr* in, size_t n) {
  const Access &dst = in[0].args[0], &st = in[0].args[1];
  const int64_t M = st.free_elements(), N = in[0].args[2].free_elements();
  // Straight into an fp32 PSUM tile when every element of it is in the same state (all fresh:
  // overwrite; all written, or accumulate=True: add), else through R.
  std::vector<float>& R = buf[3];
  float* out = nullptr;
  int64_t ldo = N;
  bool add = false;
  int64_t ldd = 0;
  if (float* d = const_cast<float*>(dense_f32(dst, &ldd))) {
    const int64_t acc_mode = int_attr(in[0], "accumulate", -1);
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
    n = 1;
    R.resize(M * N);
    out = R.data();
  }
  // One term per matmul. Operand tiles are often the same SBUF data for many matmuls (a column
  // block of b against every row block of a, a row block of a.T against every column block): a
  // tile read in place is packed once per version of its tensor, the terms' tiles together over
  // the host's threads. Entries are keyed by where the tile starts in the arena: tiles that take
  // over a place take over its entry, so a program holds about one SBUF of packed tiles however
  // many it loads.
  const auto key_of = [&](const Access& x) {
    const TensorDecl& decl = p.k_.tensors[x.tensor];
    return decl.external < 0 ? p.offset_[x.tensor] + x.offset * static_cast<int64_t>(dtype_size(decl.dtype))
                             : -1 - ((static_cast<int64_t>(x.tensor) << 40) ^ x.offset);
  };
  const auto holds = [&](const auto& e, const Access& x) {
    return e.tensor == x.tensor && e.version == version_[x.tensor] && e.offset == x.offset && same_dims(e.dims, x.dims);
  };
  const auto take = [&](auto& e, const Access& x) {
    e.tensor = x.tensor, e.version = version_[x.tensor], e.offset = x.offset, e.dims = x.dims;
  };
  const cpu::GemmOptions options = cpu::default_gemm_options(&host_parallel_for(), add);
  std::vector<cpu::GemmTerm>& terms = terms_;
  std::vector<cpu::PackAJob>& a_jobs = pack_a_jobs_;
  std::vector<cpu::PackBJob>& b_jobs = pack_b_jobs_;
  terms.clear();
  a_jobs.clear();
  b_jobs.clear();
  for (size_t j = 0; j < n; ++j) {
    const Access &sj = in[j].args[1], &mv = in[j].args[2];
    const int64_t K = sj.partitions();
    // Later terms are read in place only (a gathered one would share buf[1] with the first).
    int64_t ld = 0;
    const bool a_in_place = in_place_operand(sj, M, &ld);
    if (j > 0 && !a_in_place) break;
    const cpu::MatrixRef a = matmul_operand(sj, M, true, 1);
    const bool b_in_place = in_place_operand(mv, N, &ld);
    PackedTile<cpu::PackedB>& pm = p.packed_moving_[key_of(mv)];
    if (!(holds(pm, mv) && pm.packed.path == options.path && pm.packed.a_dtype == a.dtype && pm.packed.K == K &&
          pm.packed.N == N)) {
      bool in_use = false;  // by an earlier term of this sum (the same key, another view)
      for (const cpu::GemmTerm& t : terms) in_use = in_use || t.b == &pm.packed;
      if (in_use) break;
      const cpu::MatrixRef b = matmul_operand(mv, N, false, 2);
      if (b_in_place) {
        b_jobs.push_back({K, N, b, a.dtype, &pm.packed});
      } else {  // gathered into buf[2]: packed before the next term's gather reuses it
        cpu::pack_b(K, N, b, a.dtype, options.path, pm.packed);
      }
      take(pm, mv);
    }
    const cpu::PackedA* packed_a = nullptr;  // a gathered stationary is packed by the GEMM itself
    if (a_in_place) {
      const cpu::Dtype b_dtype = operand_dtype(mv, b_in_place);
      PackedTile<cpu::PackedA>& ps = p.packed_stationary_[key_of(sj)];
      if (!(holds(ps, sj) && ps.packed.path == options.path && ps.packed.a_dtype == a.dtype &&
            ps.packed.b_dtype == b_dtype && ps.packed.M == M && ps.packed.K == K)) {
        bool in_use = false;
        for (const cpu::GemmTerm& t : terms) in_use = in_use || t.packed_a == &ps.packed;
        if (in_use) break;
        a_jobs.push_back({M, K, a, b_dtype, &ps.packed});
        take(ps, sj);
      }
      packed_a = &ps.packed;
    }
    terms.push_back({a, &pm.packed, packed_a});
  }
  cpu::pack_a(a_jobs, options.path, &host_parallel_for());
  cpu::pack_b(b_jobs, options.path, &host_parallel_for());
  cpu::gemm_sum(M, terms, out, ldo, options);
  if (!direct) accumulate_psum(in[0], dst, R, M, N);
  return terms.size();
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
