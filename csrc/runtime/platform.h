// Platform model of the simulated Trainium instance: which chip, how physical
// NeuronCores are grouped into logical devices (LNC), which devices this process
// may see, and how much HBM each one has. Read once from the environment.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace neuron::rt {

// Every chip the platform model knows. trn2 and trn3 are simulated by the torch device;
// trn1 and inf2 (NeuronCore-v2) are NKI targets only (trace, verify, run, estimate).
enum class Chip { kTrn1, kInf2, kTrn2, kTrn3 };

// Facts of one chip and its NeuronCore: the one owner of every hardware number the runtime,
// the NKI verifier, nl.tile_size and torch.neuron.get_platform() use. Values and their sources
// are in platform.cpp.
struct ChipFacts {
  Chip chip;
  const char* name;            // "trn1" / "inf2" / "trn2" / "trn3": what NEURON_PLATFORM names
  const char* product;         // "Trainium" / "Inferentia2" / "Trainium2" / "Trainium3"
  const char* core_name;       // "NeuronCore-v2" / "NeuronCore-v3" / "NeuronCore-v4"
  int nc_version;              // 2 / 3 / 4 (nki.isa.nc_version)
  bool torch_device;           // the torch device can simulate this chip
  int physical_cores;          // per chip

  // On-chip memory of one physical core.
  int partitions;              // SBUF/PSUM partitions = engine lanes
  uint64_t sbuf_partition_bytes;
  uint64_t psum_partition_bytes;
  int psum_banks;              // PSUM banks per partition
  uint64_t psum_bank_bytes;

  // Engines of one core.
  int pe_rows, pe_cols;        // TensorE systolic array
  int gemm_moving_fmax;        // matmul moving free size with an fp32 result
  int gemm_moving_fmax_bf16;   // ... with a bf16 result (NeuronCore-v4 writes across every PSUM bank)
  double tensor_ghz;           // TensorE clock
  double vector_ghz;           // VectorE clock
  double engine_ghz;           // ScalarE / GpSimdE clock: the cycles torch.neuron._sleep counts
  double vector_fp32_tflops;   // per core

  // TensorE dense TFLOPS per core.
  double core_bf16_tflops;
  double core_fp32_tflops;
  double core_fp8_tflops;

  // Per chip.
  double bf16_tflops;          // dense, as AWS's chip page states it
  double fp32_tflops;
  double fp8_tflops;           // cFP8 (trn1/inf2/trn2) or MXFP8 (trn3)
  uint64_t hbm_bytes;
  double hbm_tbps;             // bandwidth, TB/s
  int dma_engines_per_core;
  double dma_engine_gbps;      // one DMA engine, GB/s
  double dma_tbps;             // all DMA engines of the chip, TB/s
  const char* link_name;       // chip-to-chip interconnect
  double link_tbps;            // per chip, TB/s; 0 where AWS publishes no per-chip figure

  // FP8 / MX matmuls on the torch device (TorchNeuron documents them for Trainium 3 only).
  bool supports_fp8;
  bool supports_mx;

  // The instance the chip ships in: how a step estimate maps ranks to chips, links and EFA.
  const char* instance_name = "";  // the largest single instance (or UltraServer) of the chip
  int chips_per_instance = 1;
  const char* link_topology = "";  // how NeuronLink connects the chips of one instance
  int link_dims = 1;               // dimensions of that topology; a ring along one uses 1/link_dims of link_tbps
  double efa_gbps = 0;             // EFA between instances, per instance, Gbit/s; 0: no EFA
  // Per-step latencies of a collective (AWS publishes none: assumed, and said so in every estimate).
  double link_latency_us = 0;      // one step between chips over NeuronLink (or between cores of a chip)
  double efa_latency_us = 0;       // one step between instances over EFA

  uint64_t sbuf_bytes() const { return static_cast<uint64_t>(partitions) * sbuf_partition_bytes; }
  uint64_t psum_bytes() const { return static_cast<uint64_t>(partitions) * psum_partition_bytes; }
};

const ChipFacts& chip_facts(Chip chip);

// Every chip, oldest generation first.
const std::vector<const ChipFacts*>& all_chips();

// The chip a platform name means: "trn1", "inf2", "trn2", "trn3" or AWS's generation names
// "gen2" (trn1), "gen3" (trn2), "gen4" (trn3); case and surrounding blanks are ignored.
// nullptr when the name is unknown (or empty).
const ChipFacts* find_chip(const std::string& name) noexcept;

// The chip NKI kernels are traced for: AWS's NEURON_PLATFORM_TARGET_OVERRIDE if set, else
// NEURON_PLATFORM, else trn2. Read at every call (kernels may switch targets between launches).
// Throws Error(kConfig) naming the variable and the accepted values.
const ChipFacts& nki_target_from_env();

struct DeviceInfo {
  int index;                 // logical device index as torch sees it (0..count-1)
  int logical_core;          // logical core id on the chip (what NEURON_RT_VISIBLE_CORES names)
  std::vector<int> physical_cores;
  uint64_t total_memory;     // capacity in bytes
};

struct Platform {
  const ChipFacts* chip;
  int lnc;                   // physical cores per logical device (1 or 2)
  int logical_cores;         // logical cores on the chip
  std::vector<DeviceInfo> devices;
  bool launch_blocking;      // NEURON_LAUNCH_BLOCKING
  std::string memory_source; // where total_memory came from (platform / NEURON_DEVICE_MEMORY)
};

// The platform parsed from the environment on first use. Throws Error(kConfig)
// with a message naming the variable and the fix when the environment is malformed.
const Platform& platform();

// Number of visible logical devices; 0 when the configuration is invalid (never throws).
int device_count() noexcept;

// The configuration error message, or "" when the configuration is valid.
std::string config_error() noexcept;

// Throws Error(kInvalidDevice) unless 0 <= index < device_count().
void check_device(int index);

// Parses "0-3", "0,2,5", "1" into core ids. Exposed for tests.
std::vector<int> parse_core_list(const std::string& spec, const char* var_name);

// Parses "123", "64K", "512MiB", "2GB", "1.5G" into bytes. Exposed for tests.
uint64_t parse_bytes(const std::string& spec, const char* var_name);

// Test hook: forget the parsed platform so the next call re-reads the environment.
// Only valid while no device memory is allocated.
void reset_platform_for_testing();

// Process-wide state: marks the runtime as initialized and installs the fork guard.
void initialize();
bool is_initialized() noexcept;
// True in a child forked after initialize(); every entry point then refuses to run.
bool in_bad_fork() noexcept;
// Throws Error(kForked) in a bad fork.
void check_not_forked();

}  // namespace neuron::rt
