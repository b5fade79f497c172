// Device activity for PyTorch's profilers.
//
// Every neuron kernel (typed, boxed fallback, copies) reports its span on the device's
// timeline while a profiler listens (one relaxed atomic load per op otherwise). Two
// consumers, the two ways PyTorch profiles a PrivateUse1 device:
//  * torch.profiler.profile(activities=[CPU, PrivateUse1]) goes through Kineto, which asks
//    the registered activity profiler below for a session: kernels become device events
//    linked to the CPU op that launched them (Kineto's correlation ids), so key_averages()
//    has device time columns and export_chrome_trace() has a row per device and stream.
//  * torch.autograd.profiler.profile(use_device="neuron") (legacy) times each op with the
//    profiler stubs: an event is a timestamp taken where the device's queue is, which for
//    a synchronous device is the op's host time.
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <c10/util/ApproximateClock.h>
#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>
#include <torch/csrc/profiler/stubs/base.h>

#include <GenericTraceActivity.h>
#include <IActivityProfiler.h>
#include <libkineto.h>

#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "aten/neuron.h"

namespace torch_neuronx {

std::atomic<bool> g_device_activity_on{false};

namespace {

struct Record {
  std::string name;
  int64_t start_ns;
  int64_t end_ns;
  uint64_t correlation;
  c10::DeviceIndex device;
  int64_t stream;
};

std::mutex g_mu;
std::vector<Record> g_records;
// Correlation ids Kineto pushes per thread as ops begin (the innermost is the launcher).
thread_local std::vector<uint64_t> tls_correlation;

}  // namespace

int64_t device_clock_ns() { return c10::getTime(); }

void record_device_activity(const char* name, c10::DeviceIndex device, int64_t start_ns, int64_t end_ns) {
  if (device < 0) device = current_device();
  Record r{name, start_ns, end_ns, tls_correlation.empty() ? 0 : tls_correlation.back(), device,
           static_cast<int64_t>(c10::impl::getDeviceGuardImpl(kNeuron)->getStream(c10::Device(kNeuron, device)).id())};
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_device_activity_on.load(std::memory_order_relaxed)) g_records.push_back(std::move(r));
}

namespace {

// ---- Kineto --------------------------------------------------------------------------

class NeuronSession final : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    {
      std::lock_guard<std::mutex> lock(g_mu);
      g_records.clear();
    }
    g_device_activity_on.store(true);
    status_ = libkineto::TraceStatus::RECORDING;
  }
  void stop() override {
    g_device_activity_on.store(false);
    status_ = libkineto::TraceStatus::PROCESSING;
  }
  std::vector<std::string> errors() override { return {}; }

  void pushCorrelationId(uint64_t id) override { tls_correlation.push_back(id); }
  void popCorrelationId() override {
    if (!tls_correlation.empty()) tls_correlation.pop_back();
  }

  void processTrace(libkineto::ActivityLogger& logger) override { processTrace(logger, nullptr, 0, 0); }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked, int64_t start,
                    int64_t end) override {
    std::vector<Record> records;
    {
      std::lock_guard<std::mutex> lock(g_mu);
      records.swap(g_records);
    }
    buffer_ = std::make_unique<libkineto::CpuTraceBuffer>();
    buffer_->span = libkineto::TraceSpan(start, end, "neuron");
    buffer_->gpuOpCount = static_cast<int>(records.size());
    for (const Record& r : records) {
      buffer_->emplace_activity(buffer_->span, libkineto::ActivityType::CONCURRENT_KERNEL, r.name);
      libkineto::GenericTraceActivity& a = *buffer_->activities.back();
      a.startTime = r.start_ns;
      a.endTime = r.end_ns;
      a.id = static_cast<int32_t>(r.correlation);
      a.device = r.device;
      a.resource = static_cast<int32_t>(r.stream);
      a.threadId = static_cast<int32_t>(r.stream);
      a.linked = (linked && r.correlation != 0) ? linked(static_cast<int32_t>(r.correlation)) : nullptr;
      if (r.correlation != 0) {  // an arrow from the launching CPU op to the kernel
        a.flow.id = static_cast<uint32_t>(r.correlation);
        a.flow.type = libkineto::kLinkAsyncCpuGpu;
        a.flow.start = false;
      }
      // (addMetadata would instantiate fmt, which libtorch does not export)
      a.addMetadataQuoted("device", "neuron:" + std::to_string(r.device));
      a.addMetadataQuoted("stream", std::to_string(r.stream));
      a.addMetadataQuoted("correlation", std::to_string(r.correlation));
      streams_.insert({r.device, r.stream});
      a.log(logger);
    }
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override {
    return std::make_unique<libkineto::DeviceInfo>(libkineto::DeviceInfo{0, 0, "neuron", "neuron"});
  }

  std::vector<libkineto::ResourceInfo> getResourceInfos() override {
    std::vector<libkineto::ResourceInfo> out;
    for (const auto& [device, stream] : streams_) {
      out.push_back({stream, stream, device, "neuron:" + std::to_string(device) + " stream " + std::to_string(stream)});
    }
    return out;
  }

  // The activities must outlive this session: Kineto keeps the buffer with the trace.
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return std::move(buffer_); }

  ~NeuronSession() override { g_device_activity_on.store(false); }

 private:
  std::unique_ptr<libkineto::CpuTraceBuffer> buffer_;
  std::set<std::pair<int, int64_t>> streams_;
};

