// GoogleTest suite for the torch-free Neuron runtime (csrc/runtime).
//
// Process-state notes:
//  * ctest (gtest_discover_tests) runs every test in its own process, but running
//    the binary directly runs them all in one; the suite must pass both ways.
//  * memory.cpp and stream.cpp size their per-device tables from device_count() on
//    first use, so every test that touches memory or streams runs with the default
//    platform (trn2, LNC=2 -> 4 devices). Tests that change NEURON_* variables live in
//    the PlatformEnv fixture, which restores the default environment afterwards.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <ostream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "runtime/errors.h"
#include "runtime/memory.h"
#include "runtime/platform.h"
#include "runtime/stream.h"

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

namespace {

namespace rt = neuron::rt;
using rt::ErrorCode;

constexpr uint64_t kKiB = 1ull << 10;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kGiB = 1ull << 30;
constexpr int kDefaultDevices = 4;

// gmock is not installed (Debian's libgtest-dev only), so a small substring check.
::testing::AssertionResult ContainsFmt(const char* hay_expr, const char* needle_expr, const std::string& hay,
                                       const std::string& needle) {
  if (hay.find(needle) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << hay_expr << " does not contain " << needle_expr << "\n  text:   \""
                                       << hay << "\"\n  wanted: \"" << needle << "\"";
}
#define EXPECT_CONTAINS(hay, needle) EXPECT_PRED_FORMAT2(ContainsFmt, hay, needle)

const char* const kNeuronVars[] = {
    "NEURON_PLATFORM",     "NEURON_LOGICAL_NC_CONFIG", "NEURON_RT_VISIBLE_CORES",
    "NEURON_RT_NUM_CORES", "NEURON_DEVICE_MEMORY",     "NEURON_LAUNCH_BLOCKING",
};

void clear_neuron_env() {
  for (const char* v : kNeuronVars) unsetenv(v);
}

// The suite must not depend on the caller's shell: drop NEURON_* before any test
// (and before gtest_main runs), so the platform is the default one.
[[maybe_unused]] const bool g_env_cleared = [] {
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

#define RT_ERROR(stmt, code)                                \
  ([&]() -> std::string {                                   \
    SCOPED_TRACE(#stmt);                                    \
    return error_message([&] { (void)(stmt); }, (code));    \
  }())

// ---------------------------------------------------------------------------
// Platform: every test starts from, and returns to, the default environment.
// ---------------------------------------------------------------------------

class PlatformEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    clear_neuron_env();
    rt::reset_platform_for_testing();
  }
  void TearDown() override {
    clear_neuron_env();
    rt::reset_platform_for_testing();
    // Leave a default platform behind for tests that run later in this process.
    ASSERT_EQ(rt::device_count(), kDefaultDevices);
  }
  // Sets (or, with nullptr, unsets) a variable and forces a re-parse.
  static void set(const char* name, const char* value) {
    if (value) setenv(name, value, 1);
    else unsetenv(name);
    rt::reset_platform_for_testing();
  }
  // Expects the current environment to be rejected, naming `var`; returns the message.
  static std::string expect_config_error(const char* var) {
    EXPECT_EQ(rt::device_count(), 0);
    std::string err = rt::config_error();
    EXPECT_CONTAINS(err, var);
    std::string thrown = RT_ERROR(rt::platform(), ErrorCode::kConfig);
    EXPECT_EQ(thrown, err);
    // Entry points that validate a device surface the configuration error.
    RT_ERROR(rt::check_device(0), ErrorCode::kConfig);
    return err;
  }
};

TEST_F(PlatformEnv, DefaultsAreTrn2WithLnc2) {
  const rt::Platform& p = rt::platform();
  EXPECT_EQ(rt::config_error(), "");
  EXPECT_EQ(p.chip->chip, rt::Chip::kTrn2);
  EXPECT_STREQ(p.chip->name, "trn2");
  EXPECT_EQ(p.lnc, 2);
  EXPECT_EQ(p.logical_cores, 4);
  EXPECT_EQ(p.memory_source, "platform");
  EXPECT_FALSE(p.launch_blocking);
  ASSERT_EQ(rt::device_count(), 4);
  ASSERT_EQ(p.devices.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const rt::DeviceInfo& d = p.devices[static_cast<size_t>(i)];
    EXPECT_EQ(d.index, i);
    EXPECT_EQ(d.logical_core, i);
    EXPECT_EQ(d.physical_cores, (std::vector<int>{2 * i, 2 * i + 1}));
    EXPECT_EQ(d.total_memory, 24 * kGiB) << "96 GiB trn2 HBM split over 4 logical devices";
  }
}

TEST_F(PlatformEnv, ChipFacts) {
  const rt::ChipFacts& t2 = rt::chip_facts(rt::Chip::kTrn2);
  const rt::ChipFacts& t3 = rt::chip_facts(rt::Chip::kTrn3);
  EXPECT_EQ(t2.chip, rt::Chip::kTrn2);
  EXPECT_STREQ(t2.name, "trn2");
  EXPECT_STREQ(t2.core_name, "NeuronCore-v3");
  EXPECT_EQ(t2.physical_cores, 8);
  EXPECT_EQ(t2.hbm_bytes, 96 * kGiB);
  EXPECT_FALSE(t2.supports_fp8);
  EXPECT_EQ(t3.chip, rt::Chip::kTrn3);
  EXPECT_STREQ(t3.name, "trn3");
  EXPECT_STREQ(t3.core_name, "NeuronCore-v4");
  EXPECT_EQ(t3.physical_cores, 8);
  EXPECT_EQ(t3.hbm_bytes, 144 * kGiB);
  EXPECT_TRUE(t3.supports_fp8);
  EXPECT_TRUE(t3.supports_mx);
}

TEST_F(PlatformEnv, Trn3) {
  set("NEURON_PLATFORM", "trn3");
  const rt::Platform& p = rt::platform();
  EXPECT_EQ(p.chip->chip, rt::Chip::kTrn3);
  EXPECT_EQ(p.chip, &rt::chip_facts(rt::Chip::kTrn3));
  EXPECT_EQ(p.lnc, 2);
  ASSERT_EQ(rt::device_count(), 4);
  for (const rt::DeviceInfo& d : p.devices) EXPECT_EQ(d.total_memory, 144 * kGiB / 4);

  set("NEURON_PLATFORM", " trn3 ");  // surrounding blanks are ignored
  EXPECT_EQ(rt::platform().chip->chip, rt::Chip::kTrn3);
  set("NEURON_PLATFORM", "trn2");
  EXPECT_EQ(rt::platform().chip->chip, rt::Chip::kTrn2);
  set("NEURON_PLATFORM", "");  // empty means the default
  EXPECT_EQ(rt::platform().chip->chip, rt::Chip::kTrn2);
}

TEST_F(PlatformEnv, UnknownPlatformIsAConfigError) {
  set("NEURON_PLATFORM", "trn1");
  std::string err = expect_config_error("NEURON_PLATFORM");
  EXPECT_CONTAINS(err, "trn1");
  EXPECT_CONTAINS(err, "trn3");
}

TEST_F(PlatformEnv, Lnc1GivesEightDevicesOnePhysicalCoreEach) {
  set("NEURON_LOGICAL_NC_CONFIG", "1");
  const rt::Platform& p = rt::platform();
  EXPECT_EQ(p.lnc, 1);
  EXPECT_EQ(p.logical_cores, 8);
  ASSERT_EQ(rt::device_count(), 8);
  for (int i = 0; i < 8; ++i) {
    const rt::DeviceInfo& d = p.devices[static_cast<size_t>(i)];
    EXPECT_EQ(d.index, i);
    EXPECT_EQ(d.logical_core, i);
    EXPECT_EQ(d.physical_cores, std::vector<int>{i});
    EXPECT_EQ(d.total_memory, 12 * kGiB);
  }
  set("NEURON_PLATFORM", "trn3");
  ASSERT_EQ(rt::device_count(), 8);
  EXPECT_EQ(rt::platform().devices[0].total_memory, 18 * kGiB);
}

TEST_F(PlatformEnv, Lnc1WithVisibleCoresMapsPhysicalCores) {
  set("NEURON_LOGICAL_NC_CONFIG", "1");
  set("NEURON_RT_VISIBLE_CORES", "5,7");
  const rt::Platform& p = rt::platform();
  ASSERT_EQ(rt::device_count(), 2);
  EXPECT_EQ(p.devices[0].index, 0);
  EXPECT_EQ(p.devices[0].logical_core, 5);
  EXPECT_EQ(p.devices[0].physical_cores, std::vector<int>{5});
  EXPECT_EQ(p.devices[1].index, 1);
  EXPECT_EQ(p.devices[1].logical_core, 7);
  EXPECT_EQ(p.devices[1].physical_cores, std::vector<int>{7});
}

TEST_F(PlatformEnv, InvalidLncIsAConfigError) {
  for (const char* bad : {"3", "0", "x", "2x", ""}) {
    SCOPED_TRACE(bad);
    set("NEURON_LOGICAL_NC_CONFIG", bad);
    expect_config_error("NEURON_LOGICAL_NC_CONFIG");
  }
}

TEST_F(PlatformEnv, VisibleCoresRange) {
  set("NEURON_RT_VISIBLE_CORES", "0-3");
  ASSERT_EQ(rt::device_count(), 4);
  EXPECT_EQ(rt::config_error(), "");
  for (int i = 0; i < 4; ++i) EXPECT_EQ(rt::platform().devices[static_cast<size_t>(i)].logical_core, i);

  set("NEURON_RT_VISIBLE_CORES", "1-2");
  ASSERT_EQ(rt::device_count(), 2);
  EXPECT_EQ(rt::platform().devices[0].logical_core, 1);
  EXPECT_EQ(rt::platform().devices[1].logical_core, 2);
}

TEST_F(PlatformEnv, VisibleCoresList) {
  set("NEURON_RT_VISIBLE_CORES", "1,3");
  const rt::Platform& p = rt::platform();
  ASSERT_EQ(rt::device_count(), 2);
  EXPECT_EQ(p.devices[0].index, 0);
  EXPECT_EQ(p.devices[0].logical_core, 1);
  EXPECT_EQ(p.devices[0].physical_cores, (std::vector<int>{2, 3}));
  EXPECT_EQ(p.devices[1].index, 1);
  EXPECT_EQ(p.devices[1].logical_core, 3);
  EXPECT_EQ(p.devices[1].physical_cores, (std::vector<int>{6, 7}));
  // Memory per device does not grow when fewer devices are visible.
  EXPECT_EQ(p.devices[0].total_memory, 24 * kGiB);
}

TEST_F(PlatformEnv, VisibleCoresSingle) {
  set("NEURON_RT_VISIBLE_CORES", "2");
  ASSERT_EQ(rt::device_count(), 1);
  const rt::DeviceInfo& d = rt::platform().devices[0];
  EXPECT_EQ(d.index, 0);
  EXPECT_EQ(d.logical_core, 2);
  EXPECT_EQ(d.physical_cores, (std::vector<int>{4, 5}));
}

TEST_F(PlatformEnv, EmptyVisibleCoresHidesEveryDevice) {
  set("NEURON_RT_VISIBLE_CORES", "");
  EXPECT_EQ(rt::device_count(), 0);
  EXPECT_EQ(rt::config_error(), "") << "an empty list is valid, not an error";
  EXPECT_NO_THROW(rt::platform());
  EXPECT_TRUE(rt::platform().devices.empty());
  std::string msg = RT_ERROR(rt::check_device(0), ErrorCode::kInvalidDevice);
  EXPECT_CONTAINS(msg, "no neuron devices are visible");
  EXPECT_CONTAINS(msg, "NEURON_RT_VISIBLE_CORES=''");
}

TEST_F(PlatformEnv, BadVisibleCoresAreConfigErrors) {
  for (const char* bad : {"a", "3-1", "0,0", "0-2,1", "9", "4", "-1", "1-", "-", "0,,1", "1.5", "0-3x"}) {
    SCOPED_TRACE(bad);
    set("NEURON_RT_VISIBLE_CORES", bad);
    std::string err = expect_config_error("NEURON_RT_VISIBLE_CORES");
    EXPECT_CONTAINS(err, bad);
  }
}

TEST_F(PlatformEnv, OutOfRangeVisibleCoreExplainsTheLimit) {
  set("NEURON_RT_VISIBLE_CORES", "9");
  std::string err = expect_config_error("NEURON_RT_VISIBLE_CORES");
  EXPECT_CONTAINS(err, "core 9");
  EXPECT_CONTAINS(err, "0-3");
  // With LNC=1 there are 8 logical cores, so 7 is fine and 8 is not.
  set("NEURON_LOGICAL_NC_CONFIG", "1");
  set("NEURON_RT_VISIBLE_CORES", "7");
  EXPECT_EQ(rt::device_count(), 1);
  set("NEURON_RT_VISIBLE_CORES", "8");
  EXPECT_CONTAINS(expect_config_error("NEURON_RT_VISIBLE_CORES"), "0-7");
}

TEST_F(PlatformEnv, HugeVisibleCoreIdIsRejectedNotWrapped) {
  // 2^32 must not wrap to core 0 when narrowed to int.
  set("NEURON_RT_VISIBLE_CORES", "4294967296");
  expect_config_error("NEURON_RT_VISIBLE_CORES");
  set("NEURON_RT_VISIBLE_CORES", "4294967296-4294967297");
  expect_config_error("NEURON_RT_VISIBLE_CORES");
  // A huge range is rejected up front instead of being expanded id by id.
  set("NEURON_RT_VISIBLE_CORES", "0-2147483647");
  expect_config_error("NEURON_RT_VISIBLE_CORES");
  RT_ERROR(rt::parse_core_list("65536", "X"), ErrorCode::kConfig);
  EXPECT_EQ(rt::parse_core_list("65535", "X"), std::vector<int>{65535});
}

TEST_F(PlatformEnv, ParseCoreListDirect) {
  using V = std::vector<int>;
  EXPECT_EQ(rt::parse_core_list("0-3", "X"), (V{0, 1, 2, 3}));
  EXPECT_EQ(rt::parse_core_list("1,3", "X"), (V{1, 3}));
  EXPECT_EQ(rt::parse_core_list(" 2 ", "X"), (V{2}));
  EXPECT_EQ(rt::parse_core_list("0-1, 5 ,3", "X"), (V{0, 1, 5, 3}));
  EXPECT_EQ(rt::parse_core_list("4 - 6", "X"), (V{4, 5, 6}));
  EXPECT_EQ(rt::parse_core_list("", "X"), V{});
  EXPECT_EQ(rt::parse_core_list("   ", "X"), V{});
  std::string msg = RT_ERROR(rt::parse_core_list("3-1", "MY_VAR"), ErrorCode::kConfig);
  EXPECT_CONTAINS(msg, "MY_VAR='3-1'");
  EXPECT_CONTAINS(msg, "reversed");
  EXPECT_CONTAINS(RT_ERROR(rt::parse_core_list("0,0", "MY_VAR"), ErrorCode::kConfig), "twice");
  EXPECT_CONTAINS(RT_ERROR(rt::parse_core_list("a", "MY_VAR"), ErrorCode::kConfig), "not a core id");
  RT_ERROR(rt::parse_core_list("1-a", "MY_VAR"), ErrorCode::kConfig);
}

TEST_F(PlatformEnv, NumCores) {
  set("NEURON_RT_NUM_CORES", "2");
  ASSERT_EQ(rt::device_count(), 2);
  EXPECT_EQ(rt::platform().devices[1].logical_core, 1);

  set("NEURON_RT_NUM_CORES", "4");
  EXPECT_EQ(rt::device_count(), 4);

  set("NEURON_RT_NUM_CORES", "0");
  EXPECT_EQ(rt::device_count(), 0);
  EXPECT_EQ(rt::config_error(), "");

  // Applied after NEURON_RT_VISIBLE_CORES: the first N of the visible list.
  set("NEURON_RT_VISIBLE_CORES", "1,3");
  set("NEURON_RT_NUM_CORES", "1");
  ASSERT_EQ(rt::device_count(), 1);
  EXPECT_EQ(rt::platform().devices[0].logical_core, 1);

  set("NEURON_RT_NUM_CORES", "3");  // only 2 visible
  EXPECT_CONTAINS(expect_config_error("NEURON_RT_NUM_CORES"), "(2)");
  set("NEURON_RT_VISIBLE_CORES", nullptr);

  for (const char* bad : {"5", "-1", "x", "", "1.5"}) {
    SCOPED_TRACE(bad);
    set("NEURON_RT_NUM_CORES", bad);
    expect_config_error("NEURON_RT_NUM_CORES");
  }
}

TEST_F(PlatformEnv, DeviceMemoryFromEnv) {
  struct Case {
    const char* spec;
    uint64_t bytes;
  };
  for (const Case& c : {Case{"512MiB", 512 * kMiB}, Case{"2G", 2 * kGiB}, Case{"1024", 1024},
                        Case{"64K", 64 * kKiB}, Case{"1.5GiB", 3 * kGiB / 2}}) {
    SCOPED_TRACE(c.spec);
    set("NEURON_DEVICE_MEMORY", c.spec);
    const rt::Platform& p = rt::platform();
    EXPECT_EQ(p.memory_source, "NEURON_DEVICE_MEMORY");
    ASSERT_EQ(p.devices.size(), 4u);
    for (const rt::DeviceInfo& d : p.devices) EXPECT_EQ(d.total_memory, c.bytes);
  }
  for (const char* bad : {"abc", "0", "", "-5", "12X", "0.5"}) {
    SCOPED_TRACE(bad);
    set("NEURON_DEVICE_MEMORY", bad);
    std::string err = expect_config_error("NEURON_DEVICE_MEMORY");
    EXPECT_CONTAINS(err, "is not a size");
  }
}

TEST_F(PlatformEnv, ParseBytesDirect) {
  EXPECT_EQ(rt::parse_bytes("123", "S"), 123u);
  EXPECT_EQ(rt::parse_bytes("1B", "S"), 1u);
  EXPECT_EQ(rt::parse_bytes("64K", "S"), 64 * kKiB);
  EXPECT_EQ(rt::parse_bytes(" 8 kb ", "S"), 8 * kKiB);
  EXPECT_EQ(rt::parse_bytes("512MiB", "S"), 512 * kMiB);
  EXPECT_EQ(rt::parse_bytes("512m", "S"), 512 * kMiB);
  EXPECT_EQ(rt::parse_bytes("2GB", "S"), 2 * kGiB);
  EXPECT_EQ(rt::parse_bytes("2G", "S"), 2 * kGiB);
  EXPECT_EQ(rt::parse_bytes("1.5G", "S"), 3 * kGiB / 2);
  EXPECT_EQ(rt::parse_bytes("1TiB", "S"), 1ull << 40);
  EXPECT_EQ(rt::parse_bytes("0.5K", "S"), 512u);
  EXPECT_EQ(rt::parse_bytes("16777215T", "S"), 16777215ull << 40);  // just below 2^64
  for (const char* bad : {"abc", "0", "0.0", "", " ", "-5", "12X", "1.2.3", "MiB", "5 G B",
                          // Below one byte, and beyond 2^64 bytes, are not sizes either.
                          "0.5", "0.0001K", "20000000T"}) {
    SCOPED_TRACE(bad);
    std::string msg = RT_ERROR(rt::parse_bytes(bad, "MY_SIZE"), ErrorCode::kConfig);
    EXPECT_CONTAINS(msg, std::string("MY_SIZE='") + bad + "'");
    EXPECT_CONTAINS(msg, "512MiB");
  }
}

TEST_F(PlatformEnv, LaunchBlocking) {
  set("NEURON_LAUNCH_BLOCKING", "1");
  EXPECT_TRUE(rt::platform().launch_blocking);
  set("NEURON_LAUNCH_BLOCKING", "0");
  EXPECT_FALSE(rt::platform().launch_blocking);
  set("NEURON_LAUNCH_BLOCKING", "");
  EXPECT_FALSE(rt::platform().launch_blocking);
}

TEST_F(PlatformEnv, CheckDevice) {
  for (int i = 0; i < 4; ++i) EXPECT_NO_THROW(rt::check_device(i)) << i;
  for (int bad : {-1, 4, 5, 1000, std::numeric_limits<int>::min()}) {
    SCOPED_TRACE(bad);
    std::string msg = RT_ERROR(rt::check_device(bad), ErrorCode::kInvalidDevice);
    EXPECT_CONTAINS(msg, "Invalid device index " + std::to_string(bad));
    EXPECT_CONTAINS(msg, "4 neuron devices are visible");
    EXPECT_CONTAINS(msg, "0..3");
  }
  set("NEURON_RT_VISIBLE_CORES", "3");
  EXPECT_NO_THROW(rt::check_device(0));
  std::string msg = RT_ERROR(rt::check_device(1), ErrorCode::kInvalidDevice);
  EXPECT_CONTAINS(msg, "1 neuron device is visible");
  EXPECT_CONTAINS(msg, "0..0");
}

TEST_F(PlatformEnv, ResetRereadsTheEnvironment) {
  EXPECT_EQ(rt::device_count(), 4);
  setenv("NEURON_LOGICAL_NC_CONFIG", "1", 1);
  EXPECT_EQ(rt::device_count(), 4) << "the platform is parsed once, until reset";
  rt::reset_platform_for_testing();
  EXPECT_EQ(rt::device_count(), 8);
}

// ---------------------------------------------------------------------------
// Memory (default platform: 4 devices, 24 GiB each).
// ---------------------------------------------------------------------------

class Memory : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(rt::device_count(), kDefaultDevices) << "memory tests need the default platform";
    for (int d = 0; d < kDefaultDevices; ++d) ASSERT_EQ(rt::memory_info(d).used, 0u) << "device " << d;
  }
  void TearDown() override {
    for (int d = 0; d < kDefaultDevices; ++d) {
      EXPECT_EQ(rt::memory_info(d).used, 0u) << "test leaked memory on device " << d;
      rt::set_memory_capacity(d, 24 * kGiB);
    }
  }
};

