// The memory plan: one arena holds every SBUF/PSUM tensor (and HBM scratch the kernel
// allocates), placed once from the tensors' live ranges so tensors that are never alive
// together share bytes, as the compiler's allocator does. Memory that comes alive is filled
// with NaN / 4 sentinels, so reading uninitialized data shows, unless it is wholly written
// before anything reads it.
#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>
#include <utility>

#include "nki/executor.h"
#include "nki/numerics.h"

namespace neuron::nki {

Program::Program(Kernel k) : k_(std::move(k)) {
  verify(k_);
  for (Instr& in : k_.instrs) {  // optional operands left off the end are absent ones
    const auto& operands = op_info(in.op).operands;
    if (in.args.size() < operands.size() && operands.back().arity != Arity::kVariadic) in.args.resize(operands.size());
  }
  plan();
}

// First-fit placement by live range: tensors whose lifetimes do not overlap share bytes.
void Program::plan() {
  const size_t nt = k_.tensors.size(), ni = k_.instrs.size();
  const auto [first, last] = live_ranges(k_);
  offset_.assign(nt, -1);
  alloc_at_.assign(ni, {});
  std::vector<int> order;
  for (size_t t = 0; t < nt; ++t)
    if (k_.tensors[t].external < 0 && k_.tensors[t].alias < 0 && first[t] >= 0) order.push_back(static_cast<int>(t));
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return first[x] < first[y]; });
  struct Block { int64_t begin, end; int tensor; };
  std::vector<Block> active;  // sorted by begin
  int64_t top = 0;
  for (int t : order) {
    active.erase(std::remove_if(active.begin(), active.end(), [&](const Block& b) { return last[b.tensor] < first[t]; }),
                 active.end());
    const TensorDecl& d = k_.tensors[t];
    const int64_t bytes = (d.elements() * static_cast<int64_t>(dtype_size(d.dtype)) + 63) / 64 * 64;
    int64_t at = 0;
    for (const Block& b : active) {
      if (b.begin - at >= bytes) break;
      at = std::max(at, b.end);
    }
    offset_[t] = at;
    top = std::max(top, at + bytes);
    active.push_back({at, at + bytes, t});
    std::sort(active.begin(), active.end(), [](const Block& x, const Block& y) { return x.begin < y.begin; });
    alloc_at_[first[t]].push_back(t);
  }
  for (size_t t = 0; t < nt; ++t) {  // an alias is its base's memory: the same bytes or argument
    TensorDecl& d = k_.tensors[t];
    if (d.alias < 0) continue;
    offset_[t] = offset_[d.alias];
    d.external = k_.tensors[d.alias].external;
  }
  arena_.assign(top, 0);
  psum_written_.assign(top, 0);
  // Decided by the first run (building a program, for the estimate too, stays cheap), except
  // that a tensor another one aliases is always filled.
  fill_.assign(nt, -1);
  for (const TensorDecl& d : k_.tensors) {
    if (d.alias >= 0) fill_[d.alias] = 1;
  }
}

namespace {

// Instructions whose dst (operand 0) is written whole from their other operands, never read.
bool plain_write(const Instr& in) {
  switch (in.op) {
    case Op::kDmaCopy:
    case Op::kTensorCopy:
    case Op::kTranspose:
    case Op::kMemset:
    case Op::kIota:
      return true;
    case Op::kMatmul:  // the first write to a PSUM element overwrites it, unless accumulate=True
      return int_attr(in, "accumulate", -1) != 1;
    default:
      return false;
  }
}

}  // namespace

// Whether tensor t, alive from instruction i, is wholly written by plain writes of static
// accesses before anything reads it (within a few instructions): then its sentinels could never
// be seen, and filling it is skipped. (Aliased tensors are not asked: plan() fills them.)
bool Program::written_before_read(int t, size_t i) const {
  constexpr size_t kWindow = 64;
  constexpr int64_t kMaxElements = int64_t{1} << 26;
  const int64_t n = k_.tensors[t].elements();
  if (n <= 0 || n > kMaxElements) return false;
  std::vector<uint8_t> seen;
  int64_t covered = 0;
  for (size_t j = i; j < k_.instrs.size() && j < i + kWindow; ++j) {
    const Instr& in = k_.instrs[j];
    bool writes = false;
    for (size_t a = 0; a < in.args.size(); ++a) {
      const Access& x = in.args[a];
      if (!x.present() || (x.tensor != t && x.index.tensor != t)) continue;
      if (a != 0 || x.index.present() || !plain_write(in)) return false;  // read (or written another way) first
      writes = true;
    }
    if (!writes) continue;
    if (seen.empty()) seen.assign(static_cast<size_t>(n), 0);
    for_runs(in.args[0], [&](int64_t off, int64_t stride, int64_t count, int64_t) {
      for (int64_t e = 0; e < count; ++e) {
        uint8_t& s = seen[static_cast<size_t>(off + e * stride)];
        covered += s == 0;
        s = 1;
      }
    });
    if (covered == n) return true;
  }
  return false;
}

void Program::check_external(const std::vector<void*>& external) const {
  for (const TensorDecl& t : k_.tensors) {
    if (t.external >= 0 && (t.external >= static_cast<int>(external.size()) || external[t.external] == nullptr)) {
      throw std::invalid_argument("nki: no memory given for kernel tensor '" + t.name + "'");
    }
  }
}

void Program::prepare(size_t i) {
  for (int t : alloc_at_[i]) {  // fresh memory: NaN / 4 sentinels, no matmul writes yet
    const TensorDecl& d = k_.tensors[t];
    const int64_t n = d.elements();
    if (d.buffer == Buffer::kPsum) std::memset(psum_written_.data() + offset_[t], 0, n);
    if (fill_[t] < 0) fill_[t] = written_before_read(t, i) ? 0 : 1;
    if (fill_[t] == 0) continue;
    // The sentinel pattern is encoded once per dtype, then copied.
    const size_t es = dtype_size(d.dtype);
    std::vector<uint8_t>& pattern = fill_patterns_[static_cast<int>(d.dtype)];
    if (pattern.empty()) {
      std::vector<float> v(4096, is_float(d.dtype) ? kNaN : 4.0f);
      pattern.resize(4096 * es);
      encode_run(d.dtype, v.data(), 4096, pattern.data(), 1);
    }
    uint8_t* dst = arena_.data() + offset_[t];
    for (int64_t i = 0; i < n; i += 4096) std::memcpy(dst + i * es, pattern.data(), std::min<int64_t>(4096, n - i) * es);
  }
}

}  // namespace neuron::nki
