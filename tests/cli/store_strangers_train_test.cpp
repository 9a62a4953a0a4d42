// A training job's rendezvous store and clients that never identify
// themselves (Note [Strangers] in src/runtime/store_server.cpp), end to
// end: while `strata train --devices 2` trains, three connections to rank
// 0's store port (one silent, one that announces 1000 bytes and stops, one
// that announces 64 MiB - 1 and sends 48 MiB) are closed by the hello
// timeout, rank 0's memory does not grow with them, and the job trains on.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "strata/runtime/store.h"
#include "support/tool.h"
#include "support/sockets.h"

namespace {

using strata::testing::raw_connect;

using namespace std::chrono_literals;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

size_t line_count(const fs::path& file) {
  std::ifstream in(file);
  size_t n = 0;
  for (std::string line; std::getline(in, line);) ++n;
  return n;
}

// Waits until `file` has at least `lines` lines, up to `limit`.
bool wait_for_lines(const fs::path& file, size_t lines, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (line_count(file) >= lines) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

long long resident_bytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  return -1;
}

bool closed_by_peer(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char buffer[4096];
  ssize_t n = ::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
}

TEST(StoreStrangersTrainTest, IdleClientsAreClosedAndRankZeroKeepsItsMemoryWhileTheJobTrainsOn) {
  std::string templ = ::testing::TempDir() + "strata_strangers_XXXXXX";
  ASSERT_NE(::mkdtemp(templ.data()), nullptr);
  const fs::path dir = templ;
  const fs::path metrics = dir / "metrics.jsonl";
  const int port = strata::runtime::find_free_port();
  // The job's port and a short hello timeout reach its workers through the
  // environment it starts with.
  ::setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  ::setenv("STRATA_STORE_HELLO_TIMEOUT_MS", "2000", 1);
  strata::testing::Child child = strata::testing::start_strata(
      {"train", "--model-size", "tiny", "--devices", "2", "--batch-size", "8", "--max-steps", "1000000",
       "--sample-tokens", "0", "--val-every", "0", "--log-every", "100000", "--metrics-file", metrics.string(),
       "--ckpt-dir", (dir / "ckpt").string()});
  ::unsetenv("MASTER_PORT");
  ::unsetenv("STRATA_STORE_HELLO_TIMEOUT_MS");
  auto stop = [&] {
    ::kill(child.pid, SIGINT);
    strata::testing::Outcome o = strata::testing::finish(child);
    fs::remove_all(dir);
    return o;
  };
  // A few steps in, rank 0's memory has settled.
  if (!wait_for_lines(metrics, 5, 120s)) {
    strata::testing::Outcome o = stop();
    FAIL() << "no steps within 120 s:\n" << o.out << o.err;
  }
  // `strata train` is rank 0 itself (Note [The launching process is rank
  // 0] in strategies/launchers/subprocess.h), hosting the store.
  const pid_t rank_zero = child.pid;
  const long long before = resident_bytes(rank_zero);

  const auto start = Clock::now();
  const int fds[3] = {raw_connect(port), raw_connect(port), raw_connect(port)};
  ::send(fds[1], "\0\0\x03\xe8", 4, MSG_NOSIGNAL);  // 1000 bytes, never sent
  ::send(fds[2], "\x03\xff\xff\xff", 4, MSG_NOSIGNAL);  // 64 MiB - 1 ...
  const std::string piece(64 << 10, 'x');  // ... of which 48 MiB
  for (size_t sent = 0; sent < (48u << 20) && seconds_since(start) < 10.0;) {
    ssize_t n = ::send(fds[2], piece.data(), piece.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EAGAIN) {
      pollfd p{fds[2], POLLOUT, 0};
      ::poll(&p, 1, 50);
      continue;
    }
    if (n <= 0) break;  // closed by the store
    sent += static_cast<size_t>(n);
  }
  std::optional<double> closed[3];
  while (seconds_since(start) < 30.0 && !(closed[0] && closed[1] && closed[2])) {
    for (int i = 0; i < 3; ++i)
      if (!closed[i] && closed_by_peer(fds[i])) closed[i] = seconds_since(start);
    std::this_thread::sleep_for(10ms);
  }
  const long long after = resident_bytes(rank_zero);
  for (int fd : fds) ::close(fd);
  // The job trains on: more steps after the strangers are gone.
  const size_t steps = line_count(metrics);
  const bool trains_on = wait_for_lines(metrics, steps + 3, 60s);
  const bool rank_zero_alive = ::kill(rank_zero, 0) == 0;
  strata::testing::Outcome o = stop();

  for (int i = 0; i < 3; ++i) EXPECT_TRUE(closed[i]) << "client " << i << " still open after 30 s\n" << o.err;
  EXPECT_TRUE(trains_on) << o.err;
  EXPECT_TRUE(rank_zero_alive) << o.err;
  ASSERT_GT(before, 0);
  ASSERT_GT(after, 0);
  EXPECT_LT(after - before, 8LL << 20) << "rank 0's resident memory grew by " << (after - before) << " bytes";
  // Stopped by the test's SIGINT, not by a failure.
  EXPECT_EQ(o.status, 130) << o.err;
  EXPECT_NE(o.err.find("[store] dropped a connection from 127.0.0.1:"), std::string::npos) << o.err;
  std::cerr << "rank 0 resident memory: " << before << " -> " << after << " bytes; closed after";
  for (const auto& c : closed) std::cerr << " " << (c ? *c : -1.0) << " s";
  std::cerr << "\n";
}

}  // namespace