size_t round_up(size_t n) { return (n + rt::kDeviceAlignment - 1) / rt::kDeviceAlignment * rt::kDeviceAlignment; }

TEST_F(Memory, DefaultCapacity) {
  for (int d = 0; d < kDefaultDevices; ++d) {
    EXPECT_EQ(rt::memory_info(d).capacity, 24 * kGiB);
    EXPECT_EQ(rt::memory_info(d).capacity, rt::platform().devices[static_cast<size_t>(d)].total_memory);
  }
}

TEST_F(Memory, AccountingRoundsToAlignmentAndTracksPeak) {
  static_assert(rt::kDeviceAlignment == 256);
  rt::reset_peak(0);
  const rt::MemoryInfo before = rt::memory_info(0);
  EXPECT_EQ(before.peak, 0u);

  void* a = rt::device_malloc(0, 1);
  ASSERT_NE(a, nullptr);
  rt::MemoryInfo i1 = rt::memory_info(0);
  EXPECT_EQ(i1.used, 256u);
  EXPECT_EQ(i1.peak, 256u);
  EXPECT_EQ(i1.num_allocs, before.num_allocs + 1);
  EXPECT_EQ(i1.num_frees, before.num_frees);

  void* b = rt::device_malloc(0, 300);  // -> 512
  ASSERT_NE(b, nullptr);
  void* c = rt::device_malloc(0, 256);  // exact multiple is not padded
  ASSERT_NE(c, nullptr);
  rt::MemoryInfo i2 = rt::memory_info(0);
  EXPECT_EQ(i2.used, 256u + 512u + 256u);
  EXPECT_EQ(i2.peak, 1024u);
  EXPECT_EQ(i2.num_allocs, before.num_allocs + 3);

  rt::device_free(0, b, 300);
  rt::MemoryInfo i3 = rt::memory_info(0);
  EXPECT_EQ(i3.used, 512u);
  EXPECT_EQ(i3.peak, 1024u) << "peak is a high-water mark";
  EXPECT_EQ(i3.num_frees, before.num_frees + 1);

  rt::reset_peak(0);
  EXPECT_EQ(rt::memory_info(0).peak, 512u) << "reset_peak lowers peak to current use";

  rt::device_free(0, a, 1);
  rt::device_free(0, c, 256);
  rt::MemoryInfo i4 = rt::memory_info(0);
  EXPECT_EQ(i4.used, 0u);
  EXPECT_EQ(i4.peak, 512u);
  EXPECT_EQ(i4.num_allocs, before.num_allocs + 3);
  EXPECT_EQ(i4.num_frees, before.num_frees + 3);
  EXPECT_EQ(i4.capacity, before.capacity);
}

