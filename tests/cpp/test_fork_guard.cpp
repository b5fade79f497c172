// GoogleTest suite for the fork guard (runtime/platform.h): a child forked after initialize()
// refuses every entry point with a message that names the fix; the parent is unaffected.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "runtime/errors.h"
#include "runtime/memory.h"
#include "runtime/platform.h"
#include "runtime/stream.h"

#include "runtime_test_util.h"

namespace {

using namespace rt_test;

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
