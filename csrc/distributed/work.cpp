#include "distributed/work.h"

#include <torch/csrc/distributed/c10d/reducer_timer.hpp>

#include <algorithm>
#include <map>
#include <set>

#include "aten/neuron.h"
#include "distributed/process_group.h"

namespace torch_neuronx::dist {

// ---- counters ---------------------------------------------------------------------------

namespace {
std::mutex g_stats_mu;
std::map<std::string, std::map<std::string, int64_t>> g_stats;
}  // namespace

void count(const char* op, const char* transport) {
  std::lock_guard<std::mutex> g(g_stats_mu);
  ++g_stats[op][transport];
}

std::map<std::string, std::map<std::string, int64_t>> stats() {
  std::lock_guard<std::mutex> g(g_stats_mu);
  return g_stats;
}

void reset_stats() {
  std::lock_guard<std::mutex> g(g_stats_mu);
  g_stats.clear();
}

// ---- work -------------------------------------------------------------------------------

namespace {
std::vector<c10::Device> devices_of(const std::vector<at::Tensor>& ts) {
  std::vector<c10::Device> d;
  for (const auto& t : ts)
    if (t.defined() && t.device().type() == kNeuron && std::find(d.begin(), d.end(), t.device()) == d.end())
      d.push_back(t.device());
  return d;
}

// Profiler titles as gloo and NCCL name them ("<backend>:<op>"). c10d's Work keeps the
// pointer it is given, so titles are interned for the life of the process.
const char* profiling_title(const std::string& op) {
  static std::mutex mu;
  static std::set<std::string> titles;
  std::lock_guard<std::mutex> g(mu);
  return titles.insert("neuron:" + op).first->c_str();
}
}  // namespace

thread_local int t_inside_composite = 0;

NeuronWork::NeuronWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, int pending, std::string what,
                       const char* profiled_as, const std::vector<at::Tensor>& inputs)
    : Work(rank, type, profiled_as && t_inside_composite == 0 ? profiling_title(profiled_as) : nullptr,
           std::optional<std::vector<at::Tensor>>(inputs)),
      outputs_(std::move(outputs)), pending_(pending), what_(std::move(what)) {
  future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                     devices_of(outputs_));
  if (pending_ == 0) complete(nullptr);
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