TEST_F(Memory, PointersAreAligned) {
  std::vector<std::pair<void*, size_t>> live;
  for (size_t n : {size_t{1}, size_t{7}, size_t{255}, size_t{256}, size_t{257}, size_t{1000}, size_t{4096},
                   size_t{65537}, size_t{1} << 20}) {
    void* p = rt::device_malloc(0, n);
    ASSERT_NE(p, nullptr) << n;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % rt::kDeviceAlignment, 0u) << "size " << n;
    live.emplace_back(p, n);
  }
  size_t expect_used = 0;
  for (auto& [p, n] : live) expect_used += round_up(n);
  EXPECT_EQ(rt::memory_info(0).used, expect_used);
  for (auto& [p, n] : live) rt::device_free(0, p, n);
}

TEST_F(Memory, ZeroBytesIsNullAndNotCounted) {
  const rt::MemoryInfo before = rt::memory_info(0);
  EXPECT_EQ(rt::device_malloc(0, 0), nullptr);
  rt::device_free(0, nullptr, 0);
  rt::device_free(0, nullptr, 4096);  // freeing nullptr is a no-op whatever the size
  const rt::MemoryInfo after = rt::memory_info(0);
  EXPECT_EQ(after.used, 0u);
  EXPECT_EQ(after.num_allocs, before.num_allocs);
  EXPECT_EQ(after.num_frees, before.num_frees);
  // The device index is still validated.
  RT_ERROR(rt::device_malloc(4, 0), ErrorCode::kInvalidDevice);
}

