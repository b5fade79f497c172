// The engine model of a NeuronCore (cost_model.h): costs per instruction, dependencies, schedule.
#include "nki/cost_model.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <tuple>

namespace neuron::nki {
namespace {

// ---- the cost rules, one row per chip -------------------------------------------------------
// Sources (aws-neuron-sdk, SDK 2.33):
//   [arch]   nki/guides/architecture/trainium_inferentia2_arch.rst (NeuronCore-v2, rules every
//            later generation inherits)
//   [trn2]   nki/guides/architecture/trainium2_arch.rst
//   [perf]   nki/deep-dives/nki_perf_guide.rst
//   [expl]   tools/neuron-explorer/overview-summary-page.rst
// and ../shared/reference/trainium-performance.md, "Instruction-level cost rules", which
// summarises them.
constexpr CostRules rules_row(const char* chip, int nc_version) {
  const bool v3 = nc_version >= 3;
  return CostRules{
      .chip = chip,
      .matmul_min_cycles = 64,          // [perf] Opt #7: MM_INIT_LATENCY 64 cycles; [arch] II = max(N, 64)
      .load_stationary_cycles = 128,    // [arch] LoadStationary of a 128-row stationary, ~128 cycles
      .fp32_matmul_slowdown = 4,        // [arch] FP32 matmuls take 4 passes (79 vs 20 TFLOPS [trn2])
      .fp32_transpose_slowdown = v3 ? 2.0 : 4.0,  // [trn2] transpose mode: "2x speedup in FP32 transpose"
      .sbuf_access_cycles = 60,         // [arch] per-instruction SBUF access bubble, ~60 cycles
      .dependency_cycles = 100,         // [arch] ~100 cycles when an instruction consumes the previous result
      .stride_penalty_bytes = 16,       // [arch] an access stride over 16 B halves SBUF bandwidth
      .vector_perf_mode_max = v3 ? 4.0 : 1.0,  // [trn2] "Vector Engine Performance Mode" (2x / 4x rules)
      .dma_fixed_ns = 600,              // [trn2] DGE: "each DGE-based DMA instruction takes about 600 ns"
      .dma_min_descriptor_bytes = 512,  // [arch] descriptors under 512 B are inefficient
      .dma_transpose_efficiency = v3 ? 0.9 : 0.0,      // [trn2] DMA transpose: up to 90% of DMA throughput;
                                                       // NeuronCore-v2 has none: element-wise descriptors
      .dma_sbuf_transpose_efficiency = v3 ? 0.5 : 0.0,  // [trn2] SBUF2SBUF transpose: up to 50%
      .throttle = v3,                   // [expl] power throttle on trn2 / trn3
      .throttle_start_rate = 0.5,       // [expl] TensorE starts at ~50% of its rate ...
      .throttle_ramp_ns = 3000,         // [expl] ... and ramps up over ~3 us
      .throttle_window_ns = 3000,       // [expl] re-engages after a 3 us window ...
      .throttle_util = 0.5,             // [expl] ... below 50% utilisation
  };
}

constexpr CostRules kRules[] = {rules_row("trn1", 2), rules_row("inf2", 2), rules_row("trn2", 3),
                                 rules_row("trn3", 4)};

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int64_t kAll = std::numeric_limits<int64_t>::max() / 4;

// ---- accesses as regions --------------------------------------------------------------------
// A region of a tensor's storage: partitions [p_lo, p_hi] and bytes [f_lo, f_hi) within each
// partition (HBM tensors: one "partition", the flat byte span). Aliases map to their base.
struct Region {
  int32_t base;
  int64_t p_lo, p_hi, f_lo, f_hi;
};

bool overlaps(const Region& a, const Region& b) {
  return a.p_lo <= b.p_hi && b.p_lo <= a.p_hi && a.f_lo < b.f_hi && b.f_lo < a.f_hi;
}
bool covers(const Region& a, const Region& b) {
  return a.p_lo <= b.p_lo && a.p_hi >= b.p_hi && a.f_lo <= b.f_lo && a.f_hi >= b.f_hi;
}

Region region_of(const Kernel& k, const Access& a) {
  const TensorDecl& d = k.tensors.at(a.tensor);
  Region r{d.alias >= 0 ? d.alias : a.tensor, 0, kAll, 0, kAll};
  if (a.index.present()) return r;  // a run-time offset: anywhere in the tensor
  const int64_t es = static_cast<int64_t>(dtype_size(d.dtype));
  if (!on_chip(d.buffer)) {
    const auto [lo, hi] = a.span();
    r.p_hi = 0;
    r.f_lo = lo * es;
    r.f_hi = (hi + 1) * es;
    return r;
  }
  const int64_t pe = d.partition_elements();
  if (pe <= 0) return r;
  int64_t lo = 0, hi = 0;
  for (size_t i = 1; i < a.dims.size(); ++i) {
    const int64_t s = a.dims[i].stride * (a.dims[i].size - 1);
    (s < 0 ? lo : hi) += s;
  }
  const int64_t p0 = a.offset / pe, f0 = a.offset % pe;
  const int64_t ps = a.dims.empty() ? 1 : a.dims[0].size, pst = a.dims.empty() ? 0 : a.dims[0].stride;
  if (f0 + lo < 0 || f0 + hi >= pe || (ps > 1 && pst % pe != 0)) {  // not partition-aligned: whole rows
    const auto [slo, shi] = a.span();
    r.p_lo = std::max<int64_t>(0, slo / pe);
    r.p_hi = shi / pe;
    r.f_lo = 0;
    r.f_hi = pe * es;
    return r;
  }
  const int64_t reach = (pst / pe) * (ps - 1);
  r.p_lo = p0 + std::min<int64_t>(0, reach);
  r.p_hi = p0 + std::max<int64_t>(0, reach);
  r.f_lo = (f0 + lo) * es;
  r.f_hi = (f0 + hi + 1) * es;
  return r;
}

// Whether an instruction writes its i-th operand: by the operand's name in the op table (ir.h).
bool writes(Op op, size_t i) {
  const auto& ops = op_info(op).operands;
  if (ops.empty() || op == Op::kDevicePrint || op == Op::kCoreBarrier) return false;
  const std::string_view name = ops[std::min(i, ops.size() - 1)].name;
  return name == "dst" || name == "reduce_res" || name == "dst_idx";
}

// ---- engines --------------------------------------------------------------------------------
Track from_engine(Engine e) {
  switch (e) {
    case Engine::kTensor: return Track::kTensor;
    case Engine::kScalar: return Track::kScalar;
    case Engine::kGpSimd: return Track::kGpSimd;
    case Engine::kDma: return Track::kDma;
    case Engine::kSync: return Track::kSync;
    case Engine::kVector: case Engine::kUnknown: break;
  }
  return Track::kVector;
}

// Where an instruction stores its engine= argument (the op table's "engine" int), or -1.
int engine_attr(Op op) {
  const auto& ints = op_info(op).ints;
  for (size_t i = 0; i < ints.size(); ++i)
    if (std::string_view(ints[i].name) == "engine") return static_cast<int>(i);
  return -1;
}

double track_ghz(Track t, const rt::ChipFacts& c) {
  switch (t) {
    case Track::kTensor: return c.tensor_ghz;
    case Track::kVector: return c.vector_ghz;
    default: return c.engine_ghz;
  }
}

int64_t bytes_of(const Kernel& k, const Access& a) {
  return a.elements() * static_cast<int64_t>(dtype_size(k.tensors[a.tensor].dtype));
}

bool is_16bit_float(DType d) { return d == DType::kBFloat16 || d == DType::kFloat16; }

// Elements of the innermost contiguous run of an access (stride-1 trailing dims; an on-chip
// access's partitions are separate rows however they are numbered).
int64_t contiguous_run(const Access& a, bool chip) {
  int64_t run = 1;
  for (size_t i = a.dims.size(); i-- > (chip ? 1 : 0);) {
    const Dim& d = a.dims[i];
    if (d.size == 1) continue;
    if (d.stride != run) break;
    run *= d.size;
  }
  return run;
}

int64_t inner_stride(const Access& a) {
  for (size_t i = a.dims.size(); i-- > 1;) {
    if (a.dims[i].size > 1) return a.dims[i].stride;
  }
  return 1;
}

// ---- the scheduler --------------------------------------------------------------------------
struct Touch {
  Region r;
  double end;     // when the access is complete
  double ready;   // when a consumer of a write may start (end + the producer's latency)
  bool write;
  Track track;
};

struct ProgramState {
  const Kernel* k;
  int index;
  size_t pc = 0;
  std::vector<std::vector<Touch>> touches;  // by base tensor
  std::array<double, kNumTracks> free{};    // when each engine's stream is next free
  std::vector<double> queue_free;           // per DMA queue
  double fence = 0;                         // no instruction starts before (core_barrier)
  double last_end = 0;                      // the latest end so far
  // TensorE: the stationary operand loaded, and the power-throttle state.
  int32_t stat_tensor = -1;
  int64_t stat_offset = -1;
  std::vector<Dim> stat_dims;
  std::vector<std::pair<double, double>> tensor_busy;  // recent TensorE intervals (throttle window)
  size_t busy_head = 0;
  double ramp_start = -kInf;
};

struct Scheduler {
  const rt::ChipFacts& chip;
  const CostRules& rules;
  Estimate& est;
  std::vector<ProgramState> progs;
  double core_hbm_gbps, engine_gbps;

