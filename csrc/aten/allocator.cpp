// Caching allocator for neuron device memory, the kernel CPU allocator that lets CPU
// kernels write their outputs straight into device memory, and pinned host memory.
#include <ATen/core/CachingHostAllocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <vector>

#include "aten/neuron.h"
#include "runtime/memory.h"
#include "runtime/platform.h"

namespace torch_neuronx {

thread_local c10::DeviceIndex tls_kernel_device = -1;

namespace {

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingAllocator::StatType;
using neuron::rt::format_bytes;

constexpr size_t kRound = 512;              // allocation granularity, as CUDA's
constexpr size_t kSmallSize = 1 << 20;      // blocks up to 1 MiB come from the small pool

size_t round_size(size_t n) { return (n + kRound - 1) / kRound * kRound; }


// Every op takes this lock twice (its output's allocation and, later, its free), for
// a few hundred nanoseconds at most; a spin lock costs one atomic exchange where a
// mutex costs two locked operations. A waiter yields, so a preempted holder is not
// starved on a 2-core machine.
class SpinLock {
 public:
  void lock() {
    while (held_.exchange(true, std::memory_order_acquire)) {
      while (held_.load(std::memory_order_relaxed)) std::this_thread::yield();
    }
  }
  void unlock() { held_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> held_{false};
};

struct Block {
  void* ptr;
  size_t size;       // segment size (what the device gave us)
  size_t rounded;    // rounded request of the current allocation
  size_t requested;  // exact request of the current allocation
  c10::DeviceIndex device;
  bool small;
  bool allocated;
};

struct Pool {
  // Cached blocks by segment size. Vectors stay allocated when empty, so the steady
  // state (the same sizes freed and taken again) allocates no host memory.
  std::map<size_t, std::vector<Block*>> free;
  size_t num_free = 0;
  DeviceStats stats;
  uint64_t limit = UINT64_MAX;         // set_per_process_memory_fraction
  uint64_t reserved = 0;
};

void raw_delete(void* ptr);

class NeuronAllocator final : public c10::DeviceAllocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    c10::DeviceIndex d = tls_kernel_device >= 0 ? tls_kernel_device : current_device();
    return allocate_on(d, n, c10::Device(kNeuron, d));
  }

  // `checked`: d is a device index already validated (the one a kernel call runs for).
  c10::DataPtr allocate_on(c10::DeviceIndex d, size_t n, c10::Device as_device, bool checked = false) {
    if (!checked) {
      lazy_init();
      check_device_index(d);
    }
    if (n == 0) return c10::DataPtr(nullptr, nullptr, &raw_delete, as_device);
    size_t size = round_size(n);
    std::lock_guard<SpinLock> lock(mu_);
    Pool& pool = pool_of(d);
    Block* b = take_cached(pool, size);
    if (b == nullptr) b = new_segment(pool, d, size, n);
    b->allocated = true;
    b->rounded = size;
    b->requested = n;
    account(pool.stats, b, +1);
    // context == data: Allocator::raw_allocate requires it (CPU kernels use it for scratch)
    return c10::DataPtr(b->ptr, b->ptr, &raw_delete, as_device);
  }

  void free(void* ptr) {
    if (ptr == nullptr) return;
    std::lock_guard<SpinLock> lock(mu_);
    auto it = by_ptr_.find(ptr);
    TORCH_INTERNAL_ASSERT(it != by_ptr_.end() && it->second->allocated, "neuron allocator: freeing an unknown pointer");
    Block* b = it->second;
    Pool& pool = pool_of(b->device);
    account(pool.stats, b, -1);
    b->allocated = false;
    pool.free[b->size].push_back(b);
    ++pool.num_free;
  }

  bool owns(const void* ptr) {
    std::lock_guard<SpinLock> lock(mu_);
    return by_ptr_.count(ptr) > 0;
  }

  // Device of the block containing `ptr`, or -1.
  c10::DeviceIndex device_containing(const void* ptr) {
    std::lock_guard<SpinLock> lock(mu_);
    auto p = reinterpret_cast<uintptr_t>(ptr);
    auto it = blocks_.upper_bound(p);
    if (it == blocks_.begin()) return -1;
    --it;
    Block* b = it->second;
    return (p < it->first + b->size && b->allocated) ? b->device : -1;
  }

