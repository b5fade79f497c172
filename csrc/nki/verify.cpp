// The hardware-limit verifier: every rule a NeuronCore enforces (or that its compiler
// rejects), checked on the traced program before it runs. Rule names are stable; docs/nki.md
// lists them.
#include <algorithm>
#include <sstream>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "nki/ir.h"

namespace neuron::nki {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream o;
  o << "[";
  for (size_t i = 0; i < s.size(); ++i) o << (i ? ", " : "") << s[i];
  o << "]";
  return o.str();
}

std::string access_shape(const Access& a) {
  std::vector<int64_t> s;
  for (const Dim& d : a.dims) s.push_back(d.size);
  return shape_str(s);
}

class Verifier {
 public:
  explicit Verifier(const Kernel& k) : k_(k) {}

  void run() {
    for (const TensorDecl& t : k_.tensors) check_decl(t);
    for (const Instr& recorded : k_.instrs) {
      cur_ = &recorded;
      // What the instruction holds must fit its row of the op table before anything reads it
      // by name; optional operands left off the end are absent.
      const std::string problem = layout_problem(recorded);
      if (!problem.empty()) fail("instr-layout", problem);
      const std::string bad_code = code_problem(recorded);
      if (!bad_code.empty()) fail("ir-code", bad_code);
      std::optional<Instr> padded;
      const size_t n_operands = op_info(recorded.op).operands.size();
      if (recorded.args.size() < n_operands && op_info(recorded.op).operands.back().arity != Arity::kVariadic) {
        padded = recorded;
        padded->args.resize(n_operands);
      }
      const Instr& in = padded ? *padded : recorded;
      cur_ = &in;
      for (size_t i = 0; i < in.args.size(); ++i) {
        if (in.args[i].present()) check_access(in.args[i], i);
      }
      check_instr(in);
    }
    cur_ = nullptr;
    check_capacity();
  }

 private:
  [[noreturn]] void fail(const std::string& rule, const std::string& msg, const Loc* loc = nullptr) const {
    std::string full = cur_ ? std::string(op_name(cur_->op)) + ": " + msg : msg;
    throw VerifyError(rule, full, loc ? *loc : (cur_ ? cur_->loc : Loc{}));
  }

  const TensorDecl& decl(const Access& a) const { return k_.tensors.at(a.tensor); }
  Buffer buf(const Access& a) const { return decl(a).buffer; }
  DType dt(const Access& a) const { return decl(a).dtype; }
  std::string describe(const Access& a) const {
    const TensorDecl& t = decl(a);
    return (t.name.empty() ? std::string("a tensor") : "'" + t.name + "'") + " (" + access_shape(a) + " in " +
           buffer_name(t.buffer) + ")";
  }

  void check_decl(const TensorDecl& t) {
    // Codes first: everything below reads them as enum values.
    if (static_cast<int>(t.dtype) >= kNumDTypes) {
      fail("ir-code", "tensor '" + t.name + "' has dtype code " + std::to_string(static_cast<int>(t.dtype)) +
                          ", which is not a dtype (codes 0.." + std::to_string(kNumDTypes - 1) + ")", &t.loc);
    }
    if (static_cast<int>(t.buffer) >= kNumBuffers) {
      fail("ir-code", "tensor '" + t.name + "' has memory code " + std::to_string(static_cast<int>(t.buffer)) +
                          ", which is not a memory (codes 0.." + std::to_string(kNumBuffers - 1) + ")", &t.loc);
    }
    if (!on_chip(t.buffer)) return;
    const std::string what = "a " + shape_str(t.shape) + " " + dtype_name(t.dtype) + " tensor in " +
                             buffer_name(t.buffer);
    if (t.shape.size() < 2) {
      fail("on-chip-rank", what + " is " + std::to_string(t.shape.size()) +
                               "-D; tensors in SBUF/PSUM have a partition dimension and at least one free "
                               "dimension (use shape (P, F))", &t.loc);
    }
    if (t.shape[0] > k_.target.partitions) {
      fail("partition-limit", what + " has " + std::to_string(t.shape[0]) + " partitions; the first (partition) "
                              "dimension of an on-chip tensor is at most " + std::to_string(k_.target.partitions) +
                              " (nl.tile_size.pmax): tile the data along it", &t.loc);
    }
    const int64_t bytes = t.partition_elements() * static_cast<int64_t>(dtype_size(t.dtype));
    const int64_t cap = t.buffer == Buffer::kSbuf ? k_.target.sbuf_partition_bytes : k_.target.psum_partition_bytes;
    if (bytes > cap) {
      fail(t.buffer == Buffer::kSbuf ? "sbuf-capacity" : "psum-capacity",
           what + " needs " + std::to_string(bytes) + " bytes per partition; " + k_.target.name + " has " +
               std::to_string(cap) + " bytes per partition of " + buffer_name(t.buffer), &t.loc);
    }
  }

  // A run-time index: integers in SBUF; a vector index only on a DMA's HBM side, one value per
  // element of dims[0]. The access itself is checked as if every index were 0; the executor
  // checks the offsets it reads.
  void check_index(const Access& a) {
    const DynamicIndex& ix = a.index;
    if (ix.tensor < 0 || ix.tensor >= static_cast<int32_t>(k_.tensors.size())) {
      fail("dynamic-offset", "an access to " + describe(a) + " names an unknown index tensor");
    }
    const TensorDecl& it = k_.tensors[ix.tensor];
    const std::string what = "the run-time offset of an access to " + describe(a);
    if (it.buffer != Buffer::kSbuf) {
      fail("dynamic-offset", what + " is read from " + buffer_name(it.buffer) + "; offsets are read from SBUF "
                             "(copy them there with nisa.dma_copy)");
    }
    if (is_float(it.dtype)) {
      fail("dynamic-offset", what + " is read from a " + dtype_name(it.dtype) + " tensor; offsets are integers "
                             "(int32 / uint32)");
    }
    const int64_t n = ix.vector ? (a.dims.empty() ? 1 : a.dims[0].size) : 1;
    const int64_t last = ix.offset + (n - 1) * ix.step;
    if (ix.offset < 0 || last >= it.elements()) {
      fail("out-of-bounds", what + " reads " + std::to_string(n) + " value(s) past the end of its index tensor");
    }
    if (ix.vector) {
      const bool transpose = cur_->op == Op::kDmaTranspose;
      if (cur_->op != Op::kDmaCopy && cur_->op != Op::kDmaCompute && !transpose) {
        fail("dynamic-offset", "vector_offset (a per-partition index) is a DMA feature: use it in nisa.dma_copy, "
                               "nisa.dma_compute or nisa.dma_transpose(dge_mode=swdge)");
      }
      if (transpose && (&a != &cur_->args[1] ||
                        static_cast<DgeMode>(int_attr(*cur_, "dge_mode")) != DgeMode::kSwdge)) {
        fail("dynamic-offset", "an indirect dma_transpose indexes its source, with dge_mode=nisa.dge_mode.swdge");
      }
      if (on_chip(decl(a).buffer)) {
        fail("dynamic-offset", what + ": a vector offset indexes an HBM tensor (gather from or scatter into HBM)");
      }
      for (const Access& o : cur_->args) {
        if (transpose) break;  // the destination is the permuted source
        if (o.present() && &o != &a && (o.dims.empty() ? 1 : o.dims[0].size) != n) {
          fail("dynamic-offset", what + " has " + std::to_string(n) + " offsets; the other operand " + describe(o) +
                                 " must have " + std::to_string(n) + " elements in its first dimension too "
                                 "(one row per offset)");
        }
      }
    }
  }

