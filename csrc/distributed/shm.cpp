#include "distributed/shm.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

namespace neuron::dist {
namespace {

constexpr uint64_t kMagic = 0x6e6575726f6e3031ULL;  // "neuron01"

size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

void futex_wait(std::atomic<uint32_t>* addr, uint32_t val, std::chrono::microseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000), static_cast<long>(timeout.count() % 1000000) * 1000};
  // Not FUTEX_PRIVATE: the word lives in memory shared between processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAIT, val, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* addr) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

inline void cpu_relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

int online_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

[[noreturn]] void sys_fail(const std::string& what) {
  throw CommError(what + ": " + std::strerror(errno));
}

}  // namespace

bool process_alive(int pid) {
  if (pid <= 0) return true;  // not yet published
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  FILE* f = std::fopen(path, "r");
  if (!f) return false;
  char buf[512];
  size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
  std::fclose(f);
  buf[n] = 0;
  // State follows the command name, which is in parentheses and may contain spaces.
  const char* close = std::strrchr(buf, ')');
  if (!close || close[1] == 0 || close[2] == 0) return true;
  char state = close[2];
  return state != 'Z' && state != 'X' && state != 'x';
}

std::string ShmGroup::unique_name() {
  static std::atomic<uint64_t> counter{0};
  std::random_device rd;
  char buf[96];
  std::snprintf(buf, sizeof(buf), "/torch_neuronx_%d_%llu_%08x", static_cast<int>(getpid()),
                static_cast<unsigned long long>(counter.fetch_add(1)), rd());
  return buf;
}

ShmGroup::ShmGroup(const std::string& name, bool create, int nlocal, int local_rank, size_t half_bytes,
                   size_t ring_bytes)
    : name_(name), n_(nlocal), me_(local_rank), half_(align_up(half_bytes, 4096)), ring_(align_up(ring_bytes, 4096)) {
  if (n_ < 1 || n_ > kMaxLocalRanks)
    throw CommError("neuron process group: " + std::to_string(n_) + " ranks on one host; at most " +
                    std::to_string(kMaxLocalRanks) + " are supported");
  size_t hdr = align_up(sizeof(Header), 4096);
  size_t slots = align_up(sizeof(RankSlot) * n_, 4096);
  size_t data = size_t(n_) * 2 * half_;
  size_t rings = size_t(n_) * n_ * (align_up(sizeof(RingCtl), 4096) + ring_);
  bytes_ = hdr + slots + data + rings;

  if (create) {
    // O_EXCL + 0600: never adopt someone else's segment, never readable by other users.
    fd_ = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd_ < 0) sys_fail("shm_open(" + name_ + ")");
    linked_ = true;
    if (ftruncate(fd_, static_cast<off_t>(bytes_)) != 0) {
      int e = errno;
      unlink();
      close(fd_);
      errno = e;
      sys_fail("ftruncate of shared memory " + name_ + " (" + std::to_string(bytes_) + " bytes; is /dev/shm full?)");
    }
  } else {
    fd_ = shm_open(name_.c_str(), O_RDWR, 0600);
    if (fd_ < 0) sys_fail("shm_open(" + name_ + ")");
  }
  base_ = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
  if (base_ == MAP_FAILED) {
    int e = errno;
    if (create) unlink();
    close(fd_);
    errno = e;
    sys_fail("mmap of shared memory " + name_);
  }
  close(fd_);  // the mapping keeps the memory
  fd_ = -1;
  char* p = static_cast<char*>(base_);
  hdr_ = reinterpret_cast<Header*>(p);
  slots_ = reinterpret_cast<RankSlot*>(p + hdr);
  data_ = p + hdr + slots;
  rings_ = p + hdr + slots + data;
  if (create) {
    // Fresh pages are zero: atomics start at 0. Publish the geometry last.
    hdr_->nlocal = static_cast<uint32_t>(n_);
    hdr_->half_bytes = half_;
    hdr_->ring_bytes = ring_;
    std::atomic_thread_fence(std::memory_order_release);
    reinterpret_cast<std::atomic<uint64_t>*>(&hdr_->magic)->store(kMagic, std::memory_order_release);
  } else {
    if (reinterpret_cast<std::atomic<uint64_t>*>(&hdr_->magic)->load(std::memory_order_acquire) != kMagic ||
        hdr_->nlocal != static_cast<uint32_t>(n_) || hdr_->half_bytes != half_ || hdr_->ring_bytes != ring_) {
      munmap(base_, bytes_);
      base_ = nullptr;
      throw CommError("neuron process group: shared memory " + name_ +
                      " has a different layout; are all ranks running the same torch_neuronx and "
                      "TORCH_NEURONX_SHM_* settings?");
    }
  }
  slots_[me_].pid.store(static_cast<int32_t>(getpid()), std::memory_order_release);
  spin_ = n_ <= online_cpus() ? 20000 : 64;
}

