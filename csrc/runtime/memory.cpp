#include "runtime/memory.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <map>
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

// ---- shareable allocations ----------------------------------------------------------

std::atomic<bool> g_shareable{false};
std::atomic<bool> g_any_shareable{false};  // some allocation is a memfd: frees must look

struct Region {
  size_t size;
  int fd;
  uint64_t id;
};

struct Shareable {
  std::mutex mu;
  std::map<uintptr_t, Region> regions;  // by base address
  uint64_t next_id = 1;
  bool raised_fd_limit = false;
};

Shareable& shareable() {
  static Shareable* s = new Shareable();  // never destroyed: frees may run during exit
  return *s;
}

// A memfd mapping of `bytes`, or nullptr (then the caller uses ordinary memory).
void* shareable_alloc(size_t bytes) {
  Shareable& sh = shareable();
  int fd = memfd_create("neuron-device-memory", MFD_CLOEXEC);
  if (fd < 0 && errno == EMFILE) {
    // Each shareable allocation keeps its fd open for peers: allow as many as the hard limit.
    std::lock_guard<std::mutex> lock(sh.mu);
    if (!sh.raised_fd_limit) {
      sh.raised_fd_limit = true;
      rlimit rl;
      if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
      }
    }
    fd = memfd_create("neuron-device-memory", MFD_CLOEXEC);
  }
  if (fd < 0) return nullptr;
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    close(fd);
    return nullptr;
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    close(fd);
    return nullptr;
  }
  std::lock_guard<std::mutex> lock(sh.mu);
  sh.regions[reinterpret_cast<uintptr_t>(p)] = Region{bytes, fd, sh.next_id++};
  g_any_shareable.store(true, std::memory_order_relaxed);
  return p;
}

bool shareable_free(void* p) {
  if (!g_any_shareable.load(std::memory_order_relaxed)) return false;
  Shareable& sh = shareable();
  Region r;
  {
    std::lock_guard<std::mutex> lock(sh.mu);
    auto it = sh.regions.find(reinterpret_cast<uintptr_t>(p));
    if (it == sh.regions.end()) return false;
    r = it->second;
    sh.regions.erase(it);
  }
  munmap(p, r.size);
  close(r.fd);
  return true;
}

}  // namespace

void set_shareable_allocations(bool on) { g_shareable.store(on, std::memory_order_relaxed); }

bool shareable_handle(const void* p, size_t bytes, ShareableHandle* out) {
  Shareable& sh = shareable();
  uintptr_t a = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(sh.mu);
  auto it = sh.regions.upper_bound(a);
  if (it == sh.regions.begin()) return false;
  --it;
  if (a + bytes > it->first + it->second.size) return false;
  *out = ShareableHandle{static_cast<int32_t>(getpid()), it->second.fd, it->second.id, it->second.size, a - it->first};
  return true;
}

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
  void* p = g_shareable.load(std::memory_order_relaxed) && rounded >= kShareableMin ? shareable_alloc(rounded) : nullptr;
  if (p == nullptr) p = std::aligned_alloc(kDeviceAlignment, rounded);
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
  if (!shareable_free(ptr)) std::free(ptr);
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