TEST_F(Memory, MemoryIsWritableAndAllocationsDoNotOverlap) {
  const size_t n = 1 << 20;
  auto* a = static_cast<unsigned char*>(rt::device_malloc(0, n));
  auto* b = static_cast<unsigned char*>(rt::device_malloc(0, n));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (size_t i = 0; i < n; ++i) a[i] = static_cast<unsigned char>(i * 31 + 7);
  std::memset(b, 0xAB, n);
  size_t bad_a = 0, bad_b = 0;
  for (size_t i = 0; i < n; ++i) {
    bad_a += a[i] != static_cast<unsigned char>(i * 31 + 7);
    bad_b += b[i] != 0xAB;
  }
  EXPECT_EQ(bad_a, 0u);
  EXPECT_EQ(bad_b, 0u);
  // Typed access at the alignment the runtime promises.
  auto* d = reinterpret_cast<double*>(b);
  for (size_t i = 0; i < n / sizeof(double); ++i) d[i] = static_cast<double>(i) * 0.5;
  EXPECT_EQ(d[1000], 500.0);
  rt::device_free(0, a, n);
  rt::device_free(0, b, n);
}

TEST_F(Memory, OutOfMemoryCarriesTheNumbersAndLeaksNothing) {
  rt::set_memory_capacity(1, 4096);
  EXPECT_EQ(rt::memory_info(1).capacity, 4096u);
  void* a = rt::device_malloc(1, 3000);  // -> 3072
  ASSERT_NE(a, nullptr);
  const rt::MemoryInfo before = rt::memory_info(1);
  ASSERT_EQ(before.used, 3072u);

  bool thrown = false;
  try {
    rt::device_malloc(1, 2000);
  } catch (const rt::OutOfMemoryError& e) {
    thrown = true;
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_EQ(e.device, 1);
    EXPECT_EQ(e.requested, 2000u);
    EXPECT_EQ(e.capacity, 4096u);
    EXPECT_EQ(e.used, 3072u);
    EXPECT_CONTAINS(std::string(e.what()), "Neuron device 1 out of memory");
    EXPECT_CONTAINS(std::string(e.what()), "1.95 KiB");  // requested
    EXPECT_CONTAINS(std::string(e.what()), "capacity 4.00 KiB");
    EXPECT_CONTAINS(std::string(e.what()), "3.00 KiB in use");
    EXPECT_CONTAINS(std::string(e.what()), "1.00 KiB free");
  }
  EXPECT_TRUE(thrown) << "OutOfMemoryError expected";
  // Also catchable as the base Error.
  RT_ERROR(rt::device_malloc(1, 4096), ErrorCode::kOutOfMemory);

  const rt::MemoryInfo after = rt::memory_info(1);
  EXPECT_EQ(after.used, before.used) << "a failed allocation must not be charged";
  EXPECT_EQ(after.peak, before.peak);
  EXPECT_EQ(after.num_allocs, before.num_allocs);

  // The remaining 1024 bytes can still be used, exactly.
  void* b = rt::device_malloc(1, 1024);
  ASSERT_NE(b, nullptr);
  EXPECT_EQ(rt::memory_info(1).used, 4096u);
  RT_ERROR(rt::device_malloc(1, 1), ErrorCode::kOutOfMemory);
  // Other devices are unaffected.
  void* c = rt::device_malloc(2, 8192);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(rt::memory_info(1).used, 4096u);
  EXPECT_EQ(rt::memory_info(2).used, 8192u);
  rt::device_free(2, c, 8192);
  rt::device_free(1, b, 1024);
  rt::device_free(1, a, 3000);
}