  void check_access(const Access& a, size_t index) {
    if (a.index.present()) {
      check_index(a);
      if (a.index.vector && !a.dims.empty()) {  // dims[0]'s stride is replaced: check one row
        Access row = a;
        row.dims[0].size = 1;
        row.index = {};
        return check_access(row, index);
      }
    }
    const TensorDecl& t = decl(a);
    for (const Dim& d : a.dims) {
      if (d.size <= 0) fail("out-of-bounds", "an access to " + describe(a) + " has an empty dimension");
    }
    const auto [lo, hi] = a.span();
    if (lo < 0 || hi >= t.elements()) {
      fail("out-of-bounds", "an access to " + describe(a) + " reaches element " + std::to_string(lo < 0 ? lo : hi) +
                                " of a tensor of shape " + shape_str(t.shape) + " (" + std::to_string(t.elements()) +
                                " elements)");
    }
    if (on_chip(t.buffer)) {
      const int64_t pe = t.partition_elements();
      if (a.dims.empty()) fail("on-chip-rank", "a 0-D access to " + describe(a));
      if (a.dims[0].size > 1 && a.dims[0].stride != pe) {
        fail("partition-access", "an access to " + describe(a) + " steps " + std::to_string(a.dims[0].stride) +
                                     " elements along the partition dimension; on-chip accesses cover a contiguous "
                                     "range of partitions (the first dimension cannot be strided or permuted)");
      }
      // Within each partition the free pattern must stay inside that partition's row.
      int64_t flo = a.offset % pe, fhi = flo;
      for (size_t i = 1; i < a.dims.size(); ++i) {
        int64_t ext = (a.dims[i].size - 1) * a.dims[i].stride;
        (ext < 0 ? flo : fhi) += ext;
      }
      if (flo < 0 || fhi >= pe) {
        fail("out-of-bounds", "an access to " + describe(a) + " crosses from one partition's free elements into "
                                  "another's (free offsets " + std::to_string(flo) + ".." + std::to_string(fhi) +
                                  " of " + std::to_string(pe) + ")");
      }
    }
    (void)index;
  }

  void need_on_chip(const Access& a, const char* role) const {
    if (a.present() && !on_chip(buf(a))) {
      fail("engine-memory", std::string(role) + " " + describe(a) + " is in HBM; compute engines read and write "
                            "SBUF/PSUM only: move the data with nisa.dma_copy (or nl.load/nl.store) first");
    }
  }
  void need_no_psum_gpsimd(const Instr& in, std::initializer_list<size_t> idx) const {
    for (size_t i : idx) {
      if (i < in.args.size() && in.args[i].present() && buf(in.args[i]) == Buffer::kPsum) {
        fail("gpsimd-psum", describe(in.args[i]) + " is in PSUM, which the GpSimd engine cannot access; use SBUF "
                            "or another engine");
      }
    }
  }
  void same_layout(const Access& a, const Access& b, const char* what) const {
    if (a.partitions() != b.partitions() || a.free_elements() != b.free_elements()) {
      fail("shape-mismatch", std::string(what) + ": " + describe(a) + " and " + describe(b) +
                                 " differ in partitions or in elements per partition");
    }
  }
  void not_both_psum(const Access& a, const Access& b) const {
    if (a.present() && b.present() && buf(a) == Buffer::kPsum && buf(b) == Buffer::kPsum) {
      fail("psum-operands", "both inputs " + describe(a) + " and " + describe(b) + " are in PSUM; at most one "
                            "input of an instruction can be read from PSUM: copy one to SBUF first");
    }
  }
  // A per-partition column an engine reads (bias, scale, reduce_res, ...): on chip, (P, 1).
  void column_of(const Access& v, const Access& data, const char* what) const {
    if (!v.present()) return;
    need_on_chip(v, what);
    if (v.partitions() != data.partitions() || v.free_elements() != 1) {
      fail("shape-mismatch", std::string(what) + " " + describe(v) + " must be a (" +
                                 std::to_string(data.partitions()) + ", 1) column: one value per partition");
    }
  }
  void alu_dtypes(Alu op, std::initializer_list<const Access*> ops) const {
    if (!alu_is_bitvec(op)) return;
    for (const Access* a : ops) {
      if (a->present() && is_float(dt(*a))) {
        fail("dtype", std::string("bitwise operators take integer tensors; ") + describe(*a) + " is " +
                          dtype_name(dt(*a)));
      }
    }
  }

