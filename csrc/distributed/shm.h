// Shared-memory transport of the `neuron` process group within one host. No torch headers:
// this is raw memory, a futex barrier, per-pair byte rings and peer liveness.
//
// Segment layout (one per process group per host; created 0600 by the host's first rank,
// unlinked as soon as every local rank has mapped it):
//   Header | RankSlot x n | data buffers: n x 2 halves x half_bytes | rings: n x n x (RingCtl + ring_bytes)
// Data buffers carry collectives. A collective is a sequence of "epochs": each writes into
// half (epoch % 2) of the writer's buffer, passes one barrier, then reads peers' buffers.
// The next use of the same half is two epochs later, after another barrier every peer has
// reached only once done reading: so one barrier per epoch suffices.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <utility>
#include <stdexcept>
#include <string>

namespace neuron::dist {

constexpr int kMaxLocalRanks = 128;
using Clock = std::chrono::steady_clock;

// Why a wait failed. The backend turns these into torch.distributed.DistBackendError.
struct CommError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// What a rank is about to do; compared across ranks after an op's first barrier so
// mismatched collectives raise on every rank instead of corrupting data or hanging.
struct OpDesc {
  uint64_t seq;
  int32_t op;
  int32_t dtype;
  int64_t bytes;
  int64_t root;
  int32_t redop;
  int32_t pad;
  char text[112];  // human-readable: "all_reduce(float32[1024], SUM)"
};

// Where a rank's tensor lives, for peers to map it (see rt::ShareableHandle).
struct PeerBuffer {
  int32_t ok;      // the tensor is in shareable device memory
  int32_t mapped;  // this rank mapped every peer's buffer
  int32_t pid;
  int32_t fd;
  uint64_t id;
  uint64_t size;
  uint64_t offset;
};

struct alignas(64) RankSlot {
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> doorbell;      // futex word: bumped when p2p data or ring space appears for this rank
  std::atomic<uint32_t> sleeping;      // the rank's p2p thread is (about to be) in futex_wait on doorbell
  std::atomic<uint64_t> barriers;      // barriers this rank has entered (names stragglers on timeout)
  OpDesc desc[2];                      // by op seq parity
  int64_t a2a_send[2][kMaxLocalRanks]; // all-to-all bytes this rank sends to each peer, by op seq parity
  int64_t a2a_recv[2][kMaxLocalRanks]; // ... and expects from each peer
  PeerBuffer peer_buffer[2];           // by op seq parity
};

struct alignas(64) RingCtl {
  std::atomic<uint64_t> wpos;  // bytes written by the sender
  alignas(64) std::atomic<uint64_t> rpos;  // bytes consumed by the receiver
};

struct Header {
  uint64_t magic;
  uint32_t nlocal;
  uint32_t pad;
  uint64_t half_bytes;
  uint64_t ring_bytes;
  alignas(64) std::atomic<uint32_t> bar_count;
  alignas(64) std::atomic<uint32_t> bar_gen;   // futex word of the barrier
  std::atomic<uint32_t> bar_sleepers;
  alignas(64) std::atomic<uint32_t> abort_state;  // 0 ok, 1 being written, 2 aborted (message valid)
  char abort_msg[768];
};

class ShmGroup {
 public:
  // Creates (create=true, the host's first rank) or maps the named segment.
  ShmGroup(const std::string& name, bool create, int nlocal, int local_rank, size_t half_bytes, size_t ring_bytes);
  ~ShmGroup();
  ShmGroup(const ShmGroup&) = delete;
  ShmGroup& operator=(const ShmGroup&) = delete;

  // "/torch_neuronx_<pid>_<n>_<random>": unique per process and call.
  static std::string unique_name();
  void unlink();  // removes the name (the creator calls it once every rank has mapped it)

  int size() const { return n_; }
  int rank() const { return me_; }
  size_t half_bytes() const { return half_; }
  RankSlot& slot(int r) { return slots_[r]; }
  char* buffer(int r, int half) { return data_ + (size_t(r) * 2 + size_t(half)) * half_; }

  // Blocks until every local rank has entered; spins briefly, then sleeps on a futex.
  // Throws CommError when the deadline passes, a peer process is gone, or another rank
  // aborted the group. `what` names the operation in messages.
  void barrier(Clock::time_point deadline, const std::function<std::string()>& what);

  // Marks the group unusable and wakes every waiter; the first message wins.
  void abort(const std::string& msg);
  // Throws CommError if the group was aborted.
  void check_abort();
  bool aborted() const;

  // Throws CommError naming the first local peer whose process has exited.
  void check_peers(const std::function<std::string()>& what);
  std::string peer_desc(int r);  // "local rank r (pid P)"

  // ---- point-to-point byte rings (me -> dst, src -> me); non-blocking ----
  size_t ring_write(int dst, const void* src, size_t n);  // bytes written
  size_t ring_readable(int src);
  size_t ring_read(int src, void* dst, size_t n);  // bytes read
  void ring_peek(int src, void* dst, size_t n);  // copies n (<= readable) bytes without consuming
  // The p2p thread of this rank sleeps here until a peer rings, or the timeout.
  uint32_t doorbell() { return slots_[me_].doorbell.load(std::memory_order_acquire); }
  void wait_doorbell(uint32_t seen, std::chrono::microseconds timeout);
  void ring_doorbell(int r);

 private:
  RingCtl* ring_ctl(int src, int dst);
  char* ring_data(int src, int dst);

  std::string name_;
  int fd_ = -1;
  void* base_ = nullptr;
  size_t bytes_ = 0;
  int n_;
  int me_;
  size_t half_;
  size_t ring_;
  int spin_;  // barrier spin iterations before sleeping (few when ranks outnumber cores)
  Header* hdr_;
  RankSlot* slots_;
  char* data_;
  char* rings_;
  bool linked_ = false;
  Clock::time_point next_peer_check_{};
};

// Peers' device memory mapped into this process, cached (collectives reuse the same
// buffers: gradient buckets, parameters), least recently used evicted past a bound.
class PeerMemory {
 public:
  ~PeerMemory();
  // Starts a collective: mappings handed out from here on stay mapped until the next call.
  void new_op() { op_start_ = tick_ + 1; }
  // The base of a peer's allocation, or nullptr when it cannot be mapped.
  char* map(int pid, int fd, uint64_t id, size_t size);

 private:
  struct Entry {
    char* base;
    size_t size;
    uint64_t last_use;
  };
  std::map<std::pair<int, uint64_t>, Entry> cache_;
  uint64_t tick_ = 0;
  uint64_t op_start_ = 1;
  size_t mapped_ = 0;
};

// True while the process exists and is not a zombie.
bool process_alive(int pid);

}  // namespace neuron::dist
