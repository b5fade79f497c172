// Device memory ("HBM") of the simulated NeuronCores. It is host memory, but the
// runtime owns it: every byte is accounted against its device's capacity, so a
// device runs out of memory exactly as real hardware would.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace neuron::rt {

// Alignment of every device allocation (what a DMA engine would want).
constexpr size_t kDeviceAlignment = 256;

struct MemoryInfo {
  uint64_t capacity;  // bytes this device may hold (platform, env or set_memory_capacity)
  uint64_t used;      // bytes currently taken from the device
  uint64_t peak;      // high-water mark of used since start or reset_peak
  uint64_t num_allocs;
  uint64_t num_frees;
};

// Allocates `bytes` on `device`. Throws OutOfMemoryError when the device's capacity
// (or the host) cannot hold it, Error(kInvalidDevice) for a bad index, Error(kForked)
// in a forked child. Zero bytes returns nullptr.
void* device_malloc(int device, size_t bytes);

// Returns memory from device_malloc; `bytes` must be the size it was allocated with.
void device_free(int device, void* ptr, size_t bytes) noexcept;

MemoryInfo memory_info(int device);

// Lowers or raises a device's capacity (never below what is in use).
void set_memory_capacity(int device, uint64_t bytes);
void reset_peak(int device);

// ---- memory other processes can map (the simulator's IPC handles) ----------------
// Ranks of a process group on one host read and write each other's device memory
// directly, as NeuronCores on one instance do. Once enabled, allocations of at least
// kShareableMin bytes are backed by a memfd that a peer maps through /proc/<pid>/fd.
constexpr size_t kShareableMin = size_t(1) << 20;
void set_shareable_allocations(bool on);
struct ShareableHandle {
  int32_t pid;
  int32_t fd;
  uint64_t id;      // unique per allocation in this process (fds are reused)
  uint64_t size;    // of the whole allocation
  uint64_t offset;  // of the queried pointer within it
};
// The handle of the shareable allocation holding [p, p + bytes), if there is one.
bool shareable_handle(const void* p, size_t bytes, ShareableHandle* out);

// "32.00 MiB"-style text for byte counts, used in every memory error message.
std::string format_bytes(uint64_t bytes);

}  // namespace neuron::rt