TEST_F(Memory, HugeRequestsAreOutOfMemoryNotWrapped) {
  // Sizes near SIZE_MAX must not wrap around in the alignment rounding or the
  // capacity check and come back as a tiny (or bogus) allocation.
  const rt::MemoryInfo before = rt::memory_info(0);
  const size_t max = std::numeric_limits<size_t>::max();
  for (size_t n : {max, max - 1, max - 255, max - 256, max - 4096, size_t{1} << 63, size_t{25} * kGiB}) {
    SCOPED_TRACE(n);
    try {
      void* p = rt::device_malloc(0, n);
      ADD_FAILURE() << "allocated " << n << " bytes on a 24 GiB device";
      rt::device_free(0, p, n);
    } catch (const rt::OutOfMemoryError& e) {
      EXPECT_EQ(e.device, 0);
      EXPECT_EQ(e.requested, n);
      EXPECT_EQ(e.capacity, 24 * kGiB);
      EXPECT_EQ(e.used, 0u);
    }
  }
  // The same with something in use (used + rounded must not overflow).
  void* a = rt::device_malloc(0, 4096);
  try {
    void* p = rt::device_malloc(0, max - 2048);
    ADD_FAILURE() << "allocated SIZE_MAX-2048 bytes";
    rt::device_free(0, p, max - 2048);
  } catch (const rt::OutOfMemoryError& e) {
    EXPECT_EQ(e.used, 4096u);
  }
  rt::device_free(0, a, 4096);
  const rt::MemoryInfo after = rt::memory_info(0);
  EXPECT_EQ(after.used, 0u);
  EXPECT_EQ(after.num_allocs, before.num_allocs + 1);
}