  Scheduler(const rt::ChipFacts& c, Estimate& e)
      : chip(c), rules(cost_rules(c.chip)), est(e) {
    // The core's DMA queues together move at most the core's share of the chip's HBM bandwidth.
    core_hbm_gbps = chip.hbm_tbps * 1000.0 / chip.physical_cores;
    engine_gbps = std::min(chip.dma_engine_gbps, core_hbm_gbps / chip.dma_engines_per_core);
  }

  double cycles_ns(double cycles, Track t) const { return cycles / track_ghz(t, chip); }

  // When an instruction touching these regions may start: after the writes it reads (RAW), and
  // after every access to what it writes (WAR, WAW).
  double ready_time(ProgramState& p, const std::vector<Region>& reads, const std::vector<Region>& wr,
                    Track track) const {
    double t = p.fence;
    for (const Region& r : reads) {
      for (const Touch& x : p.touches[r.base]) {
        if (x.write && overlaps(x.r, r)) t = std::max(t, (x.track == track && track == Track::kTensor) ? x.end : x.ready);
      }
    }
    for (const Region& r : wr) {
      for (const Touch& x : p.touches[r.base]) {
        if (!overlaps(x.r, r)) continue;
        // Matmuls of one PSUM accumulation group follow each other on TensorE without a wait.
        const bool same_stream = x.track == track;
        t = std::max(t, x.write && !same_stream ? x.ready : x.end);
      }
    }
    return t;
  }