  void dtype_in(const Access& a, const char* what, std::initializer_list<DType> ok) const {
    for (DType d : ok) if (dt(a) == d) return;
    std::string names;
    for (DType d : ok) names += std::string(names.empty() ? "" : ", ") + dtype_name(d);
    fail("dtype", std::string(what) + " " + describe(a) + " is " + dtype_name(dt(a)) + "; it must be one of " + names);
  }
  void float32_operand(const Access& a, const char* what) const {
    if (dt(a) != DType::kFloat32) {
      fail("dtype", std::string(what) + " " + describe(a) + " is " + dtype_name(dt(a)) + "; it must be float32");
    }
  }
  void reduce_op_in(int64_t op, const char* what, std::initializer_list<Alu> ok) const {
    for (Alu a : ok) if (static_cast<int64_t>(a) == op) return;
    fail("alu-op", std::string(what) + " is not an operator this instruction supports");
  }
  void need_version(int v, const char* what) const {
    if (k_.target.nc_version < v) {
      fail("nc-version", std::string(what) + " needs NeuronCore-v" + std::to_string(v) + " (trn3); the kernel is "
                         "traced for " + k_.target.name + " (NeuronCore-v" + std::to_string(k_.target.nc_version) + ")");
    }
  }
  int64_t start_partition(const Access& a) const {
    const int64_t pe = decl(a).partition_elements();
    return pe > 0 ? a.offset / pe : 0;
  }

  void check_dma_transpose(const Instr& in) {
    const Access &dst = in.args[0], &src = in.args[1];
    const DgeMode mode = static_cast<DgeMode>(int_attr(in, "dge_mode"));
    const std::vector<int64_t> axes = int_tail(in, "axes");
    if (buf(dst) != Buffer::kSbuf) {
      fail("dma-transpose", "destination " + describe(dst) + " must be in SBUF");
    }
    if (buf(src) == Buffer::kPsum) {
      fail("dma-psum", "source " + describe(src) + " is in PSUM; DMA cannot access PSUM");
    }
    if (dt(dst) != dt(src)) {
      fail("dma-transpose", std::string("destination dtype ") + dtype_name(dt(dst)) + " must equal the source's " +
                                dtype_name(dt(src)));
    }
    const size_t nd = src.dims.size();
    const std::vector<int64_t> perm = nd == 2 ? std::vector<int64_t>{1, 0} : nd == 3 ? std::vector<int64_t>{2, 1, 0}
                                      : nd == 4 ? std::vector<int64_t>{3, 1, 2, 0} : std::vector<int64_t>{};
    if (perm.empty()) fail("dma-transpose", "source " + describe(src) + " must be 2-D, 3-D or 4-D");
    if (!axes.empty() && axes != perm) {
      std::string p;
      for (int64_t x : perm) p += (p.empty() ? "" : ", ") + std::to_string(x);
      fail("dma-transpose", "axes for a " + std::to_string(nd) + "-D source must be (" + p + ")");
    }
    bool same = dst.dims.size() == nd;
    for (size_t i = 0; same && i < nd; ++i) same = dst.dims[i].size == src.dims[perm[i]].size;
    if (!same) {
      std::vector<int64_t> want;
      for (int64_t x : perm) want.push_back(src.dims[x].size);
      fail("dma-transpose", "destination " + describe(dst) + " must have the permuted source shape " +
                                shape_str(want));
    }
    if (mode == DgeMode::kSwdge && !src.index.present()) {
      fail("dma-transpose", "dge_mode=swdge is the indirect form: give the source a vector_offset (or use unknown, "
                            "hwdge or none)");
    }
    if (mode == DgeMode::kHwdge) {
      if (dtype_size(dt(src)) != 2) {
        fail("dma-transpose", std::string("a hwdge transpose moves 2-byte elements; the source is ") +
                                  dtype_name(dt(src)));
      }
      const int64_t s0 = src.dims[0].size, last = src.dims[nd - 1].size;
      if (nd == 2 && s0 != 16) {
        fail("dma-transpose", "a 2-D hwdge transpose needs src.shape[0] == 16, got " + std::to_string(s0));
      }
      if (nd > 2 && ((s0 != 1 && s0 != 2 && s0 != 4 && s0 != 8 && s0 != 16) || (s0 * src.dims[nd - 2].size) % 16)) {
        fail("dma-transpose", "a " + std::to_string(nd) + "-D hwdge transpose needs src.shape[0] in {1, 2, 4, 8, 16} "
                              "and src.shape[0] * src.shape[-2] a multiple of 16");
      }
      if (last > 128) {
        fail("dma-transpose", "a hwdge transpose needs src.shape[-1] <= 128, got " + std::to_string(last));
      }
    }
  }

  // Instructions whose operators compute in fp32 only (no bitwise operators).
  void arithmetic_only(const Instr& in, std::initializer_list<const char*> ops) const {
    for (const char* name : ops) {
      if (alu_is_bitvec(static_cast<Alu>(int_attr(in, name)))) {
        fail("dtype", "takes arithmetic operators only (computed in fp32); bitwise operators run in "
                      "tensor_tensor / tensor_scalar on integer tensors");
      }
    }
  }

