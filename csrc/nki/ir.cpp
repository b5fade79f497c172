#include "nki/ir.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "nki/numerics.h"
#include "runtime/platform.h"

namespace neuron::nki {

size_t dtype_size(DType d) {
  switch (d) {
    case DType::kFloat32: case DType::kTFloat32: case DType::kInt32: case DType::kUInt32: return 4;
    case DType::kBFloat16: case DType::kFloat16: case DType::kInt16: case DType::kUInt16: return 2;
    default: return 1;
  }
}

const char* dtype_name(DType d) {
  static const char* names[] = {"float32", "bfloat16", "float16", "tfloat32", "float8_e4m3", "float8_e4m3fn",
                                "float8_e5m2", "int8", "uint8", "int16", "uint16", "int32", "uint32", "bool_"};
  return names[static_cast<int>(d)];
}

bool is_float(DType d) { return static_cast<int>(d) <= static_cast<int>(DType::kFloat8E5M2); }
bool is_fp8(DType d) { return d == DType::kFloat8E4M3 || d == DType::kFloat8E4M3FN || d == DType::kFloat8E5M2; }

const char* buffer_name(Buffer b) {
  switch (b) {
    case Buffer::kPrivateHbm: return "hbm";
    case Buffer::kSharedHbm: return "shared_hbm";
    case Buffer::kSbuf: return "sbuf";
    case Buffer::kPsum: return "psum";
  }
  return "?";
}

const char* op_name(Op op) {
  static const char* names[] = {
      "dma_copy", "tensor_copy", "memset", "iota", "nc_matmul", "nc_transpose", "tensor_tensor", "tensor_scalar",
      "activation", "tensor_reduce", "tensor_tensor_scan", "affine_select", "bn_stats", "bn_aggr", "max8",
      "nc_find_index8", "reciprocal", "tensor_partition_reduce", "scalar_tensor_tensor", "select",
      "tensor_copy_predicated", "select_reduce", "range_select", "tensor_scalar_reduce", "tensor_scalar_cumulative",
      "exponential", "activate2", "nc_match_replace8", "nc_stream_shuffle", "dma_transpose", "nc_n_gather",
      "local_gather", "nonzero_with_count", "dma_compute", "sendrecv", "core_barrier",
      "device_print"};
  static_assert(sizeof(names) / sizeof(names[0]) == kNumOps, "one name per Op");
  return names[static_cast<int>(op)];
}

bool alu_is_bitvec(Alu a) {
  return a == Alu::kBitwiseAnd || a == Alu::kBitwiseOr || a == Alu::kBitwiseXor || a == Alu::kLeftShift ||
         a == Alu::kRightShift;
}

int64_t TensorDecl::elements() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

int64_t TensorDecl::partition_elements() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

int64_t Access::elements() const {
  int64_t n = 1;
  for (const Dim& d : dims) n *= d.size;
  return n;
}

int64_t Access::free_elements() const {
  int64_t n = 1;
  for (size_t i = 1; i < dims.size(); ++i) n *= dims[i].size;
  return n;
}

std::pair<int64_t, int64_t> Access::span() const {
  int64_t lo = offset, hi = offset;
  for (const Dim& d : dims) (d.stride < 0 ? lo : hi) += (d.size - 1) * d.stride;
  return {lo, hi};
}

LiveRanges live_ranges(const Kernel& k) {
  LiveRanges r{std::vector<int>(k.tensors.size(), -1), std::vector<int>(k.tensors.size(), -1)};
  for (size_t i = 0; i < k.instrs.size(); ++i) {
    for (const Access& a : k.instrs[i].args) {
      if (!a.present()) continue;
      // A run-time index is read by the instruction too; an alias uses its base's memory.
      for (int t : {a.tensor, a.index.tensor, k.tensors[a.tensor].alias}) {
        if (t < 0) continue;
        if (r.first[t] < 0) r.first[t] = static_cast<int>(i);
        r.last[t] = static_cast<int>(i);
      }
    }
  }
  return r;
}

Target target_for(const std::string& name) {
  const rt::ChipFacts* c = rt::find_chip(name);
  if (c == nullptr) throw std::invalid_argument("unknown NKI target '" + name + "': expected trn1, inf2, trn2 or trn3");
  return Target{c->name,
                c->nc_version,
                static_cast<int64_t>(c->sbuf_partition_bytes),
                static_cast<int64_t>(c->psum_partition_bytes),
                static_cast<int64_t>(c->psum_bank_bytes),
                c->partitions,
                c->gemm_moving_fmax,
                c->gemm_moving_fmax_bf16};
}

void decode_run(DType d, const uint8_t* p, int64_t stride, int64_t n, float* out) {
  const int64_t step = stride * static_cast<int64_t>(dtype_size(d));
  switch (d) {
    case DType::kFloat32:
    case DType::kTFloat32:
      if (stride == 1) {
        std::memcpy(out, p, n * 4);
      } else {
        for (int64_t i = 0; i < n; ++i) std::memcpy(out + i, p + i * step, 4);
      }
      return;
    case DType::kBFloat16:
      if (stride == 1) {  // a plain loop the compiler vectorizes
        const uint16_t* h = reinterpret_cast<const uint16_t*>(p);
        uint32_t* o = reinterpret_cast<uint32_t*>(out);
        for (int64_t i = 0; i < n; ++i) o[i] = static_cast<uint32_t>(h[i]) << 16;
        return;
      }
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + i * step, 2);
        out[i] = bf16_to_float(h);
      }
      return;
    case DType::kFloat16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + i * step, 2);
        out[i] = decode_minifloat(h, kF16);
      }
      return;
    case DType::kFloat8E4M3: case DType::kFloat8E4M3FN: case DType::kFloat8E5M2: {
      static const auto table = [] {
        struct T { float v[3][256]; } t{};
        for (int c = 0; c < 256; ++c) {
          t.v[0][c] = decode_minifloat(c, kE4M3);
          t.v[1][c] = decode_minifloat(c, kE4M3FN);
          t.v[2][c] = decode_minifloat(c, kE5M2);
        }
        return t;
      }();
      const float* tab = table.v[d == DType::kFloat8E4M3 ? 0 : d == DType::kFloat8E4M3FN ? 1 : 2];
      for (int64_t i = 0; i < n; ++i) out[i] = tab[p[i * step]];
      return;
    }
    case DType::kInt8: for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int8_t>(p[i * step]); return;
    case DType::kUInt8: case DType::kBool: for (int64_t i = 0; i < n; ++i) out[i] = p[i * step]; return;
    case DType::kInt16:
      for (int64_t i = 0; i < n; ++i) { int16_t v; std::memcpy(&v, p + i * step, 2); out[i] = v; }
      return;
    case DType::kUInt16:
      for (int64_t i = 0; i < n; ++i) { uint16_t v; std::memcpy(&v, p + i * step, 2); out[i] = v; }
      return;
    case DType::kInt32:
      for (int64_t i = 0; i < n; ++i) { int32_t v; std::memcpy(&v, p + i * step, 4); out[i] = static_cast<float>(v); }
      return;
    case DType::kUInt32:
      for (int64_t i = 0; i < n; ++i) { uint32_t v; std::memcpy(&v, p + i * step, 4); out[i] = static_cast<float>(v); }
      return;
  }
}