  void record(ProgramState& p, const Region& r, bool write, double end, double ready, Track track) {
    std::vector<Touch>& list = p.touches[r.base];
    if (write) {  // a write waited for every access it covers: later accesses need only the write
      list.erase(std::remove_if(list.begin(), list.end(), [&](const Touch& x) { return covers(r, x.r); }),
                 list.end());
    } else {
      for (Touch& x : list) {
        if (!x.write && x.r.p_lo == r.p_lo && x.r.p_hi == r.p_hi && x.r.f_lo == r.f_lo && x.r.f_hi == r.f_hi) {
          x.end = std::max(x.end, end);
          x.ready = std::max(x.ready, ready);
          return;
        }
      }
    }
    list.push_back({r, end, ready, write, track});
    if (list.size() > 64) {  // bound the work per access: merge the oldest half conservatively
      Touch m = list[0];
      const size_t half = list.size() / 2;
      for (size_t i = 1; i < half; ++i) {
        const Touch& x = list[i];
        m.r.p_lo = std::min(m.r.p_lo, x.r.p_lo);
        m.r.p_hi = std::max(m.r.p_hi, x.r.p_hi);
        m.r.f_lo = std::min(m.r.f_lo, x.r.f_lo);
        m.r.f_hi = std::max(m.r.f_hi, x.r.f_hi);
        m.end = std::max(m.end, x.end);
        m.ready = std::max(m.ready, x.ready);
        m.write = m.write || x.write;
        if (x.track != m.track) m.track = Track::kSync;  // no same-stream shortcut for a merged touch
      }
      list.erase(list.begin() + 1, list.begin() + half);
      list[0] = m;
    }
  }

  // ---- per-engine costs (ns) ----
  // TensorE's rate at time t under the power throttle (1: full rate).
  double throttle_rate(ProgramState& p, double t) {
    if (!rules.throttle) return 1.0;
    const double w0 = t - rules.throttle_window_ns;
    while (p.busy_head < p.tensor_busy.size() && p.tensor_busy[p.busy_head].second <= w0) ++p.busy_head;
    double busy = 0;
    for (size_t i = p.busy_head; i < p.tensor_busy.size(); ++i) {
      busy += std::min(t, p.tensor_busy[i].second) - std::max(w0, p.tensor_busy[i].first);
    }
    // Below 50% over the last window (or never busy): the ramp starts again here.
    if (busy < rules.throttle_util * rules.throttle_window_ns && t - p.ramp_start >= rules.throttle_ramp_ns) {
      p.ramp_start = t;
    }
    const double x = std::clamp((t - p.ramp_start) / rules.throttle_ramp_ns, 0.0, 1.0);
    return rules.throttle_start_rate + (1.0 - rules.throttle_start_rate) * x;
  }