TEST_F(Memory, SetCapacityBelowUseIsRejected) {
  void* a = rt::device_malloc(3, 1000);  // -> 1024
  std::string msg = RT_ERROR(rt::set_memory_capacity(3, 512), ErrorCode::kInvalidArgument);
  EXPECT_CONTAINS(msg, "neuron device 3");
  EXPECT_CONTAINS(msg, "in use");
  EXPECT_EQ(rt::memory_info(3).capacity, 24 * kGiB) << "capacity unchanged after a rejected set";
  EXPECT_NO_THROW(rt::set_memory_capacity(3, 1024));  // exactly what is in use is fine
  EXPECT_EQ(rt::memory_info(3).capacity, 1024u);
  RT_ERROR(rt::device_malloc(3, 1), ErrorCode::kOutOfMemory);
  rt::set_memory_capacity(3, 48 * kGiB);  // raising above the platform value is allowed
  EXPECT_EQ(rt::memory_info(3).capacity, 48 * kGiB);
  rt::device_free(3, a, 1000);
  EXPECT_NO_THROW(rt::set_memory_capacity(3, 0));
  RT_ERROR(rt::device_malloc(3, 1), ErrorCode::kOutOfMemory);
}

TEST_F(Memory, ManyCyclesLeaveNothingInUse) {
  const rt::MemoryInfo before = rt::memory_info(0);
  rt::reset_peak(0);
  constexpr int kCycles = 10000;
  for (int i = 0; i < kCycles; ++i) {
    size_t n = 1 + static_cast<size_t>(i % 5000);
    void* p = rt::device_malloc(0, n);
    ASSERT_NE(p, nullptr) << "cycle " << i;
    static_cast<char*>(p)[n - 1] = 1;
    rt::device_free(0, p, n);
  }
  const rt::MemoryInfo after = rt::memory_info(0);
  EXPECT_EQ(after.used, 0u);
  EXPECT_EQ(after.num_allocs - before.num_allocs, static_cast<uint64_t>(kCycles));
  EXPECT_EQ(after.num_frees - before.num_frees, static_cast<uint64_t>(kCycles));
  EXPECT_EQ(after.peak, round_up(5000)) << "one live allocation at a time";
}

