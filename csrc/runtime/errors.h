// Error type of the Neuron runtime. The runtime knows nothing about torch; the
// ATen layer maps each code onto the matching PyTorch exception type.
#pragma once

#include <cstddef>
#include <stdexcept>
#include <string>

namespace neuron::rt {

enum class ErrorCode {
  kConfig,         // a NEURON_* environment variable is malformed
  kInvalidDevice,  // device index outside 0..device_count()-1
  kOutOfMemory,    // device memory capacity exhausted
  kForked,         // runtime used in a child forked after initialization
  kInvalidArgument,
};

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& what) : std::runtime_error(what), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

// Carries the numbers a CUDA-style OOM message needs.
class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(const std::string& what, int device, size_t requested, size_t capacity, size_t used)
      : Error(ErrorCode::kOutOfMemory, what),
        device(device), requested(requested), capacity(capacity), used(used) {}
  int device;
  size_t requested;
  size_t capacity;
  size_t used;
};

}  // namespace neuron::rt