void encode_run(DType d, const float* in, int64_t n, uint8_t* p, int64_t stride) {
  const int64_t step = stride * static_cast<int64_t>(dtype_size(d));
  switch (d) {
    case DType::kFloat32:
      if (stride == 1) {
        std::memcpy(p, in, n * 4);
      } else {
        for (int64_t i = 0; i < n; ++i) std::memcpy(p + i * step, in + i, 4);
      }
      return;
    case DType::kTFloat32:
      for (int64_t i = 0; i < n; ++i) { float v = tf32_round(in[i]); std::memcpy(p + i * step, &v, 4); }
      return;
    case DType::kBFloat16:
      if (stride == 1) {  // branch-free, so the compiler vectorizes it
        uint16_t* o = reinterpret_cast<uint16_t*>(p);
        const uint32_t* b = reinterpret_cast<const uint32_t*>(in);
        for (int64_t i = 0; i < n; ++i) {
          const uint32_t x = b[i];
          const uint16_t rounded = static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
          const uint16_t nan = static_cast<uint16_t>((x >> 16) | 0x40u);
          o[i] = (x & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
        }
        return;
      }
      for (int64_t i = 0; i < n; ++i) { uint16_t h = float_to_bf16(in[i]); std::memcpy(p + i * step, &h, 2); }
      return;
    case DType::kFloat16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h = static_cast<uint16_t>(encode_minifloat(in[i], kF16));
        std::memcpy(p + i * step, &h, 2);
      }
      return;
    case DType::kFloat8E4M3: for (int64_t i = 0; i < n; ++i) p[i * step] = encode_minifloat(in[i], kE4M3); return;
    case DType::kFloat8E4M3FN: for (int64_t i = 0; i < n; ++i) p[i * step] = encode_minifloat(in[i], kE4M3FN); return;
    case DType::kFloat8E5M2: for (int64_t i = 0; i < n; ++i) p[i * step] = encode_minifloat(in[i], kE5M2); return;
    case DType::kInt8: for (int64_t i = 0; i < n; ++i) p[i * step] = static_cast<uint8_t>(saturate_round<int8_t>(in[i])); return;
    case DType::kUInt8: for (int64_t i = 0; i < n; ++i) p[i * step] = saturate_round<uint8_t>(in[i]); return;
    case DType::kBool: for (int64_t i = 0; i < n; ++i) p[i * step] = in[i] != 0.0f; return;
    case DType::kInt16:
      for (int64_t i = 0; i < n; ++i) { int16_t v = saturate_round<int16_t>(in[i]); std::memcpy(p + i * step, &v, 2); }
      return;
    case DType::kUInt16:
      for (int64_t i = 0; i < n; ++i) { uint16_t v = saturate_round<uint16_t>(in[i]); std::memcpy(p + i * step, &v, 2); }
      return;
    case DType::kInt32:
      for (int64_t i = 0; i < n; ++i) { int32_t v = saturate_round<int32_t>(in[i]); std::memcpy(p + i * step, &v, 4); }
      return;
    case DType::kUInt32:
      for (int64_t i = 0; i < n; ++i) { uint32_t v = saturate_round<uint32_t>(in[i]); std::memcpy(p + i * step, &v, 4); }
      return;
  }
}