  void tensor_cost(ProgramState& p, const Instr& in, double* cycles, double* flops, bool* transpose) {
    const Kernel& k = *p.k;
    const Access& dst = in.args[0];
    const bool is_mm = in.op == Op::kMatmul;
    *transpose = !is_mm || (in.ints.size() > 1 && in.ints[1] != 0);
    const Access& stat = in.args[1];
    const DType sd = k.tensors[stat.tensor].dtype;
    const bool fp32 = sd == DType::kFloat32;
    const int64_t M = dst.partitions(), N = dst.free_elements();
    if (*transpose) {
      // data [p, f] -> dst [f, p]: the data is the stationary, an identity streams through.
      *cycles = std::max<double>(static_cast<double>(N), rules.matmul_min_cycles) *
                    (fp32 ? rules.fp32_transpose_slowdown : 1.0) + rules.load_stationary_cycles;
      *flops = 2.0 * static_cast<double>(stat.partitions()) * static_cast<double>(M) * static_cast<double>(N);
      p.stat_tensor = -1;  // the identity replaced the stationary
      return;
    }
    // Rows of the contraction per output row: K = stationary elements / M (2 x 128 in FP8
    // double-row mode, in the same time as a BF16 matmul: [trn2] "Double FP8 Matmul Performance").
    const double K = static_cast<double>(stat.elements()) / static_cast<double>(std::max<int64_t>(1, M));
    *cycles = std::max<double>(static_cast<double>(N), rules.matmul_min_cycles) * (fp32 ? rules.fp32_matmul_slowdown : 1.0);
    if (stat.tensor != p.stat_tensor || stat.offset != p.stat_offset || stat.dims.size() != p.stat_dims.size() ||
        !std::equal(stat.dims.begin(), stat.dims.end(), p.stat_dims.begin(),
                    [](const Dim& a, const Dim& b) { return a.stride == b.stride && a.size == b.size; })) {
      *cycles += rules.load_stationary_cycles;
      p.stat_tensor = stat.tensor;
      p.stat_offset = stat.offset;
      p.stat_dims = stat.dims;
    }
    *flops = 2.0 * K * static_cast<double>(M) * static_cast<double>(N);
  }

  double compute_cycles(const ProgramState& p, const Instr& in, Track track) const {
    const Kernel& k = *p.k;
    int64_t n = 1;
    int inputs = 0;
    bool wide_stride = false, all16 = true, all_sbuf = true, contiguous = true;
    for (size_t i = 0; i < in.args.size(); ++i) {
      const Access& a = in.args[i];
      if (!a.present()) continue;
      const TensorDecl& d = k.tensors[a.tensor];
      const int64_t f = a.free_elements();
      n = std::max(n, f);
      if (!writes(in.op, i) && f > 1) ++inputs;
      if (std::abs(inner_stride(a)) * static_cast<int64_t>(dtype_size(d.dtype)) > rules.stride_penalty_bytes) wide_stride = true;
      if (f > 1) {
        all16 = all16 && is_16bit_float(d.dtype);
        all_sbuf = all_sbuf && d.buffer == Buffer::kSbuf;
        contiguous = contiguous && inner_stride(a) == 1;
      }
    }
    double c = static_cast<double>(n) * std::max(1, inputs);
    if (wide_stride) c *= 2;
    // [trn2] VectorE performance mode for BF16/FP16 operands.
    if (track == Track::kVector && rules.vector_perf_mode_max > 1 && all16) {
      const bool copy_like = in.op == Op::kTensorCopy || in.op == Op::kTensorScalar;
      if (copy_like) c /= (all_sbuf && contiguous) ? rules.vector_perf_mode_max : rules.vector_perf_mode_max / 2;
      else if (in.op == Op::kTensorTensor && all_sbuf) c /= rules.vector_perf_mode_max / 2;
    }
    return rules.sbuf_access_cycles + c;
  }

  // ---- DMA ----
  struct DmaPlan {
    int64_t bytes = 0;
    double ns_per_byte = 0;  // on one queue
    int64_t rows = 1;        // independent rows the transfer splits into over queues
    int64_t descriptors = 1;
    int64_t desc_bytes = 0;
  };

