// The c10d surface of the `neuron` process group: construction (topology, the shared-memory
// segment), and each collective choosing its transport: itself (one rank), shared memory
// (one host, shm_collectives.cpp) or gloo between hosts; coalescing.
#include "distributed/process_group.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "distributed/reduce.h"
#include "distributed/tensors.h"
#include "distributed/work.h"
#include "runtime/memory.h"

namespace torch_neuronx::dist {

using neuron::dist::Clock;
using neuron::dist::CommError;
using neuron::dist::OpDesc;
using neuron::dist::ShmGroup;
using RO = c10d::ReduceOp;

// ---- helpers ----------------------------------------------------------------------------

namespace {

size_t env_size(const char* name, size_t dflt, size_t unit) {
  const char* v = std::getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  double x = std::strtod(v, &end);
  TORCH_CHECK_VALUE(end && *end == 0 && x > 0, name, "=", v, " is not a positive number");
  return static_cast<size_t>(x * static_cast<double>(unit));
}

std::string host_identity() {
  // Ranks share a host when they can map the same /dev/shm: same kernel boot, same mount
  // namespace, and (so namespaced "hosts" stay apart) the same hostname.
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  std::string id = name;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string b;
  if (boot >> b) id += "|" + b;
  char link[128] = {0};
  if (readlink("/proc/self/ns/mnt", link, sizeof(link) - 1) > 0) id += "|" + std::string(link);
  return id;
}

std::string to_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
std::vector<uint8_t> to_bytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }

void check_root(int64_t root, int size, const char* op) {
  TORCH_CHECK_VALUE(root >= 0 && root < size, op, ": root rank ", root, " is outside the group of size ", size);
}

}  // namespace

// ---- construction -----------------------------------------------------------------------

ProcessGroupNeuron::ProcessGroupNeuron(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                       std::chrono::milliseconds timeout, std::string group_name)
    : Backend(rank, size), store_(store), timeout_(timeout), group_name_(std::move(group_name)) {
  TORCH_CHECK_VALUE(size >= 1 && rank >= 0 && rank < size, "neuron process group: rank ", rank,
                    " is outside a group of size ", size);
  small_bytes_ = env_size("TORCH_NEURONX_SHM_SMALL_KB", 32 * 1024, 1024);
  zero_copy_bytes_ = env_size("TORCH_NEURONX_SHM_ZERO_COPY_KB", neuron::rt::kShareableMin, 1024);
  size_t half = env_size("TORCH_NEURONX_SHM_BUFFER_MB", 4u << 20, 1u << 20);
  size_t ring = env_size("TORCH_NEURONX_SHM_RING_MB", 1u << 20, 1u << 20);

  // A group name can come back (destroy_process_group, then init again on the same store):
  // count this rank's incarnations so every key below is fresh. All ranks of a group
  // re-create it equally often, so they agree on the count.
  key_ = "neuron/" + std::to_string(store_->add("neuron/incarnation/" + std::to_string(rank), 1)) + "/";
  const std::string& key = key_;
  // Which ranks share a host: every rank publishes its host identity in the group's store.
  std::string me = host_identity();
  store_->set(key + "host/" + std::to_string(rank), to_bytes(me));
  std::vector<std::string> keys;
  for (int r = 0; r < size; ++r) keys.push_back(key + "host/" + std::to_string(r));
  store_->wait(keys, timeout_);
  std::vector<std::string> ids;
  for (int r = 0; r < size; ++r) ids.push_back(r == rank ? me : to_string(store_->get(keys[r])));
  host_of_.assign(size, -1);
  local_index_.assign(size, -1);
  for (int r = 0; r < size; ++r) {
    for (int h = 0; h < static_cast<int>(hosts_.size()); ++h)
      if (ids[hosts_[h].front()] == ids[r]) host_of_[r] = h;
    if (host_of_[r] < 0) {
      host_of_[r] = static_cast<int>(hosts_.size());
      hosts_.emplace_back();
    }
    local_index_[r] = static_cast<int>(hosts_[host_of_[r]].size());
    hosts_[host_of_[r]].push_back(r);
  }
  my_host_ = host_of_[rank];
  local_ranks_ = hosts_[my_host_];
  int nlocal = static_cast<int>(local_ranks_.size());
  int li = local_index_[rank];
  sends_.resize(nlocal);
  recvs_.resize(nlocal);

  if (nlocal > 1) {
    // Large device allocations from now on can be mapped by the other ranks of this host.
    neuron::rt::set_shareable_allocations(true);
    // The host's first rank creates the segment and publishes its name; it unlinks the
    // name once every local rank has mapped it, so nothing is left in /dev/shm.
    std::string name_key = key + "shm/" + std::to_string(my_host_);
    try {
      if (li == 0) {
        std::string name = ShmGroup::unique_name();
        shm_ = std::make_unique<ShmGroup>(name, true, nlocal, 0, half, ring);
        store_->set(name_key, to_bytes(name));
        std::vector<std::string> attached;
        for (int r : local_ranks_)
          if (r != rank) attached.push_back(key + "attached/" + std::to_string(r));
        store_->wait(attached, timeout_);
        shm_->unlink();
      } else {
        store_->wait({name_key}, timeout_);
        std::string name = to_string(store_->get(name_key));
        shm_ = std::make_unique<ShmGroup>(name, false, nlocal, li, half, ring);
        store_->set(key + "attached/" + std::to_string(rank), to_bytes("1"));
      }
    } catch (const CommError& e) {
      C10_THROW_ERROR(DistBackendError, c10::str("neuron process group ", group_name_, ": ", e.what()));
    }
  }
}

