// GoogleTest suite for the devices the environment selects (runtime/platform.h): NEURON_PLATFORM,
// the logical-core configuration, visible cores, device memory and launch blocking, and the
// configuration errors each of them gives. Every test starts from, and returns to, the default environment.
#include <gtest/gtest.h>

#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "runtime/errors.h"
#include "runtime/platform.h"

#include "runtime_test_util.h"

namespace {

using namespace rt_test;

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

}  // namespace
