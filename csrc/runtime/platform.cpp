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
constexpr uint64_t kMiB = 1ull << 20;
constexpr long long kMaxCoreId = 65535;

const ChipFacts kTrn2{Chip::kTrn2, "trn2", "NeuronCore-v3", 8, 96 * kGiB, 2.9, 667, 181, 1299,
                      24 * kMiB, 2 * kMiB, false, false, 1.2};
const ChipFacts kTrn3{Chip::kTrn3, "trn3", "NeuronCore-v4", 8, 144 * kGiB, 4.9, 671, 183, 2517,
                      32 * kMiB, 2 * kMiB, true, true, 1.2};

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
  std::string plat_s = plat ? trim(plat) : "trn2";
  if (plat_s == "trn2" || plat_s.empty()) {
    p->chip = &kTrn2;
  } else if (plat_s == "trn3") {
    p->chip = &kTrn3;
  } else {
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

const ChipFacts& chip_facts(Chip chip) { return chip == Chip::kTrn2 ? kTrn2 : kTrn3; }

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