ShmGroup::~ShmGroup() {
  if (linked_) unlink();
  if (base_) munmap(base_, bytes_);
}

void ShmGroup::unlink() {
  if (linked_) {
    shm_unlink(name_.c_str());
    linked_ = false;
  }
}

bool ShmGroup::aborted() const { return hdr_->abort_state.load(std::memory_order_acquire) != 0; }

void ShmGroup::abort(const std::string& msg) {
  uint32_t expected = 0;
  if (hdr_->abort_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    std::snprintf(hdr_->abort_msg, sizeof(hdr_->abort_msg), "%s", msg.c_str());
    hdr_->abort_state.store(2, std::memory_order_release);
  }
  futex_wake_all(&hdr_->bar_gen);
  for (int r = 0; r < n_; ++r) ring_doorbell(r);
}

void ShmGroup::check_abort() {
  uint32_t s = hdr_->abort_state.load(std::memory_order_acquire);
  if (s == 0) return;
  for (int i = 0; s != 2 && i < 100000; ++i) s = hdr_->abort_state.load(std::memory_order_acquire);
  throw CommError(std::string("the process group was aborted: ") + (s == 2 ? hdr_->abort_msg : "(no message)"));
}

std::string ShmGroup::peer_desc(int r) {
  return "local rank " + std::to_string(r) + " (pid " + std::to_string(slots_[r].pid.load()) + ")";
}

void ShmGroup::check_peers(const std::function<std::string()>& what) {
  for (int r = 0; r < n_; ++r) {
    if (r == me_) continue;
    if (!process_alive(slots_[r].pid.load(std::memory_order_acquire))) {
      std::string msg = what() + ": " + peer_desc(r) + " has exited";
      abort(msg);
      throw CommError(msg);
    }
  }
}

void ShmGroup::barrier(Clock::time_point deadline, const std::function<std::string()>& what) {
  if (n_ == 1) return;
  check_abort();
  uint64_t mine = slots_[me_].barriers.fetch_add(1, std::memory_order_relaxed) + 1;
  uint32_t gen = hdr_->bar_gen.load(std::memory_order_acquire);
  if (hdr_->bar_count.fetch_add(1, std::memory_order_acq_rel) == static_cast<uint32_t>(n_ - 1)) {
    hdr_->bar_count.store(0, std::memory_order_relaxed);
    // seq_cst pairs with the sleeper's increment-then-check: one of the two sees the other.
    hdr_->bar_gen.fetch_add(1, std::memory_order_seq_cst);
    if (hdr_->bar_sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&hdr_->bar_gen);
    return;
  }
  for (int i = 0; i < spin_; ++i) {
    if (hdr_->bar_gen.load(std::memory_order_acquire) != gen) return;
    cpu_relax();
  }
  auto check_every = std::chrono::milliseconds(50);
  while (true) {
    hdr_->bar_sleepers.fetch_add(1, std::memory_order_seq_cst);
    if (hdr_->bar_gen.load(std::memory_order_seq_cst) == gen) futex_wait(&hdr_->bar_gen, gen, std::chrono::milliseconds(20));
    hdr_->bar_sleepers.fetch_sub(1, std::memory_order_acq_rel);
    if (hdr_->bar_gen.load(std::memory_order_acquire) != gen) return;
    check_abort();
    auto now = Clock::now();
    if (now >= next_peer_check_) {
      next_peer_check_ = now + check_every;
      check_peers(what);
    }
    if (now >= deadline) {
      std::string late;
      for (int r = 0; r < n_; ++r)
        if (r != me_ && slots_[r].barriers.load(std::memory_order_relaxed) < mine)
          late += (late.empty() ? "" : ", ") + peer_desc(r);
      // c10d's wording first: tools and tests match on it.
      std::string msg = "caught collective operation timeout: " + what() + " timed out waiting for " +
                        (late.empty() ? std::string("peers") : late) + " (the process group's timeout elapsed)";
      abort(msg);
      throw CommError(msg);
    }
  }
}

// ---- rings ----------------------------------------------------------------------------

RingCtl* ShmGroup::ring_ctl(int src, int dst) {
  size_t stride = align_up(sizeof(RingCtl), 4096) + ring_;
  return reinterpret_cast<RingCtl*>(rings_ + (size_t(src) * n_ + dst) * stride);
}

