// Platform model of the simulated Trainium instance: which chip, how physical
// NeuronCores are grouped into logical devices (LNC), which devices this process
// may see, and how much HBM each one has. Read once from the environment.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace neuron::rt {

enum class Chip { kTrn2, kTrn3 };

struct ChipFacts {
  Chip chip;
  const char* name;            // "trn2" / "trn3"
  const char* core_name;       // "NeuronCore-v3" / "NeuronCore-v4"
  int physical_cores;          // per chip
  uint64_t hbm_bytes;          // per chip
  double hbm_tbps;             // bandwidth per chip, TB/s
  double bf16_tflops;          // dense, per chip
  double fp32_tflops;
  double fp8_tflops;           // 0 where the chip has no FP8 matmul in TorchNeuron
  uint64_t sbuf_bytes;         // per physical core
  uint64_t psum_bytes;         // per physical core
  bool supports_fp8;
  bool supports_mx;
  double engine_ghz;           // ScalarE / GpSimdE clock: the cycles torch.neuron._sleep counts
};

const ChipFacts& chip_facts(Chip chip);

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
