// Clients of the rendezvous store that never identify themselves (Note
// [Strangers] in src/runtime/store_server.cpp): silent ones and ones that
// announce a frame and stop are closed at the hello timeout, a length no
// hello has is refused at its first four bytes, a c10d TCPStore client is
// refused, the number held at once is bounded, and none of them costs the
// store's process memory or stops it serving the job.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/runtime/store.h"
#include "support/tool.h"
#include "support/environment.h"
#include "support/sockets.h"

namespace {

using strata::testing::ScopedEnv;
using strata::testing::raw_connect;

using namespace std::chrono_literals;
using strata::runtime::make_tcp_store;
using strata::runtime::TcpStoreOptions;
using Clock = std::chrono::steady_clock;

constexpr const char* kToken = "the-job-token";

std::shared_ptr<strata::runtime::Store> host_store(int port) {
  TcpStoreOptions o;
  o.port = port;
  o.is_server = true;
  o.token = kToken;
  o.timeout = 5s;
  return make_tcp_store(o);
}

std::shared_ptr<strata::runtime::Store> member_of(int port) {
  TcpStoreOptions o;
  o.port = port;
  o.token = kToken;
  o.timeout = 10s;
  return make_tcp_store(o);
}

void send_bytes(int fd, const std::string& bytes) {
  EXPECT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
}

// Whether the store has closed `fd` (end of stream or a reset), without
// waiting.
bool closed_by_peer(int fd) {
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  char buffer[4096];
  ssize_t n = ::recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR);
}

// The resident memory of this process, in bytes.
long long resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("VmRSS:", 0) == 0) return std::atoll(line.c_str() + 6) * 1024;
  return -1;
}

size_t count(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) ++n;
  return n;
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// The three clients of the report: one silent, one that announces 1000
// bytes and stops, one that announces 64 MiB - 1 and sends 48 MiB of it.
TEST(StoreStrangersTest, IdleClientsAreClosedAtTheHelloTimeoutAndABigLengthAtOnce) {
  ScopedEnv timeout("STRATA_STORE_HELLO_TIMEOUT_MS", "2000");
  const int port = strata::runtime::find_free_port();
  auto store = host_store(port);
  store->set("k", "v");
  ::testing::internal::CaptureStderr();
  const long long before = resident_bytes();
  const auto start = Clock::now();
  const int silent = raw_connect(port);
  const int announces_1000 = raw_connect(port);
  send_bytes(announces_1000, std::string("\0\0\x03\xe8", 4));
  const int announces_64m = raw_connect(port);
  send_bytes(announces_64m, std::string("\x03\xff\xff\xff", 4));
  // 48 MiB in 64 KiB pieces, as far as the socket takes them: the store
  // reads none of it.
  const std::string piece(64 << 10, 'x');
  size_t sent = 0;
  while (sent < (48u << 20) && seconds_since(start) < 10.0) {
    ssize_t n = ::send(announces_64m, piece.data(), piece.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0 && errno == EAGAIN) {
      pollfd p{announces_64m, POLLOUT, 0};
      ::poll(&p, 1, 50);
      continue;
    }
    if (n <= 0) break;  // the store closed the connection
    sent += static_cast<size_t>(n);
  }
  EXPECT_LT(sent, 48u << 20) << "the store took the whole body of a client that never said hello";

  // Each is closed; the two that could still become a hello only at the
  // timeout (2 s), the length no hello has before it.
  std::optional<double> closed[3];
  const int fds[3] = {silent, announces_1000, announces_64m};
  while (seconds_since(start) < 20.0 && !(closed[0] && closed[1] && closed[2])) {
    for (int i = 0; i < 3; ++i)
      if (!closed[i] && closed_by_peer(fds[i])) closed[i] = seconds_since(start);
    ::poll(nullptr, 0, 10);
  }
  const long long after = resident_bytes();
  const std::string log = ::testing::internal::GetCapturedStderr();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(closed[i]) << "client " << i << " still open after 20 s; log:\n" << log;
  EXPECT_GE(*closed[0], 1.9) << "a silent client was dropped before its hello timeout";
  EXPECT_GE(*closed[1], 1.9) << "a client inside a hello's frame was dropped before its hello timeout";
  EXPECT_LT(*closed[2], *closed[0]) << "a length over a hello's limit waited for the hello timeout";
  for (int fd : fds) ::close(fd);
  // Nothing a stranger sent stayed in the store's process.
  EXPECT_LT(after - before, 8LL << 20) << "resident memory grew by " << (after - before) << " bytes";
  // The first drop is said at once, the others are held for the next line
  // (at most one line per 10 s).
  EXPECT_EQ(count(log, "[store] dropped a connection from 127.0.0.1:"), 1u) << log;
  EXPECT_NE(log.find(" to the rendezvous store at 127.0.0.1:" + std::to_string(port) +
                     ": its first message announced 67108863 bytes, more than a hello's 4096: it is not a strata "
                     "client\n"),
            std::string::npos)
      << log;
  // The job's own clients are served as before.
  EXPECT_EQ(member_of(port)->get("k"), "v");
  EXPECT_EQ(store->add("n", 3), 3);
}