char* ShmGroup::ring_data(int src, int dst) {
  return reinterpret_cast<char*>(ring_ctl(src, dst)) + align_up(sizeof(RingCtl), 4096);
}

size_t ShmGroup::ring_write(int dst, const void* src, size_t n) {
  RingCtl* c = ring_ctl(me_, dst);
  uint64_t w = c->wpos.load(std::memory_order_relaxed);
  uint64_t r = c->rpos.load(std::memory_order_acquire);
  size_t room = ring_ - static_cast<size_t>(w - r);
  size_t k = std::min(room, n);
  if (k == 0) return 0;
  char* d = ring_data(me_, dst);
  size_t off = w % ring_;
  size_t first = std::min(k, ring_ - off);
  std::memcpy(d + off, src, first);
  if (k > first) std::memcpy(d, static_cast<const char*>(src) + first, k - first);
  c->wpos.store(w + k, std::memory_order_release);
  ring_doorbell(dst);
  return k;
}

size_t ShmGroup::ring_readable(int src) {
  RingCtl* c = ring_ctl(src, me_);
  return static_cast<size_t>(c->wpos.load(std::memory_order_acquire) - c->rpos.load(std::memory_order_relaxed));
}

void ShmGroup::ring_peek(int src, void* dst, size_t n) {
  RingCtl* c = ring_ctl(src, me_);
  uint64_t r = c->rpos.load(std::memory_order_relaxed);
  const char* d = ring_data(src, me_);
  size_t off = r % ring_;
  size_t first = std::min(n, ring_ - off);
  std::memcpy(dst, d + off, first);
  if (n > first) std::memcpy(static_cast<char*>(dst) + first, d, n - first);
}

size_t ShmGroup::ring_read(int src, void* dst, size_t n) {
  size_t k = std::min(n, ring_readable(src));
  if (k == 0) return 0;
  ring_peek(src, dst, k);
  RingCtl* c = ring_ctl(src, me_);
  c->rpos.store(c->rpos.load(std::memory_order_relaxed) + k, std::memory_order_release);
  ring_doorbell(src);
  return k;
}

void ShmGroup::ring_doorbell(int r) {
  slots_[r].doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (slots_[r].sleeping.load(std::memory_order_seq_cst) != 0) futex_wake_all(&slots_[r].doorbell);
}

void ShmGroup::wait_doorbell(uint32_t seen, std::chrono::microseconds timeout) {
  RankSlot& s = slots_[me_];
  s.sleeping.store(1, std::memory_order_seq_cst);
  if (s.doorbell.load(std::memory_order_seq_cst) == seen) futex_wait(&s.doorbell, seen, timeout);
  s.sleeping.store(0, std::memory_order_release);
}

// ---- peers' memory --------------------------------------------------------------------

PeerMemory::~PeerMemory() {
  for (auto& [key, e] : cache_) munmap(e.base, e.size);
}

char* PeerMemory::map(int pid, int fd, uint64_t id, size_t size) {
  auto key = std::make_pair(pid, id);
  auto it = cache_.find(key);
  if (it != cache_.end() && it->second.size == size) {
    it->second.last_use = ++tick_;
    return it->second.base;
  }
  if (it != cache_.end()) {  // same id, other size: cannot happen for one allocation; remap
    munmap(it->second.base, it->second.size);
    mapped_ -= it->second.size;
    cache_.erase(it);
  }
  // A mapping keeps the peer's memory alive after the peer frees it: bound what we hold.
  constexpr size_t kMaxEntries = 256, kMaxBytes = size_t(4) << 30;
  while (!cache_.empty() && (cache_.size() >= kMaxEntries || mapped_ + size > kMaxBytes)) {
    auto lru = cache_.end();
    for (auto i = cache_.begin(); i != cache_.end(); ++i)
      if (i->second.last_use < op_start_ && (lru == cache_.end() || i->second.last_use < lru->second.last_use)) lru = i;
    if (lru == cache_.end()) break;  // all in use by the current collective: exceed the bound
    munmap(lru->second.base, lru->second.size);
    mapped_ -= lru->second.size;
    cache_.erase(lru);
  }
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, fd);
  int f = open(path, O_RDWR | O_CLOEXEC);
  if (f < 0) return nullptr;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
  close(f);
  if (p == MAP_FAILED) return nullptr;
  cache_[key] = Entry{static_cast<char*>(p), size, ++tick_};
  mapped_ += size;
  return static_cast<char*>(p);
}

}  // namespace neuron::dist