  c10::DeleterFnPtr raw_deleter() const override { return &raw_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  bool initialized() override { return neuron::rt::is_initialized(); }

  void emptyCache(c10::MempoolId_t /*unused*/) override {
    std::lock_guard<SpinLock> lock(mu_);
    for (size_t d = 0; d < pools_.size(); ++d) release_cached(pools_[d]);
  }

  // Synchronous execution: a freed block is never still in use by a stream.
  void recordStream(const c10::DataPtr& /*unused*/, c10::Stream /*unused*/) override {}

  DeviceStats getDeviceStats(c10::DeviceIndex d) override {
    check_device_index(d);
    std::lock_guard<SpinLock> lock(mu_);
    return pool_of(d).stats;
  }

  void resetAccumulatedStats(c10::DeviceIndex d) override {
    check_device_index(d);
    std::lock_guard<SpinLock> lock(mu_);
    DeviceStats& s = pool_of(d).stats;
    for (auto* arr : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
                      &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
      for (auto& st : *arr) st.reset_accumulated();
    }
    s.num_alloc_retries = 0;
    s.num_ooms = 0;
    s.num_device_alloc = 0;
    s.num_device_free = 0;
  }

  void resetPeakStats(c10::DeviceIndex d) override {
    check_device_index(d);
    std::lock_guard<SpinLock> lock(mu_);
    DeviceStats& s = pool_of(d).stats;
    for (auto* arr : {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
                      &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
      for (auto& st : *arr) st.reset_peak();
    }
    rt_call([&] { neuron::rt::reset_peak(d); });
  }

  std::pair<size_t, size_t> getMemoryInfo(c10::DeviceIndex d) override {
    check_device_index(d);
    auto info = rt_call([&] { return neuron::rt::memory_info(d); });
    return {info.capacity - info.used, info.capacity};
  }

  void set_fraction(double fraction, c10::DeviceIndex d) {
    check_device_index(d);
    TORCH_CHECK_VALUE(fraction >= 0 && fraction <= 1, "Invalid fraction value: ", fraction,
                      ". It should be in [0, 1].");
    auto cap = rt_call([&] { return neuron::rt::memory_info(d); }).capacity;
    std::lock_guard<SpinLock> lock(mu_);
    pool_of(d).limit = static_cast<uint64_t>(fraction * static_cast<double>(cap));
  }

  std::pair<uint64_t, uint64_t> limit(c10::DeviceIndex d) {
    check_device_index(d);
    auto cap = rt_call([&] { return neuron::rt::memory_info(d); }).capacity;
    std::lock_guard<SpinLock> lock(mu_);
    return {std::min<uint64_t>(pool_of(d).limit, cap), cap};
  }

 private:
  Pool& pool_of(c10::DeviceIndex d) {
    if (pools_.size() <= static_cast<size_t>(d)) pools_.resize(static_cast<size_t>(d) + 1);
    return pools_[static_cast<size_t>(d)];
  }

  // A cached block no more than 25% larger than the request (blocks are not split).
  Block* take_cached(Pool& pool, size_t size) {
    if (pool.num_free == 0) return nullptr;
    for (auto it = pool.free.lower_bound(size); it != pool.free.end() && it->first <= size + size / 4; ++it) {
      if (it->second.empty()) continue;
      Block* b = it->second.back();
      it->second.pop_back();
      --pool.num_free;
      return b;
    }
    return nullptr;
  }

  Block* new_segment(Pool& pool, c10::DeviceIndex d, size_t size, size_t requested) {
    void* p = nullptr;
    for (int attempt = 0;; ++attempt) {
      if (pool.reserved + size <= pool.limit) {
        try {
          p = neuron::rt::device_malloc(d, size);
          break;
        } catch (const neuron::rt::OutOfMemoryError&) {
          // the device is full: free the cache and retry once
        } catch (const neuron::rt::Error& e) {
          rethrow_runtime_error(e);
        }
      }
      if (attempt > 0 || pool.num_free == 0) raise_oom(pool, d, requested);
      release_cached(pool);
      ++pool.stats.num_alloc_retries;
    }
    Block* b = new Block{p, size, size, requested, d, size <= kSmallSize, false};
    blocks_.emplace(reinterpret_cast<uintptr_t>(p), b);
    by_ptr_.emplace(p, b);
    pool.reserved += size;
    auto types = pool_types(b);
    for (size_t t : types) pool.stats.segment[t].increase(1), pool.stats.reserved_bytes[t].increase(size);
    ++pool.stats.num_device_alloc;
    return b;
  }

  [[noreturn]] void raise_oom(Pool& pool, c10::DeviceIndex d, size_t requested) {
    ++pool.stats.num_ooms;
    auto info = neuron::rt::memory_info(d);
    uint64_t cap = std::min<uint64_t>(info.capacity, pool.limit);
    uint64_t allocated = static_cast<uint64_t>(pool.stats.allocated_bytes[0].current);
    uint64_t reserved = pool.reserved;
    std::ostringstream m;
    m << "Neuron out of memory. Tried to allocate " << format_bytes(requested) << ". Device neuron:" << static_cast<int>(d)
      << " has a total capacity of " << format_bytes(cap) << " of which " << format_bytes(cap > reserved ? cap - reserved : 0)
      << " is free";
    if (pool.limit < info.capacity) m << " (limited by set_per_process_memory_fraction)";
    m << ". Of the allocated memory " << format_bytes(allocated) << " is allocated by PyTorch, and "
      << format_bytes(reserved - allocated) << " is reserved by PyTorch but unallocated. Free tensors you no longer need "
      << "(del them, then torch.neuron.empty_cache()), or use smaller batches.";
    TORCH_CHECK_WITH(OutOfMemoryError, false, m.str());
  }

  void release_cached(Pool& pool) {
    for (auto& [size, blocks] : pool.free) {
      for (Block* b : blocks) {
        neuron::rt::device_free(b->device, b->ptr, b->size);
        blocks_.erase(reinterpret_cast<uintptr_t>(b->ptr));
        by_ptr_.erase(b->ptr);
        pool.reserved -= b->size;
        for (size_t t : pool_types(b)) pool.stats.segment[t].decrease(1), pool.stats.reserved_bytes[t].decrease(b->size);
        ++pool.stats.num_device_free;
        delete b;
      }
    }
    pool.free.clear();
    pool.num_free = 0;
  }

  static std::array<size_t, 2> pool_types(const Block* b) {
    return {static_cast<size_t>(StatType::AGGREGATE),
            static_cast<size_t>(b->small ? StatType::SMALL_POOL : StatType::LARGE_POOL)};
  }

  static void account(DeviceStats& s, const Block* b, int sign) {
    for (size_t t : pool_types(b)) {
      if (sign > 0) {
        s.allocation[t].increase(1);
        s.active[t].increase(1);
        s.allocated_bytes[t].increase(b->rounded);
        s.active_bytes[t].increase(b->rounded);
        s.requested_bytes[t].increase(b->requested);
      } else {
        s.allocation[t].decrease(1);
        s.active[t].decrease(1);
        s.allocated_bytes[t].decrease(b->rounded);
        s.active_bytes[t].decrease(b->rounded);
        s.requested_bytes[t].decrease(b->requested);
      }
    }
  }

  SpinLock mu_;
  std::map<uintptr_t, Block*> blocks_;                 // by address, for range queries
  std::unordered_map<const void*, Block*> by_ptr_;     // the same blocks, for exact lookups
  std::vector<Pool> pools_;
};

NeuronAllocator g_allocator;

void raw_delete(void* ptr) { g_allocator.free(ptr); }

// Every CPU allocation goes through this wrapper. On a thread that is running a CPU
// kernel for a neuron op (tls_kernel_device >= 0) it hands out device memory, so the
// kernel's outputs are born on the device and need no copy.
class KernelCPUAllocator final : public c10::Allocator {
 public:
  explicit KernelCPUAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) override {
    c10::DeviceIndex d = tls_kernel_device;
    if (d < 0) return base_->allocate(n);
    return g_allocator.allocate_on(d, n, c10::Device(c10::kCPU), /*checked=*/true);
  }
  c10::DeleterFnPtr raw_deleter() const override { return &kernel_raw_delete; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

 private:
  static void kernel_raw_delete(void* p);
  c10::Allocator* base_;
};

KernelCPUAllocator* g_kernel_cpu = nullptr;

void KernelCPUAllocator::kernel_raw_delete(void* p) {
  if (g_allocator.owns(p)) g_allocator.free(p);
  else g_kernel_cpu->base_->raw_deleter()(p);
}

// Pinned host memory. Device memory is host memory, so pinning only needs to be
// remembered (is_pinned) and to be the allocator PyTorch asks for. It is also the
// device's host allocator (torch.accelerator.empty_host_cache() and friends look one up
// per device type and dereference it): nothing is cached and execution is synchronous,
// so there is no cache to empty and no stream use to wait for.
class PinnedAllocator final : public at::HostAllocator {
 public:
  bool record_event(void*, void*, c10::Stream) override { return true; }
  void empty_cache() override {}
  at::HostStats get_stats() override { return {}; }
  void reset_accumulated_stats() override {}
  void reset_peak_stats() override {}

  c10::DataPtr allocate(size_t n) override {
    if (n == 0) return c10::DataPtr(nullptr, nullptr, &raw_free, c10::Device(c10::kCPU));
    size_t rounded = round_size(n);
    void* p = std::aligned_alloc(neuron::rt::kDeviceAlignment, rounded);
    if (p == nullptr) {
      TORCH_CHECK_WITH(OutOfMemoryError, false, "Out of pinned host memory: tried to allocate ", format_bytes(n), ".");
    }
    std::lock_guard<std::mutex> lock(mu());
    ranges()[reinterpret_cast<uintptr_t>(p)] = rounded;
    return c10::DataPtr(p, p, &raw_free, c10::Device(c10::kCPU));
  }
  c10::DeleterFnPtr raw_deleter() const override { return &raw_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { std::memcpy(dest, src, count); }

  static bool contains(const void* ptr) {
    auto p = reinterpret_cast<uintptr_t>(ptr);
    std::lock_guard<std::mutex> lock(mu());
    auto& r = ranges();
    auto it = r.upper_bound(p);
    if (it == r.begin()) return false;
    --it;
    return p < it->first + it->second;
  }

 private:
  static std::mutex& mu() {
    static std::mutex m;
    return m;
  }
  static std::map<uintptr_t, size_t>& ranges() {
    static std::map<uintptr_t, size_t> r;
    return r;
  }
  static void raw_free(void* p) {
    if (p == nullptr) return;
    {
      std::lock_guard<std::mutex> lock(mu());
      ranges().erase(reinterpret_cast<uintptr_t>(p));
    }
    std::free(p);
  }
};

PinnedAllocator g_pinned;

}  // namespace

REGISTER_ALLOCATOR(kNeuron, &g_allocator)
REGISTER_HOST_ALLOCATOR(kNeuron, &g_pinned)

c10::DeviceAllocator* neuron_allocator() { return &g_allocator; }

c10::DataPtr allocate_device_memory(c10::DeviceIndex device, size_t nbytes, c10::Device as_device) {
  return g_allocator.allocate_on(device, nbytes, as_device);
}

bool is_device_memory(const c10::DataPtr& p) { return p.get_deleter() == &raw_delete; }

void adopt_storage(c10::StorageImpl* s, c10::DeviceIndex device) {
  s->mutable_data_ptr().unsafe_set_device(c10::Device(kNeuron, device));
  s->set_allocator(&g_allocator);
}

void set_memory_fraction(double fraction, c10::DeviceIndex device) { g_allocator.set_fraction(fraction, device); }
std::pair<uint64_t, uint64_t> allocator_limit(c10::DeviceIndex device) { return g_allocator.limit(device); }

c10::Allocator* pinned_allocator() { return &g_pinned; }
bool is_pinned_ptr(const void* p) { return PinnedAllocator::contains(p); }

c10::Device device_of_ptr(void* p) {
  c10::DeviceIndex d = g_allocator.device_containing(p);
  TORCH_CHECK(d >= 0, "The pointer ", p, " is not in neuron device memory.");
  return c10::Device(kNeuron, d);
}

void install_kernel_cpu_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_kernel_cpu = new KernelCPUAllocator(c10::GetCPUAllocator());
    c10::SetCPUAllocator(g_kernel_cpu, /*priority=*/100);
  });
}

}  // namespace torch_neuronx
