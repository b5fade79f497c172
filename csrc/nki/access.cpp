// Gather/scatter: an access's elements between simulated memory and dense buffers (fp32,
// int64 or raw bytes, in access order), copies between accesses, and run-time offsets.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "cpu/transpose.h"
#include "nki/executor.h"
#include "nki/numerics.h"

namespace neuron::nki {

float* Program::State::gather(const Access& a, int slot) {
  std::vector<float>& v = buf[slot];
  v.resize(a.elements());
  const DType d = dt(a);
  const size_t es = dtype_size(d);
  uint8_t* b = base(a.tensor);
  for_runs(a, [&](int64_t off, int64_t stride, int64_t n, int64_t at) { decode_run(d, b + off * es, stride, n, v.data() + at); });
  return v.data();
}

void Program::State::scatter(const Access& a, const float* in) {
  const DType d = dt(a);
  const size_t es = dtype_size(d);
  uint8_t* b = base(a.tensor);
  for_runs(a, [&](int64_t off, int64_t stride, int64_t n, int64_t at) { encode_run(d, in + at, n, b + off * es, stride); });
}

int64_t* Program::State::gather_int(const Access& a, std::vector<int64_t>& v) {
  v.resize(a.elements());
  const DType d = dt(a);
  const size_t es = dtype_size(d);
  uint8_t* b = base(a.tensor);
  for_runs(a, [&](int64_t off, int64_t stride, int64_t n, int64_t at) { decode_int_run(d, b + off * es, stride, n, v.data() + at); });
  return v.data();
}

void Program::State::scatter_int(const Access& a, const int64_t* in, bool wrap) {
  const DType d = dt(a);
  const size_t es = dtype_size(d);
  uint8_t* b = base(a.tensor);
  for_runs(a, [&](int64_t off, int64_t stride, int64_t n, int64_t at) { encode_int_run(d, in + at, n, b + off * es, stride, wrap); });
}

void Program::State::gather_raw(const Access& a, std::vector<uint8_t>& out) {
  const size_t es = dtype_size(dt(a));
  if (a.index.present()) {  // a vector index (indirect dma_transpose; exec_dynamic checked the rows)
    out.clear();
    std::vector<uint8_t> row_bytes;
    int64_t v;
    for (int64_t w = 0; w < a.dims[0].size; ++w) {
      gather_raw(resolved(a, w, &v), row_bytes);
      out.insert(out.end(), row_bytes.begin(), row_bytes.end());
    }
    return;
  }
  out.resize(a.elements() * es);
  const uint8_t* b = base(a.tensor);
  for_runs(a, [&](int64_t off, int64_t stride, int64_t n, int64_t at) {
    for (int64_t i = 0; i < n; ++i) std::memcpy(out.data() + (at + i) * es, b + (off + i * stride) * es, es);
  });
}

void Program::State::scatter_raw(const Access& a, const std::vector<uint8_t>& in) {
  const size_t es = dtype_size(dt(a));
  uint8_t* b = base(a.tensor);
  for_runs(a, [&](int64_t off, int64_t stride, int64_t n, int64_t at) {
    for (int64_t i = 0; i < n; ++i) std::memcpy(b + (off + i * stride) * es, in.data() + (at + i) * es, es);
  });
}

namespace {

// The dims of an access that are not 1, outermost first.
std::vector<Dim> squeezed(const Access& a) {
  std::vector<Dim> d;
  for (const Dim& x : a.dims) {
    if (x.size != 1) d.push_back(x);
  }
  return d;
}

// For a same-dtype copy between two accesses of one shape (dims of size 1 dropped): the source's and
// the destination's densest dims when they differ, i.e. when the copy transposes and copying it in
// blocks pays; nullopt otherwise.
std::optional<std::pair<size_t, size_t>> transposed_dims(const Access& src, const Access& dst,
                                                         const std::vector<Dim>& sd, const std::vector<Dim>& dd) {
  if (src.tensor == dst.tensor || src.index.present() || dst.index.present()) return std::nullopt;
  if (sd.size() < 2 || sd.size() != dd.size()) return std::nullopt;
  size_t x = 0, y = 0;
  for (size_t i = 0; i < sd.size(); ++i) {
    if (sd[i].size != dd[i].size) return std::nullopt;
    if (std::llabs(sd[i].stride) < std::llabs(sd[x].stride)) x = i;
    if (std::llabs(dd[i].stride) < std::llabs(dd[y].stride)) y = i;
  }
  if (x == y) return std::nullopt;
  return std::make_pair(x, y);
}

// Copies of at least this many elements split over the host's threads (a 128 x 512 fp32 tile).
constexpr int64_t kParallelCopyElements = int64_t{1} << 16;

}  // namespace

bool Program::State::overlap(const Access& a, const Access& b) const {
  const auto [alo, ahi] = a.span();
  const auto [blo, bhi] = b.span();
  const size_t as = dtype_size(dt(a)), bs = dtype_size(dt(b));
  const uint8_t* a0 = base(a.tensor) + alo * as;
  const uint8_t* a1 = base(a.tensor) + (ahi + 1) * as;
  const uint8_t* b0 = base(b.tensor) + blo * bs;
  const uint8_t* b1 = base(b.tensor) + (bhi + 1) * bs;
  return a0 < b1 && b0 < a1;
}

template <class E>
void Program::State::copy_raw_as(const Access& dst, const Access& src) {
  const std::vector<Dim> sd = squeezed(src), dd = squeezed(dst);
  if (const auto xy = transposed_dims(src, dst, sd, dd)) {
    // A transposing copy: the source's densest dim (x) is not the destination's (y). Element by
    // element in row order would touch a new cache line per element on one side; 8 x 8 blocks
    // over (x, y) keep both sides in cache. 8: rows on both sides are often 4 KiB multiples apart
    // (the same L1 set), so a block may use at most 8 lines per side.
    const auto [x, y] = *xy;
    const size_t nd = sd.size();
    std::vector<size_t> rest;
    int64_t outer = 1;
    for (size_t i = 0; i < nd; ++i) {
      if (i != x && i != y) rest.push_back(i), outer *= sd[i].size;
    }
    const E* sb = reinterpret_cast<const E*>(base(src.tensor)) + src.offset;
    E* db = reinterpret_cast<E*>(base(dst.tensor)) + dst.offset;
    constexpr int64_t kB = 8;
    // Tasks are (outer index, strip of kB along x): disjoint destination elements, so large copies
    // (a matmul's a.T loads) split over the host's threads.
    const int64_t strips = (sd[x].size + kB - 1) / kB;
    // Unit strides on both dense dims, 4-byte elements (fp32 / int32 tiles): cpu/transpose.h, in
    // SIMD registers where the host has them.
    const bool unit = sizeof(E) == 4 && sd[x].stride == 1 && dd[y].stride == 1;
    const auto body = [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        int64_t r = t / strips, so = 0, dof = 0;
        for (size_t k = rest.size(); k-- > 0;) {
          const int64_t i = r % sd[rest[k]].size;
          r /= sd[rest[k]].size;
          so += i * sd[rest[k]].stride, dof += i * dd[rest[k]].stride;
        }
        const int64_t x0 = (t % strips) * kB, x1 = std::min(sd[x].size, x0 + kB);
        if (unit) {
          cpu::transpose32(reinterpret_cast<const uint32_t*>(sb + so + x0), sd[y].stride,
                           reinterpret_cast<uint32_t*>(db + dof + x0 * dd[x].stride), dd[x].stride, x1 - x0,
                           sd[y].size);
          continue;
        }
        for (int64_t y0 = 0; y0 < sd[y].size; y0 += kB) {
          const int64_t y1 = std::min(sd[y].size, y0 + kB);
          for (int64_t a = x0; a < x1; ++a) {
            for (int64_t b = y0; b < y1; ++b) {
              db[dof + a * dd[x].stride + b * dd[y].stride] = sb[so + a * sd[x].stride + b * sd[y].stride];
            }
          }
        }
      }
    };
    const int64_t tasks = outer * strips;
    if (tasks > 1 && src.elements() >= kParallelCopyElements && !overlap(src, dst)) {
      host_parallel_for()(tasks, body);
    } else {
      body(0, tasks);
    }
    return;
  }
  std::vector<E> tmp(src.elements());
  const E* sb = reinterpret_cast<const E*>(base(src.tensor));
  for_runs(src, [&](int64_t off, int64_t stride, int64_t n, int64_t at) {
    for (int64_t i = 0; i < n; ++i) tmp[at + i] = sb[off + i * stride];
  });
  E* db = reinterpret_cast<E*>(base(dst.tensor));
  for_runs(dst, [&](int64_t off, int64_t stride, int64_t n, int64_t at) {
    for (int64_t i = 0; i < n; ++i) db[off + i * stride] = tmp[at + i];
  });
}

