// The `neuron` c10d backend: torch.distributed's process group for neuron tensors.
//
// Ranks on one host exchange through a shared-memory segment (distributed/shm.h); ranks on
// different hosts through torch's own ProcessGroupGloo on zero-copy CPU aliases of the
// same device memory (device memory is host memory). All-reduce and barrier are
// hierarchical across hosts (shared memory within, gloo between host leaders).
//
// Execution is synchronous like the rest of the device: a collective has finished when
// the call returns, so it is ordered with every stream. Point-to-point sends and receives
// are the exception: they progress on a per-group thread, so isend never blocks.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "distributed/shm.h"

namespace torch_neuronx::dist {

class NeuronWork;
struct P2POp;
struct SelfMsg;
struct Reduction;

class ProcessGroupNeuron : public c10d::Backend {
 public:
  ProcessGroupNeuron(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout, std::string group_name);
  ~ProcessGroupNeuron() override;

  const std::string getBackendName() const override { return "neuron"; }
  c10::intrusive_ptr<Options> getBackendOptions() override;
  void setTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& outputSplitSizes,
                                               std::vector<int64_t>& inputSplitSizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override { return op_seq_; }
  void abort() override { shutdown(); }
  void shutdown() override;

  // Topology, decided through the store when the group is made.
  int num_hosts() const { return static_cast<int>(hosts_.size()); }
  int host_index() const { return my_host_; }
  bool is_host_leader() const { return local_ranks_.front() == rank_; }
  int local_size() const { return static_cast<int>(local_ranks_.size()); }
  // Groups that span hosts get torch's gloo over all ranks (`flat`) and over host leaders
  // (`leaders`, null on other ranks); Python makes them right after this constructor.
  void set_gloo(c10::intrusive_ptr<c10d::Backend> flat, c10::intrusive_ptr<c10d::Backend> leaders);

 private:
  using Deadline = neuron::dist::Clock::time_point;
  // One collective: profiled as "neuron:<name>" with the inputs' shapes, CommErrors named.
  template <class F>
  c10::intrusive_ptr<c10d::Work> run(const char* name, c10d::OpType type, const std::vector<at::Tensor>& inputs,
                                     std::vector<at::Tensor> outputs, std::chrono::milliseconds op_timeout, F&& body);
  // An op made of other ops of this group (body()): profiled once, under its own name.
  template <class F>
  c10::intrusive_ptr<c10d::Work> composite(const char* name, c10d::OpType type, const std::vector<at::Tensor>& inputs,
                                           std::vector<at::Tensor> outputs, F&& body);
  Deadline deadline(std::chrono::milliseconds op_timeout) const;
  int next_half() { return static_cast<int>(epoch_++ & 1); }
  void publish(neuron::dist::OpDesc& d);
  void check_descs(const neuron::dist::OpDesc& d);
  void sync(neuron::dist::OpDesc& d, bool first, Deadline dl);  // barrier (+ publish/check on the first)
  bool local_only() const { return hosts_.size() == 1; }
  void need_gloo(const char* what) const;

  // Shared-memory algorithms on the host's ranks (local indices; shm_collectives.cpp); tensors are flat,
  // contiguous CPU views of device memory.
  void shm_allreduce(const at::Tensor& src, const at::Tensor& dst, const Reduction& red,
                     neuron::dist::OpDesc& d, Deadline dl);
  // Maps every local rank's [p, p + bytes) into this process (ptrs, by local rank) after
  // publishing and checking the op; false on every rank alike when some rank's buffer is
  // not shareable (`eligible` false, ordinary memory) or cannot be mapped.
  bool map_peers(const void* p, size_t bytes, bool eligible, neuron::dist::OpDesc& d, Deadline dl,
                 std::vector<char*>& ptrs);
  void peers_done(neuron::dist::OpDesc& d, Deadline dl);  // the closing barrier of a zero-copy op
  // False (on every rank alike) when some rank's tensor cannot be mapped.
  bool zero_copy_allreduce(const at::Tensor& t, const Reduction& red, neuron::dist::OpDesc& d, Deadline dl);
  void shm_reduce(const at::Tensor& src, const at::Tensor& dst, int root, const Reduction& red,
                  neuron::dist::OpDesc& d, Deadline dl);
  void shm_broadcast(const at::Tensor& t, int root, neuron::dist::OpDesc& d, Deadline dl);
  void shm_gather(const at::Tensor& src, const std::vector<at::Tensor>& outs, int root, neuron::dist::OpDesc& d,
                  Deadline dl);  // root < 0: all ranks receive (all-gather)
  void shm_scatter(const std::vector<at::Tensor>& ins, const at::Tensor& dst, int root, neuron::dist::OpDesc& d,
                   Deadline dl);
  void shm_reduce_scatter(const std::vector<at::Tensor>& ins, const at::Tensor& dst, const Reduction& red,
                          neuron::dist::OpDesc& d, Deadline dl);
  void shm_alltoall(const std::vector<at::Tensor>& sends, const std::vector<at::Tensor>& recvs,
                    neuron::dist::OpDesc& d, Deadline dl);

  // Point-to-point (p2p.cpp).
  c10::intrusive_ptr<c10d::Work> submit_p2p(bool is_send, std::vector<at::Tensor>& tensors, int peer, int tag);
  void p2p_loop();
  bool advance(P2POp& op);
  void fail_all_p2p(const std::string& msg);
  c10::intrusive_ptr<c10d::Work> self_p2p(bool is_send, const at::Tensor& t, const std::string& what);

  c10::intrusive_ptr<c10d::Store> store_;
  std::chrono::milliseconds timeout_;
  std::string group_name_;
  std::string key_;  // store prefix of this incarnation of the group
  std::vector<std::vector<int>> hosts_;  // group ranks per host, hosts in order of their lowest rank
  std::vector<int> host_of_;             // group rank -> host index
  std::vector<int> local_index_;         // group rank -> index on its host
  int my_host_ = 0;
  std::vector<int> local_ranks_;         // group ranks on this host, ascending
  std::unique_ptr<neuron::dist::ShmGroup> shm_;
  c10::intrusive_ptr<c10d::Backend> gloo_, leaders_;
  size_t small_bytes_;
  size_t zero_copy_bytes_;
  neuron::dist::PeerMemory peer_memory_;

  std::mutex coll_mu_;  // one collective at a time per group
  uint64_t op_seq_ = 0;
  uint64_t epoch_ = 0;
  c10::intrusive_ptr<NeuronWork> coalesced_;

  std::mutex p2p_mu_;
  std::thread p2p_thread_;
  bool p2p_stop_ = false;
  std::string p2p_broken_;
  std::vector<std::deque<std::shared_ptr<P2POp>>> sends_, recvs_;
  std::deque<std::shared_ptr<P2POp>> any_recvs_;
  std::deque<std::shared_ptr<SelfMsg>> self_sends_, self_recvs_;  // to and from this rank
  uint64_t monitored_seq_ = 0;
};

// Process-wide counters: collective name -> transport ("shm", "gloo", "self") -> calls.
std::map<std::string, std::map<std::string, int64_t>> stats();
void reset_stats();

}  // namespace torch_neuronx::dist