  void check_instr(const Instr& in) {
    const auto& a = in.args;
    switch (in.op) {
      case Op::kDmaCopy:
        for (int i = 0; i < 2; ++i) {
          if (buf(a[i]) == Buffer::kPsum) {
            fail("dma-psum", std::string(i ? "source " : "destination ") + describe(a[i]) + " is in PSUM; DMA "
                             "cannot access PSUM: copy PSUM to SBUF with nisa.tensor_copy first");
          }
        }
        if (a[0].elements() != a[1].elements()) {
          fail("shape-mismatch", "destination " + describe(a[0]) + " and source " + describe(a[1]) +
                                     " have different numbers of elements");
        }
        break;
      case Op::kTensorCopy:
      case Op::kReciprocal:
        need_on_chip(a[0], "destination");
        need_on_chip(a[1], "source");
        same_layout(a[0], a[1], "destination and source");
        if (in.op == Op::kTensorCopy && int_attr(in, "engine", 0) == static_cast<int>(Engine::kGpSimd)) {
          need_no_psum_gpsimd(in, {0, 1});
        }
        break;
      case Op::kMemset:
        need_on_chip(a[0], "destination");
        break;
      case Op::kIota:
      case Op::kAffineSelect:
        need_on_chip(a[0], "destination");
        need_no_psum_gpsimd(in, {0, 1});
        if (in.op == Op::kAffineSelect) {
          need_on_chip(a[1], "on_true_tile");
          same_layout(a[0], a[1], "destination and on_true_tile");
        }
        break;
      case Op::kMatmul: check_matmul(in); break;
      case Op::kTranspose: check_transpose(in); break;
      case Op::kTensorTensor: {
        for (int i = 0; i < 3; ++i) need_on_chip(a[i], i ? "input" : "destination");
        same_layout(a[0], a[1], "destination and data1");
        same_layout(a[0], a[2], "destination and data2");
        not_both_psum(a[1], a[2]);
        alu_dtypes(static_cast<Alu>(int_attr(in, "op")), {&a[0], &a[1], &a[2]});
        if (int_attr(in, "engine", 0) == static_cast<int>(Engine::kGpSimd)) need_no_psum_gpsimd(in, {0, 1, 2});
        break;
      }
      case Op::kTensorScalar: {
        need_on_chip(a[0], "destination");
        need_on_chip(a[1], "data");
        same_layout(a[0], a[1], "destination and data");
        for (size_t i = 2; i < 4; ++i) {
          if (a[i].present()) {
            need_on_chip(a[i], "operand");
            column_of(a[i], a[1], i == 2 ? "operand0" : "operand1");
            if (dt(a[i]) != DType::kFloat32) {
              fail("dtype", std::string(i == 2 ? "operand0 " : "operand1 ") + describe(a[i]) + " is " +
                                dtype_name(dt(a[i])) + "; tensor_scalar's vector operands are float32");
            }
          }
        }
        alu_dtypes(static_cast<Alu>(int_attr(in, "op0")), {&a[0], &a[1]});
        if (int_attr(in, "op1") >= 0) alu_dtypes(static_cast<Alu>(int_attr(in, "op1")), {&a[0], &a[1]});
        break;
      }
      case Op::kActivation:
        need_on_chip(a[0], "destination");
        need_on_chip(a[1], "data");
        same_layout(a[0], a[1], "destination and data");
        column_of(a[2], a[1], "bias");
        column_of(a[3], a[1], "scale");
        column_of(a[4], a[1], "reduce_res");
        break;
      case Op::kTensorReduce: check_reduce(in); break;
      case Op::kTensorTensorScan:
        for (int i = 0; i < 3; ++i) need_on_chip(a[i], i ? "input" : "destination");
        same_layout(a[0], a[1], "destination and data0");
        same_layout(a[0], a[2], "destination and data1");
        not_both_psum(a[1], a[2]);
        column_of(a[3], a[1], "initial");
        arithmetic_only(in, {"op0", "op1"});
        break;
      case Op::kBnStats:
        need_on_chip(a[0], "destination");
        need_on_chip(a[1], "data");
        if (a[1].free_elements() > kBnStatsFmax) {
          fail("bn-stats-free", describe(a[1]) + " has " + std::to_string(a[1].free_elements()) +
                                    " elements per partition; bn_stats takes at most " +
                                    std::to_string(kBnStatsFmax) +
                                    " (nl.tile_size.bn_stats_fmax): split it and combine with bn_aggr");
        }
        if (a[0].free_elements() != 6 || a[0].partitions() != a[1].partitions()) {
          fail("shape-mismatch", "destination " + describe(a[0]) + " must be (" + std::to_string(a[1].partitions()) +
                                     ", 6)");
        }
        break;
      case Op::kBnAggr:
        need_on_chip(a[0], "destination");
        need_on_chip(a[1], "data");
        if (a[1].free_elements() % 3 != 0) {
          fail("shape-mismatch", "data " + describe(a[1]) + " must hold (count, mean, var*count) triples from "
                                 "bn_stats: its elements per partition are a multiple of 3");
        }
        if (a[0].free_elements() != 2 || a[0].partitions() != a[1].partitions()) {
          fail("shape-mismatch", "destination " + describe(a[0]) + " must be (" + std::to_string(a[1].partitions()) +
                                     ", 2): mean and variance");
        }
        break;
      case Op::kMax8:
      case Op::kFindIndex8: {
        const Access& src = a[1];
        need_on_chip(a[0], "destination");
        need_on_chip(src, "data");
        if (src.free_elements() < 8 || src.free_elements() > 16384) {
          fail("shape-mismatch", describe(src) + " must have 8 to 16384 elements per partition");
        }
        if (a[0].free_elements() != 8 || a[0].partitions() != src.partitions()) {
          fail("shape-mismatch", "destination " + describe(a[0]) + " must be (" + std::to_string(src.partitions()) +
                                     ", 8)");
        }
        if (in.op == Op::kFindIndex8) need_on_chip(a[2], "vals");
        if (in.op == Op::kFindIndex8 && (a[2].partitions() != src.partitions() || a[2].free_elements() != 8)) {
          fail("shape-mismatch", "vals " + describe(a[2]) + " must be (" + std::to_string(src.partitions()) + ", 8)");
        }
        break;
      }
      case Op::kPartitionReduce:
        need_on_chip(a[0], "destination");
        need_on_chip(a[1], "data");
        need_no_psum_gpsimd(in, {0, 1});
        if (a[0].partitions() != 1 || a[0].free_elements() != a[1].free_elements()) {
          fail("shape-mismatch", "destination " + describe(a[0]) + " must be (1, " +
                                     std::to_string(a[1].free_elements()) + ")");
        }
        break;
      case Op::kScalarTensorTensor:
        need_on_chip(a[0], "destination");
        need_on_chip(a[1], "data");
        need_on_chip(a[3], "operand1");
        same_layout(a[0], a[1], "destination and data");
        same_layout(a[0], a[3], "destination and operand1");
        column_of(a[2], a[1], "operand0");
        not_both_psum(a[1], a[3]);
        arithmetic_only(in, {"op0", "op1"});
        break;
      case Op::kSelect:
        for (int i = 0; i < 3; ++i) need_on_chip(a[i], i ? "input" : "destination");
        same_layout(a[0], a[1], "destination and predicate");
        same_layout(a[0], a[2], "destination and on_true");
        not_both_psum(a[1], a[2]);
        if (a.size() > 3) column_of(a[3], a[1], "on_false");
        break;
      case Op::kCopyPredicated: {
        need_on_chip(a[0], "destination");
        need_on_chip(a[2], "predicate");
        same_layout(a[0], a[2], "destination and predicate");
        if (a[1].present()) {
          need_on_chip(a[1], "source");
          same_layout(a[0], a[1], "destination and source");
          not_both_psum(a[1], a[2]);
          if (dt(a[1]) != dt(a[0])) {
            fail("dtype", "source " + describe(a[1]) + " is " + dtype_name(dt(a[1])) + " but the destination is " +
                              dtype_name(dt(a[0])) + "; tensor_copy_predicated copies without conversion");
          }
        }
        dtype_in(a[2], "predicate", {DType::kUInt8, DType::kUInt16, DType::kUInt32});
        break;
      }
      case Op::kSelectReduce:
        for (int i = 0; i < 3; ++i) need_on_chip(a[i], i ? "input" : "destination");
        same_layout(a[0], a[1], "destination and predicate");
        same_layout(a[0], a[2], "destination and on_true");
        not_both_psum(a[1], a[2]);
        column_of(a[3], a[2], "on_false");
        column_of(a[4], a[2], "reduce_res");
        dtype_in(a[1], "predicate", {DType::kInt8, DType::kUInt8, DType::kInt16, DType::kUInt16});
        if (dt(a[2]) == DType::kTFloat32 || dt(a[2]) == DType::kInt32 || dt(a[2]) == DType::kUInt32) {
          fail("dtype", "on_true " + describe(a[2]) + " is " + dtype_name(dt(a[2])) + "; select_reduce takes any "
                        "dtype but tfloat32, int32 and uint32");
        }
        if (a[3].present()) float32_operand(a[3], "on_false");
        if (a[4].present() && !is_float(dt(a[4]))) {
          fail("dtype", "reduce_res " + describe(a[4]) + " must be a floating-point tensor");
        }
        break;
      case Op::kRangeSelect:
        need_on_chip(a[0], "destination");
        need_on_chip(a[1], "on_true_tile");
        same_layout(a[0], a[1], "destination and on_true_tile");
        for (int i = 2; i < 4; ++i) {
          need_on_chip(a[i], i == 2 ? "bound0" : "bound1");
          column_of(a[i], a[1], i == 2 ? "bound0" : "bound1");
          float32_operand(a[i], i == 2 ? "bound0" : "bound1");
        }
        column_of(a[4], a[1], "reduce_res");
        if (!is_float(dt(a[1]))) {
          fail("dtype", "on_true_tile " + describe(a[1]) + " is " + dtype_name(dt(a[1])) + "; range_select selects "
                        "from floating-point tiles");
        }
        for (int i = 0; i < 2; ++i) {
          const Alu c = static_cast<Alu>(int_attr(in, i ? "comp_op1" : "comp_op0"));
          if (c != Alu::kEqual && c != Alu::kLess && c != Alu::kLessEqual && c != Alu::kGreater &&
              c != Alu::kGreaterEqual) {
            fail("alu-op", std::string(i ? "comp_op1" : "comp_op0") + " must be one of nl.equal, nl.less, "
                           "nl.less_equal, nl.greater, nl.greater_equal");
          }
        }
        // The engine fills with FP32_MIN only (the hardware has no other fill value).
        if (static_cast<float>(float_attr(in, "on_false_value")) != -std::numeric_limits<float>::max()) {  // as an fp32 value
          fail("alu-op", "on_false_value must be FP32_MIN (-3.4028235e+38): the only fill value the Vector engine's "
                         "range select supports");
        }
        break;
      case Op::kTensorScalarReduce:
        need_on_chip(a[0], "destination");
        need_on_chip(a[1], "data");
        same_layout(a[0], a[1], "destination and data");
        column_of(a[2], a[1], "operand0");
        if (a[2].present()) float32_operand(a[2], "operand0");
        column_of(a[3], a[1], "reduce_res");
        column_of(a[4], a[1], "reduce_init");
        arithmetic_only(in, {"op0"});
        reduce_op_in(int_attr(in, "reduce_op"), "reduce_op", {Alu::kAdd, Alu::kMultiply, Alu::kMaximum, Alu::kMinimum});
        break;
      case Op::kTensorScalarCumulative:
        need_on_chip(a[0], "destination");
        need_on_chip(a[1], "src");
        same_layout(a[0], a[1], "destination and src");
        column_of(a[2], a[1], "imm0");
        column_of(a[3], a[1], "imm1");
        if (a[2].present()) float32_operand(a[2], "imm0");
        if (a[3].present()) float32_operand(a[3], "imm1");
        arithmetic_only(in, {"op0"});
        reduce_op_in(int_attr(in, "op1"), "op1", {Alu::kAdd, Alu::kSubtract, Alu::kMultiply, Alu::kMaximum, Alu::kMinimum});
        for (int i = 0; i < 2; ++i) {
          const DType d = dt(a[i]);
          if (d == DType::kInt32 || d == DType::kUInt32 || d == DType::kTFloat32) {
            fail("dtype", std::string(i ? "src " : "destination ") + describe(a[i]) + " is " + dtype_name(d) +
                              "; tensor_scalar_cumulative takes bf16/fp16/fp32/fp8 and 8/16-bit integers");
          }
        }
        break;
      case Op::kExponential:
        need_version(4, "exponential");
        need_on_chip(a[0], "destination");
        need_on_chip(a[1], "src");
        same_layout(a[0], a[1], "destination and src");
        column_of(a[2], a[1], "max_value");
        if (a[2].present()) float32_operand(a[2], "max_value");
        column_of(a[3], a[1], "reduce_res");
        column_of(a[4], a[1], "reduce_init");
        break;
      case Op::kActivate2: {
        need_version(4, "activate2");
        need_on_chip(a[0], "destination");
        need_on_chip(a[1], "data");
        same_layout(a[0], a[1], "destination and data");
        column_of(a[2], a[1], "imm0");
        column_of(a[3], a[1], "imm1");
        column_of(a[4], a[1], "relu_param");
        column_of(a[5], a[1], "reduce_res");
        const Alu o0 = static_cast<Alu>(int_attr(in, "op0")), o1 = static_cast<Alu>(int_attr(in, "op1"));
        const bool ok = (o0 == Alu::kMultiply && (o1 == Alu::kAdd || o1 == Alu::kSubtract || o1 == Alu::kBypass)) ||
                        ((o0 == Alu::kAdd || o0 == Alu::kSubtract || o0 == Alu::kBypass) && o1 == Alu::kBypass);
        if (!ok) {
          fail("alu-op", "(op0, op1) must be one of (multiply, add), (multiply, subtract), (multiply, bypass), "
                         "(add, bypass), (subtract, bypass), (bypass, bypass)");
        }
        if (int_attr(in, "reduce_op") >= 0) {
          reduce_op_in(int_attr(in, "reduce_op"), "reduce_op", {Alu::kAdd, Alu::kMaximum, Alu::kMinimum, Alu::kAbsMax, Alu::kAbsMin});
        }
        break;
      }
      case Op::kMatchReplace8: {
        const Access& src = a[1];
        need_on_chip(a[0], "destination");
        need_on_chip(src, "data");
        same_layout(a[0], src, "destination and data");
        need_on_chip(a[2], "vals");
        if (src.free_elements() < 8 || src.free_elements() > 16384) {
          fail("shape-mismatch", describe(src) + " must have 8 to 16384 elements per partition");
        }
        if (a[2].partitions() != src.partitions() || a[2].free_elements() != 8) {
          fail("shape-mismatch", "vals " + describe(a[2]) + " must be (" + std::to_string(src.partitions()) + ", 8)");
        }
        if (a[3].present()) {
          need_on_chip(a[3], "dst_idx");
          if (a[3].partitions() != src.partitions() || a[3].free_elements() != 8) {
            fail("shape-mismatch", "dst_idx " + describe(a[3]) + " must be (" + std::to_string(src.partitions()) +
                                       ", 8)");
          }
        }
        break;
      }
      case Op::kStreamShuffle: {
        need_on_chip(a[0], "destination");
        need_on_chip(a[1], "src");
        if (a[0].free_elements() != a[1].free_elements()) {
          fail("shape-mismatch", "destination " + describe(a[0]) + " and src " + describe(a[1]) +
                                     " differ in elements per partition");
        }
        if (dt(a[0]) != dt(a[1])) {
          fail("dtype", std::string("destination dtype ") + dtype_name(dt(a[0])) + " must equal src's " +
                            dtype_name(dt(a[1])));
        }
        const int64_t active = (std::max(a[0].partitions(), a[1].partitions()) + 31) / 32 * 32;
        const int64_t align = active > 64 ? 128 : active;
        for (int i = 0; i < 2; ++i) {
          const int64_t start = start_partition(a[i]);
          if (start % align != 0) {
            fail("quadrant", std::string(i ? "src " : "destination ") + describe(a[i]) + " starts at partition " +
                                 std::to_string(start) + "; with " + std::to_string(active) + " active partitions "
                                 "the start partition must be a multiple of " + std::to_string(align));
          }
        }
        const std::vector<int64_t> mask = int_tail(in, "shuffle_mask");
        for (size_t i = 0; i < mask.size(); ++i) {
          const int64_t m = mask[i];
          if (m != 255 && (m < 0 || m >= 32 || m >= a[1].partitions())) {
            fail("shuffle-mask", "shuffle_mask[" + std::to_string(i) + "] = " + std::to_string(m) + " names no source "
                                 "partition of " + describe(a[1]) + " (0..31 within a quadrant, or 255 to keep)");
          }
        }
        break;
      }
      case Op::kDmaTranspose: check_dma_transpose(in); break;
      case Op::kNGather:
        for (int i = 0; i < 3; ++i) {
          need_on_chip(a[i], i == 0 ? "destination" : i == 1 ? "data" : "indices");
          if (buf(a[i]) != Buffer::kSbuf) {
            fail("gpsimd-psum", describe(a[i]) + " is in PSUM, which the GpSimd engine cannot access; use SBUF");
          }
        }
        if (a[0].partitions() != a[1].partitions() || a[2].partitions() != a[1].partitions() ||
            a[0].free_elements() != a[2].free_elements()) {
          fail("shape-mismatch", "destination " + describe(a[0]) + ", data " + describe(a[1]) + " and indices " +
                                     describe(a[2]) + " must share partitions, and the destination has one element "
                                     "per index");
        }
        if (dt(a[0]) != dt(a[1])) fail("dtype", "the destination's dtype must equal the data's");
        dtype_in(a[2], "indices", {DType::kUInt32});
        break;
      case Op::kLocalGather: {
        for (int i = 0; i < 3; ++i) {
          need_on_chip(a[i], i == 0 ? "destination" : i == 1 ? "src_buffer" : "index");
          if (buf(a[i]) != Buffer::kSbuf) {
            fail("gpsimd-psum", describe(a[i]) + " is in PSUM, which the GpSimd engine cannot access; use SBUF");
          }
        }
        const int64_t P = a[1].partitions();
        if (a[2].partitions() != P || P % 16 != 0 || a[0].partitions() != P) {
          fail("shape-mismatch", "src_buffer " + describe(a[1]) + ", index " + describe(a[2]) + " and destination " +
                                     describe(a[0]) + " must have the same number of partitions, a multiple of 16 "
                                     "(one GpSimd core per 16 partitions)");
        }
        if (start_partition(a[1]) % 16 != 0 || start_partition(a[2]) % 16 != 0) {
          fail("quadrant", "src_buffer and index start on a 16-partition boundary (one GpSimd core's partitions)");
        }
        if (dt(a[0]) != dt(a[1])) fail("dtype", "the destination's dtype must equal src_buffer's (no conversion)");
        dtype_in(a[2], "index", {DType::kUInt16});
        const int64_t per_core = a[2].free_elements() * 16, n_elem = int_attr(in, "num_elem_per_idx");
        const int64_t valid = int_attr(in, "num_valid_indices");
        if (n_elem != 1 && n_elem != 2 && n_elem != 4 && n_elem != 8 && n_elem != 16 && n_elem != 32) {
          fail("shape-mismatch", "num_elem_per_idx must be 1, 2, 4, 8, 16 or 32, got " + std::to_string(n_elem));
        }
        if (valid < 1 || valid > per_core) {
          fail("shape-mismatch", "num_valid_indices is " + std::to_string(valid) + "; each core has " +
                                     std::to_string(per_core) + " indices");
        }
        if (valid > 4096) fail("shape-mismatch", "at most 4096 indices per GpSimd core, got " + std::to_string(valid));
        if (a[0].free_elements() != valid * n_elem) {
          fail("shape-mismatch", "destination " + describe(a[0]) + " must hold num_valid_indices * num_elem_per_idx = " +
                                     std::to_string(valid * n_elem) + " elements per partition");
        }
        break;
      }
      case Op::kNonzeroWithCount:
        for (int i = 0; i < 2; ++i) {
          if (buf(a[i]) != Buffer::kSbuf) {
            fail("engine-memory", std::string(i ? "src " : "dst ") + describe(a[i]) + " must be in SBUF (GpSimd)");
          }
        }
        dtype_in(a[1], "src", {DType::kFloat32, DType::kInt32});
        dtype_in(a[0], "dst", {DType::kInt32});
        if (a[0].partitions() != a[1].partitions() || a[0].free_elements() != a[1].free_elements() + 1) {
          fail("shape-mismatch", "dst " + describe(a[0]) + " must have src's partitions and one more element per "
                                 "partition than src " + describe(a[1]) + " (the count)");
        }
        break;
      case Op::kDmaCompute:
        for (size_t i = 0; i < a.size(); ++i) {
          if (buf(a[i]) == Buffer::kPsum) {
            fail("dma-psum", describe(a[i]) + " is in PSUM; DMA cannot access PSUM: copy PSUM to SBUF with "
                             "nisa.tensor_copy first");
          }
          if (a[i].elements() != a[0].elements()) {
            fail("shape-mismatch", "source " + describe(a[i]) + " and destination " + describe(a[0]) +
                                       " have different numbers of elements");
          }
        }
        break;
      case Op::kSendRecv:
        for (int i = 0; i < 2; ++i) {
          if (buf(a[i]) != Buffer::kSbuf) {
            fail("engine-memory", std::string(i ? "src " : "dst ") + describe(a[i]) + " must be in SBUF");
          }
        }
        if (dt(a[0]) != dt(a[1]) || a[0].partitions() != a[1].partitions() ||
            a[0].free_elements() != a[1].free_elements()) {
          fail("shape-mismatch", "src " + describe(a[1]) + " and dst " + describe(a[0]) + " must have the same "
                                 "dtype, partitions and elements per partition");
        }
        break;
      case Op::kCoreBarrier:
        if (on_chip(buf(a[0]))) fail("engine-memory", "core_barrier's data " + describe(a[0]) + " is shared HBM");
        break;
      case Op::kDevicePrint:  // reads any memory (SBUF, PSUM, HBM); the access itself was checked above
        break;
    }
  }