class NeuronActivityProfiler final : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }
  const std::set<libkineto::ActivityType>& availableActivities() const override { return activities_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config& /*config*/) override {
    for (auto t : types) {
      if (activities_.count(t)) return std::make_unique<NeuronSession>();
    }
    return nullptr;
  }
  std::unique_ptr<libkineto::IActivityProfilerSession> configure(int64_t /*ts_ms*/, int64_t /*duration_ms*/,
                                                                 const std::set<libkineto::ActivityType>& types,
                                                                 const libkineto::Config& config) override {
    return configure(types, config);
  }

 private:
  std::string name_{"neuron"};
  std::set<libkineto::ActivityType> activities_{libkineto::ActivityType::CONCURRENT_KERNEL};
};

// ---- legacy profiler stubs ------------------------------------------------------------

struct NeuronProfilerStubs final : public torch::profiler::impl::ProfilerStubs {
  void record(c10::DeviceIndex* device, torch::profiler::impl::ProfilerVoidEventStub* event,
              int64_t* cpu_ns) const override {
    int64_t now = device_clock_ns();
    if (device != nullptr) *device = current_device();
    *event = std::make_shared<int64_t>(now);
    if (cpu_ns != nullptr) *cpu_ns = now;
  }
  // microseconds, as the profiler expects
  float elapsed(const torch::profiler::impl::ProfilerVoidEventStub* a,
                const torch::profiler::impl::ProfilerVoidEventStub* b) const override {
    if (a == nullptr || b == nullptr || !*a || !*b) return 0.f;
    int64_t t0 = *static_cast<const int64_t*>(a->get());
    int64_t t1 = *static_cast<const int64_t*>(b->get());
    return static_cast<float>(t1 - t0) / 1000.0f;
  }
  void mark(const char* /*name*/) const override {}
  void rangePush(const char* /*name*/) const override {}
  void rangePop() const override {}
  bool enabled() const override { return true; }
  void onEachDevice(std::function<void(int)> op) const override {
    c10::DeviceIndex prev = current_device();
    for (c10::DeviceIndex d = 0; d < device_count(); ++d) {
      set_current_device(d);
      op(d);
    }
    set_current_device(prev);
  }
  void synchronize() const override {}  // execution is synchronous: nothing is in flight
};

struct Register {
  Register() {
    static NeuronProfilerStubs stubs;
    torch::profiler::impl::registerPrivateUse1Methods(&stubs);
  }
} g_register;

}  // namespace
}  // namespace torch_neuronx

namespace {
using torch_neuronx::NeuronActivityProfiler;
REGISTER_PRIVATEUSE1_PROFILER(NeuronActivityProfiler);
}  // namespace
