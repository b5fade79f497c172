#include "distributed/backend.h"

#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "aten/kernel.h"
#include "aten/neuron.h"
#include "runtime/memory.h"

namespace torch_neuronx::dist {

using neuron::dist::Clock;
using neuron::dist::CommError;
using neuron::dist::OpDesc;
using neuron::dist::ShmGroup;
using RO = c10d::ReduceOp;

// ---- counters ---------------------------------------------------------------------------

namespace {
std::mutex g_stats_mu;
std::map<std::string, std::map<std::string, int64_t>> g_stats;

void count(const char* op, const char* transport) {
  std::lock_guard<std::mutex> g(g_stats_mu);
  ++g_stats[op][transport];
}
}  // namespace

std::map<std::string, std::map<std::string, int64_t>> stats() {
  std::lock_guard<std::mutex> g(g_stats_mu);
  return g_stats;
}

void reset_stats() {
  std::lock_guard<std::mutex> g(g_stats_mu);
  g_stats.clear();
}

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

const char* red_name(RO::RedOpType op) {
  switch (op) {
    case RO::SUM: return "SUM";
    case RO::AVG: return "AVG";
    case RO::PRODUCT: return "PRODUCT";
    case RO::MIN: return "MIN";
    case RO::MAX: return "MAX";
    case RO::BAND: return "BAND";
    case RO::BOR: return "BOR";
    case RO::BXOR: return "BXOR";
    case RO::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

bool is_low_precision(at::ScalarType dt) {
  return dt == at::kHalf || dt == at::kBFloat16 || at::isFloat8Type(dt);
}

void check_dense_neuron(const at::Tensor& t, const char* op) {
  TORCH_CHECK_VALUE(t.defined() && t.device().type() == kNeuron && t.layout() == at::kStrided,
                    "Tensors must be neuron and dense: ", op, " got ",
                    t.defined() ? t.device().str() + " " + c10::str(t.layout()) : std::string("an undefined"),
                    " tensor. Move it with .to(\"neuron\"), or run CPU tensors on a gloo group "
                    "(init_process_group(\"cpu:gloo,neuron:neuron\")).");
}

void check_single(const std::vector<at::Tensor>& v, const char* op) {
  TORCH_CHECK_VALUE(v.size() == 1, op, ": the neuron backend takes one tensor per process, got ", v.size());
  check_dense_neuron(v[0], op);
}

void check_root(int64_t root, int size, const char* op) {
  TORCH_CHECK_VALUE(root >= 0 && root < size, op, ": root rank ", root, " is outside the group of size ", size);
}

std::string shape_str(const at::Tensor& t) {
  std::ostringstream s;
  s << c10::getDtypeNames(t.scalar_type()).first << t.sizes();  // torch's name: float32[4, 8]
  return s.str();
}

// A contiguous CPU view of a neuron tensor's memory (copied when the tensor is not
// contiguous; `writeback` then copies results back).
struct Flat {
  at::Tensor alias;  // CPU alias of the user's tensor
  at::Tensor flat;   // 1-D contiguous; shares memory with alias when possible
  bool copied = false;
  static Flat of(const at::Tensor& t, bool read) {
    Flat f;
    f.alias = cpu_alias(t);
    if (f.alias.is_contiguous()) {
      f.flat = f.alias.view({-1});
    } else {
      f.copied = true;
      f.flat = read ? f.alias.contiguous().view({-1}) : at::empty({f.alias.numel()}, f.alias.options());
    }
    return f;
  }
  void writeback() {
    if (copied) alias.copy_(flat.view(alias.sizes()));
  }
  char* ptr() const { return static_cast<char*>(flat.data_ptr()); }
  size_t bytes() const { return flat.nbytes(); }
};

// Flat views of a list of tensors (the outputs of a gather, the inputs of a scatter).
struct FlatList {
  std::vector<Flat> all;
  std::vector<at::Tensor> flats;
  static FlatList of(const std::vector<at::Tensor>& ts, bool read) {
    FlatList l;
    for (const auto& t : ts) {
      l.all.push_back(Flat::of(t, read));
      l.flats.push_back(l.all.back().flat);
    }
    return l;
  }
  void writeback() {
    for (auto& f : all) f.writeback();
  }
};

at::Tensor view_of(void* p, int64_t numel, at::ScalarType dt) {
  return at::from_blob(p, {numel}, at::TensorOptions().dtype(dt).device(at::kCPU));
}

std::vector<c10::Device> devices_of(const std::vector<at::Tensor>& ts) {
  std::vector<c10::Device> d;
  for (const auto& t : ts)
    if (t.defined() && t.device().type() == kNeuron && std::find(d.begin(), d.end(), t.device()) == d.end())
      d.push_back(t.device());
  return d;
}

}  // namespace

// ---- reductions -------------------------------------------------------------------------

struct Reduction {
  RO::RedOpType op = RO::SUM;
  double factor = 1.0;  // PREMUL_SUM
  int n = 1;            // AVG divides by this
};

namespace {

Reduction make_reduction(const RO& rop, at::ScalarType dt, int n, const char* opname) {
  Reduction r;
  r.op = rop.op_;
  r.n = n;
  bool fp = at::isFloatingType(dt), cx = at::isComplexType(dt);
  switch (r.op) {
    case RO::BAND:
    case RO::BOR:
    case RO::BXOR:
      TORCH_CHECK_VALUE(!fp && !cx, opname, ": ", red_name(r.op), " needs an integer or bool tensor, got ", dt);
      break;
    case RO::MIN:
    case RO::MAX:
      TORCH_CHECK_VALUE(!cx, opname, ": ", red_name(r.op), " is not defined for complex tensors (", dt, ")");
      break;
    case RO::AVG:
      TORCH_CHECK_VALUE(dt != at::kBool, opname, ": AVG of bool tensors is undefined; use SUM (logical or)");
      break;
    case RO::PREMUL_SUM: {
      TORCH_CHECK_VALUE(fp || cx, opname, ": PREMUL_SUM needs a floating-point tensor, got ", dt);
      auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(rop.supplement_.get());
      TORCH_CHECK_VALUE(s, opname, ": PREMUL_SUM without a factor; make it with "
                        "torch.distributed._make_nccl_premul_sum(factor)");
      r.factor = s->tensor_factor.defined() ? s->tensor_factor.to(at::kCPU).item<double>() : s->double_factor;
      break;
    }
    case RO::SUM:
    case RO::PRODUCT:
      break;
    default:
      TORCH_CHECK_VALUE(false, opname, ": unsupported reduce op ", static_cast<int>(r.op));
  }
  return r;
}

// AVG's final step: floating and complex divide, integers truncate (as NCCL).
void divide_for_avg(const at::Tensor& t, int n) {
  if (at::isFloatingType(t.scalar_type()) || at::isComplexType(t.scalar_type())) t.div_(n);
  else t.div_(n, "trunc");
}

// dst = a (op) b, elementwise; dst may alias a.
void combine(const at::Tensor& dst, const at::Tensor& a, const at::Tensor& b, const Reduction& r, bool is_bool) {
  switch (r.op) {
    case RO::SUM:
    case RO::AVG:
      if (is_bool) at::logical_or_out(const_cast<at::Tensor&>(dst), a, b);
      else at::add_out(const_cast<at::Tensor&>(dst), a, b);
      break;
    case RO::PREMUL_SUM:
      at::add_out(const_cast<at::Tensor&>(dst), a, b, r.factor);
      break;
    case RO::PRODUCT:
      if (is_bool) at::logical_and_out(const_cast<at::Tensor&>(dst), a, b);
      else at::mul_out(const_cast<at::Tensor&>(dst), a, b);
      break;
    case RO::MIN:
      if (is_bool) at::logical_and_out(const_cast<at::Tensor&>(dst), a, b);
      else at::minimum_out(const_cast<at::Tensor&>(dst), a, b);
      break;
    case RO::MAX:
      if (is_bool) at::logical_or_out(const_cast<at::Tensor&>(dst), a, b);
      else at::maximum_out(const_cast<at::Tensor&>(dst), a, b);
      break;
    case RO::BAND: at::bitwise_and_out(const_cast<at::Tensor&>(dst), a, b); break;
    case RO::BOR: at::bitwise_or_out(const_cast<at::Tensor&>(dst), a, b); break;
    case RO::BXOR: at::bitwise_xor_out(const_cast<at::Tensor&>(dst), a, b); break;
    default: TORCH_CHECK(false, "unsupported reduce op");
  }
}

// out = reduce(ins) in the order given (so every rank that reduces the same inputs gets
// the same bits). Half, bfloat16 and fp8 accumulate in float32 and round once.
void reduce_into(const at::Tensor& out, const std::vector<at::Tensor>& ins, const Reduction& r) {
  at::ScalarType dt = out.scalar_type();
  bool is_bool = dt == at::kBool;
  bool low = is_low_precision(dt);
  bool alias = false;
  for (size_t i = 1; i < ins.size(); ++i) alias |= ins[i].data_ptr() == out.data_ptr();
  at::Tensor acc = low ? at::empty(out.sizes(), out.options().dtype(at::kFloat)) : (alias ? at::empty_like(out) : out);
  acc.copy_(ins[0]);
  if (r.op == RO::PREMUL_SUM) acc.mul_(r.factor);
  // TensorIterator does not promote float8 with float: widen those inputs explicitly.
  bool fp8 = at::isFloat8Type(dt);
  for (size_t i = 1; i < ins.size(); ++i) combine(acc, acc, fp8 ? ins[i].to(at::kFloat) : ins[i], r, is_bool);
  if (r.op == RO::AVG) divide_for_avg(acc, r.n);
  if (!acc.is_same(out)) out.copy_(acc);
}

}  // namespace

// ---- work -------------------------------------------------------------------------------

// Profiler titles as gloo and NCCL name them ("<backend>:<op>"). c10d's Work keeps the
// pointer it is given, so titles are interned for the life of the process.
const char* profiling_title(const std::string& op) {
  static std::mutex mu;
  static std::set<std::string> titles;
  std::lock_guard<std::mutex> g(mu);
  return titles.insert("neuron:" + op).first->c_str();
}

// Ops that a composite op issues internally are not profiled again: the profiler shows the
// call the user made, once (as gloo's does).
thread_local int t_inside_composite = 0;

class NeuronWork : public c10d::Work {
 public:
  // With `profiled_as`, the work is an async profiler event "neuron:<profiled_as>" from now
  // until it completes, with the shapes of `inputs` (unless it runs inside a composite op).
  NeuronWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, int pending, std::string what,
             const char* profiled_as = nullptr, const std::vector<at::Tensor>& inputs = {})
      : Work(rank, type, profiled_as && t_inside_composite == 0 ? profiling_title(profiled_as) : nullptr,
             std::optional<std::vector<at::Tensor>>(inputs)),
        outputs_(std::move(outputs)), pending_(pending), what_(std::move(what)) {
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                       devices_of(outputs_));
    if (pending_ == 0) complete(nullptr);
  }