TEST(StoreStrangersTest, AClientThatOpensWithAnotherRequestThanHelloIsDroppedAndNamedInTheLog) {
  const int port = strata::runtime::find_free_port();
  auto store = host_store(port);
  ::testing::internal::CaptureStderr();
  const int fd = raw_connect(port);
  send_bytes(fd, std::string("\0\0\0\x01\x02", 5));  // a kSet with nothing after it
  const auto start = Clock::now();
  bool closed = false;
  while (!closed && seconds_since(start) < 10.0) {
    closed = closed_by_peer(fd);
    ::poll(nullptr, 0, 10);
  }
  ::close(fd);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(closed);
  EXPECT_NE(log.find(": its first message is not strata's hello: it is not a strata client\n"), std::string::npos)
      << log;
}

// Note [Strangers]: at most 64 strangers at once; a rank that connects
// behind them is served once the oldest has waited a second.
TEST(StoreStrangersTest, ARankIsServedWhileTheMostStrangersTheStoreHoldsStaySilent) {
  const int port = strata::runtime::find_free_port();
  auto store = host_store(port);
  store->set("k", "v");
  ::testing::internal::CaptureStderr();
  std::vector<int> silent;
  for (int i = 0; i < 70; ++i) silent.push_back(raw_connect(port));
  EXPECT_EQ(member_of(port)->get("k"), "v");
  int closed = 0;
  for (int fd : silent) {
    closed += closed_by_peer(fd) ? 1 : 0;
    ::close(fd);
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_GE(closed, 1) << "no stranger made room";
  EXPECT_NE(log.find(": 64 connections were waiting to identify themselves; the oldest made room for a new one\n"),
            std::string::npos)
      << log;
}

// c10d's TCPStore client opens with a VALIDATE query, whose bytes read as a
// 13 MB frame length: it is refused at once, every time it retries, so it
// fails at its own timeout instead of waiting on a store that never
// answers, and the store's log names it.
TEST(StoreStrangersTest, AC10dTcpStoreClientIsRefusedAndNamedInTheLog) {
  const std::string python = strata::testing::project_python();
  if (python.empty()) GTEST_SKIP() << "no project Python (STRATA_PYTHON) with torch";
  const int port = strata::runtime::find_free_port();
  auto store = host_store(port);
  store->set("k", "v");
  ::testing::internal::CaptureStderr();
  const auto start = Clock::now();
  const std::string script =
      "import datetime, sys\n"
      "import torch.distributed as dist\n"
      "try:\n"
      "    dist.TCPStore('127.0.0.1', int(sys.argv[1]), is_master=False, timeout=datetime.timedelta(seconds=1))\n"
      "except Exception as e:\n"
      "    print('refused:', type(e).__name__)\n"
      "    sys.exit(3)\n"
      "print('connected')\n";
  strata::testing::Outcome o =
      strata::testing::finish(strata::testing::start_program({python, "-c", script, std::to_string(port)}));
  const double took = seconds_since(start);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(o.status, 3) << o.out << o.err;
  EXPECT_EQ(o.out, "refused: DistNetworkError\n") << o.err;
  // Its own timeout is 1 s (importing torch takes seconds more); on a store
  // that buffered what it sent, it waited for minutes.
  EXPECT_LT(took, 30.0) << o.err;
  EXPECT_NE(log.find("[store] dropped a connection from 127.0.0.1:"), std::string::npos) << log;
  EXPECT_NE(log.find(": it speaks the protocol of c10d's TCPStore (torch.distributed), not strata's; give that "
                     "PyTorch job its own MASTER_PORT\n"),
            std::string::npos)
      << log;
  EXPECT_EQ(member_of(port)->get("k"), "v");
}

TEST(StoreStrangersTest, AJobTokenTooLongForAHelloIsAConfigErrorNamingItsLength) {
  TcpStoreOptions o;
  o.is_server = true;
  o.token = std::string(3000, 't');
  try {
    make_tcp_store(o);
    FAIL() << "no error";
  } catch (const strata::ConfigError& e) {
    EXPECT_EQ(std::string(e.what()), "[store] the job token (STRATA_JOB_TOKEN) is 3000 bytes long; the rendezvous "
                                     "store accepts at most 2048 bytes: choose a shorter secret");
  }
}

TEST(StoreStrangersTest, AHelloTimeoutThatIsNotANumberOfMillisecondsIsAConfigErrorNamingIt) {
  for (const char* bad : {"soon", "50", "10s"}) {
    ScopedEnv timeout("STRATA_STORE_HELLO_TIMEOUT_MS", bad);
    TcpStoreOptions o;
    o.is_server = true;
    try {
      make_tcp_store(o);
      FAIL() << "no error for " << bad;
    } catch (const strata::ConfigError& e) {
      EXPECT_EQ(std::string(e.what()), std::string("[store] STRATA_STORE_HELLO_TIMEOUT_MS='") + bad +
                                           "' is not a number of milliseconds between 100 and 3600000; unset it to "
                                           "use the default (10000)");
    }
  }
}

}  // namespace