  void check_matmul(const Instr& in) {
    const Access &dst = in.args[0], &st = in.args[1], &mv = in.args[2];
    const bool transpose = int_attr(in, "is_transpose", 0) != 0;
    for (const Access* x : {&st, &mv}) {
      if (buf(*x) != Buffer::kSbuf) {
        fail("matmul-memory", std::string(x == &st ? "stationary " : "moving ") + describe(*x) +
                                  " must be in SBUF: the Tensor engine reads its operands from SBUF");
      }
    }
    if (buf(dst) != Buffer::kPsum) {
      fail("matmul-memory", "destination " + describe(dst) + " must be in PSUM: the Tensor engine writes its "
                            "results to PSUM (copy them to SBUF afterwards with nisa.tensor_copy)");
    }
    const int64_t K = st.partitions(), M = st.free_elements(), N = mv.free_elements();
    if (K > k_.target.pe_rows || mv.partitions() > k_.target.pe_rows) {
      fail("matmul-contraction", "the contraction (partition) dimension is " + std::to_string(std::max(K, mv.partitions())) +
                                     "; it is at most " + std::to_string(k_.target.pe_rows) +
                                     " on both operands (nl.tile_size.pmax)");
    }
    if (mv.partitions() != K) {
      fail("matmul-contraction", "stationary " + describe(st) + " and moving " + describe(mv) +
                                     " must have the same contraction (partition) size");
    }
    if (M > k_.target.pe_cols) {
      fail("matmul-stationary-free", "stationary " + describe(st) + " has " + std::to_string(M) + " free elements; at most " +
                                         std::to_string(k_.target.pe_cols) + " (nl.tile_size.gemm_stationary_fmax)");
    }
    // One PSUM bank of results (512 fp32) per matmul; NeuronCore-v4 writes across all 8 banks.
    const int64_t n_max = dt(dst) == DType::kBFloat16 ? k_.target.gemm_moving_fmax_bf16 : k_.target.gemm_moving_fmax;
    if (N > n_max) {
      fail("matmul-moving-free", "moving " + describe(mv) + " has " + std::to_string(N) + " free elements; at most " +
                                     std::to_string(n_max) + (n_max == 512 ? " (nl.tile_size.gemm_moving_fmax)" :
                                                              " on " + k_.target.name));
    }
    if (dst.partitions() != M || dst.free_elements() != N) {
      fail("shape-mismatch", "destination " + describe(dst) + " must be [" + std::to_string(M) + ", " +
                                 std::to_string(N) + "]: stationary.T @ moving");
    }
    const DType ds = dt(st), dm = dt(mv), dd = dt(dst);
    auto wide = [](DType d) { return d == DType::kFloat32 || d == DType::kTFloat32; };
    if (!is_float(ds) || !is_float(dm)) {
      fail("matmul-dtype", std::string("operands must be floating point, got ") + dtype_name(ds) + " and " +
                               dtype_name(dm));
    }
    if (wide(ds) != wide(dm)) {
      fail("matmul-dtype", std::string("a float32/tfloat32 operand pairs only with float32/tfloat32; got ") +
                               dtype_name(ds) + " and " + dtype_name(dm));
    }
    if ((ds == DType::kFloat8E4M3FN && dm == DType::kFloat8E4M3) || (ds == DType::kFloat8E4M3 && dm == DType::kFloat8E4M3FN)) {
      fail("matmul-dtype", "float8_e4m3fn and the legacy float8_e4m3 cannot be mixed in one matmul");
    }
    if ((ds == DType::kFloat8E4M3FN || dm == DType::kFloat8E4M3FN) && k_.target.nc_version < 4) {
      fail("matmul-dtype", "float8_e4m3fn operands need NeuronCore-v4 (trn3); " + k_.target.name +
                               " multiplies float8_e4m3 / float8_e5m2");
    }
    bool ok_dst = dd == DType::kFloat32 || (k_.target.nc_version >= 4 && dd == DType::kBFloat16) ||
                  (transpose && dd == ds);
    if (!ok_dst) {
      fail("matmul-dtype", std::string("the PSUM result is ") + dtype_name(dd) + "; the Tensor engine writes float32" +
                               (k_.target.nc_version >= 4 ? " or bfloat16" : " on " + k_.target.name));
    }
  }

