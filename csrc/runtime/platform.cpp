#include "runtime/platform.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <pthread.h>
#include <atomic>
#include <set>
#include <sstream>

#include "runtime/errors.h"

namespace neuron::rt {
namespace {

constexpr uint64_t kGiB = 1ull << 30;
constexpr long long kMaxCoreId = 65535;

constexpr uint64_t kKiB = 1ull << 10;

// Sources are pages of AWS's Neuron documentation (aws-neuron-sdk, SDK 2.33):
//   chip pages   about-neuron/arch/neuron-hardware/{trainium,inferentia2,trainium2,trainium3}.rst
//   core pages   about-neuron/arch/neuron-hardware/neuron-core-v{2,3,4}.rst
//   NKI guides   nki/guides/architecture/{trainium_inferentia2,trainium2,trainium3}_arch.rst
// Where pages disagree the choice is noted. Per-core TensorE TFLOPS for NeuronCore-v2 is the chip
// figure over its two cores (the core page gives none).

// NeuronCore-v2: one definition for trn1 and inf2, which differ only in name and product.
constexpr ChipFacts nc_v2(Chip chip, const char* name, const char* product) {
  return ChipFacts{
      .chip = chip, .name = name, .product = product, .core_name = "NeuronCore-v2", .nc_version = 2,
      .torch_device = false,
      .physical_cores = 2,                 // chip pages: two NeuronCore-v2
      .partitions = 128,                   // NKI guide (trainium_inferentia2_arch)
      .sbuf_partition_bytes = 192 * kKiB,  // 24 MiB SBUF per core = 128 x 192 KiB (NKI guide)
      .psum_partition_bytes = 16 * kKiB,   // 2 MiB PSUM per core (NKI guide)
      .psum_banks = 8,
      .psum_bank_bytes = 2 * kKiB,         // 512 fp32 per bank (NKI guide)
      .pe_rows = 128, .pe_cols = 128,      // TensorE systolic array (NKI guide)
      .gemm_moving_fmax = 512, .gemm_moving_fmax_bf16 = 512,  // one PSUM bank (NKI guide)
      .tensor_ghz = 2.8,                   // TensorE clock (NKI guide)
      .vector_ghz = 1.4,                   // the guides give a 0.96-1.4 GHz class: the upper end
      .engine_ghz = 1.4,                   // as VectorE (no separate figure published)
      .vector_fp32_tflops = 2.3,           // core page: VectorE 2.3 FP32 TFLOPS
      .core_bf16_tflops = 95, .core_fp32_tflops = 23.75, .core_fp8_tflops = 95,  // chip / 2
      .bf16_tflops = 190, .fp32_tflops = 47.5, .fp8_tflops = 190,  // chip pages (cFP8 190)
      .hbm_bytes = 32 * kGiB,              // chip pages
      .hbm_tbps = 0.82,                    // chip pages: 820 GB/s
      .dma_engines_per_core = 16,          // NKI guide: 16 DMA engines per core
      .dma_engine_gbps = 27,               // NKI guide: ~27 GB/s each
      .dma_tbps = 1.0,                     // chip pages: 1 TB/s of DMA bandwidth
      .link_name = "NeuronLink-v2",        // chip pages
      .link_tbps = 0,                      // no per-chip figure published
      .supports_fp8 = false, .supports_mx = false};
}

// Latencies of one collective step: AWS publishes none. Assumed orders of magnitude for a
// NeuronLink hop and for an EFA message; every estimate lists them among its assumptions.
constexpr double kAssumedLinkLatencyUs = 2.0;
constexpr double kAssumedEfaLatencyUs = 15.0;

constexpr ChipFacts with_instance(ChipFacts c, const char* instance, int chips, const char* topology, int dims,
                                  double efa_gbps) {
  c.instance_name = instance;
  c.chips_per_instance = chips;
  c.link_topology = topology;
  c.link_dims = dims;
  c.efa_gbps = efa_gbps;
  c.link_latency_us = kAssumedLinkLatencyUs;
  c.efa_latency_us = efa_gbps > 0 ? kAssumedEfaLatencyUs : 0;
  return c;
}

// trn1-arch page: trn1.32xlarge, 16 Trainium, NeuronLink-v2 in a 4-D hypercube, 800 Gbps EFA (trn1n 1,600).
constexpr ChipFacts kTrn1 = with_instance(nc_v2(Chip::kTrn1, "trn1", "Trainium"), "trn1.32xlarge", 16,
                                          "4-D hypercube", 4, 800);
// inf2-arch page: inf2.48xlarge, 12 Inferentia2 on a NeuronLink-v2 ring; no EFA.
constexpr ChipFacts kInf2 = with_instance(nc_v2(Chip::kInf2, "inf2", "Inferentia2"), "inf2.48xlarge", 12,
                                          "ring", 1, 0);

constexpr ChipFacts kTrn2{
    .chip = Chip::kTrn2, .name = "trn2", .product = "Trainium2", .core_name = "NeuronCore-v3", .nc_version = 3,
    .torch_device = true,
    .physical_cores = 8,                 // chip page: eight NeuronCore-v3 (LNC=2 -> 4 logical)
    .partitions = 128,
    .sbuf_partition_bytes = 224 * kKiB,  // 28 MiB per core = 128 x 224 KiB (core page "28MB"; trn3 page
                                         // "up from 28 MiB"); 24 MiB is NeuronCore-v2
    .psum_partition_bytes = 16 * kKiB,   // 2 MiB PSUM per core (NKI guide trainium2_arch)
    .psum_banks = 8,
    .psum_bank_bytes = 2 * kKiB,
    .pe_rows = 128, .pe_cols = 128,
    .gemm_moving_fmax = 512, .gemm_moving_fmax_bf16 = 512,
    .tensor_ghz = 2.4,                   // NKI guide trainium2_arch
    .vector_ghz = 0.96,                  // NKI guide: 512 BF16 elements/cycle at 0.96 GHz
    .engine_ghz = 1.2,                   // NKI guide: ScalarE and GpSimdE at 1.2 GHz
    .vector_fp32_tflops = 1.0,           // NKI guide
    .core_bf16_tflops = 79, .core_fp32_tflops = 20, .core_fp8_tflops = 158,  // core page
    // Chip page (8 x the core figures is 632 BF16: the pages disagree; the chip page is kept for
    // chip totals, the core page for per-core rates).
    .bf16_tflops = 667, .fp32_tflops = 181, .fp8_tflops = 1299,
    .hbm_bytes = 96 * kGiB,
    .hbm_tbps = 2.9,                     // chip page (the NKI guide rounds to 3 TB/s)
    .dma_engines_per_core = 16,          // NKI guide: 128 DMA engines per chip
    .dma_engine_gbps = 3500.0 / 128,     // the chip's DMA bandwidth over its engines
    .dma_tbps = 3.5,                     // chip page
    .link_name = "NeuronLink-v3",
    .link_tbps = 1.28,                   // chip page
    .supports_fp8 = false, .supports_mx = false,
    // trn2-arch page: trn2.48xlarge, 16 Trainium2 in a 4x4 2-D torus, EFAv3 3,200 Gbps.
    .instance_name = "trn2.48xlarge", .chips_per_instance = 16, .link_topology = "4x4 2-D torus",
    .link_dims = 2, .efa_gbps = 3200,
    .link_latency_us = kAssumedLinkLatencyUs, .efa_latency_us = kAssumedEfaLatencyUs};

constexpr ChipFacts kTrn3{
    .chip = Chip::kTrn3, .name = "trn3", .product = "Trainium3", .core_name = "NeuronCore-v4", .nc_version = 4,
    .torch_device = true,
    .physical_cores = 8,                 // chip page: eight NeuronCore-v4
    .partitions = 128,
    .sbuf_partition_bytes = 256 * kKiB,  // 32 MiB per core = 128 x 256 KiB (core page)
    .psum_partition_bytes = 16 * kKiB,   // 2 MiB PSUM per core (NKI guide trainium3_arch)
    .psum_banks = 8,
    .psum_bank_bytes = 2 * kKiB,
    .pe_rows = 128, .pe_cols = 128,
    .gemm_moving_fmax = 4096, .gemm_moving_fmax_bf16 = 8192,  // NKI guide: a matmul writes all 8 banks
    .tensor_ghz = 2.4,                   // NKI guide trainium3_arch
    .vector_ghz = 1.2,
    .engine_ghz = 1.2,                   // ScalarE (256 BF16 lanes) and GpSimdE at 1.2 GHz
    .vector_fp32_tflops = 1.2,
    .core_bf16_tflops = 79, .core_fp32_tflops = 20, .core_fp8_tflops = 315,  // core page (MXFP8)
    .bf16_tflops = 671, .fp32_tflops = 183, .fp8_tflops = 2517,             // chip page
    .hbm_bytes = 144 * kGiB,
    .hbm_tbps = 4.9,                     // chip page (the NKI guide says 4.7)
    .dma_engines_per_core = 16,          // as NeuronCore-v3 (no figure published for v4)
    .dma_engine_gbps = 4900.0 / 128,     // the chip's DMA bandwidth over 128 engines
    .dma_tbps = 4.9,                     // chip page
    .link_name = "NeuronLink-v4",
    .link_tbps = 2.56,                   // chip page
    .supports_fp8 = true, .supports_mx = true,
    // trn3 pages: Trn3 UltraServer of 64 chips with 12,800 Gbps EFA (a 144-chip one has 28,800). The
    // NeuronLink-v4 topology is not published: modelled as every link usable by any group.
    .instance_name = "Trn3 UltraServer (64)", .chips_per_instance = 64,
    .link_topology = "not published (all links usable)", .link_dims = 1, .efa_gbps = 12800,
    .link_latency_us = kAssumedLinkLatencyUs, .efa_latency_us = kAssumedEfaLatencyUs};

[[noreturn]] void config_fail(const std::string& msg) { throw Error(ErrorCode::kConfig, msg); }

const char* env(const char* name) { return std::getenv(name); }

std::string trim(const std::string& s) {
  size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

bool parse_int(const std::string& s, long long* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  long long v = std::strtoll(s.c_str(), &end, 10);
  if (*end != '\0') return false;
  *out = v;
  return true;
}

std::unique_ptr<Platform> build_platform() {
  auto p = std::make_unique<Platform>();

  const char* plat = env("NEURON_PLATFORM");
  std::string plat_s = plat ? trim(plat) : "";
  p->chip = plat_s.empty() ? &kTrn2 : find_chip(plat_s);
  // trn1 / inf2 are NKI targets only: the torch device simulates trn2 and trn3.
  if (p->chip == nullptr || !p->chip->torch_device) {
    config_fail("NEURON_PLATFORM='" + plat_s + "' is not a known platform; set it to 'trn2' or 'trn3' (or unset it for trn2).");
  }

  p->lnc = 2;
  if (const char* lnc = env("NEURON_LOGICAL_NC_CONFIG")) {
    long long v = 0;
    if (!parse_int(trim(lnc), &v) || (v != 1 && v != 2)) {
      config_fail(std::string("NEURON_LOGICAL_NC_CONFIG='") + lnc + "' is invalid; set it to 1 or 2 (physical NeuronCores per logical device).");
    }
    p->lnc = static_cast<int>(v);
  }
  p->logical_cores = p->chip->physical_cores / p->lnc;

  std::vector<int> cores;
  if (const char* vis = env("NEURON_RT_VISIBLE_CORES")) {
    cores = parse_core_list(vis, "NEURON_RT_VISIBLE_CORES");
    for (int c : cores) {
      if (c >= p->logical_cores) {
        std::ostringstream m;
        m << "NEURON_RT_VISIBLE_CORES names core " << c << ", but a " << p->chip->name << " chip with LNC="
          << p->lnc << " has " << p->logical_cores << " logical cores (0-" << p->logical_cores - 1 << ").";
        config_fail(m.str());
      }
    }
  } else {
    for (int c = 0; c < p->logical_cores; ++c) cores.push_back(c);
  }
  if (const char* num = env("NEURON_RT_NUM_CORES")) {
    long long n = 0;
    if (!parse_int(trim(num), &n) || n < 0) {
      config_fail(std::string("NEURON_RT_NUM_CORES='") + num + "' is invalid; set it to a non-negative number of logical cores.");
    }
    if (static_cast<size_t>(n) > cores.size()) {
      std::ostringstream m;
      m << "NEURON_RT_NUM_CORES=" << n << " asks for more logical cores than are available (" << cores.size() << ").";
      config_fail(m.str());
    }
    cores.resize(static_cast<size_t>(n));
  }

  uint64_t per_device = p->chip->hbm_bytes / static_cast<uint64_t>(p->logical_cores);
  p->memory_source = "platform";
  if (const char* mem = env("NEURON_DEVICE_MEMORY")) {
    per_device = parse_bytes(mem, "NEURON_DEVICE_MEMORY");
    p->memory_source = "NEURON_DEVICE_MEMORY";
  }

  for (size_t i = 0; i < cores.size(); ++i) {
    DeviceInfo d;
    d.index = static_cast<int>(i);
    d.logical_core = cores[i];
    for (int k = 0; k < p->lnc; ++k) d.physical_cores.push_back(cores[i] * p->lnc + k);
    d.total_memory = per_device;
    p->devices.push_back(std::move(d));
  }

  const char* lb = env("NEURON_LAUNCH_BLOCKING");
  p->launch_blocking = lb && std::string(lb) != "0" && std::string(lb) != "";
  return p;
}

std::mutex g_mutex;
std::unique_ptr<Platform> g_platform;
std::string g_error;
std::atomic<bool> g_parsed{false};  // fast path: checked on every allocation

void ensure_parsed() {
  if (g_parsed.load(std::memory_order_acquire)) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_parsed.load(std::memory_order_relaxed)) return;
  try {
    g_platform = build_platform();
  } catch (const Error& e) {
    g_error = e.what();
  }
  g_parsed.store(true, std::memory_order_release);
}

}  // namespace

const ChipFacts& chip_facts(Chip chip) {
  switch (chip) {
    case Chip::kTrn1: return kTrn1;
    case Chip::kInf2: return kInf2;
    case Chip::kTrn2: return kTrn2;
    case Chip::kTrn3: return kTrn3;
  }
  return kTrn2;
}

const std::vector<const ChipFacts*>& all_chips() {
  static const std::vector<const ChipFacts*> chips{&kTrn1, &kInf2, &kTrn2, &kTrn3};
  return chips;
}

const ChipFacts* find_chip(const std::string& name_in) noexcept {
  std::string name;
  for (char c : trim(name_in)) name += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  // AWS's NKI names generations too (NEURON_PLATFORM_TARGET_OVERRIDE=gen3).
  if (name == "gen2") return &kTrn1;
  if (name == "gen3") return &kTrn2;
  if (name == "gen4") return &kTrn3;
  for (const ChipFacts* c : all_chips()) {
    if (name == c->name) return c;
  }
  return nullptr;
}

const ChipFacts& nki_target_from_env() {
  const char* var = "NEURON_PLATFORM_TARGET_OVERRIDE";
  const char* raw = env(var);
  if (raw == nullptr || trim(raw).empty()) {
    var = "NEURON_PLATFORM";
    raw = env(var);
  }
  if (raw == nullptr || trim(raw).empty()) return kTrn2;
  if (const ChipFacts* c = find_chip(raw)) return *c;
  config_fail(std::string("NKI target '") + trim(raw) + "' (" + var + ") is not supported: use trn1 (gen2), inf2, "
              "trn2 (gen3) or trn3 (gen4) in NEURON_PLATFORM_TARGET_OVERRIDE / NEURON_PLATFORM.");
}

std::vector<int> parse_core_list(const std::string& spec_in, const char* var) {
  std::vector<int> out;
  std::set<int> seen;
  std::string spec = trim(spec_in);
  if (spec.empty()) return out;  // an empty list hides every device
  std::stringstream ss(spec);
  std::string item;
  auto bad = [&](const std::string& why) {
    config_fail(std::string(var) + "='" + spec_in + "' is invalid (" + why +
                "); use a list such as '0-3' or '0,2'.");
  };
  while (std::getline(ss, item, ',')) {
    item = trim(item);
    long long lo = 0, hi = 0;
    size_t dash = item.find('-');
    if (dash == std::string::npos) {
      if (!parse_int(item, &lo)) bad("'" + item + "' is not a core id");
      hi = lo;
    } else {
      if (!parse_int(trim(item.substr(0, dash)), &lo) || !parse_int(trim(item.substr(dash + 1)), &hi))
        bad("'" + item + "' is not a range");
      if (hi < lo) bad("range '" + item + "' is reversed");
    }
    if (lo < 0) bad("core ids are non-negative");
    // Far above any chip's core count; keeps ids from wrapping when narrowed to int
    // (2^32 became core 0) and bounds the range expansion below.
    if (hi > kMaxCoreId) bad("core ids must be at most " + std::to_string(kMaxCoreId));
    for (long long c = lo; c <= hi; ++c) {
      if (!seen.insert(static_cast<int>(c)).second) bad("core " + std::to_string(c) + " is listed twice");
      out.push_back(static_cast<int>(c));
    }
  }
  return out;
}

uint64_t parse_bytes(const std::string& spec_in, const char* var) {
  std::string s = trim(spec_in);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  std::string num = s.substr(0, i), unit = trim(s.substr(i));
  char* end = nullptr;
  double v = num.empty() ? -1 : std::strtod(num.c_str(), &end);
  uint64_t mult = 0;
  std::string u;
  for (char c : unit) u += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (u.empty() || u == "B") mult = 1;
  else if (u == "K" || u == "KB" || u == "KIB") mult = 1ull << 10;
  else if (u == "M" || u == "MB" || u == "MIB") mult = 1ull << 20;
  else if (u == "G" || u == "GB" || u == "GIB") mult = 1ull << 30;
  else if (u == "T" || u == "TB" || u == "TIB") mult = 1ull << 40;
  // Reject totals below one byte (they would truncate to 0) and at or above 2^64
  // (converting those to uint64_t is undefined).
  double total = v * static_cast<double>(mult);
  if (num.empty() || (end && *end != '\0') || v <= 0 || mult == 0 || !std::isfinite(v) || total < 1.0 ||
      total >= 18446744073709551616.0) {
    config_fail(std::string(var) + "='" + spec_in + "' is not a size; use bytes or a suffix, e.g. '512MiB' or '2GiB'.");
  }
  return static_cast<uint64_t>(total);
}

const Platform& platform() {
  ensure_parsed();
  if (!g_platform) throw Error(ErrorCode::kConfig, g_error);
  return *g_platform;
}

int device_count() noexcept {
  ensure_parsed();
  return g_platform ? static_cast<int>(g_platform->devices.size()) : 0;
}

std::string config_error() noexcept {
  ensure_parsed();
  return g_error;
}

void check_device(int index) {
  const Platform& p = platform();
  int n = static_cast<int>(p.devices.size());
  if (index < 0 || index >= n) {
    std::ostringstream m;
    if (n == 0) {
      m << "Invalid device index " << index << ": no neuron devices are visible";
      if (const char* vis = env("NEURON_RT_VISIBLE_CORES")) m << " (NEURON_RT_VISIBLE_CORES='" << vis << "')";
      m << ".";
    } else {
      m << "Invalid device index " << index << ": " << n << " neuron device" << (n == 1 ? " is" : "s are")
        << " visible, so valid indices are 0.." << n - 1 << ". Check the index, or NEURON_RT_VISIBLE_CORES / NEURON_RT_NUM_CORES.";
    }
    throw Error(ErrorCode::kInvalidDevice, m.str());
  }
}

void reset_platform_for_testing() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_platform.reset();
  g_error.clear();
  g_parsed.store(false, std::memory_order_release);
}

namespace {
std::atomic<bool> g_initialized{false};
std::atomic<bool> g_bad_fork{false};
std::once_flag g_init_once;
void on_fork_child() { g_bad_fork.store(true, std::memory_order_relaxed); }
}  // namespace

void initialize() {
  check_not_forked();
  std::call_once(g_init_once, [] {
    platform();  // surfaces configuration errors at first use
    pthread_atfork(nullptr, nullptr, &on_fork_child);
    g_initialized.store(true);
  });
}

bool is_initialized() noexcept { return g_initialized.load(std::memory_order_relaxed); }
bool in_bad_fork() noexcept { return g_bad_fork.load(std::memory_order_relaxed); }

void check_not_forked() {
  if (in_bad_fork()) {
    throw Error(ErrorCode::kForked,
                "Cannot re-initialize the neuron device in a forked subprocess: the parent process had already "
                "initialized it. To use the neuron device with multiprocessing, use the 'spawn' start method "
                "(multiprocessing.set_start_method('spawn') or torch.multiprocessing.start_processes(..., start_method='spawn')).");
  }
}

}  // namespace neuron::rt