ProcessGroupNeuron::~ProcessGroupNeuron() { shutdown(); }

c10::intrusive_ptr<c10d::Backend::Options> ProcessGroupNeuron::getBackendOptions() {
  auto o = c10::make_intrusive<Options>("neuron", timeout_);
  o->group_name = group_name_;
  return o;
}

void ProcessGroupNeuron::set_gloo(c10::intrusive_ptr<c10d::Backend> flat, c10::intrusive_ptr<c10d::Backend> leaders) {
  gloo_ = std::move(flat);
  leaders_ = std::move(leaders);
}

void ProcessGroupNeuron::need_gloo(const char* what) const {
  TORCH_CHECK(gloo_, "neuron process group ", group_name_, " spans ", hosts_.size(), " hosts but has no gloo transport for ",
              what, "; create it with torch.distributed.init_process_group/new_group (torch_neuronx.distributed "
              "attaches gloo), not by constructing ProcessGroupNeuron directly");
}

// ---- collective framework -----------------------------------------------------------------

ProcessGroupNeuron::Deadline ProcessGroupNeuron::deadline(std::chrono::milliseconds op_timeout) const {
  auto t = op_timeout == c10d::kUnsetTimeout ? timeout_ : op_timeout;
  auto now = Clock::now();
  if (t > std::chrono::hours(24 * 365)) return now + std::chrono::hours(24 * 365);
  return now + t;
}

template <class F>
c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::run(const char* name, c10d::OpType type,
                                                       const std::vector<at::Tensor>& inputs,
                                                       std::vector<at::Tensor> outputs,
                                                       std::chrono::milliseconds op_timeout, F&& body) {
  std::lock_guard<std::mutex> g(coll_mu_);
  // Made before the op runs, so the profiler's event spans it.
  auto work = c10::make_intrusive<NeuronWork>(rank_, type, std::move(outputs), 1, name, name, inputs);
  Deadline dl = deadline(op_timeout);
  try {
    body(dl);
  } catch (const CommError& e) {
    C10_THROW_ERROR(DistBackendError, c10::str("neuron process group ", group_name_, " (rank ", rank_, " of ", size_,
                                               "): ", e.what()));
  }
  work->part_done(nullptr);
  return work;
}

template <class F>
c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::composite(const char* name, c10d::OpType type,
                                                             const std::vector<at::Tensor>& inputs,
                                                             std::vector<at::Tensor> outputs, F&& body) {
  auto work = c10::make_intrusive<NeuronWork>(rank_, type, std::move(outputs), 1, name, name, inputs);
  ++t_inside_composite;
  try {
    body();
  } catch (...) {
    --t_inside_composite;
    throw;
  }
  --t_inside_composite;
  work->part_done(nullptr);
  return work;
}