  DmaPlan plan_dma(const Kernel& k, const Instr& in) const {
    DmaPlan d;
    const Access& dst = in.args[0];
    const TensorDecl& dd = k.tensors[dst.tensor];
    const int64_t es = static_cast<int64_t>(dtype_size(dd.dtype));
    d.bytes = bytes_of(k, dst);
    bool transpose = in.op == Op::kDmaTranspose;
    int64_t run = contiguous_run(dst, on_chip(dd.buffer));
    bool sbuf_src = false;
    for (size_t i = 1; i < in.args.size(); ++i) {
      const Access& s = in.args[i];
      if (!s.present()) continue;
      sbuf_src = sbuf_src || on_chip(k.tensors[s.tensor].buffer);
      const int64_t rs = contiguous_run(s, on_chip(k.tensors[s.tensor].buffer));
      // A source walked with a stride where the destination is contiguous: a transposing access.
      if (rs == 1 && run > 1 && s.elements() > 1) transpose = true;
      run = std::min(run, rs);
    }
    double eff = 1.0;
    int64_t desc_elems = std::max<int64_t>(1, run);
    if (transpose) {
      const double te = sbuf_src && on_chip(dd.buffer) ? rules.dma_sbuf_transpose_efficiency : rules.dma_transpose_efficiency;
      if (te > 0) {  // the DMA engines transpose in hardware: full descriptors at a lower efficiency
        eff = te;
        desc_elems = std::max<int64_t>(1, dst.free_elements());
      } else {
        desc_elems = 1;  // element-wise descriptors
      }
    }
    d.desc_bytes = desc_elems * es;
    d.descriptors = std::max<int64_t>(1, dst.elements() / desc_elems);
    // Small descriptors cost as much as a 512-byte one.
    const double moved = static_cast<double>(d.descriptors) *
                         std::max<double>(static_cast<double>(d.desc_bytes), rules.dma_min_descriptor_bytes);
    d.ns_per_byte = 1.0 / (engine_gbps * eff) * (moved / std::max<double>(1.0, static_cast<double>(d.bytes)));
    d.rows = on_chip(dd.buffer) ? dst.partitions() : (dst.dims.empty() ? 1 : dst.dims[0].size);
    d.rows = std::max<int64_t>(d.rows, std::min<int64_t>(d.descriptors, chip.dma_engines_per_core));
    return d;
  }

  // Runs a transfer of `bytes` split over the queues that free up first, from `ready` on.
  double run_dma(ProgramState& p, int32_t index, int64_t bytes, double ns_per_byte, int64_t rows, double ready,
                 double* first_start) {
    const int nq = chip.dma_engines_per_core;
    const int parts = static_cast<int>(std::clamp<int64_t>(rows, 1, nq));
    std::vector<int> order(nq);
    for (int q = 0; q < nq; ++q) order[q] = q;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p.queue_free[a] < p.queue_free[b]; });
    double end = ready;
    *first_start = kInf;
    const int64_t base = rows / parts, extra = rows % parts;
    for (int i = 0; i < parts; ++i) {
      const int q = order[i];
      const int64_t r = base + (i < extra ? 1 : 0);
      const int64_t b = bytes * r / std::max<int64_t>(1, rows);
      const double s = std::max(ready, p.queue_free[q]);
      const double e = s + static_cast<double>(b) * ns_per_byte;
      p.queue_free[q] = e;
      est.dma.push_back({p.index, index, static_cast<int16_t>(q), s, e, b});
      *first_start = std::min(*first_start, s);
      end = std::max(end, e);
    }
    return end;
  }

  // ---- one instruction ----
  void account_hbm(const Kernel& k, const Instr& in) {
    for (size_t i = 0; i < in.args.size(); ++i) {
      const Access& a = in.args[i];
      if (!a.present()) continue;
      const TensorDecl& d = k.tensors[a.tensor];
      if (on_chip(d.buffer)) continue;
      const int64_t b = bytes_of(k, a);
      const TensorDecl& base = d.alias >= 0 ? k.tensors[d.alias] : d;
      const bool scratch = base.external < 0;
      if (writes(in.op, i)) {
        est.hbm_write_bytes += b;
        if (scratch) est.spill_save_bytes += b;
      } else {
        est.hbm_read_bytes += b;
        if (scratch) est.spill_reload_bytes += b;
      }
    }
  }

  void regions(const Kernel& k, const Instr& in, std::vector<Region>* rd, std::vector<Region>* wr) const {
    rd->clear();
    wr->clear();
    for (size_t i = 0; i < in.args.size(); ++i) {
      const Access& a = in.args[i];
      if (!a.present()) continue;
      (writes(in.op, i) ? wr : rd)->push_back(region_of(k, a));
      if (a.index.present()) rd->push_back(Region{a.index.tensor, 0, kAll, 0, kAll});  // the index is read
    }
  }

  void finish(ProgramState& p, const Instr& in, Track track, double start, double end, double dep_latency_ns,
              const std::vector<Region>& rd, const std::vector<Region>& wr, double flops) {
    for (const Region& r : rd) record(p, r, false, end, end, track);
    for (const Region& r : wr) record(p, r, true, end, end + dep_latency_ns, track);
    est.instrs.push_back({p.index, static_cast<int32_t>(p.pc), track, start, end, flops});
    TrackStats& ts = est.tracks[static_cast<int>(track)];
    ts.instructions++;
    if (track != Track::kDma) ts.active_ns += end - start;
    p.last_end = std::max(p.last_end, end);
    (void)in;
  }

