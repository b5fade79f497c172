// GoogleTest suite for the shared-memory transport of the neuron process group
// (csrc/distributed/shm.{h,cpp}; no torch). Peers are forked processes.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "distributed/shm.h"
#include "runtime/memory.h"

using neuron::dist::Clock;
using neuron::dist::CommError;
using neuron::dist::ShmGroup;

namespace {

const auto kWhat = [] { return std::string("test"); };
Clock::time_point in(std::chrono::milliseconds ms) { return Clock::now() + ms; }

// Runs `child(group)` in a forked process attached to `name` as local rank 1; returns its pid.
template <class F>
pid_t fork_peer(const std::string& name, int n, int rank, size_t half, size_t ring, F child) {
  pid_t pid = fork();
  if (pid == 0) {
    int rc = 0;
    try {
      ShmGroup g(name, false, n, rank, half, ring);
      rc = child(g);
    } catch (const std::exception& e) {
      fprintf(stderr, "child: %s\n", e.what());
      rc = 99;
    }
    _exit(rc);
  }
  return pid;
}

int wait_rc(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
}

bool shm_exists(const std::string& name) { return access(("/dev/shm" + name).c_str(), F_OK) == 0; }

}  // namespace

TEST(Shm, SegmentIsPrivateAndUnlinked) {
  std::string name = ShmGroup::unique_name();
  {
    ShmGroup g(name, true, 2, 0, 4096, 4096);
    struct stat st;
    ASSERT_EQ(stat(("/dev/shm" + name).c_str(), &st), 0);
    EXPECT_EQ(st.st_mode & 0777, 0600u);
    // A second creator with the same name is refused (O_EXCL), never adopted.
    EXPECT_THROW(ShmGroup(name, true, 2, 0, 4096, 4096), CommError);
    g.unlink();
    EXPECT_FALSE(shm_exists(name));
  }
  std::string other = ShmGroup::unique_name();
  { ShmGroup g(other, true, 2, 0, 4096, 4096); }  // destroyed without unlink(): still removed
  EXPECT_FALSE(shm_exists(other));
  EXPECT_NE(name, other);
}

TEST(Shm, BarrierAndBuffersAcrossProcesses) {
  std::string name = ShmGroup::unique_name();
  ShmGroup g(name, true, 2, 0, 1 << 16, 4096);
  pid_t pid = fork_peer(name, 2, 1, 1 << 16, 4096, [](ShmGroup& p) {
    for (int i = 0; i < 2000; ++i) {
      int h = i & 1;
      std::memcpy(p.buffer(1, h), &i, sizeof(i));
      p.barrier(in(std::chrono::seconds(30)), kWhat);
      int got;
      std::memcpy(&got, p.buffer(0, h), sizeof(got));
      if (got != -i) return 1;
    }
    return 0;
  });
  for (int i = 0; i < 2000; ++i) {
    int h = i & 1, v = -i;
    std::memcpy(g.buffer(0, h), &v, sizeof(v));
    g.barrier(in(std::chrono::seconds(30)), kWhat);
    int got;
    std::memcpy(&got, g.buffer(1, h), sizeof(got));
    ASSERT_EQ(got, i);
  }
  EXPECT_EQ(wait_rc(pid), 0);
}

TEST(Shm, RingStreamsMoreThanItsSize) {
  std::string name = ShmGroup::unique_name();
  const size_t ring = 4096, total = 1 << 20;
  ShmGroup g(name, true, 2, 0, 4096, ring);
  pid_t pid = fork_peer(name, 2, 1, 4096, ring, [&](ShmGroup& p) {
    std::vector<uint8_t> got(total);
    size_t pos = 0;
    auto deadline = in(std::chrono::seconds(30));
    while (pos < total && Clock::now() < deadline) {
      uint32_t bell = p.doorbell();
      size_t k = p.ring_read(0, got.data() + pos, total - pos);
      pos += k;
      if (!k) p.wait_doorbell(bell, std::chrono::milliseconds(20));
    }
    for (size_t i = 0; i < total; ++i)
      if (got[i] != static_cast<uint8_t>(i * 7)) return 2;
    return pos == total ? 0 : 1;
  });
  std::vector<uint8_t> data(total);
  for (size_t i = 0; i < total; ++i) data[i] = static_cast<uint8_t>(i * 7);
  size_t pos = 0;
  auto deadline = in(std::chrono::seconds(30));
  while (pos < total && Clock::now() < deadline) {
    uint32_t bell = g.doorbell();
    size_t k = g.ring_write(1, data.data() + pos, total - pos);
    EXPECT_LE(k, ring);
    pos += k;
    if (!k) g.wait_doorbell(bell, std::chrono::milliseconds(20));
  }
  EXPECT_EQ(pos, total);
  EXPECT_EQ(wait_rc(pid), 0);
}