  void check_transpose(const Instr& in) {
    const Access &dst = in.args[0], &src = in.args[1];
    Engine e = static_cast<Engine>(int_attr(in, "engine", 0));
    if (e == Engine::kUnknown) e = (buf(dst) == Buffer::kPsum && buf(src) == Buffer::kSbuf) ? Engine::kTensor : Engine::kVector;
    need_on_chip(dst, "destination");
    need_on_chip(src, "data");
    const int64_t lim = e == Engine::kTensor ? k_.target.pe_rows : 32;  // Vector: one 32-partition quadrant
    if (src.partitions() > lim || src.free_elements() > lim) {
      fail("transpose-limit", "data " + describe(src) + " is larger than the " + (e == Engine::kTensor ? "Tensor" : "Vector") +
                                  " engine's transpose of at most [" + std::to_string(lim) + ", " + std::to_string(lim) + "]");
    }
    if (e == Engine::kTensor && (buf(src) != Buffer::kSbuf || buf(dst) != Buffer::kPsum)) {
      fail("matmul-memory", "a Tensor-engine transpose reads SBUF and writes PSUM; got " + describe(src) + " -> " +
                                describe(dst));
    }
    if (dst.partitions() != src.free_elements() || dst.free_elements() != src.partitions()) {
      fail("shape-mismatch", "destination " + describe(dst) + " must be [" + std::to_string(src.free_elements()) + ", " +
                                 std::to_string(src.partitions()) + "]");
    }
    if (dt(dst) != dt(src)) {
      fail("dtype", std::string("destination dtype ") + dtype_name(dt(dst)) + " must equal the data's " + dtype_name(dt(src)));
    }
  }

