// GoogleTest suite for device memory (runtime/memory.h): allocation, alignment, accounting,
// capacity and out-of-memory errors (default platform: 4 devices, 24 GiB each).
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "runtime/errors.h"
#include "runtime/memory.h"
#include "runtime/platform.h"

#include "runtime_test_util.h"

namespace {

using namespace rt_test;

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

}  // namespace
