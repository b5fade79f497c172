// The engine model of a NeuronCore: when every instruction of a traced NKI kernel would run.
//
// Each instruction gets an engine (TensorE, VectorE, ScalarE, GpSimdE, sync, or the core's DMA
// queues) and a cost from AWS's public instruction rules (CostRules, one row per chip, every value
// with its source). Each engine executes its own instruction stream in program order; engines run
// in parallel and wait only on true data dependencies: the tile regions an instruction reads and
// writes (RAW, WAR, WAW), PSUM accumulation groups, core_barrier and sendrecv between the programs
// of a launch. The result is a deterministic schedule (start/end per instruction and per DMA
// transfer) and the summary metrics AWS's profiler (Neuron Explorer) reports, under its names.
// Nothing is executed: only shapes, dtypes, memories and access patterns matter.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "nki/ir.h"
#include "runtime/platform.h"

namespace neuron::nki {

// Cost-rule constants that are not chip facts (chip facts are rt::ChipFacts). Values and sources
// are in cost_model.cpp, one row per chip.
struct CostRules {
  const char* chip;
  // TensorE
  double matmul_min_cycles;         // initiation interval floor: max(N, this) cycles per matmul
  double load_stationary_cycles;    // LoadStationary when the stationary operand changes
  double fp32_matmul_slowdown;      // FP32 operands vs BF16 (1 pass vs 4)
  double fp32_transpose_slowdown;   // FP32 transposes (NeuronCore-v3+ transpose mode halves it)
  // VectorE / ScalarE / GpSimdE
  double sbuf_access_cycles;        // fixed cost of every instruction (SBUF/PSUM access)
  double dependency_cycles;         // an instruction that consumes a result waits this long after it
  double stride_penalty_bytes;      // an inner stride above this many bytes halves access bandwidth
  double vector_perf_mode_max;      // VectorE BF16/FP16 performance mode (1: none, 4: 4x/2x rules)
  // DMA
  double dma_fixed_ns;              // per DMA instruction: descriptor generation before data moves
  double dma_min_descriptor_bytes;  // a descriptor moves at least this many bytes' worth of time
  double dma_transpose_efficiency;  // HBM->SBUF transposing DMA vs a plain copy (0: element-wise)
  double dma_sbuf_transpose_efficiency;  // SBUF->SBUF transposing DMA
  // TensorE power throttle (dI/dt)
  bool throttle;
  double throttle_start_rate;       // rate when the ramp starts
  double throttle_ramp_ns;          // time to full rate
  double throttle_window_ns;        // re-engages after a window this long below ...
  double throttle_util;             // ... this utilisation
};
const CostRules& cost_rules(rt::Chip chip);

// Engines of one core, as tracks. kDma is the union of the DMA queues.
enum class Track : int8_t { kTensor, kVector, kScalar, kGpSimd, kSync, kDma };
constexpr int kNumTracks = 6;
const char* track_name(Track t);  // "tensor", "vector", "scalar", "gpsimd", "sync", "dma"

// The engine an instruction runs on: the op table's default, or the instruction's engine= argument.
Track track_of(const Instr& in);

struct InstrTiming {
  int32_t program;
  int32_t index;    // in its program
  Track track;
  double start_ns, end_ns;
  double flops;     // TensorE FLOPs (matmul and transpose)
};

// One DMA transfer on one queue (a DMA instruction is split over up to dma_engines_per_core).
struct DmaSlice {
  int32_t program;
  int32_t index;    // the instruction
  int16_t queue;
  double start_ns, end_ns;
  int64_t bytes;
};

struct TrackStats {
  int64_t instructions = 0;
  double active_ns = 0;   // time with at least one instruction running (summed over programs)
};

struct Estimate {
  std::string platform;
  int programs = 0;
  double total_ns = 0;                       // kernel latency: the last instruction's end
  std::vector<InstrTiming> instrs;           // program 0's instructions, then program 1's, ...
  std::vector<DmaSlice> dma;
  std::array<TrackStats, kNumTracks> tracks;
  double model_flops = 0, transpose_flops = 0, throttled_flops = 0;
  int64_t hbm_read_bytes = 0, hbm_write_bytes = 0;
  int64_t spill_save_bytes = 0, spill_reload_bytes = 0;  // kernel-internal HBM scratch
  double peak_flops_per_s = 0;               // 2 x PE count x TensorE clock, per core
  double hbm_bytes_per_s = 0;                // one core's share of the chip's HBM bandwidth

  double active_percent(Track t) const;
  double hfu_percent() const;                // (model + transpose FLOPs) / peak
  double mfu_percent() const;                // model FLOPs / peak
  double mbu_percent() const;                // HBM bytes / (HBM bandwidth x time)
  double mm_arithmetic_intensity() const;    // model FLOPs / HBM bytes
};

// Models the programs of one launch (one program: a kernel call) on `chip`. Throws
// std::invalid_argument for an instruction it cannot place, std::runtime_error when the
// programs wait for each other forever (as run_launch does).
Estimate estimate(const std::vector<const Kernel*>& programs, const rt::ChipFacts& chip);

// The schedule as Chrome trace-event JSON (Perfetto opens it): one process per program, one
// track per engine and DMA queue; each slice names its instruction and kernel source line.
std::string chrome_trace(const Estimate& e, const std::vector<const Kernel*>& programs);

}  // namespace neuron::nki