  void check_reduce(const Instr& in) {
    const Access &dst = in.args[0], &src = in.args[1];
    need_on_chip(dst, "destination");
    need_on_chip(src, "data");
    const int nd = static_cast<int>(src.dims.size());
    std::vector<int64_t> axes = int_tail(in, "axis");
    std::sort(axes.begin(), axes.end());
    if (axes.empty()) fail("reduce-axis", "no axis to reduce");
    for (size_t i = 0; i < axes.size(); ++i) {
      if (axes[i] <= 0 || axes[i] >= nd) {
        fail("reduce-axis", "axis " + std::to_string(axes[i]) + " of " + describe(src) + " cannot be reduced: the "
                            "partition axis 0 is never reduced by tensor_reduce (use nisa.tensor_partition_reduce "
                            "or a matmul) and axes are 1.." + std::to_string(nd - 1));
      }
      if (axes[i] != nd - static_cast<int64_t>(axes.size()) + static_cast<int64_t>(i)) {
        fail("reduce-axis", "the reduced axes must be the trailing free axes of " + describe(src) + " (e.g. " +
                                std::to_string(nd - 1) + ", or " + std::to_string(nd - 2) + " and " +
                                std::to_string(nd - 1) + ")");
      }
    }
    int64_t kept = 1;
    for (int i = 1; i < nd - static_cast<int>(axes.size()); ++i) kept *= src.dims[i].size;
    if (dst.partitions() != src.partitions() || dst.free_elements() != kept) {
      fail("shape-mismatch", "destination " + describe(dst) + " must hold " + std::to_string(kept) +
                                 " element(s) per partition over " + std::to_string(src.partitions()) + " partitions");
    }
    alu_dtypes(static_cast<Alu>(int_attr(in, "op")), {&dst, &src});
  }