namespace {
OpDesc make_desc(const char* name, c10d::OpType type, at::ScalarType dt, int64_t bytes, int64_t root, int redop,
                 const std::string& detail) {
  OpDesc d{};
  d.op = static_cast<int32_t>(type);
  d.dtype = static_cast<int32_t>(dt);
  d.bytes = bytes;
  d.root = root;
  d.redop = redop;
  std::snprintf(d.text, sizeof(d.text), "%s(%s)", name, detail.c_str());
  return d;
}
}  // namespace

// ---- collectives ------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  check_single(tensors, "all_reduce");
  at::Tensor t = tensors[0];
  Reduction red = make_reduction(opts.reduceOp, t.scalar_type(), size_, "all_reduce");
  return run("all_reduce", c10d::OpType::ALLREDUCE, tensors, tensors, opts.timeout, [&](Deadline dl) {
    Flat f = Flat::of(t, true);
    OpDesc d = make_desc("all_reduce", c10d::OpType::ALLREDUCE, t.scalar_type(), f.bytes(), 0, red.op,
                         shape_str(t) + ", " + red_name(red.op));
    if (size_ == 1) {
      reduce_into(f.flat, {f.flat}, red);
      count("all_reduce", "self");
    } else if (local_only()) {
      shm_allreduce(f.flat, f.flat, red, d, dl);
      count("all_reduce", "shm");
    } else {
      // Hierarchical: reduce on each host to its leader, all-reduce among leaders over gloo,
      // broadcast on each host. AVG and PREMUL_SUM become SUM across hosts.
      need_gloo("all_reduce");
      Reduction local = red;
      if (red.op == RO::AVG) local.op = RO::SUM;
      if (shm_) {
        shm_reduce(f.flat, f.flat, 0, local, d, dl);
        count("all_reduce", "shm");
      }
      if (is_host_leader() && hosts_.size() > 1) {
        c10d::AllreduceOptions go;
        go.reduceOp = (red.op == RO::AVG || red.op == RO::PREMUL_SUM) ? RO(RO::SUM) : opts.reduceOp;
        go.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(dl - Clock::now());
        std::vector<at::Tensor> v{f.flat};
        leaders_->allreduce(v, go)->wait();
        if (red.op == RO::AVG) divide_for_avg(f.flat, size_);
      }
      count("all_reduce", "gloo");
      if (shm_) {
        OpDesc b = make_desc("all_reduce/broadcast", c10d::OpType::BROADCAST, t.scalar_type(), f.bytes(), 0, 0,
                             shape_str(t));
        shm_broadcast(f.flat, 0, b, dl);
      }
    }
    f.writeback();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                       const c10d::AllreduceCoalescedOptions& opts) {
  return composite("all_reduce_coalesced", c10d::OpType::ALLREDUCE_COALESCED, tensors, tensors, [&] {
    for (auto& t : tensors) {
      std::vector<at::Tensor> one{t};
      allreduce(one, opts);
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  check_single(tensors, "reduce");
  at::Tensor t = tensors[0];
  int root = static_cast<int>(opts.rootRank);
  check_root(root, size_, "reduce");
  Reduction red = make_reduction(opts.reduceOp, t.scalar_type(), size_, "reduce");
  return run("reduce", c10d::OpType::REDUCE, tensors, tensors, opts.timeout, [&](Deadline dl) {
    Flat f = Flat::of(t, true);
    OpDesc d = make_desc("reduce", c10d::OpType::REDUCE, t.scalar_type(), f.bytes(), root, red.op,
                         shape_str(t) + ", " + red_name(red.op) + ", root " + std::to_string(root));
    if (size_ == 1) {
      reduce_into(f.flat, {f.flat}, red);
      count("reduce", "self");
    } else if (local_only()) {
      shm_reduce(f.flat, f.flat, root, red, d, dl);
      count("reduce", "shm");
    } else {
      need_gloo("reduce");
      c10d::ReduceOptions go = opts;
      std::vector<at::Tensor> v{f.flat};
      gloo_->reduce(v, go)->wait();
      count("reduce", "gloo");
    }
    if (rank_ == root) f.writeback();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  check_single(tensors, "broadcast");
  at::Tensor t = tensors[0];
  int root = static_cast<int>(opts.rootRank);
  check_root(root, size_, "broadcast");
  return run("broadcast", c10d::OpType::BROADCAST, tensors, tensors, opts.timeout, [&](Deadline dl) {
    Flat f = Flat::of(t, rank_ == root);
    OpDesc d = make_desc("broadcast", c10d::OpType::BROADCAST, t.scalar_type(), f.bytes(), root, 0,
                         shape_str(t) + ", root " + std::to_string(root));
    if (size_ == 1) {
      count("broadcast", "self");
    } else if (local_only()) {
      shm_broadcast(f.flat, root, d, dl);
      count("broadcast", "shm");
    } else {
      need_gloo("broadcast");
      std::vector<at::Tensor> v{f.flat};
      gloo_->broadcast(v, opts)->wait();
      count("broadcast", "gloo");
    }
    if (rank_ != root) f.writeback();
  });
}

namespace {
void check_same(const at::Tensor& a, const at::Tensor& ref, const char* op, const char* what, bool numel = true) {
  check_dense_neuron(a, op);
  TORCH_CHECK_VALUE(a.scalar_type() == ref.scalar_type(), op, ": ", what, " has dtype ", a.scalar_type(),
                    " but the input has ", ref.scalar_type());
  TORCH_CHECK_VALUE(!numel || a.numel() == ref.numel(), op, ": ", what, " has ", a.numel(),
                    " elements but the input has ", ref.numel());
}

// List forms whose tensors differ in size per rank (NCCL's "v" collectives).
bool uneven(const std::vector<at::Tensor>& ts, int64_t numel) {
  for (const auto& t : ts)
    if (t.numel() != numel) return true;
  return false;
}
}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  check_single(inputs, "all_gather");
  TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_, "all_gather: expected a list of ",
                    size_, " output tensors (one per rank), got ", outputs.empty() ? 0 : outputs[0].size());
  at::Tensor in = inputs[0];
  for (auto& o : outputs[0]) check_same(o, in, "all_gather", "an output tensor", false);
  if (uneven(outputs[0], in.numel())) {
    // Output j holds rank j's input, whose size may differ per rank: one broadcast per rank
    // (the broadcasts check that every rank agrees on each size).
    at::Tensor mine = outputs[0][rank_];
    TORCH_CHECK_VALUE(mine.numel() == in.numel(), "all_gather: output tensor ", rank_, " (this rank's) has ",
                      mine.numel(), " elements but the input has ", in.numel());
    return composite("all_gather", c10d::OpType::ALLGATHER, inputs, outputs[0], [&] {
      mine.copy_(in.reshape(mine.sizes()));
      for (int j = 0; j < size_; ++j) {
        c10d::BroadcastOptions bo;
        bo.rootRank = j;
        bo.timeout = opts.timeout;
        std::vector<at::Tensor> v{outputs[0][j]};
        broadcast(v, bo);
      }
    });
  }
  return run("all_gather", c10d::OpType::ALLGATHER, inputs, outputs[0], opts.timeout, [&](Deadline dl) {
    Flat src = Flat::of(in, true);
    FlatList outs = FlatList::of(outputs[0], false);
    std::vector<at::Tensor>& flats = outs.flats;
    OpDesc d = make_desc("all_gather", c10d::OpType::ALLGATHER, in.scalar_type(), src.bytes(), -1, 0, shape_str(in));
    if (size_ == 1) {
      flats[0].copy_(src.flat);
      count("all_gather", "self");
    } else if (local_only()) {
      shm_gather(src.flat, flats, -1, d, dl);
      count("all_gather", "shm");
    } else {
      need_gloo("all_gather");
      std::vector<std::vector<at::Tensor>> o{flats};
      std::vector<at::Tensor> i{src.flat};
      gloo_->allgather(o, i, opts)->wait();
      count("all_gather", "gloo");
    }
    outs.writeback();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::AllgatherOptions& opts) {
  check_dense_neuron(input, "all_gather_into_tensor");
  check_dense_neuron(output, "all_gather_into_tensor");
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(), "all_gather_into_tensor: output dtype ",
                    output.scalar_type(), " differs from input dtype ", input.scalar_type());
  TORCH_CHECK_VALUE(output.numel() == input.numel() * size_, "all_gather_into_tensor: output has ", output.numel(),
                    " elements; expected world size (", size_, ") x input numel (", input.numel(), ")");
  TORCH_CHECK_VALUE(output.is_contiguous(), "all_gather_into_tensor: the output tensor must be contiguous");
  std::vector<at::Tensor> parts = output.view({-1}).chunk(size_);
  if (input.numel() == 0) parts.assign(size_, output.view({-1}));
  std::vector<std::vector<at::Tensor>> outs{parts};
  std::vector<at::Tensor> ins{input};
  return composite("all_gather_into_tensor", c10d::OpType::_ALLGATHER_BASE, ins, {output},
                   [&] { allgather(outs, ins, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                       std::vector<at::Tensor>& inputs,
                                                                       const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "all_gather_coalesced: ", outputs.size(), " output lists for ",
                    inputs.size(), " inputs");
  std::vector<at::Tensor> all;
  for (auto& o : outputs) all.insert(all.end(), o.begin(), o.end());
  return composite("all_gather_coalesced", c10d::OpType::ALLGATHER_COALESCED, inputs, all, [&] {
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::vector<std::vector<at::Tensor>> o{outputs[i]};
      std::vector<at::Tensor> in{inputs[i]};
      allgather(o, in, opts);
    }
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "all_gather_into_tensor_coalesced: ", outputs.size(),
                    " outputs for ", inputs.size(), " inputs");
  return composite("all_gather_into_tensor_coalesced", c10d::OpType::COALESCED, inputs, outputs, [&] {
    for (size_t i = 0; i < inputs.size(); ++i) _allgather_base(outputs[i], inputs[i], opts);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::GatherOptions& opts) {
  check_single(inputs, "gather");
  int root = static_cast<int>(opts.rootRank);
  check_root(root, size_, "gather");
  at::Tensor in = inputs[0];
  std::vector<at::Tensor> outs_user;
  if (rank_ == root) {
    TORCH_CHECK_VALUE(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_, "gather: the root needs a "
                      "gather_list of ", size_, " tensors");
    for (auto& o : outputs[0]) check_same(o, in, "gather", "a gather_list tensor");
    outs_user = outputs[0];
  } else {
    TORCH_CHECK_VALUE(outputs.empty() || outputs[0].empty(), "gather: only the root (rank ", root,
                      ") may pass a gather_list");
  }
  return run("gather", c10d::OpType::GATHER, inputs, outs_user, opts.timeout, [&](Deadline dl) {
    Flat src = Flat::of(in, true);
    FlatList outs = FlatList::of(outs_user, false);
    std::vector<at::Tensor>& flats = outs.flats;
    OpDesc d = make_desc("gather", c10d::OpType::GATHER, in.scalar_type(), src.bytes(), root, 0,
                         shape_str(in) + ", root " + std::to_string(root));
    if (size_ == 1) {
      flats[0].copy_(src.flat);
      count("gather", "self");
    } else if (local_only()) {
      shm_gather(src.flat, flats, root, d, dl);
      count("gather", "shm");
    } else {
      need_gloo("gather");
      std::vector<std::vector<at::Tensor>> o;
      if (rank_ == root) o.push_back(flats);
      std::vector<at::Tensor> i{src.flat};
      gloo_->gather(o, i, opts)->wait();
      count("gather", "gloo");
    }
    outs.writeback();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ScatterOptions& opts) {
  check_single(outputs, "scatter");
  int root = static_cast<int>(opts.rootRank);
  check_root(root, size_, "scatter");
  at::Tensor out = outputs[0];
  std::vector<at::Tensor> ins_user;
  if (rank_ == root) {
    TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, "scatter: the root needs a "
                      "scatter_list of ", size_, " tensors");
    for (auto& i : inputs[0]) check_same(i, out, "scatter", "a scatter_list tensor");
    ins_user = inputs[0];
  } else {
    TORCH_CHECK_VALUE(inputs.empty() || inputs[0].empty(), "scatter: only the root (rank ", root,
                      ") may pass a scatter_list");
  }
  return run("scatter", c10d::OpType::SCATTER, ins_user, outputs, opts.timeout, [&](Deadline dl) {
    Flat dst = Flat::of(out, false);
    std::vector<at::Tensor> flats = FlatList::of(ins_user, true).flats;
    OpDesc d = make_desc("scatter", c10d::OpType::SCATTER, out.scalar_type(), dst.bytes(), root, 0,
                         shape_str(out) + ", root " + std::to_string(root));
    if (size_ == 1) {
      dst.flat.copy_(flats[0]);
      count("scatter", "self");
    } else if (local_only()) {
      shm_scatter(flats, dst.flat, root, d, dl);
      count("scatter", "shm");
    } else {
      need_gloo("scatter");
      std::vector<std::vector<at::Tensor>> i;
      if (rank_ == root) i.push_back(flats);
      std::vector<at::Tensor> o{dst.flat};
      gloo_->scatter(o, i, opts)->wait();
      count("scatter", "gloo");
    }
    dst.writeback();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                                  const c10d::ReduceScatterOptions& opts) {
  check_single(outputs, "reduce_scatter");
  at::Tensor out = outputs[0];
  TORCH_CHECK_VALUE(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_, "reduce_scatter: expected a "
                    "list of ", size_, " input tensors (one per rank), got ", inputs.empty() ? 0 : inputs[0].size());
  for (auto& i : inputs[0]) check_same(i, out, "reduce_scatter", "an input tensor", false);
  Reduction red = make_reduction(opts.reduceOp, out.scalar_type(), size_, "reduce_scatter");
  if (uneven(inputs[0], out.numel())) {
    // Input j is reduced into rank j's output, whose size may differ per rank: one reduce per
    // rank (the reduces check that every rank agrees on each size).
    at::Tensor mine = inputs[0][rank_];
    TORCH_CHECK_VALUE(mine.numel() == out.numel(), "reduce_scatter: input tensor ", rank_, " (this rank's) has ",
                      mine.numel(), " elements but the output has ", out.numel());
    return composite("reduce_scatter", c10d::OpType::REDUCE_SCATTER, inputs[0], outputs, [&] {
      for (int j = 0; j < size_; ++j) {
        c10d::ReduceOptions ro;
        ro.reduceOp = opts.reduceOp;
        ro.rootRank = j;
        ro.timeout = opts.timeout;
        if (j == rank_) out.copy_(mine.reshape(out.sizes()));
        // gloo (between hosts) may use a non-root's buffer as scratch: give it a copy.
        std::vector<at::Tensor> v{j == rank_ ? out : (local_only() ? inputs[0][j] : inputs[0][j].clone())};
        reduce(v, ro);
      }
    });
  }
  return run("reduce_scatter", c10d::OpType::REDUCE_SCATTER, inputs[0], outputs, opts.timeout, [&](Deadline dl) {
    Flat dst = Flat::of(out, false);
    std::vector<at::Tensor> flats = FlatList::of(inputs[0], true).flats;
    OpDesc d = make_desc("reduce_scatter", c10d::OpType::REDUCE_SCATTER, out.scalar_type(), dst.bytes(), 0, red.op,
                         shape_str(out) + ", " + red_name(red.op));
    if (size_ == 1) {
      reduce_into(dst.flat, {flats[0]}, red);
      count("reduce_scatter", "self");
    } else if (local_only()) {
      shm_reduce_scatter(flats, dst.flat, red, d, dl);
      count("reduce_scatter", "shm");
    } else {
      // gloo has no reduce_scatter: all-reduce the whole input over gloo, keep our part.
      need_gloo("reduce_scatter");
      at::Tensor all = at::cat(flats);
      c10d::AllreduceOptions go;
      go.reduceOp = (red.op == RO::AVG || red.op == RO::PREMUL_SUM) ? RO(RO::SUM) : opts.reduceOp;
      if (red.op == RO::PREMUL_SUM) all.mul_(red.factor);
      std::vector<at::Tensor> v{all};
      gloo_->allreduce(v, go)->wait();
      at::Tensor mine = all.chunk(size_)[rank_];
      if (red.op == RO::AVG) {
        Reduction avg = red;
        reduce_into(dst.flat, {mine}, avg);
      } else {
        dst.flat.copy_(mine);
      }
      count("reduce_scatter", "gloo");
    }
    dst.writeback();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                        const c10d::ReduceScatterOptions& opts) {
  check_dense_neuron(input, "reduce_scatter_tensor");
  check_dense_neuron(output, "reduce_scatter_tensor");
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(), "reduce_scatter_tensor: output dtype ",
                    output.scalar_type(), " differs from input dtype ", input.scalar_type());
  TORCH_CHECK_VALUE(input.numel() == output.numel() * size_, "reduce_scatter_tensor: input has ", input.numel(),
                    " elements; expected world size (", size_, ") x output numel (", output.numel(), ")");
  at::Tensor in = input.is_contiguous() ? input : input.contiguous();
  std::vector<at::Tensor> parts = in.view({-1}).chunk(size_);
  if (output.numel() == 0) parts.assign(size_, in.view({-1}));
  std::vector<std::vector<at::Tensor>> ins{parts};
  std::vector<at::Tensor> outs{output};
  return composite("reduce_scatter_tensor", c10d::OpType::_REDUCE_SCATTER_BASE, {input}, outs,
                   [&] { reduce_scatter(outs, ins, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK_VALUE(outputs.size() == inputs.size(), "reduce_scatter_tensor_coalesced: ", outputs.size(),
                    " outputs for ", inputs.size(), " inputs");
  return composite("reduce_scatter_tensor_coalesced", c10d::OpType::COALESCED, inputs, outputs, [&] {
    for (size_t i = 0; i < inputs.size(); ++i) _reduce_scatter_base(outputs[i], inputs[i], opts);
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
  TORCH_CHECK_VALUE(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_,
                    "all_to_all: expected ", size_, " input and output tensors, got ", inputs.size(), " and ",
                    outputs.size());
  for (auto& t : inputs) check_dense_neuron(t, "all_to_all");
  for (auto& t : outputs) check_dense_neuron(t, "all_to_all");
  at::ScalarType dt = inputs[0].scalar_type();
  for (auto& t : inputs)
    TORCH_CHECK_VALUE(t.scalar_type() == dt, "all_to_all: input tensors have different dtypes (", dt, ", ",
                      t.scalar_type(), ")");
  for (auto& t : outputs)
    TORCH_CHECK_VALUE(t.scalar_type() == dt, "all_to_all: output dtype ", t.scalar_type(), " differs from input dtype ",
                      dt);
  return run("all_to_all", c10d::OpType::ALLTOALL, inputs, outputs, opts.timeout, [&](Deadline dl) {
    std::vector<at::Tensor> sflat = FlatList::of(inputs, true).flats;
    FlatList outs = FlatList::of(outputs, false);
    std::vector<at::Tensor>& rflat = outs.flats;
    OpDesc d = make_desc("all_to_all", c10d::OpType::ALLTOALL, dt, -1, 0, 0, std::string(c10::getDtypeNames(dt).first));
    if (size_ == 1) {
      rflat[0].copy_(sflat[0]);
      count("all_to_all", "self");
    } else if (local_only()) {
      shm_alltoall(sflat, rflat, d, dl);
      count("all_to_all", "shm");
    } else {
      need_gloo("all_to_all");
      gloo_->alltoall(rflat, sflat, opts)->wait();
      count("all_to_all", "gloo");
    }
    outs.writeback();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                 std::vector<int64_t>& outputSplitSizes,
                                                                 std::vector<int64_t>& inputSplitSizes,
                                                                 const c10d::AllToAllOptions& opts) {
  check_dense_neuron(input, "all_to_all_single");
  check_dense_neuron(output, "all_to_all_single");
  TORCH_CHECK_VALUE(output.scalar_type() == input.scalar_type(), "all_to_all_single: output dtype ",
                    output.scalar_type(), " differs from input dtype ", input.scalar_type());
  auto split = [&](const at::Tensor& t, std::vector<int64_t>& sizes, const char* which) {
    int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    if (sizes.empty()) {
      TORCH_CHECK_VALUE(rows % size_ == 0, "all_to_all_single: ", which, " has ", rows,
                        " rows, not divisible by the world size ", size_, "; pass split sizes");
      sizes.assign(size_, rows / size_);
    }
    TORCH_CHECK_VALUE(static_cast<int>(sizes.size()) == size_, "all_to_all_single: ", which, " split sizes have ",
                      sizes.size(), " entries for a group of ", size_);
    int64_t sum = 0;
    for (auto s : sizes) {
      TORCH_CHECK_VALUE(s >= 0, "all_to_all_single: negative split size ", s);
      sum += s;
    }
    TORCH_CHECK_VALUE(sum == rows, "all_to_all_single: ", which, " split sizes sum to ", sum, " but dim 0 has ", rows);
    at::Tensor flat = t.dim() == 0 ? t.view({1}) : t;
    return flat.split_with_sizes(sizes);
  };
  at::Tensor in = input.is_contiguous() ? input : input.contiguous();
  TORCH_CHECK_VALUE(output.is_contiguous(), "all_to_all_single: the output tensor must be contiguous");
  std::vector<at::Tensor> ins = split(in, inputSplitSizes, "input");
  std::vector<at::Tensor> outs = split(output, outputSplitSizes, "output");
  if (!local_only()) {
    // Between hosts: gloo's own all-to-all with splits, on CPU views of device memory.
    need_gloo("all_to_all_single");
    return run("all_to_all", c10d::OpType::ALLTOALL_BASE, {input}, {output}, opts.timeout, [&](Deadline) {
      at::Tensor o = cpu_alias(output), i = cpu_alias(in);
      gloo_->alltoall_base(o, i, outputSplitSizes, inputSplitSizes, opts)->wait();
      count("all_to_all", "gloo");
    });
  }
  return composite("all_to_all", c10d::OpType::ALLTOALL_BASE, {input}, {output}, [&] { alltoall(outs, ins, opts); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::barrier(const c10d::BarrierOptions& opts) {
  return run("barrier", c10d::OpType::BARRIER, {}, {}, opts.timeout, [&](Deadline dl) {
    OpDesc d = make_desc("barrier", c10d::OpType::BARRIER, at::kByte, 0, 0, 0, "");
    if (size_ == 1) {
      count("barrier", "self");
      return;
    }
    if (shm_) {
      sync(d, true, dl);
      count("barrier", "shm");
    }
    if (!local_only()) {
      need_gloo("barrier");
      if (is_host_leader()) {
        c10d::BarrierOptions go;
        go.timeout = std::chrono::duration_cast<std::chrono::milliseconds>(dl - Clock::now());
        leaders_->barrier(go)->wait();
      }
      count("barrier", "gloo");
      if (shm_) sync(d, false, dl);
    }
  });
}

void ProcessGroupNeuron::monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) {
  // Through the store, like gloo's: rank 0 learns exactly which ranks did not arrive.
  std::lock_guard<std::mutex> g(coll_mu_);
  auto timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
  std::string base = key_ + "monitored/" + std::to_string(++monitored_seq_) + "/";
  count("monitored_barrier", "store");
  if (rank_ != 0) {
    store_->set(base + std::to_string(rank_), to_bytes("1"));
    try {
      store_->wait({base + "done"}, timeout);
    } catch (const std::exception& e) {
      C10_THROW_ERROR(DistBackendError, c10::str("neuron monitored_barrier: rank ", rank_,
                                                 " timed out waiting for rank 0 after ", timeout.count(), " ms"));
    }
    return;
  }
  auto deadline = Clock::now() + timeout;
  std::vector<int> missing;
  for (int r = 1; r < size_; ++r) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    bool ok = false;
    try {
      if (left.count() > 0) {
        store_->wait({base + std::to_string(r)}, left);
        ok = true;
      }
    } catch (const std::exception&) {
    }
    if (!ok) {
      missing.push_back(r);
      if (!waitAllRanks) break;
    }
  }
  if (!missing.empty()) {
    std::string list;
    for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
    C10_THROW_ERROR(DistBackendError, c10::str(waitAllRanks ? "Ranks " : "Rank ", list,
                                               " failed to pass monitoredBarrier in ", timeout.count(), " ms"));
  }
  store_->set(base + "done", to_bytes("1"));
}

// ---- coalescing ---------------------------------------------------------------------------

void ProcessGroupNeuron::startCoalescing() {
  TORCH_CHECK(!coalesced_, "neuron process group: startCoalescing called twice without endCoalescing");
  // One pending count held until endCoalescing, so the batch cannot complete early.
  coalesced_ = c10::make_intrusive<NeuronWork>(rank_, c10d::OpType::COALESCED, std::vector<at::Tensor>{}, 1,
                                               "coalesced operations");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::endCoalescing() {
  TORCH_CHECK(coalesced_, "neuron process group: endCoalescing without startCoalescing");
  auto w = coalesced_;
  coalesced_.reset();
  w->part_done(nullptr);
  return w;
}

}  // namespace torch_neuronx::dist
