// GoogleTest suite for streams and events (runtime/stream.h): per-device streams, priorities,
// launches, sleeps and event timing (default platform).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "runtime/errors.h"
#include "runtime/platform.h"
#include "runtime/stream.h"

#include "runtime_test_util.h"

namespace {

using namespace rt_test;

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

}  // namespace
