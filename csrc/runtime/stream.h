// Streams and events of the simulated NeuronCores.
//
// Execution model: synchronous. Work launched on a stream runs to completion before
// launch() returns, so program order is stream order, cross-stream waits are already
// satisfied, and an event completes when it is recorded. This is the simplest correct
// model; NEURON_LAUNCH_BLOCKING=1 (always true here) is therefore accepted as is.
// Timing events take a steady-clock timestamp at record time, which is the moment all
// earlier work on the stream finished.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>

namespace neuron::rt {

using StreamId = int64_t;
constexpr StreamId kDefaultStream = 0;

// Creates a stream on `device`. Priorities follow CUDA: lower is higher priority,
// clamped to [kHighestPriority, kLowestPriority].
constexpr int kLowestPriority = 0;
constexpr int kHighestPriority = -1;
StreamId stream_create(int device, int priority);
bool stream_exists(int device, StreamId id);
int stream_priority(int device, StreamId id);
// Runs `work` on the stream (synchronously) and counts it.
void launch(int device, StreamId id, const std::function<void()>& work);
uint64_t stream_launch_count(int device, StreamId id);
// Launches a busy wait of `cycles` cycles of the chip's engine clock (ChipFacts::engine_ghz) on
// the stream: the stream is busy for cycles / clock, as CUDA's _sleep holds a stream busy.
void sleep_cycles(int device, StreamId id, int64_t cycles);
bool stream_query(int device, StreamId id);
void stream_synchronize(int device, StreamId id);
void device_synchronize(int device);

class Event {
 public:
  explicit Event(bool enable_timing) : timing_(enable_timing) {}
  void record(int device, StreamId stream);
  bool recorded() const { return recorded_; }
  bool timing() const { return timing_; }
  int device() const { return device_; }
  StreamId stream() const { return stream_; }
  // True when never recorded (as CUDA) or when all work before the record finished.
  bool query() const { return true; }
  void synchronize() const {}
  // Milliseconds from this event to `end`. Throws Error(kInvalidArgument) unless both
  // were created with timing, both were recorded, and both are on the same device.
  double elapsed_ms(const Event& end) const;

 private:
  bool timing_;
  bool recorded_ = false;
  int device_ = -1;
  StreamId stream_ = kDefaultStream;
  std::chrono::steady_clock::time_point when_{};
};

// Makes future work on `stream` wait for `event` (already complete in this model).
void stream_wait_event(int device, StreamId stream, const Event& event);

}  // namespace neuron::rt