// Same-dtype copy: bits move unchanged (integers above 2**24, NaN payloads).
void Program::State::copy_raw(const Access& dst, const Access& src) {
  switch (dtype_size(dt(src))) {  // element-typed loops for the strided runs (transposing DMAs)
    case 4: return copy_raw_as<uint32_t>(dst, src);
    case 2: return copy_raw_as<uint16_t>(dst, src);
    default: return copy_raw_as<uint8_t>(dst, src);
  }
}

int64_t Program::State::dense_row(const Access& a, int64_t* ld) {
  if (a.dims.empty()) return -1;
  int64_t expect = 1;
  for (size_t i = a.dims.size() - 1; i >= 1; --i) {
    if (a.dims[i].size != 1 && a.dims[i].stride != expect) return -1;
    expect *= a.dims[i].size;
  }
  *ld = a.dims[0].size == 1 ? expect : a.dims[0].stride;
  return expect;
}

void Program::State::copy(const Access& dst, const Access& src) {
  int64_t lds = 0, ldd = 0;
  const int64_t ns = dense_row(src, &lds), nd = dense_row(dst, &ldd);
  // Row by row without staging, unless source and destination share a tensor (they may overlap).
  if (ns > 0 && ns == nd && src.dims[0].size == dst.dims[0].size && src.tensor != dst.tensor) {
    const DType sd = dt(src), dd = dt(dst);
    const size_t ss = dtype_size(sd), ds = dtype_size(dd);
    const uint8_t* sp = base(src.tensor) + src.offset * ss;
    uint8_t* dp = base(dst.tensor) + dst.offset * ds;
    const int64_t rows = src.dims[0].size;
    if (sd == dd) {
      const auto body = [&](int64_t p0, int64_t p1) {
        for (int64_t p = p0; p < p1; ++p) std::memmove(dp + p * ldd * ds, sp + p * lds * ss, ns * ss);
      };
      // Large copies split their rows over the host's threads, unless the two sides share bytes
      // (an alias of the other tensor), where the rows' order matters.
      if (rows > 1 && rows * ns >= kParallelCopyElements && !overlap(src, dst)) {
        host_parallel_for()(rows, body);
      } else {
        body(0, rows);
      }
      return;
    }
    std::vector<float>& row = buf[5];
    row.resize(ns);
    for (int64_t p = 0; p < rows; ++p) {
      decode_run(sd, sp + p * lds * ss, 1, ns, row.data());
      encode_run(dd, row.data(), ns, dp + p * ldd * ds, 1);
    }
    return;
  }
  if (dt(dst) == dt(src)) return copy_raw(dst, src);
  scatter(dst, gather(src, 0));
}