TEST_F(Memory, ConcurrentAllocationKeepsExactAccounting) {
  rt::reset_peak(0);  // earlier tests in this process may have raised it
  const rt::MemoryInfo before = rt::memory_info(0);
  constexpr int kThreads = 4, kIters = 2000;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([t, &failures] {
      for (int i = 0; i < kIters; ++i) {
        size_t n = 64 + static_cast<size_t>((i * 7 + t) % 1024);
        try {
          void* p = rt::device_malloc(0, n);
          if (p == nullptr || reinterpret_cast<uintptr_t>(p) % rt::kDeviceAlignment != 0) ++failures;
          rt::device_free(0, p, n);
        } catch (...) {
          ++failures;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  const rt::MemoryInfo after = rt::memory_info(0);
  EXPECT_EQ(after.used, 0u);
  EXPECT_EQ(after.num_allocs - before.num_allocs, static_cast<uint64_t>(kThreads * kIters));
  EXPECT_EQ(after.num_frees - before.num_frees, static_cast<uint64_t>(kThreads * kIters));
  EXPECT_LE(after.peak, static_cast<uint64_t>(kThreads) * round_up(64 + 1023));
}

TEST_F(Memory, InvalidDeviceIndex) {
  for (int bad : {-1, 4, 100}) {
    SCOPED_TRACE(bad);
    EXPECT_CONTAINS(RT_ERROR(rt::device_malloc(bad, 64), ErrorCode::kInvalidDevice), "0..3");
    RT_ERROR(rt::memory_info(bad), ErrorCode::kInvalidDevice);
    RT_ERROR(rt::set_memory_capacity(bad, kGiB), ErrorCode::kInvalidDevice);
    RT_ERROR(rt::reset_peak(bad), ErrorCode::kInvalidDevice);
    rt::device_free(bad, nullptr, 64);  // noexcept and harmless
  }
}

// ---------------------------------------------------------------------------
// Streams and events (default platform).
// ---------------------------------------------------------------------------

class Streams : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(rt::device_count(), kDefaultDevices) << "stream tests need the default platform"; }
};

TEST_F(Streams, DefaultStreamExistsEverywhere) {
  for (int d = 0; d < kDefaultDevices; ++d) {
    EXPECT_TRUE(rt::stream_exists(d, rt::kDefaultStream)) << d;
    EXPECT_EQ(rt::stream_priority(d, rt::kDefaultStream), rt::kLowestPriority);
    EXPECT_TRUE(rt::stream_query(d, rt::kDefaultStream));
    EXPECT_NO_THROW(rt::stream_synchronize(d, rt::kDefaultStream));
    EXPECT_NO_THROW(rt::device_synchronize(d));
  }
  EXPECT_FALSE(rt::stream_exists(-1, rt::kDefaultStream));
  EXPECT_FALSE(rt::stream_exists(4, rt::kDefaultStream));
  EXPECT_FALSE(rt::stream_exists(0, 987654));
  EXPECT_FALSE(rt::stream_exists(0, -1));
}

TEST_F(Streams, CreateGivesUniqueIdsPerDevice) {
  std::set<rt::StreamId> ids0, ids1;
  for (int i = 0; i < 16; ++i) {
    rt::StreamId s0 = rt::stream_create(0, 0);
    rt::StreamId s1 = rt::stream_create(1, 0);
    EXPECT_NE(s0, rt::kDefaultStream);
    EXPECT_NE(s1, rt::kDefaultStream);
    EXPECT_TRUE(ids0.insert(s0).second) << "duplicate id " << s0 << " on device 0";
    EXPECT_TRUE(ids1.insert(s1).second) << "duplicate id " << s1 << " on device 1";
    EXPECT_TRUE(rt::stream_exists(0, s0));
    EXPECT_TRUE(rt::stream_exists(1, s1));
  }
  // Device 2 never created a stream: ids from devices 0/1 are not streams there.
  for (rt::StreamId id : ids0) EXPECT_FALSE(rt::stream_exists(2, id)) << id;
  RT_ERROR(rt::stream_create(4, 0), ErrorCode::kInvalidDevice);
  RT_ERROR(rt::stream_create(-1, 0), ErrorCode::kInvalidDevice);
}

TEST_F(Streams, PrioritiesAreClamped) {
  struct Case {
    int asked, got;
  };
  for (Case c : {Case{0, 0}, Case{-1, -1}, Case{-5, rt::kHighestPriority}, Case{3, rt::kLowestPriority},
                 Case{std::numeric_limits<int>::min(), -1}, Case{std::numeric_limits<int>::max(), 0}}) {
    rt::StreamId s = rt::stream_create(0, c.asked);
    EXPECT_EQ(rt::stream_priority(0, s), c.got) << "asked " << c.asked;
  }
  RT_ERROR(rt::stream_priority(0, 987654), ErrorCode::kInvalidArgument);
  RT_ERROR(rt::stream_priority(4, rt::kDefaultStream), ErrorCode::kInvalidDevice);
}

TEST_F(Streams, SleepCyclesHoldsTheStreamForCyclesOverTheEngineClock) {
  rt::StreamId s = rt::stream_create(0, 0);
  rt::Event start(true), end(true);
  start.record(0, s);
  const double ghz = rt::platform().chip->engine_ghz;
  rt::sleep_cycles(0, s, static_cast<int64_t>(ghz * 1e9 * 0.01));  // 10 ms
  end.record(0, s);
  EXPECT_EQ(rt::stream_launch_count(0, s), 1u);
  EXPECT_GE(start.elapsed_ms(end), 10.0 * 0.999);  // a busy wait: never shorter
  RT_ERROR(rt::sleep_cycles(0, s, -1), ErrorCode::kInvalidArgument);
  RT_ERROR(rt::sleep_cycles(4, s, 1), ErrorCode::kInvalidDevice);
}

TEST_F(Streams, LaunchRunsSynchronouslyInOrderAndCounts) {
  rt::StreamId s = rt::stream_create(0, 0);
  const uint64_t base_default = rt::stream_launch_count(0, rt::kDefaultStream);
  EXPECT_EQ(rt::stream_launch_count(0, s), 0u);

  std::vector<int> order;
  for (int i = 0; i < 10; ++i) {
    rt::StreamId target = (i % 2) ? s : rt::kDefaultStream;
    rt::launch(0, target, [&order, i] {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      order.push_back(i);
    });
    // Synchronous: the work is done when launch returns.
    ASSERT_EQ(order.size(), static_cast<size_t>(i + 1));
    EXPECT_EQ(order.back(), i);
    EXPECT_TRUE(rt::stream_query(0, target));
  }
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  EXPECT_EQ(rt::stream_launch_count(0, s), 5u);
  EXPECT_EQ(rt::stream_launch_count(0, rt::kDefaultStream), base_default + 5);
  // Another device's default stream is counted separately.
  const uint64_t base_d3 = rt::stream_launch_count(3, rt::kDefaultStream);
  rt::launch(3, rt::kDefaultStream, [] {});
  EXPECT_EQ(rt::stream_launch_count(3, rt::kDefaultStream), base_d3 + 1);
  EXPECT_EQ(rt::stream_launch_count(0, rt::kDefaultStream), base_default + 5);
}

TEST_F(Streams, LaunchPropagatesExceptionsFromWork) {
  EXPECT_THROW(rt::launch(0, rt::kDefaultStream, [] { throw std::logic_error("kernel failed"); }),
               std::logic_error);
}

TEST_F(Streams, InvalidStream) {
  bool ran = false;
  std::string msg = RT_ERROR(rt::launch(0, 987654, [&] { ran = true; }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(msg, "Stream 987654 does not exist on neuron device 0.");
  EXPECT_FALSE(ran) << "work must not run on a missing stream";
  RT_ERROR(rt::stream_launch_count(0, 987654), ErrorCode::kInvalidArgument);
  RT_ERROR(rt::stream_query(0, 987654), ErrorCode::kInvalidArgument);
  RT_ERROR(rt::stream_synchronize(0, 987654), ErrorCode::kInvalidArgument);
  // A stream id from device 0 is not valid on device 2 (which has only its default stream).
  rt::StreamId s = rt::stream_create(0, 0);
  if (!rt::stream_exists(2, s)) {
    EXPECT_CONTAINS(RT_ERROR(rt::launch(2, s, [] {}), ErrorCode::kInvalidArgument), "neuron device 2");
  }
  ran = false;
  RT_ERROR(rt::launch(4, rt::kDefaultStream, [&] { ran = true; }), ErrorCode::kInvalidDevice);
  EXPECT_FALSE(ran);
  RT_ERROR(rt::stream_query(-1, rt::kDefaultStream), ErrorCode::kInvalidDevice);
  RT_ERROR(rt::device_synchronize(4), ErrorCode::kInvalidDevice);
}

TEST_F(Streams, EventStateAndQuery) {
  rt::Event e(true);
  EXPECT_TRUE(e.timing());
  EXPECT_FALSE(e.recorded());
  EXPECT_EQ(e.device(), -1);
  EXPECT_TRUE(e.query()) << "an unrecorded event counts as complete, as in CUDA";
  EXPECT_NO_THROW(e.synchronize());

  rt::StreamId s = rt::stream_create(1, 0);
  rt::launch(1, s, [] {});
  e.record(1, s);
  EXPECT_TRUE(e.recorded());
  EXPECT_EQ(e.device(), 1);
  EXPECT_EQ(e.stream(), s);
  EXPECT_TRUE(e.query());
  EXPECT_NO_THROW(e.synchronize());
  EXPECT_NO_THROW(rt::stream_wait_event(1, rt::kDefaultStream, e));

  // Re-recording on the same device is fine; on another device it is not.
  EXPECT_NO_THROW(e.record(1, rt::kDefaultStream));
  EXPECT_EQ(e.stream(), rt::kDefaultStream);
  std::string msg = RT_ERROR(e.record(2, rt::kDefaultStream), ErrorCode::kInvalidArgument);
  EXPECT_CONTAINS(msg, "device 1");
  EXPECT_EQ(e.device(), 1) << "a rejected record leaves the event as it was";

  rt::Event f(false);
  EXPECT_FALSE(f.timing());
  RT_ERROR(f.record(4, rt::kDefaultStream), ErrorCode::kInvalidDevice);
  EXPECT_FALSE(f.recorded());
  RT_ERROR(rt::stream_wait_event(4, rt::kDefaultStream, f), ErrorCode::kInvalidDevice);
}

TEST_F(Streams, ElapsedTimeMeasuresASleep) {
  rt::Event start(true), end(true);
  start.record(0, rt::kDefaultStream);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  end.record(0, rt::kDefaultStream);
  const double ms = start.elapsed_ms(end);
  EXPECT_GE(ms, 15.0);
  EXPECT_LT(ms, 5000.0);
  EXPECT_DOUBLE_EQ(end.elapsed_ms(start), -ms) << "reverse order gives the negated interval";
  EXPECT_EQ(start.elapsed_ms(start), 0.0);

  // Re-recording moves the timestamp: start is now after end.
  start.record(0, rt::kDefaultStream);
  EXPECT_LE(start.elapsed_ms(end), 0.0);
}

TEST_F(Streams, ElapsedTimeErrors) {
  rt::Event timed(true), timed2(true), untimed(false), unrecorded(true), other_dev(true);
  timed.record(0, rt::kDefaultStream);
  timed2.record(0, rt::kDefaultStream);
  untimed.record(0, rt::kDefaultStream);
  other_dev.record(1, rt::kDefaultStream);

  const std::string kTiming = "Both events must be created with argument 'enable_timing=True'.";
  const std::string kRecorded = "Both events must be recorded before calculating elapsed time.";
  EXPECT_EQ(RT_ERROR(timed.elapsed_ms(untimed), ErrorCode::kInvalidArgument), kTiming);
  EXPECT_EQ(RT_ERROR(untimed.elapsed_ms(timed), ErrorCode::kInvalidArgument), kTiming);
  EXPECT_EQ(RT_ERROR(timed.elapsed_ms(unrecorded), ErrorCode::kInvalidArgument), kRecorded);
  EXPECT_EQ(RT_ERROR(unrecorded.elapsed_ms(timed), ErrorCode::kInvalidArgument), kRecorded);
  rt::Event never1(true), never2(true);
  EXPECT_EQ(RT_ERROR(never1.elapsed_ms(never2), ErrorCode::kInvalidArgument), kRecorded);
  rt::Event never_untimed(false);
  EXPECT_EQ(RT_ERROR(never_untimed.elapsed_ms(never1), ErrorCode::kInvalidArgument), kTiming)
      << "the timing check comes first, as in PyTorch";
  EXPECT_CONTAINS(RT_ERROR(timed.elapsed_ms(other_dev), ErrorCode::kInvalidArgument), "same device");
  EXPECT_NO_THROW(timed.elapsed_ms(timed2));
  EXPECT_GE(timed.elapsed_ms(timed2), 0.0);
}

// ---------------------------------------------------------------------------
// Fork guard.
// ---------------------------------------------------------------------------

// Child exit codes, so a failure in the child says what went wrong.
enum ChildCode {
  kChildOk = 0,
  kChildNotBadFork = 10,
  kChildMallocDidNotThrow,
  kChildMallocWrongCode,
  kChildMallocNoSpawn,
  kChildStreamCreateDidNotThrow,
  kChildLaunchDidNotThrow,
  kChildLaunchRanWork,
  kChildInitializeDidNotThrow,
  kChildOtherException,
};

int child_checks() {
  if (!rt::in_bad_fork()) return kChildNotBadFork;
  try {
    try {
      void* p = rt::device_malloc(0, 64);
      (void)p;
      return kChildMallocDidNotThrow;
    } catch (const rt::Error& e) {
      if (e.code() != ErrorCode::kForked) return kChildMallocWrongCode;
      if (std::string(e.what()).find("spawn") == std::string::npos) return kChildMallocNoSpawn;
    }
    try {
      rt::stream_create(0, 0);
      return kChildStreamCreateDidNotThrow;
    } catch (const rt::Error& e) {
      if (e.code() != ErrorCode::kForked) return kChildStreamCreateDidNotThrow;
    }
    bool ran = false;
    try {
      rt::launch(0, rt::kDefaultStream, [&] { ran = true; });
      return kChildLaunchDidNotThrow;
    } catch (const rt::Error& e) {
      if (e.code() != ErrorCode::kForked) return kChildLaunchDidNotThrow;
    }
    if (ran) return kChildLaunchRanWork;
    try {
      rt::initialize();
      return kChildInitializeDidNotThrow;
    } catch (const rt::Error& e) {
      if (e.code() != ErrorCode::kForked) return kChildInitializeDidNotThrow;
    }
  } catch (...) {
    return kChildOtherException;
  }
  return kChildOk;
}

TEST(ForkGuard, ChildOfInitializedParentRefusesToRun) {
  ASSERT_EQ(rt::device_count(), kDefaultDevices);
  rt::initialize();
  EXPECT_TRUE(rt::is_initialized());
  EXPECT_FALSE(rt::in_bad_fork());
  EXPECT_NO_THROW(rt::check_not_forked());

  fflush(nullptr);  // don't duplicate buffered output into the child
  pid_t pid = fork();
  ASSERT_NE(pid, -1) << std::strerror(errno);
  if (pid == 0) _exit(child_checks());  // child: no gtest, no atexit handlers

  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "child did not exit normally (status " << status << ")";
  EXPECT_EQ(WEXITSTATUS(status), kChildOk) << "see enum ChildCode";

  // The parent is unaffected.
  EXPECT_FALSE(rt::in_bad_fork());
  EXPECT_NO_THROW(rt::check_not_forked());
  void* p = rt::device_malloc(0, 64);
  EXPECT_NE(p, nullptr);
  rt::device_free(0, p, 64);
  EXPECT_EQ(rt::memory_info(0).used, 0u);
}

TEST(ForkGuard, CheckNotForkedMessage) {
  // In the parent the guard is silent; the message itself is checked in the child above.
  EXPECT_FALSE(rt::in_bad_fork());
  EXPECT_NO_THROW(rt::check_not_forked());
}

}  // namespace
