// Shared by the GoogleTest files of the torch-free runtime (csrc/runtime): readable error
// codes, a substring check, RT_ERROR, and a default environment for every test.
//
// Process-state notes:
//  * ctest (gtest_discover_tests) runs every test in its own process, but running
//    the binary directly runs them all in one; the suite must pass both ways.
//  * memory.cpp and stream.cpp size their per-device tables from device_count() on
//    first use, so every test that touches memory or streams runs with the default
//    platform (trn2, LNC=2 -> 4 devices). Tests that change NEURON_* variables live in
//    the PlatformEnv fixture (test_device.cpp), which restores the default environment afterwards.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <exception>
#include <ostream>
#include <string>

#include "runtime/errors.h"

namespace neuron::rt {
// Readable gtest output for error codes.
inline void PrintTo(ErrorCode c, std::ostream* os) {
  switch (c) {
    case ErrorCode::kConfig: *os << "kConfig"; return;
    case ErrorCode::kInvalidDevice: *os << "kInvalidDevice"; return;
    case ErrorCode::kOutOfMemory: *os << "kOutOfMemory"; return;
    case ErrorCode::kForked: *os << "kForked"; return;
    case ErrorCode::kInvalidArgument: *os << "kInvalidArgument"; return;
  }
  *os << "ErrorCode(" << static_cast<int>(c) << ")";
}
}  // namespace neuron::rt

namespace rt_test {

namespace rt = neuron::rt;
using rt::ErrorCode;

inline constexpr uint64_t kKiB = 1ull << 10;
inline constexpr uint64_t kMiB = 1ull << 20;
inline constexpr uint64_t kGiB = 1ull << 30;
inline constexpr int kDefaultDevices = 4;

// gmock is not installed (Debian's libgtest-dev only), so a small substring check.
inline ::testing::AssertionResult ContainsFmt(const char* hay_expr, const char* needle_expr, const std::string& hay,
                                              const std::string& needle) {
  if (hay.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << hay_expr << " does not contain " << needle_expr << "\n  text:   \""
                                       << hay << "\"\n  wanted: \"" << needle << "\"";
}
#define EXPECT_CONTAINS(hay, needle) EXPECT_PRED_FORMAT2(::rt_test::ContainsFmt, hay, needle)

inline const char* const kNeuronVars[] = {
    "NEURON_PLATFORM",     "NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_VISIBLE_CORES",
    "NEURON_RT_NUM_CORES", "NEURON_DEVICE_MEMORY",     "NEURON_LAUNCH_BLOCKING",
};

inline void clear_neuron_env() {
  for (const char* v : kNeuronVars) unsetenv(v);
}

// The suite must not depend on the caller's shell: drop NEURON_* before any test
// (and before gtest_main runs), so the platform is the default one.
[[maybe_unused]] inline const bool g_env_cleared = [] {
  clear_neuron_env();
  return true;
}();

// Runs `f`, expects an rt::Error with code `want`, and returns its message.
template <typename F>
std::string error_message(F&& f, ErrorCode want) {
  try {
    f();
  } catch (const rt::Error& e) {
    EXPECT_EQ(e.code(), want) << "message: " << e.what();
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected rt::Error, got std::exception: " << e.what();
    return "";
  } catch (...) {
    ADD_FAILURE() << "expected rt::Error, got a non-std exception";
    return "";
  }
  ADD_FAILURE() << "expected rt::Error, nothing was thrown";
  return "";
}

}  // namespace rt_test

#define RT_ERROR(stmt, code)                                          \
  ([&]() -> std::string {                                             \
    SCOPED_TRACE(#stmt);                                              \
    return ::rt_test::error_message([&] { (void)(stmt); }, (code));   \
  }())
