// The end of the rendezvous store's life: its host waits for every rank to
// close its connection before it stops serving (Note [Closing handshake]
// in store.cpp), and a client whose host has exited fails at once, naming
// the address, instead of reconnecting until the timeout (Note [A store
// that is gone]); a client that starts before its host is up still waits,
// and so does one whose process starts its next round first (Note [The
// next round]).
#include <gtest/gtest.h>

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "strata/core/error.h"
#include "strata/runtime/launcher.h"
#include "strata/runtime/store.h"
#include "support/errors.h"
#include "support/worker.h"

extern char** environ;

namespace {

using namespace std::chrono_literals;
using strata::runtime::make_tcp_store;
using strata::runtime::Store;
using strata::runtime::TcpStoreOptions;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

TcpStoreOptions rank_of_two(int rank, int port, std::chrono::milliseconds timeout) {
  TcpStoreOptions o;
  o.is_server = rank == 0;
  o.rank = rank;
  o.world_size = 2;
  o.port = port;
  o.timeout = timeout;
  return o;
}

std::string gone_message(const std::string& what, int port) {
  const std::string where = "127.0.0.1:" + std::to_string(port);
  return "[store] " + what + " on " + where + " failed: the store's host (rank 0) has exited: " + where +
         " refuses connections since this process was connected to it; look in rank 0's output (or the "
         "launcher's report) for why it ended";
}

TEST(StoreLifetimeTest, TheHostKeepsServingUntilEveryRankHasClosedItsConnection) {
  const int port = strata::runtime::find_free_port();
  std::shared_ptr<Store> host = make_tcp_store(rank_of_two(0, port, 30s));
  std::shared_ptr<Store> client = make_tcp_store(rank_of_two(1, port, 30s));
  std::atomic<bool> closing{false}, closed{false};
  std::thread closer([&] {
    closing = true;
    host.reset();  // waits for rank 1
    closed = true;
  });
  const auto deadline = Clock::now() + 10s;
  while (!closing && Clock::now() < deadline) std::this_thread::yield();
  ASSERT_TRUE(closing);
  // The host is being destroyed, and rank 1 is still connected: the store serves.
  client->set("late", "1");
  EXPECT_EQ(client->get("late"), "1");
  EXPECT_FALSE(closed) << "the host stopped while rank 1 was still connected";
  client.reset();  // rank 1's goodbye
  auto start = Clock::now();
  closer.join();
  EXPECT_TRUE(closed);
  EXPECT_LT(seconds_since(start), 10.0) << "the host kept waiting after rank 1 left";
}

// Note [The next round] (src/runtime/store_requests.cpp): rank 1 finishes a
// round first and makes its next store while rank 0 still hosts the last
// one; it must not join that one (whose host would then wait for it to
// leave) but wait for rank 0's next store on the same port.
TEST(StoreLifetimeTest, ARankThatStartsTheNextRoundFirstWaitsForRankZerosNextStore) {
  const int port = strata::runtime::find_free_port();
  std::shared_ptr<Store> host = make_tcp_store(rank_of_two(0, port, 5s));
  std::shared_ptr<Store> client = make_tcp_store(rank_of_two(1, port, 5s));
  client->set("round 1", "done");
  client.reset();  // rank 1 is done with round 1
  std::shared_ptr<Store> next_client;
  std::thread rank1([&] { next_client = make_tcp_store(rank_of_two(1, port, 10s)); });
  std::this_thread::sleep_for(300ms);  // its hellos reach round 1's store
  const auto start = Clock::now();
  host.reset();  // round 1 ends: rank 1 has left it
  EXPECT_LT(seconds_since(start), 3.0) << "round 1's host waited for rank 1's next store";
  std::shared_ptr<Store> next_host = make_tcp_store(rank_of_two(0, port, 5s));
  rank1.join();
  ASSERT_NE(next_client, nullptr);
  next_host->set("round", "2");
  EXPECT_EQ(next_client->get("round"), "2");
  EXPECT_FALSE(next_client->check({"round 1"})) << "rank 1 joined round 1's store";
  next_client.reset();  // rank 1 leaves first, as the closing handshake wants
}

TEST(StoreLifetimeTest, TheHostStopsWaitingAtItsTimeoutAndTheRankLeftFailsAtOnce) {
  const int port = strata::runtime::find_free_port();
  std::shared_ptr<Store> host = make_tcp_store(rank_of_two(0, port, 1000ms));
  std::shared_ptr<Store> client = make_tcp_store(rank_of_two(1, port, 60s));
  auto start = Clock::now();
  ::testing::internal::CaptureStderr();
  host.reset();
  const std::string warned = ::testing::internal::GetCapturedStderr();
  EXPECT_LT(seconds_since(start), 10.0);
  EXPECT_NE(warned.find("[store] stopped hosting the rendezvous store at 127.0.0.1:" + std::to_string(port) +
                        " after waiting 1000 ms for rank 1 to close its connection; it fails if it uses the store "
                        "again"),
            std::string::npos)
      << warned;
  start = Clock::now();
  EXPECT_EQ(strata::testing::error_message<strata::CommError>([&] { client->set("k", "v"); }),
            gone_message("set('k')", port));
  EXPECT_EQ(strata::testing::error_message<strata::CommError>([&] { client->get("k"); }),
            gone_message("get('k')", port));
  EXPECT_LT(seconds_since(start), 10.0) << "the client waited for a store that is gone";
}

// Hosts a store as rank 0 of 2 on port args[0], says so, and serves until killed.
STRATA_WORKER(host_store_until_killed) {
  auto store = make_tcp_store(rank_of_two(0, std::stoi(args.at(0)), 120s));
  store->set("up", "1");
  store->wait({"never set"}, 120s);
  return 0;
}

// A child process running a worker scenario; killed when it goes out of scope.
class Child {
 public:
  explicit Child(std::vector<std::string> args) {
    args.insert(args.begin(), strata::runtime::current_command_line()[0]);
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    EXPECT_EQ(::posix_spawn(&pid_, argv[0], nullptr, nullptr, argv.data(), environ), 0);
  }
  ~Child() { kill(); }
  void kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    ::waitpid(pid_, &status, 0);
    pid_ = -1;
  }