  // Live on-chip bytes per partition must fit the memories at every instruction. A tensor is
  // live from its first to its last use, as the compiler's allocator sees it; PSUM is
  // allocated in whole 2 KiB banks.
  void check_capacity() {
    const size_t nt = k_.tensors.size();
    const auto [first, last] = live_ranges(k_);
    std::vector<std::vector<int>> starts(k_.instrs.size()), ends(k_.instrs.size());
    for (size_t t = 0; t < nt; ++t) {  // aliases take no memory of their own
      if (first[t] < 0 || !on_chip(k_.tensors[t].buffer) || k_.tensors[t].alias >= 0) continue;
      starts[first[t]].push_back(static_cast<int>(t));
      ends[last[t]].push_back(static_cast<int>(t));
    }
    auto bytes_of = [&](int t) {
      const TensorDecl& d = k_.tensors[t];
      int64_t b = d.partition_elements() * static_cast<int64_t>(dtype_size(d.dtype));
      if (d.buffer == Buffer::kPsum) b = (b + k_.target.psum_bank_bytes - 1) / k_.target.psum_bank_bytes * k_.target.psum_bank_bytes;
      return b;
    };
    int64_t live[2] = {0, 0};
    std::vector<int> live_set;
    for (size_t i = 0; i < k_.instrs.size(); ++i) {
      for (int t : starts[i]) {
        live[k_.tensors[t].buffer == Buffer::kPsum] += bytes_of(t);
        live_set.push_back(t);
      }
      for (int which = 0; which < 2; ++which) {
        const int64_t cap = which ? k_.target.psum_partition_bytes : k_.target.sbuf_partition_bytes;
        if (live[which] <= cap) continue;
        std::ostringstream o;
        o << "at this instruction the live " << (which ? "PSUM" : "SBUF") << " tensors need " << live[which]
          << " bytes per partition; " << k_.target.name << " has " << cap << (which ? " (8 banks of 2 KiB)" : "")
          << ". Live:";
        int shown = 0;
        for (int t : live_set) {
          const TensorDecl& d = k_.tensors[t];
          if ((d.buffer == Buffer::kPsum) != (which == 1)) continue;
          if (shown++ == 6) { o << " ..."; break; }
          o << " " << (d.name.empty() ? "tensor" : d.name) << shape_str(d.shape) << "@" << d.loc.file << ":"
            << d.loc.line;
        }
        o << ". Allocate tiles inside the loop that uses them, or use smaller tiles.";
        cur_ = &k_.instrs[i];
        fail(which ? "psum-capacity" : "sbuf-capacity", o.str());
      }
      for (int t : ends[i]) {
        live[k_.tensors[t].buffer == Buffer::kPsum] -= bytes_of(t);
        live_set.erase(std::find(live_set.begin(), live_set.end(), t));
      }
    }
  }

  const Kernel& k_;
  const Instr* cur_ = nullptr;
};

}  // namespace

void verify(const Kernel& k) { Verifier(k).run(); }

}  // namespace neuron::nki