  void add_pending() {
    std::lock_guard<std::mutex> g(part_mu_);
    ++pending_;
  }
  void part_done(std::exception_ptr e) {
    bool last;
    {
      std::lock_guard<std::mutex> g(part_mu_);
      if (e && !first_error_) first_error_ = e;
      last = --pending_ == 0;
      e = first_error_;
    }
    if (last) complete(e);
  }
  void set_source(int r) { source_ = r; }

  bool wait(std::chrono::milliseconds timeout) override {
    std::unique_lock<std::mutex> lock(mutex_);
    if (timeout == kNoTimeout) {
      cv_.wait(lock, [&] { return completed_; });
    } else if (!cv_.wait_for(lock, timeout, [&] { return completed_; })) {
      C10_THROW_ERROR(DistBackendError, c10::str("neuron: caught collective operation timeout: ", what_,
                                                 " did not complete within ", timeout.count(), " ms (Work.wait timeout)"));
    }
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  int sourceRank() const override {
    TORCH_CHECK(source_ >= 0, "sourceRank() is only defined for a completed recv from any source");
    return source_;
  }
  void synchronize() override {}

 private:
  void complete(std::exception_ptr e) {
    if (e) future_->setError(e);
    else future_->markCompleted(c10::IValue(outputs_));
    finish(e);
  }

  std::vector<at::Tensor> outputs_;
  std::mutex part_mu_;
  int pending_;
  std::exception_ptr first_error_;
  int source_ = -1;
  std::string what_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// ---- point-to-point op ------------------------------------------------------------------

struct MsgHeader {
  uint64_t bytes;
  int64_t tag;
};

struct P2POp {
  bool is_send;
  int peer;  // local index; -1 = any source (until matched)
  Flat data;
  size_t total;  // header + payload bytes
  size_t pos = 0;
  MsgHeader hdr{};  // what this op sends, or expects
  MsgHeader got{};  // header received
  Clock::time_point deadline;
  std::vector<c10::intrusive_ptr<NeuronWork>> works;
  std::string what;
};

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

void ProcessGroupNeuron::shutdown() {
  {
    std::lock_guard<std::mutex> g(p2p_mu_);
    p2p_stop_ = true;
  }
  if (p2p_thread_.joinable()) {
    if (shm_) shm_->ring_doorbell(shm_->rank());
    p2p_thread_.join();
  }
  fail_all_p2p("the process group was destroyed");
}

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

namespace {
// How waits and errors name an op: "all_reduce(float32[4], SUM) (call #7)".
std::string what_of(const OpDesc& d) { return std::string(d.text) + " (call #" + std::to_string(d.seq) + ")"; }
}  // namespace

void ProcessGroupNeuron::publish(OpDesc& d) {
  d.seq = ++op_seq_;
  shm_->slot(shm_->rank()).desc[d.seq & 1] = d;
}

void ProcessGroupNeuron::check_descs(const OpDesc& d) {
  for (int j = 0; j < shm_->size(); ++j) {
    if (j == shm_->rank()) continue;
    const OpDesc& o = shm_->slot(j).desc[d.seq & 1];
    bool same = o.seq == d.seq && o.op == d.op && o.dtype == d.dtype && (d.bytes < 0 || o.bytes == d.bytes) &&
                o.root == d.root && o.redop == d.redop;
    if (!same) {
      // Every rank compares with every other, so all of them raise, and the group stays usable.
      TORCH_CHECK_VALUE(false, "neuron process group ", group_name_, ": mismatched collectives: rank ",
                        local_ranks_[j], " called ", o.text, " (call #", o.seq, ") while rank ", rank_, " called ",
                        d.text, " (call #", d.seq, "); every rank of a group must issue the same collectives "
                        "with the same shapes, dtypes and roots, in the same order");
    }
  }
}

void ProcessGroupNeuron::sync(OpDesc& d, bool first, Deadline dl) {
  if (first) publish(d);
  shm_->barrier(dl, [&] { return what_of(d); });
  if (first) check_descs(d);
}

// ---- shared-memory algorithms ---------------------------------------------------------------

void ProcessGroupNeuron::shm_allreduce(const at::Tensor& src, const at::Tensor& dst, const Reduction& red, OpDesc& d,
                                       Deadline dl) {
  const int n = shm_->size(), me = shm_->rank();
  const at::ScalarType dt = src.scalar_type();
  const int64_t es = src.element_size(), numel = src.numel();
  char* s = static_cast<char*>(src.data_ptr());
  char* o = static_cast<char*>(dst.data_ptr());
  if (static_cast<size_t>(numel * es) <= small_bytes_) {
    // Direct: everyone posts its whole tensor and reduces all of them, in rank order.
    int h = next_half();
    std::memcpy(shm_->buffer(me, h), s, numel * es);
    sync(d, true, dl);
    std::vector<at::Tensor> ins;
    for (int j = 0; j < n; ++j) ins.push_back(view_of(shm_->buffer(j, h), numel, dt));
    reduce_into(view_of(o, numel, dt), ins, red);
    return;
  }
  bool published = false;
  if (static_cast<size_t>(numel * es) >= zero_copy_bytes_ && s == o) {
    if (zero_copy_allreduce(src, red, d, dl)) return;
    published = true;  // some rank's tensor is not shareable: all take the copying path
  }
  // Chunked reduce-scatter + all-gather through the buffers: rank j reduces slice j of each chunk.
  const int64_t chunk = static_cast<int64_t>(shm_->half_bytes()) / es;
  for (int64_t c0 = 0, it = 0; it == 0 || c0 < numel; c0 += chunk, ++it) {
    int64_t ce = std::min(chunk, numel - c0);
    auto lo = [&](int j) { return c0 + ce * j / n; };
    int h = next_half();
    for (int j = 0; j < n; ++j)
      if (j != me) std::memcpy(shm_->buffer(me, h) + (lo(j) - c0) * es, s + lo(j) * es, (lo(j + 1) - lo(j)) * es);
    sync(d, it == 0 && !published, dl);
    int64_t b = lo(me), m = lo(me + 1) - b;
    std::vector<at::Tensor> ins;
    for (int j = 0; j < n; ++j)
      ins.push_back(view_of(j == me ? s + b * es : shm_->buffer(j, h) + (b - c0) * es, m, dt));
    reduce_into(view_of(shm_->buffer(me, h) + (b - c0) * es, m, dt), ins, red);
    sync(d, false, dl);
    for (int j = 0; j < n; ++j)
      std::memcpy(o + lo(j) * es, shm_->buffer(j, h) + (lo(j) - c0) * es, (lo(j + 1) - lo(j)) * es);
  }
}

bool ProcessGroupNeuron::map_peers(const void* p, size_t bytes, bool eligible, OpDesc& d, Deadline dl,
                                   std::vector<char*>& ptrs) {
  // Device memory is host memory, and large allocations are shareable: each rank maps the
  // others' buffers and works on them directly, with no staging copies. Publishes and
  // checks the op (first barrier); all ranks return the same answer.
  const int n = shm_->size(), me = shm_->rank();
  neuron::rt::ShareableHandle h{};
  bool ok = eligible && neuron::rt::shareable_handle(p, bytes, &h);
  const int par = static_cast<int>((op_seq_ + 1) & 1);  // the seq publish() gives this op
  auto& mine = shm_->slot(me).peer_buffer[par];
  mine = neuron::dist::PeerBuffer{ok, 0, h.pid, h.fd, h.id, h.size, h.offset};
  sync(d, true, dl);
  for (int j = 0; j < n; ++j)
    if (!shm_->slot(j).peer_buffer[par].ok) return false;
  ptrs.assign(n, nullptr);
  peer_memory_.new_op();
  bool mapped = true;
  for (int j = 0; j < n && mapped; ++j) {
    const auto& q = shm_->slot(j).peer_buffer[par];
    char* base = j == me ? nullptr : peer_memory_.map(q.pid, q.fd, q.id, q.size);
    ptrs[j] = j == me ? static_cast<char*>(const_cast<void*>(p)) : (base ? base + q.offset : nullptr);
    mapped = ptrs[j] != nullptr;
  }
  mine.mapped = mapped;
  shm_->barrier(dl, [&] { return what_of(d); });
  for (int j = 0; j < n; ++j)
    if (!shm_->slot(j).peer_buffer[par].mapped) return false;
  return true;
}

void ProcessGroupNeuron::peers_done(OpDesc& d, Deadline dl) {
  // No rank may return (and change its buffer) while another still reads or writes it.
  shm_->barrier(dl, [&] { return what_of(d); });
}

bool ProcessGroupNeuron::zero_copy_allreduce(const at::Tensor& t, const Reduction& red, OpDesc& d, Deadline dl) {
  const int n = shm_->size(), me = shm_->rank();
  const at::ScalarType dt = t.scalar_type();
  const int64_t es = t.element_size(), numel = t.numel();
  std::vector<char*> ptrs;
  if (!map_peers(t.data_ptr(), t.nbytes(), true, d, dl, ptrs)) return false;
  // Rank r reduces slice r from every rank's tensor, in cache-sized pieces into a scratch,
  // and writes each piece into every rank's tensor.
  const int64_t b = numel * me / n, e = numel * (me + 1) / n;
  const int64_t piece = std::max<int64_t>(1, (int64_t(512) << 10) / es);
  at::Tensor scratch = at::empty({std::min(piece, std::max<int64_t>(e - b, 1))}, at::TensorOptions().dtype(dt));
  std::vector<at::Tensor> ins(n);
  for (int64_t off = b; off < e; off += piece) {
    int64_t k = std::min(piece, e - off);
    for (int j = 0; j < n; ++j) ins[j] = view_of(ptrs[j] + off * es, k, dt);
    at::Tensor out = scratch.narrow(0, 0, k);
    reduce_into(out, ins, red);
    for (int j = 0; j < n; ++j) std::memcpy(ptrs[j] + off * es, out.data_ptr(), k * es);
  }
  peers_done(d, dl);
  return true;
}

void ProcessGroupNeuron::shm_reduce(const at::Tensor& src, const at::Tensor& dst, int root, const Reduction& red,
                                    OpDesc& d, Deadline dl) {
  const int n = shm_->size(), me = shm_->rank();
  const at::ScalarType dt = src.scalar_type();
  const int64_t es = src.element_size(), numel = src.numel();
  const int64_t chunk = static_cast<int64_t>(shm_->half_bytes()) / es;
  char* s = static_cast<char*>(src.data_ptr());
  bool first = true;
  for (int64_t c0 = 0; first || c0 < numel; c0 += chunk) {
    int64_t ce = std::min(chunk, numel - c0);
    int h = next_half();
    if (me != root) std::memcpy(shm_->buffer(me, h), s + c0 * es, ce * es);
    sync(d, first, dl);
    if (me == root) {
      std::vector<at::Tensor> ins;
      for (int j = 0; j < n; ++j) ins.push_back(view_of(j == me ? s + c0 * es : shm_->buffer(j, h), ce, dt));
      reduce_into(view_of(static_cast<char*>(dst.data_ptr()) + c0 * es, ce, dt), ins, red);
    }
    first = false;
  }
}

void ProcessGroupNeuron::shm_broadcast(const at::Tensor& t, int root, OpDesc& d, Deadline dl) {
  const int me = shm_->rank();
  const int64_t bytes = t.nbytes(), chunk = shm_->half_bytes();
  char* p = static_cast<char*>(t.data_ptr());
  bool first = true;
  for (int64_t c0 = 0; first || c0 < bytes; c0 += chunk) {
    int64_t k = std::min(chunk, bytes - c0);
    int h = next_half();
    if (me == root) std::memcpy(shm_->buffer(me, h), p + c0, k);
    sync(d, first, dl);
    if (me != root) std::memcpy(p + c0, shm_->buffer(root, h), k);
    first = false;
  }
}

void ProcessGroupNeuron::shm_gather(const at::Tensor& src, const std::vector<at::Tensor>& outs, int root, OpDesc& d,
                                    Deadline dl) {
  const int n = shm_->size(), me = shm_->rank();
  const int64_t bytes = src.nbytes(), chunk = shm_->half_bytes();
  char* s = static_cast<char*>(src.data_ptr());
  bool receive = root < 0 || root == me;
  bool published = false;
  if (static_cast<size_t>(bytes) >= zero_copy_bytes_) {
    std::vector<char*> ptrs;
    if (map_peers(s, bytes, true, d, dl, ptrs)) {
      if (receive)
        for (int j = 0; j < n; ++j) std::memcpy(outs[j].data_ptr(), ptrs[j], bytes);
      peers_done(d, dl);
      return;
    }
    published = true;
  }
  bool first = true;
  for (int64_t c0 = 0; first || c0 < bytes; c0 += chunk) {
    int64_t k = std::min(chunk, bytes - c0);
    int h = next_half();
    std::memcpy(shm_->buffer(me, h), s + c0, k);
    sync(d, first && !published, dl);
    if (receive)
      for (int j = 0; j < n; ++j)
        std::memcpy(static_cast<char*>(outs[j].data_ptr()) + c0, j == me ? s + c0 : shm_->buffer(j, h), k);
    first = false;
  }
}

void ProcessGroupNeuron::shm_scatter(const std::vector<at::Tensor>& ins, const at::Tensor& dst, int root, OpDesc& d,
                                     Deadline dl) {
  const int n = shm_->size(), me = shm_->rank();
  const int64_t bytes = dst.nbytes();
  const int64_t chunk = static_cast<int64_t>(shm_->half_bytes()) / n / 64 * 64;
  char* o = static_cast<char*>(dst.data_ptr());
  bool first = true;
  for (int64_t c0 = 0; first || c0 < bytes; c0 += chunk) {
    int64_t k = std::min(chunk, bytes - c0);
    int h = next_half();
    if (me == root)
      for (int j = 0; j < n; ++j)
        std::memcpy(shm_->buffer(me, h) + j * chunk, static_cast<char*>(ins[j].data_ptr()) + c0, k);
    sync(d, first, dl);
    std::memcpy(o + c0, shm_->buffer(root, h) + me * chunk, k);
    first = false;
  }
}

void ProcessGroupNeuron::shm_reduce_scatter(const std::vector<at::Tensor>& ins, const at::Tensor& dst,
                                            const Reduction& red, OpDesc& d, Deadline dl) {
  const int n = shm_->size(), me = shm_->rank();
  const at::ScalarType dt = dst.scalar_type();
  const int64_t es = dst.element_size(), numel = dst.numel();
  const int64_t chunk = std::max<int64_t>(1, static_cast<int64_t>(shm_->half_bytes()) / n / es);
  char* o = static_cast<char*>(dst.data_ptr());
  bool published = false;
  if (static_cast<size_t>(numel * es * n) >= zero_copy_bytes_) {
    // The inputs as one buffer, when they are consecutive parts of one tensor (as in
    // reduce_scatter_tensor): then each rank reduces its part straight from the peers'.
    char* base = static_cast<char*>(ins[0].data_ptr());
    bool one_buffer = true;
    for (int j = 0; j < n; ++j) one_buffer &= static_cast<char*>(ins[j].data_ptr()) == base + j * numel * es;
    std::vector<char*> ptrs;
    if (map_peers(base, numel * es * n, one_buffer, d, dl, ptrs)) {
      std::vector<at::Tensor> v;
      for (int j = 0; j < n; ++j) v.push_back(view_of(ptrs[j] + me * numel * es, numel, dt));
      reduce_into(view_of(o, numel, dt), v, red);
      peers_done(d, dl);
      return;
    }
    published = true;
  }
  bool first = true;
  for (int64_t c0 = 0; first || c0 < numel; c0 += chunk) {
    int64_t ce = std::min(chunk, numel - c0);
    int h = next_half();
    for (int j = 0; j < n; ++j)
      if (j != me)
        std::memcpy(shm_->buffer(me, h) + j * chunk * es, static_cast<char*>(ins[j].data_ptr()) + c0 * es, ce * es);
    sync(d, first && !published, dl);
    std::vector<at::Tensor> v;
    for (int j = 0; j < n; ++j)
      v.push_back(view_of(j == me ? static_cast<char*>(ins[me].data_ptr()) + c0 * es
                                  : shm_->buffer(j, h) + me * chunk * es,
                          ce, dt));
    reduce_into(view_of(o + c0 * es, ce, dt), v, red);
    first = false;
  }
}

void ProcessGroupNeuron::shm_alltoall(const std::vector<at::Tensor>& sends, const std::vector<at::Tensor>& recvs,
                                      OpDesc& d, Deadline dl) {
  const int n = shm_->size(), me = shm_->rank();
  const int64_t per = static_cast<int64_t>(shm_->half_bytes()) / n / 64 * 64;
  // Publish how much goes to and comes from each peer, so every rank validates the whole
  // matrix and all of them agree on the number of rounds.
  d.seq = op_seq_ + 1;
  auto& mine = shm_->slot(me);
  for (int j = 0; j < n; ++j) mine.a2a_send[d.seq & 1][j] = static_cast<int64_t>(sends[j].nbytes());
  for (int j = 0; j < n; ++j) mine.a2a_recv[d.seq & 1][j] = static_cast<int64_t>(recvs[j].nbytes());
  // Zero-copy when every rank's sends are consecutive parts of one shareable buffer (as
  // all_to_all_single's are): each rank copies its parts straight out of the peers' inputs.
  char* base = static_cast<char*>(sends[0].data_ptr());
  size_t total = 0;
  bool one_buffer = true;
  for (int j = 0; j < n; ++j) {
    one_buffer &= static_cast<char*>(sends[j].data_ptr()) == base + total;
    total += sends[j].nbytes();
  }
  int64_t rounds = 1;
  for (int64_t round = 0; round < rounds; ++round) {
    int h = next_half();
    for (int j = 0; j < n; ++j) {
      int64_t len = sends[j].nbytes(), off = round * per;
      if (off < len) std::memcpy(shm_->buffer(me, h) + j * per, static_cast<char*>(sends[j].data_ptr()) + off,
                                 std::min(per, len - off));
    }
    // Round 0's data is posted before the first barrier either way, so trying zero-copy
    // costs no barrier when it does not apply (the staged rounds then go on from here).
    std::vector<char*> ptrs;
    bool zero_copy = false;
    if (round == 0) zero_copy = map_peers(base, total, one_buffer && total > 0, d, dl, ptrs);
    else sync(d, false, dl);
    if (round == 0) {
      int64_t longest = 0;
      for (int i = 0; i < n; ++i)
        for (int j = 0; j < n; ++j) {
          int64_t sent = shm_->slot(i).a2a_send[d.seq & 1][j], expect = shm_->slot(j).a2a_recv[d.seq & 1][i];
          TORCH_CHECK_VALUE(sent == expect, "neuron process group ", group_name_, ": all_to_all split mismatch: rank ",
                            local_ranks_[i], " sends ", sent, " bytes to rank ", local_ranks_[j], ", which expects ",
                            expect, " bytes; input_split_sizes on the sender must equal output_split_sizes on the "
                            "receiver");
          longest = std::max(longest, sent);
        }
      rounds = std::max<int64_t>(1, (longest + per - 1) / per);
    }
    if (zero_copy) {
      for (int j = 0; j < n; ++j) {
        int64_t at = 0;  // where rank j's part for this rank starts in its input
        for (int k = 0; k < me; ++k) at += shm_->slot(j).a2a_send[d.seq & 1][k];
        std::memcpy(recvs[j].data_ptr(), ptrs[j] + at, recvs[j].nbytes());
      }
      peers_done(d, dl);
      return;
    }
    for (int j = 0; j < n; ++j) {
      int64_t len = recvs[j].nbytes(), off = round * per;
      if (off < len)
        std::memcpy(static_cast<char*>(recvs[j].data_ptr()) + off,
                    j == me ? static_cast<char*>(sends[me].data_ptr()) + off : shm_->buffer(j, h) + me * per,
                    std::min(per, len - off));
    }
  }
}

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

// ---- point-to-point -----------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::send(std::vector<at::Tensor>& tensors, int dstRank, int tag) {
  return submit_p2p(true, tensors, dstRank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::recv(std::vector<at::Tensor>& tensors, int srcRank, int tag) {
  return submit_p2p(false, tensors, srcRank, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return submit_p2p(false, tensors, -1, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::submit_p2p(bool is_send, std::vector<at::Tensor>& tensors, int peer,
                                                              int tag) {
  const char* name = is_send ? "send" : "recv";
  check_single(tensors, name);
  TORCH_CHECK_VALUE(peer == -1 || (peer >= 0 && peer < size_), name, ": peer rank ", peer,
                    " is outside the group of size ", size_);
  at::Tensor t = tensors[0];
  std::string what = c10::str(name, is_send ? " to rank " : " from rank ", peer < 0 ? std::string("any") : std::to_string(peer),
                              " (", shape_str(t), ")");
  if (peer == rank_) return self_p2p(is_send, t, what);
  if (peer >= 0 && host_of_[peer] != my_host_) {
    need_gloo(name);
    count(name, "gloo");
    Flat f = Flat::of(t, is_send);
    TORCH_CHECK_VALUE(is_send || !f.copied, "recv: a tensor received from another host must be contiguous");
    std::vector<at::Tensor> v{f.flat};
    return is_send ? gloo_->send(v, peer, tag) : gloo_->recv(v, peer, tag);
  }
  TORCH_CHECK_VALUE(peer >= 0 || local_only(), "recv from any source: supported within one host only "
                    "(this group spans ", hosts_.size(), " hosts)");
  if (size_ == 1 || !shm_) TORCH_CHECK_VALUE(false, name, ": a group of one rank has no peer");
  auto op = std::make_shared<P2POp>();
  op->is_send = is_send;
  op->peer = peer < 0 ? -1 : local_index_[peer];
  op->data = Flat::of(t, is_send);
  op->hdr = MsgHeader{static_cast<uint64_t>(op->data.bytes()), tag};
  op->total = sizeof(MsgHeader) + op->data.bytes();
  op->deadline = deadline(c10d::kUnsetTimeout);
  op->what = what;
  auto work = c10::make_intrusive<NeuronWork>(rank_, is_send ? c10d::OpType::SEND : c10d::OpType::RECV,
                                              std::vector<at::Tensor>{t}, 1, what,
                                              is_send ? "send" : (peer < 0 ? "recvAnySource" : "recv"),
                                              std::vector<at::Tensor>{t});
  op->works.push_back(work);
  {
    std::lock_guard<std::mutex> g(p2p_mu_);
    if (!p2p_broken_.empty())
      C10_THROW_ERROR(DistBackendError, c10::str("neuron process group ", group_name_, ": ", what, ": ", p2p_broken_));
    if (coalesced_) {
      coalesced_->add_pending();
      op->works.push_back(coalesced_);
    }
    if (is_send) sends_[op->peer].push_back(op);
    else if (op->peer >= 0) recvs_[op->peer].push_back(op);
    else any_recvs_.push_back(op);
    if (!p2p_thread_.joinable()) p2p_thread_ = std::thread([this] { p2p_loop(); });
  }
  count(name, "shm");
  shm_->ring_doorbell(shm_->rank());
  return work;
}

// A send to this rank and a receive from it meet here, first with first, as NCCL lets them
// (e.g. in batch_isend_irecv). The send's data is taken when it is issued.
struct SelfMsg {
  at::Tensor data;  // send: a snapshot; recv: the user's tensor
  std::string what;
  std::vector<c10::intrusive_ptr<NeuronWork>> works;
};

c10::intrusive_ptr<c10d::Work> ProcessGroupNeuron::self_p2p(bool is_send, const at::Tensor& t, const std::string& what) {
  auto msg = std::make_shared<SelfMsg>();
  msg->data = is_send ? t.clone(at::MemoryFormat::Contiguous) : t;
  msg->what = what;
  auto work = c10::make_intrusive<NeuronWork>(rank_, is_send ? c10d::OpType::SEND : c10d::OpType::RECV,
                                              std::vector<at::Tensor>{t}, 1, what, is_send ? "send" : "recv",
                                              std::vector<at::Tensor>{t});
  msg->works.push_back(work);
  std::vector<std::pair<std::shared_ptr<SelfMsg>, std::shared_ptr<SelfMsg>>> matched;
  {
    std::lock_guard<std::mutex> g(p2p_mu_);
    if (!p2p_broken_.empty())
      C10_THROW_ERROR(DistBackendError, c10::str("neuron process group ", group_name_, ": ", what, ": ", p2p_broken_));
    if (coalesced_) {
      coalesced_->add_pending();
      msg->works.push_back(coalesced_);
    }
    (is_send ? self_sends_ : self_recvs_).push_back(msg);
    while (!self_sends_.empty() && !self_recvs_.empty()) {
      matched.emplace_back(self_sends_.front(), self_recvs_.front());
      self_sends_.pop_front();
      self_recvs_.pop_front();
    }
  }
  count(is_send ? "send" : "recv", "self");
  for (auto& [snd, rcv] : matched) {
    std::exception_ptr e;
    if (snd->data.nbytes() != rcv->data.nbytes()) {
      e = std::make_exception_ptr(c10::DistBackendError(
          c10::str("neuron process group ", group_name_, " (rank ", rank_, "): ", rcv->what, ": the matching ",
                   snd->what, " has ", snd->data.nbytes(), " bytes but this recv expects ", rcv->data.nbytes(),
                   " bytes; send and recv tensors must have the same size"),
          nullptr));
    } else {
      Flat src = Flat::of(snd->data, true), dst = Flat::of(rcv->data, false);
      std::memcpy(dst.ptr(), src.ptr(), src.bytes());
      dst.writeback();
    }
    // As between ranks: the send has done its part; the receive reports the mismatch.
    for (auto& w : snd->works) w->part_done(nullptr);
    for (auto& w : rcv->works) w->part_done(e);
  }
  return work;
}

bool ProcessGroupNeuron::advance(P2POp& op) {
  bool moved = false;
  while (op.pos < op.total) {
    size_t k;
    const size_t H = sizeof(MsgHeader);
    if (op.is_send) {
      k = op.pos < H ? shm_->ring_write(op.peer, reinterpret_cast<const char*>(&op.hdr) + op.pos, H - op.pos)
                     : shm_->ring_write(op.peer, op.data.ptr() + (op.pos - H), op.total - op.pos);
    } else if (op.pos < H) {
      // The header may arrive in pieces.
      k = shm_->ring_read(op.peer, reinterpret_cast<char*>(&op.got) + op.pos, H - op.pos);
      if (k && op.pos + k == H && op.got.bytes != op.hdr.bytes) {
        throw CommError(c10::str(op.what, ": rank ", local_ranks_[op.peer], " sent ", op.got.bytes,
                                 " bytes but this recv expects ", op.hdr.bytes,
                                 " bytes; send and recv tensors must have the same size"));
      }
    } else {
      k = shm_->ring_read(op.peer, op.data.ptr() + (op.pos - H), op.total - op.pos);
    }
    if (k == 0) break;
    op.pos += k;
    moved = true;
  }
  return moved;
}

void ProcessGroupNeuron::fail_all_p2p(const std::string& msg) {
  std::vector<std::shared_ptr<P2POp>> all;
  std::vector<std::shared_ptr<SelfMsg>> selfs;
  {
    std::lock_guard<std::mutex> g(p2p_mu_);
    if (p2p_broken_.empty()) p2p_broken_ = msg;
    for (auto* qs : {&sends_, &recvs_})
      for (auto& q : *qs) {
        all.insert(all.end(), q.begin(), q.end());
        q.clear();
      }
    all.insert(all.end(), any_recvs_.begin(), any_recvs_.end());
    any_recvs_.clear();
    for (auto* q : {&self_sends_, &self_recvs_}) {
      selfs.insert(selfs.end(), q->begin(), q->end());
      q->clear();
    }
  }
  for (auto& m : selfs) {
    auto e = std::make_exception_ptr(c10::DistBackendError(
        c10::str("neuron process group ", group_name_, " (rank ", rank_, "): ", m->what, ": ", msg), nullptr));
    for (auto& w : m->works) w->part_done(e);
  }
  for (auto& op : all) {
    auto e = std::make_exception_ptr(c10::DistBackendError(
        c10::str("neuron process group ", group_name_, " (rank ", rank_, "): ", op->what, ": ", msg), nullptr));
    for (auto& w : op->works) w->part_done(e);
  }
}

void ProcessGroupNeuron::p2p_loop() {
  auto next_check = Clock::now();
  while (true) {
    uint32_t bell = shm_->doorbell();
    std::vector<std::shared_ptr<P2POp>> done;
    bool moved = false;
    std::string failure;
    {
      std::lock_guard<std::mutex> g(p2p_mu_);
      if (p2p_stop_) return;
      try {
        shm_->check_abort();
        // Match receives from any source with the first peer that has data in flight.
        for (auto it = any_recvs_.begin(); it != any_recvs_.end();) {
          int found = -1;
          for (int j = 0; j < shm_->size() && found < 0; ++j)
            if (j != shm_->rank() && recvs_[j].empty() && shm_->ring_readable(j) > 0) found = j;
          if (found < 0) break;
          (*it)->peer = found;
          (*it)->works.front()->set_source(local_ranks_[found]);
          recvs_[found].push_back(*it);
          it = any_recvs_.erase(it);
        }
        for (auto* qs : {&sends_, &recvs_})
          for (auto& q : *qs)
            while (!q.empty()) {
              moved |= advance(*q.front());
              if (q.front()->pos < q.front()->total) break;
              done.push_back(q.front());
              q.pop_front();
            }
        auto now = Clock::now();
        if (now >= next_check) {
          next_check = now + std::chrono::milliseconds(50);
          bool pending = !any_recvs_.empty();
          for (auto* qs : {&sends_, &recvs_})
            for (auto& q : *qs)
              if (!q.empty()) {
                pending = true;
                if (now >= q.front()->deadline)
                  throw CommError("caught collective operation timeout: " + q.front()->what +
                                  " timed out: the process group's timeout elapsed");
              }
          if (pending) shm_->check_peers([] { return std::string("point-to-point"); });
        }
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    for (auto& op : done) {
      op->data.writeback();
      for (auto& w : op->works) w->part_done(nullptr);
    }
    if (!failure.empty()) {
      // A failed transfer leaves the byte streams out of step: no further p2p on this group.
      fail_all_p2p(failure);
      continue;
    }
    if (!moved && done.empty()) shm_->wait_doorbell(bell, std::chrono::milliseconds(20));
  }
}

}  // namespace torch_neuronx::dist

// DDP's runtime statistics (ddp_logging_data's avg_*_time) need a timer per device type.
// Execution is synchronous, so host timestamps are the device's.
namespace c10d {
namespace {
class NeuronTimer : public Timer {
 public:
  explicit NeuronTimer(c10::Device) {}
  std::optional<int64_t> measureDifference(Event start, Event end) override {
    int64_t a = getTimeRef(start), b = getTimeRef(end);
    if (a == kUnsetTime || b == kUnsetTime || b < a) return std::nullopt;
    return b - a;
  }
};
}  // namespace
C10_REGISTER_TYPED_CLASS(TimerRegistry, c10::kPrivateUse1, NeuronTimer)
}  // namespace c10d