void decode_int_run(DType d, const uint8_t* p, int64_t stride, int64_t n, int64_t* out) {
  const int64_t step = stride * static_cast<int64_t>(dtype_size(d));
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* e = p + i * step;
    switch (d) {
      case DType::kInt8: out[i] = static_cast<int8_t>(*e); break;
      case DType::kUInt8: case DType::kBool: out[i] = *e; break;
      case DType::kInt16: { int16_t v; std::memcpy(&v, e, 2); out[i] = v; break; }
      case DType::kUInt16: { uint16_t v; std::memcpy(&v, e, 2); out[i] = v; break; }
      case DType::kInt32: { int32_t v; std::memcpy(&v, e, 4); out[i] = v; break; }
      case DType::kUInt32: { uint32_t v; std::memcpy(&v, e, 4); out[i] = v; break; }
      default: { float f; decode_run(d, e, 1, 1, &f); out[i] = static_cast<int64_t>(std::nearbyint(f)); }
    }
  }
}

void encode_int_run(DType d, const int64_t* in, int64_t n, uint8_t* p, int64_t stride, bool wrap) {
  const int64_t step = stride * static_cast<int64_t>(dtype_size(d));
  auto put = [&](auto tag, int64_t v, uint8_t* e) {
    using T = decltype(tag);
    T x;
    if (wrap) {
      x = static_cast<T>(v);
    } else {
      x = static_cast<T>(std::clamp<int64_t>(v, std::numeric_limits<T>::min(), std::numeric_limits<T>::max()));
    }
    std::memcpy(e, &x, sizeof(T));
  };
  for (int64_t i = 0; i < n; ++i) {
    uint8_t* e = p + i * step;
    switch (d) {
      case DType::kInt8: put(int8_t{}, in[i], e); break;
      case DType::kUInt8: put(uint8_t{}, in[i], e); break;
      case DType::kBool: *e = in[i] != 0; break;
      case DType::kInt16: put(int16_t{}, in[i], e); break;
      case DType::kUInt16: put(uint16_t{}, in[i], e); break;
      case DType::kInt32: put(int32_t{}, in[i], e); break;
      case DType::kUInt32: put(uint32_t{}, in[i], e); break;
      default: { float f = static_cast<float>(in[i]); encode_run(d, &f, 1, e, 1); }
    }
  }
}

}  // namespace neuron::nki