 private:
  pid_t pid_ = -1;
};

TEST(StoreLifetimeTest, AClientWhoseHostWasKilledFailsAtOnceNamingTheAddress) {
  const int port = strata::runtime::find_free_port();
  Child host({"--strata-worker=host_store_until_killed", std::to_string(port)});
  // Started before its host is up: a slow start, which the client waits out.
  std::shared_ptr<Store> client = make_tcp_store(rank_of_two(1, port, 60s));
  EXPECT_EQ(client->get("up"), "1");
  host.kill();
  auto start = Clock::now();
  // The connection was open: the next request finds it closed, and nothing listening.
  EXPECT_EQ(strata::testing::error_message<strata::CommError>([&] { client->set("joined/1", "1"); }),
            gone_message("set('joined/1')", port));
  // The connection is closed now: reconnecting is refused, at once.
  EXPECT_EQ(strata::testing::error_message<strata::CommError>([&] { client->wait({"joined/0"}, 60s); }),
            gone_message("wait('joined/0')", port));
  EXPECT_LT(seconds_since(start), 10.0) << "the client waited for a store whose host was killed";
}

TEST(StoreLifetimeTest, AClientStartedBeforeItsHostWaitsForIt) {
  const int port = strata::runtime::find_free_port();
  auto client = std::async(std::launch::async, [&] { return make_tcp_store(rank_of_two(1, port, 30s)); });
  EXPECT_EQ(client.wait_for(300ms), std::future_status::timeout) << "the client gave up before its host started";
  std::shared_ptr<Store> host = make_tcp_store(rank_of_two(0, port, 30s));
  host->set("k", "v");
  std::shared_ptr<Store> joined = client.get();
  EXPECT_EQ(joined->get("k"), "v");
  joined.reset();  // before the host, which waits for it
}

}  // namespace