std::vector<float> Program::State::column(const Access& a, double imm, int64_t P, int slot) {
  std::vector<float> c(P, static_cast<float>(imm));
  if (a.present()) {
    const float* v = gather(a, slot);
    std::copy(v, v + P, c.begin());
  }
  return c;
}

const float* Program::State::dense_f32(const Access& a, int64_t* ld) {
  if (dt(a) != DType::kFloat32 || dense_row(a, ld) < 0) return nullptr;
  return reinterpret_cast<const float*>(base(a.tensor)) + a.offset;
}

// Run-time offsets (DynamicIndex): the offsets are read when the instruction runs, which then
// runs with static ones; a vector index, one row per value. An offset that puts the access
// outside its tensor raises, or (dma_copy's oob_mode.skip) skips the instruction / row.
int64_t Program::State::index_value(const DynamicIndex& ix, int64_t i) {
  const DType d = p.k_.tensors[ix.tensor].dtype;
  int64_t v = 0;
  decode_int_run(d, base(ix.tensor) + (ix.offset + i * ix.step) * dtype_size(d), 1, 1, &v);
  return v;
}

bool Program::State::in_bounds(const Access& a) const {
  const auto [lo, hi] = a.span();
  return lo >= 0 && hi < p.k_.tensors[a.tensor].elements();
}

// The access with its run-time index applied: the whole access for a scalar index, row w of
// dims[0] for a vector one. *value is the index read.
Access Program::State::resolved(const Access& a, int64_t w, int64_t* value) {
  Access r = a;
  *value = index_value(a.index, a.index.vector ? w : 0);
  r.offset += *value * a.index.stride;
  if (a.index.vector) r.dims[0].size = 1;
  r.index = {};
  return r;
}

void Program::State::out_of_bounds(const Instr& in, const Access& a, int64_t value) const {
  const TensorDecl& t = p.k_.tensors[a.tensor];
  throw std::out_of_range(in.loc.file + ":" + std::to_string(in.loc.line) + ": " + op_name(in.op) +
                          ": the run-time offset " + std::to_string(value) + " puts the access to '" + t.name +
                          "' outside the tensor (" + std::to_string(t.elements()) + " elements)" +
                          (in.op == Op::kDmaCopy ? "; nisa.dma_copy(..., oob_mode=nisa.oob_mode.skip) skips such "
                                                   "accesses"
                                                 : ""));
}

}  // namespace neuron::nki
