#include "runtime/memory.h"

#include <cstdint>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <sstream>

#include "runtime/errors.h"
#include "runtime/platform.h"

namespace neuron::rt {
namespace {

struct DeviceState {
  std::mutex mu;
  bool ready = false;
  MemoryInfo info{};
};

// One state per visible device; a deque keeps addresses stable.
std::deque<DeviceState>& states() {
  static std::deque<DeviceState> s(static_cast<size_t>(device_count()));
  return s;
}

DeviceState& state(int device) {
  check_device(device);
  DeviceState& st = states()[static_cast<size_t>(device)];
  std::lock_guard<std::mutex> lock(st.mu);
  if (!st.ready) {
    st.info.capacity = platform().devices[static_cast<size_t>(device)].total_memory;
    st.ready = true;
  }
  return st;
}

}  // namespace

std::string format_bytes(uint64_t b) {
  std::ostringstream o;
  o.precision(2);
  o << std::fixed;
  if (b >= (1ull << 30)) o << static_cast<double>(b) / (1ull << 30) << " GiB";
  else if (b >= (1ull << 20)) o << static_cast<double>(b) / (1ull << 20) << " MiB";
  else if (b >= (1ull << 10)) o << static_cast<double>(b) / (1ull << 10) << " KiB";
  else o << b << " bytes";
  return o.str();
}

void* device_malloc(int device, size_t bytes) {
  check_not_forked();
  initialize();
  DeviceState& st = state(device);
  if (bytes == 0) return nullptr;
  // Sizes near SIZE_MAX would wrap in the rounding (to 0) or in used + rounded; charge
  // them as SIZE_MAX so the capacity check, written as rounded > free, rejects them.
  size_t rounded = bytes > SIZE_MAX - (kDeviceAlignment - 1)
                       ? SIZE_MAX
                       : (bytes + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (rounded > st.info.capacity - st.info.used) {  // used <= capacity always holds
      std::ostringstream m;
      m << "Neuron device " << device << " out of memory: tried to allocate " << format_bytes(bytes) << "; capacity "
        << format_bytes(st.info.capacity) << ", " << format_bytes(st.info.used) << " in use, "
        << format_bytes(st.info.capacity - st.info.used) << " free.";
      throw OutOfMemoryError(m.str(), device, bytes, st.info.capacity, st.info.used);
    }
    st.info.used += rounded;
  }
  void* p = std::aligned_alloc(kDeviceAlignment, rounded);
  std::lock_guard<std::mutex> lock(st.mu);
  if (p == nullptr) {
    st.info.used -= rounded;
    std::ostringstream m;
    m << "Neuron device " << device << " out of memory: the host could not back an allocation of "
      << format_bytes(bytes) << " (simulated device memory is host memory).";
    throw OutOfMemoryError(m.str(), device, bytes, st.info.capacity, st.info.used);
  }
  if (st.info.used > st.info.peak) st.info.peak = st.info.used;
  ++st.info.num_allocs;
  return p;
}

void device_free(int device, void* ptr, size_t bytes) noexcept {
  if (ptr == nullptr) return;
  std::free(ptr);
  if (device < 0 || device >= device_count()) return;
  DeviceState& st = states()[static_cast<size_t>(device)];
  size_t rounded = (bytes + kDeviceAlignment - 1) / kDeviceAlignment * kDeviceAlignment;
  std::lock_guard<std::mutex> lock(st.mu);
  st.info.used -= rounded;
  ++st.info.num_frees;
}

MemoryInfo memory_info(int device) {
  DeviceState& st = state(device);
  std::lock_guard<std::mutex> lock(st.mu);
  return st.info;
}

void set_memory_capacity(int device, uint64_t bytes) {
  DeviceState& st = state(device);
  std::lock_guard<std::mutex> lock(st.mu);
  if (bytes < st.info.used) {
    std::ostringstream m;
    m << "Cannot set the capacity of neuron device " << device << " to " << format_bytes(bytes) << ": "
      << format_bytes(st.info.used) << " are in use (free cached memory with torch.neuron.empty_cache() first).";
    throw Error(ErrorCode::kInvalidArgument, m.str());
  }
  st.info.capacity = bytes;
}

void reset_peak(int device) {
  DeviceState& st = state(device);
  std::lock_guard<std::mutex> lock(st.mu);
  st.info.peak = st.info.used;
}

}  // namespace neuron::rt