  // Schedules program p's instruction at pc (not a sendrecv / core_barrier).
  void step(ProgramState& p) {
    const Kernel& k = *p.k;
    const Instr& in = k.instrs[p.pc];
    const Track track = track_of(in);
    std::vector<Region> rd, wr;
    regions(k, in, &rd, &wr);
    account_hbm(k, in);
    const double ready = ready_time(p, rd, wr, track);
    if (track == Track::kDma) {
      const DmaPlan d = plan_dma(k, in);
      double first = 0;
      const double end = run_dma(p, static_cast<int32_t>(p.pc), d.bytes, d.ns_per_byte, d.rows,
                                 ready + rules.dma_fixed_ns, &first);
      finish(p, in, track, ready, end, 0, rd, wr, 0);
      return;
    }
    double start = std::max(ready, p.free[static_cast<int>(track)]);
    double dur = 0, flops = 0, lat = cycles_ns(rules.dependency_cycles, track);
    if (track == Track::kTensor && (in.op == Op::kMatmul || in.op == Op::kTranspose)) {
      double cycles = 0;
      bool transpose = false;
      tensor_cost(p, in, &cycles, &flops, &transpose);
      const double rate = throttle_rate(p, start);
      dur = cycles_ns(cycles, track) / rate;
      (transpose ? est.transpose_flops : est.model_flops) += flops;
      if (rate < 1.0) est.throttled_flops += flops;
      p.tensor_busy.push_back({start, start + dur});
    } else if (track == Track::kSync) {
      dur = 0;  // device_print: a simulator aid with no hardware cost
      lat = 0;
    } else {
      dur = cycles_ns(compute_cycles(p, in, track), track);
    }
    p.free[static_cast<int>(track)] = start + dur;
    finish(p, in, track, start, start + dur, lat, rd, wr, flops);
  }
};

}  // namespace

const CostRules& cost_rules(rt::Chip chip) {
  switch (chip) {
    case rt::Chip::kTrn1: return kRules[0];
    case rt::Chip::kInf2: return kRules[1];
    case rt::Chip::kTrn2: return kRules[2];
    case rt::Chip::kTrn3: return kRules[3];
  }
  return kRules[2];
}

const char* track_name(Track t) {
  static const char* names[] = {"tensor", "vector", "scalar", "gpsimd", "sync", "dma"};
  return names[static_cast<int>(t)];
}

Track track_of(const Instr& in) {
  const int at = engine_attr(in.op);
  if (at >= 0 && static_cast<size_t>(at) < in.ints.size() && in.ints[at] != 0) {
    return from_engine(static_cast<Engine>(in.ints[at]));
  }
  // nc_transpose defaults to TensorE; tensor_copy / tensor_tensor to VectorE (the op table).
  return from_engine(engine_of(in.op));
}

double Estimate::active_percent(Track t) const {
  if (total_ns <= 0 || programs == 0) return 0;
  return 100.0 * tracks[static_cast<int>(t)].active_ns / (total_ns * programs);
}
double Estimate::hfu_percent() const {
  if (total_ns <= 0) return 0;
  return 100.0 * (model_flops + transpose_flops) / (peak_flops_per_s * programs * total_ns * 1e-9);
}
double Estimate::mfu_percent() const {
  if (total_ns <= 0) return 0;
  return 100.0 * model_flops / (peak_flops_per_s * programs * total_ns * 1e-9);
}
double Estimate::mbu_percent() const {
  if (total_ns <= 0) return 0;
  return 100.0 * static_cast<double>(hbm_read_bytes + hbm_write_bytes) / (hbm_bytes_per_s * programs * total_ns * 1e-9);
}
double Estimate::mm_arithmetic_intensity() const {
  const double b = static_cast<double>(hbm_read_bytes + hbm_write_bytes);
  return b > 0 ? model_flops / b : 0;
}

