#include "runtime/stream.h"

#include <algorithm>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "runtime/errors.h"
#include "runtime/platform.h"

namespace neuron::rt {
namespace {

struct StreamState {
  int priority = kLowestPriority;
  uint64_t launches = 0;
};

struct DeviceStreams {
  StreamId next = 1;
  std::unordered_map<StreamId, StreamState> streams{{kDefaultStream, StreamState{}}};
};

std::mutex g_mu;
std::vector<DeviceStreams>& all() {
  static std::vector<DeviceStreams> v(static_cast<size_t>(device_count()));
  return v;
}

StreamState& lookup(int device, StreamId id) {
  auto& m = all()[static_cast<size_t>(device)].streams;
  auto it = m.find(id);
  if (it == m.end()) {
    std::ostringstream o;
    o << "Stream " << id << " does not exist on neuron device " << device << ".";
    throw Error(ErrorCode::kInvalidArgument, o.str());
  }
  return it->second;
}

}  // namespace

StreamId stream_create(int device, int priority) {
  check_not_forked();
  check_device(device);
  std::lock_guard<std::mutex> lock(g_mu);
  DeviceStreams& d = all()[static_cast<size_t>(device)];
  StreamId id = d.next++;
  d.streams[id].priority = std::clamp(priority, kHighestPriority, kLowestPriority);
  return id;
}

bool stream_exists(int device, StreamId id) {
  if (device < 0 || device >= device_count()) return false;
  std::lock_guard<std::mutex> lock(g_mu);
  return all()[static_cast<size_t>(device)].streams.count(id) > 0;
}

int stream_priority(int device, StreamId id) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_mu);
  return lookup(device, id).priority;
}

void launch(int device, StreamId id, const std::function<void()>& work) {
  check_not_forked();
  check_device(device);
  {
    std::lock_guard<std::mutex> lock(g_mu);
    ++lookup(device, id).launches;
  }
  work();
}

void sleep_cycles(int device, StreamId id, int64_t cycles) {
  if (cycles < 0) throw Error(ErrorCode::kInvalidArgument, "_sleep: cycles must be >= 0.");
  const double seconds = static_cast<double>(cycles) / (platform().chip->engine_ghz * 1e9);
  launch(device, id, [seconds] {
    // Busy, not sleeping: the stream's work occupies its engine for the whole time.
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < until) {
    }
  });
}

uint64_t stream_launch_count(int device, StreamId id) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_mu);
  return lookup(device, id).launches;
}

bool stream_query(int device, StreamId id) {
  check_device(device);
  std::lock_guard<std::mutex> lock(g_mu);
  lookup(device, id);
  return true;
}

void stream_synchronize(int device, StreamId id) { stream_query(device, id); }

void device_synchronize(int device) {
  check_not_forked();
  check_device(device);
}

void Event::record(int device, StreamId stream) {
  check_not_forked();
  check_device(device);
  if (recorded_ && device != device_) {
    std::ostringstream o;
    o << "Event was recorded on neuron device " << device_ << " and cannot be recorded on device " << device
      << "; create a new event for that device.";
    throw Error(ErrorCode::kInvalidArgument, o.str());
  }
  device_ = device;
  stream_ = stream;
  recorded_ = true;
  if (timing_) when_ = std::chrono::steady_clock::now();
}

double Event::elapsed_ms(const Event& end) const {
  if (!timing_ || !end.timing_) {
    throw Error(ErrorCode::kInvalidArgument, "Both events must be created with argument 'enable_timing=True'.");
  }
  if (!recorded_ || !end.recorded_) {
    throw Error(ErrorCode::kInvalidArgument, "Both events must be recorded before calculating elapsed time.");
  }
  if (device_ != end.device_) {
    throw Error(ErrorCode::kInvalidArgument, "Both events must be recorded on the same device to measure elapsed time.");
  }
  return std::chrono::duration<double, std::milli>(end.when_ - when_).count();
}

void stream_wait_event(int device, StreamId stream, const Event& event) {
  check_device(device);
  (void)stream;
  (void)event;  // synchronous model: the event's work is already complete
}

}  // namespace neuron::rt