TEST(Shm, DeadPeerIsReportedNotWaitedFor) {
  std::string name = ShmGroup::unique_name();
  ShmGroup g(name, true, 2, 0, 4096, 4096);
  pid_t pid = fork_peer(name, 2, 1, 4096, 4096, [](ShmGroup&) {
    raise(SIGKILL);
    return 0;
  });
  // The peer published its pid, then died without reaching the barrier; it stays a
  // zombie until reaped, which must count as dead.
  while (g.slot(1).pid.load() == 0) usleep(1000);
  try {
    g.barrier(in(std::chrono::seconds(60)), kWhat);
    FAIL() << "barrier returned without the peer";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("has exited"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(g.aborted());
  EXPECT_THROW(g.check_abort(), CommError);
  EXPECT_EQ(wait_rc(pid), -SIGKILL);
}

TEST(Shm, TimeoutNamesTheLateRankAndAbortsTheGroup) {
  std::string name = ShmGroup::unique_name();
  ShmGroup g(name, true, 2, 0, 4096, 4096);
  ShmGroup peer(name, false, 2, 1, 4096, 4096);  // alive (this process) but never arrives
  try {
    g.barrier(in(std::chrono::milliseconds(200)), kWhat);
    FAIL() << "barrier did not time out";
  } catch (const CommError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("timed out"), std::string::npos) << m;
    EXPECT_NE(m.find("local rank 1"), std::string::npos) << m;
  }
  EXPECT_THROW(peer.barrier(in(std::chrono::seconds(5)), kWhat), CommError);  // sees the abort at once
}

TEST(Shm, LayoutMismatchIsRefused) {
  std::string name = ShmGroup::unique_name();
  ShmGroup g(name, true, 2, 0, 4096, 4096);
  EXPECT_THROW(ShmGroup(name, false, 2, 1, 8192, 4096), CommError);
  EXPECT_THROW(ShmGroup(name, false, 3, 1, 4096, 4096), CommError);
}

TEST(Shm, PeersMapShareableDeviceMemory) {
  neuron::rt::set_shareable_allocations(true);
  const size_t bytes = 3 << 20;
  char* p = static_cast<char*>(neuron::rt::device_malloc(0, bytes));
  neuron::rt::ShareableHandle h{};
  ASSERT_TRUE(neuron::rt::shareable_handle(p + 4096, 1 << 20, &h));
  EXPECT_EQ(h.pid, getpid());
  EXPECT_EQ(h.offset, 4096u);
  EXPECT_GE(h.size, bytes);
  EXPECT_FALSE(neuron::rt::shareable_handle(p + bytes - 8, 4096 + h.size, &h));  // runs past the allocation
  ASSERT_TRUE(neuron::rt::shareable_handle(p, bytes, &h));
  for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<char>(i * 13);
  pid_t pid = fork();
  if (pid == 0) {
    neuron::dist::PeerMemory peers;
    char* q = peers.map(h.pid, h.fd, h.id, h.size);
    if (!q) _exit(1);
    for (size_t i = 0; i < bytes; ++i)
      if (q[i] != static_cast<char>(i * 13)) _exit(2);
    q[17] = 42;  // writes land in the owner's memory
    if (peers.map(h.pid, h.fd, h.id, h.size) != q) _exit(3);  // cached
    _exit(0);
  }
  EXPECT_EQ(wait_rc(pid), 0);
  EXPECT_EQ(p[17], 42);
  neuron::rt::device_free(0, p, bytes);
  EXPECT_FALSE(neuron::rt::shareable_handle(p, 1, &h));
  // Small allocations stay ordinary memory.
  void* small = neuron::rt::device_malloc(0, 4096);
  EXPECT_FALSE(neuron::rt::shareable_handle(small, 1, &h));
  neuron::rt::device_free(0, small, 4096);
  neuron::rt::set_shareable_allocations(false);
}
