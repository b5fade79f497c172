// What each op of the `neuron` c10d backend leaves behind: its c10d Work (a future, and the
// profiler event "neuron:<op>") and a count of the transport it took.
#pragma once

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <chrono>
#include <exception>
#include <mutex>
#include <string>
#include <vector>

namespace torch_neuronx::dist {

// One call of `op` over `transport` ("self", "shm", "gloo", "store"), for stats().
void count(const char* op, const char* transport);

// Ops that a composite op issues internally are not profiled again: the profiler shows the
// call the user made, once (as gloo's does).
extern thread_local int t_inside_composite;

class NeuronWork : public c10d::Work {
 public:
  // With `profiled_as`, the work is an async profiler event "neuron:<profiled_as>" from now
  // until it completes, with the shapes of `inputs` (unless it runs inside a composite op).
  NeuronWork(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, int pending, std::string what,
             const char* profiled_as = nullptr, const std::vector<at::Tensor>& inputs = {});

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

}  // namespace torch_neuronx::dist