Estimate estimate(const std::vector<const Kernel*>& programs, const rt::ChipFacts& chip) {
  Estimate est;
  est.platform = chip.name;
  est.programs = static_cast<int>(programs.size());
  est.peak_flops_per_s = 2.0 * chip.pe_rows * chip.pe_cols * chip.tensor_ghz * 1e9;
  est.hbm_bytes_per_s = chip.hbm_tbps * 1e12 / chip.physical_cores;
  if (programs.empty()) return est;
  Scheduler s(chip, est);
  size_t total = 0;
  for (size_t r = 0; r < programs.size(); ++r) {
    if (programs[r] == nullptr) throw std::invalid_argument("nki estimate: a null program");
    ProgramState p;
    p.k = programs[r];
    p.index = static_cast<int>(r);
    p.touches.resize(p.k->tensors.size());
    p.queue_free.assign(chip.dma_engines_per_core, 0.0);
    s.progs.push_back(std::move(p));
    total += programs[r]->instrs.size();
  }
  est.instrs.reserve(total);
  const int n = static_cast<int>(programs.size());
  enum Status { kRunning, kWaiting, kDone };
  std::vector<Status> status(n, kRunning);
  std::vector<bool> sent(n, false);
  std::vector<double> arrive(n, 0);
  // (from, to, pipe_id) -> when each sent payload is ready, and its bytes
  std::map<std::tuple<int, int, int64_t>, std::vector<std::pair<double, int64_t>>> mail;
  std::map<std::tuple<int, int, int64_t>, size_t> taken;
  auto where = [&](int r) {
    const Instr& in = programs[r]->instrs[s.progs[r].pc];
    return in.loc.file + ":" + std::to_string(in.loc.line);
  };
  for (;;) {
    bool progress = false, all_done = true;
    for (int r = 0; r < n; ++r) {
      ProgramState& p = s.progs[r];
      if (status[r] == kDone) continue;
      all_done = false;
      if (status[r] == kRunning) {
        for (; p.pc < p.k->instrs.size() && !synchronizes(p.k->instrs[p.pc].op); ++p.pc) s.step(p);
        progress = true;
        if (p.pc == p.k->instrs.size()) {
          status[r] = kDone;
          continue;
        }
        status[r] = kWaiting;
        arrive[r] = -1;
      }
      const Instr& in = p.k->instrs[p.pc];
      if (in.op != Op::kSendRecv) continue;
      const int to = static_cast<int>(in.ints.at(0)), from = static_cast<int>(in.ints.at(1));
      if (to < 0 || to >= n || from < 0 || from >= n) {
        throw std::out_of_range(where(r) + ": sendrecv names program " + std::to_string(to < 0 || to >= n ? to : from) +
                                ", but this launch has " + std::to_string(n));
      }
      std::vector<Region> rd, wr;
      s.regions(*p.k, in, &rd, &wr);
      if (!sent[r]) {  // the payload is ready once the source's producers are done
        mail[{r, to, in.ints.at(2)}].push_back({s.ready_time(p, rd, {}, Track::kDma), bytes_of(*p.k, in.args[1])});
        sent[r] = true;
        progress = true;
      }
      const auto key = std::make_tuple(from, r, in.ints.at(2));
      auto box = mail.find(key);
      size_t& next = taken[key];
      if (box == mail.end() || next >= box->second.size()) continue;
      const auto [payload_ready, bytes] = box->second[next++];
      const double ready = std::max({payload_ready, s.ready_time(p, rd, wr, Track::kDma)}) + s.rules.dma_fixed_ns;
      double first = 0;
      const double end = s.run_dma(p, static_cast<int32_t>(p.pc), bytes, 1.0 / s.engine_gbps,
                                   in.args[0].partitions(), ready, &first);
      s.finish(p, in, Track::kDma, ready, end, 0, rd, wr, 0);
      sent[r] = false;
      status[r] = kRunning;
      ++p.pc;
      progress = true;
    }
    // A barrier opens when every core it names has reached one: after all their earlier work.
    for (int r = 0; r < n; ++r) {
      ProgramState& p = s.progs[r];
      if (status[r] != kWaiting || p.k->instrs[p.pc].op != Op::kCoreBarrier) continue;
      std::vector<int64_t> cores = p.k->instrs[p.pc].ints;
      if (std::find(cores.begin(), cores.end(), r) == cores.end()) cores.push_back(r);
      bool open = true;
      double release = 0;
      for (int64_t c : cores) {
        if (c < 0 || c >= n) {
          throw std::out_of_range(where(r) + ": core_barrier names core " + std::to_string(c) + ", but this launch has " +
                                  std::to_string(n));
        }
        const ProgramState& q = s.progs[c];
        open = open && status[c] == kWaiting && q.k->instrs[q.pc].op == Op::kCoreBarrier;
        if (open) release = std::max({release, q.last_end, q.fence});
      }
      if (!open) continue;
      for (int64_t c : cores) {
        ProgramState& q = s.progs[c];
        const double arrived = std::max(q.last_end, q.fence);
        s.finish(q, q.k->instrs[q.pc], Track::kSync, arrived, release, 0, {}, {}, 0);
        q.fence = release;
        status[c] = kRunning;
        ++q.pc;
      }
      progress = true;
    }
    if (all_done) break;
    if (!progress) {
      std::string msg = "nki estimate: the programs of this launch wait for each other forever:";
      for (int r = 0; r < n; ++r) {
        msg += "\n  program " + std::to_string(r) + ": " + (status[r] == kDone ? "has ended" : "waits at " + where(r));
      }
      throw std::runtime_error(msg);
    }
  }
  // DMA active time: the union of the queues' transfers, per program.
  std::vector<std::vector<std::pair<double, double>>> iv(n);
  for (const DmaSlice& d : est.dma) iv[d.program].push_back({d.start_ns, d.end_ns});
  for (auto& v : iv) {
    std::sort(v.begin(), v.end());
    double cur_s = -1, cur_e = -1;
    for (const auto& [a, b] : v) {
      if (a > cur_e) {
        if (cur_e > cur_s) est.tracks[static_cast<int>(Track::kDma)].active_ns += cur_e - cur_s;
        cur_s = a;
        cur_e = b;
      } else {
        cur_e = std::max(cur_e, b);
      }
    }
    if (cur_e > cur_s) est.tracks[static_cast<int>(Track::kDma)].active_ns += cur_e - cur_s;
  }
  for (const InstrTiming& t : est.instrs) est.total_ns = std::max(est.total_ns, t.end_ns);
  return est;
}

namespace {
void json_string(std::ostringstream& o, const std::string& s) {
  o << '"';
  for (char c : s) {
    if (c == '"' || c == '\\') o << '\\' << c;
    else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      o << buf;
    } else o << c;
  }
  o << '"';
}
}  // namespace

std::string chrome_trace(const Estimate& e, const std::vector<const Kernel*>& programs) {
  std::ostringstream o;
  o.precision(6);
  o << std::fixed;
  o << "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"platform\":\"" << e.platform
    << "\",\"note\":\"estimated schedule (engine model), not a measurement\"},\"traceEvents\":[";
  bool first = true;
  auto sep = [&] { if (!first) o << ','; first = false; };
  // Thread ids: 0..4 the compute/sync engines, 10 + q the DMA queues.
  for (int p = 0; p < e.programs; ++p) {
    sep();
    o << "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" << p << ",\"args\":{\"name\":\"core " << p << "\"}}";
    for (int t = 0; t < kNumTracks - 1; ++t) {
      sep();
      o << "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" << p << ",\"tid\":" << t << ",\"args\":{\"name\":\""
        << track_name(static_cast<Track>(t)) << "\"}}";
    }
  }
  std::vector<std::vector<bool>> queues(e.programs);
  for (const DmaSlice& d : e.dma) {
    auto& q = queues[d.program];
    if (q.size() <= static_cast<size_t>(d.queue)) q.resize(d.queue + 1, false);
    q[d.queue] = true;
  }
  for (int p = 0; p < e.programs; ++p) {
    for (size_t q = 0; q < queues[p].size(); ++q) {
      if (!queues[p][q]) continue;
      sep();
      o << "{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":" << p << ",\"tid\":" << 10 + q
        << ",\"args\":{\"name\":\"dma queue " << q << "\"}}";
    }
  }
  // Per instruction, its name and source once (a DMA instruction has up to 16 slices).
  std::vector<std::vector<std::string>> labels(e.programs);
  auto label = [&](int p, int idx) -> const std::string& {
    auto& l = labels[p];
    if (l.empty()) l.resize(programs[p]->instrs.size());
    std::string& s = l[idx];
    if (s.empty()) {
      const Instr& in = programs[p]->instrs[idx];
      std::ostringstream n;
      n << "\"name\":";
      json_string(n, op_name(in.op));
      n << ",\"args\":{\"instruction\":" << idx << ",\"source\":";
      json_string(n, in.loc.file + ":" + std::to_string(in.loc.line));
      s = n.str();
    }
    return s;
  };
  std::string out = o.str();
  // std::to_chars: printf-formatting millions of doubles dominates the time otherwise.
  char buf[64];
  auto num = [&](double v, int precision) {
    const auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::fixed, precision);
    out.append(buf, r.ptr);
  };
  auto slice = [&](int p, int tid, int idx, double s, double en, const char* extra_key, double extra) {
    out += first ? "{\"ph\":\"X\",\"pid\":" : ",{\"ph\":\"X\",\"pid\":";
    first = false;
    out += std::to_string(p);
    out += ",\"tid\":";
    out += std::to_string(tid);
    out += ",\"ts\":";
    num(s * 1e-3, 4);  // microseconds, to 0.1 ns
    out += ",\"dur\":";
    num((en - s) * 1e-3, 4);
    out += ',';
    out += label(p, idx);
    if (extra_key) {
      out += ",\"";
      out += extra_key;
      out += "\":";
      num(extra, 0);
    }
    out += "}}";
  };
  for (const InstrTiming& t : e.instrs) {
    if (t.track == Track::kDma) continue;  // drawn per queue below
    slice(t.program, static_cast<int>(t.track), t.index, t.start_ns, t.end_ns, t.flops > 0 ? "flops" : nullptr, t.flops);
  }
  for (const DmaSlice& d : e.dma) slice(d.program, 10 + d.queue, d.index, d.start_ns, d.end_ns, "bytes", static_cast<double>(d.bytes));
  out += "]}";
  return out;
}

}  // namespace neuron::nki
