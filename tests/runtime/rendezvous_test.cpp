// Hostile rendezvous: ranks that conflict or never come, clients without
// the job's token, and foreign programs on the store's port (silent, or
// answering with junk). Every case is an error that names the address
// and what to do, within seconds or within the rendezvous timeout; none
// crashes a process or hangs.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "strata/core/error.h"
#include "strata/runtime/env.h"
#include "strata/runtime/store.h"
#include "support/multiprocess.h"
#include "support/processes.h"
#include "support/worker.h"
#include "support/sockets.h"

namespace {

using strata::testing::raw_connect;

using namespace std::chrono_literals;
using strata::runtime::Environment;
using strata::runtime::LaunchOptions;
using strata::runtime::make_tcp_store;
using strata::runtime::TcpStoreOptions;
using Clock = std::chrono::steady_clock;

// Joins the rendezvous as the launcher says, except that the worker with
// LOCAL_RANK args[0] claims RANK args[1] and WORLD_SIZE args[2].
STRATA_WORKER(rendezvous_as) {
  Environment env = Environment::from_env();
  if (env.local_rank == std::stoi(args.at(0))) {
    env.rank = std::stoi(args.at(1));
    env.world_size = std::stoi(args.at(2));
  }
  auto store = strata::runtime::make_store(env, std::chrono::seconds(env.timeout_s));
  store->set("joined/" + std::to_string(env.local_rank), "1");
  return 0;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(RendezvousTest, TwoProcessesClaimingOneRankFailWithinSecondsNamingTheRank) {
  auto start = Clock::now();
  auto result = strata::testing::run_workers(3, "rendezvous_as", {"2", "1", "3"}, LaunchOptions().with_timeout_s(60));
  EXPECT_LT(seconds_since(start), 30.0);
  EXPECT_EQ(result.launch.exit_code, 1) << result.output;
  EXPECT_EQ(result.launch.failed_signal, 0) << result.output;  // never a crash
  EXPECT_NE(result.launch.last_error.find("failed: two processes claim rank 1: pid "), std::string::npos)
      << result.launch.last_error;
  EXPECT_NE(result.launch.last_error.find("was refused; give every worker a distinct RANK"), std::string::npos)
      << result.launch.last_error;
  EXPECT_NE(result.launch.last_error.find("[store] rendezvous at 127.0.0.1:"), std::string::npos)
      << result.launch.last_error;
}

TEST(RendezvousTest, RanksThatDisagreeAboutWorldSizeFailWithinSecondsNamingBothValues) {
  auto start = Clock::now();
  auto result = strata::testing::run_workers(2, "rendezvous_as", {"1", "1", "3"}, LaunchOptions().with_timeout_s(60));
  EXPECT_LT(seconds_since(start), 30.0);
  EXPECT_EQ(result.launch.exit_code, 1) << result.output;
  EXPECT_NE(result.launch.last_error.find("ranks disagree about WORLD_SIZE: rank 0 (the store's host) has "
                                          "WORLD_SIZE=2, rank 1 (pid "),
            std::string::npos)
      << result.launch.last_error;
  EXPECT_NE(result.launch.last_error.find(") has WORLD_SIZE=3; start every worker with the same WORLD_SIZE"),
            std::string::npos)
      << result.launch.last_error;
}

TEST(RendezvousTest, MissingRanksAreNamedAtTheRendezvousTimeout) {
  TcpStoreOptions o;
  o.is_server = true;
  o.rank = 0;
  o.world_size = 3;
  o.rendezvous = true;
  o.timeout = 1500ms;
  auto start = Clock::now();
  try {
    make_tcp_store(o);
    FAIL() << "no error";
  } catch (const strata::TimeoutError& e) {
    std::string what = e.what();
    EXPECT_EQ(what.rfind("[store] rendezvous at 127.0.0.1:", 0), 0u) << what;
    EXPECT_NE(what.find(" timed out after 1500 ms: ranks 1, 2 of WORLD_SIZE=3 never joined (joined: 0); start every "
                        "worker with the same MASTER_ADDR, MASTER_PORT and WORLD_SIZE"),
              std::string::npos)
        << what;
  }
  EXPECT_LT(seconds_since(start), 10.0);
}

TcpStoreOptions client_of(int port, std::chrono::milliseconds timeout = 3s) {
  TcpStoreOptions o;
  o.port = port;
  o.timeout = timeout;
  return o;
}

TEST(RendezvousTest, AClientWithoutTheJobTokenIsRefusedAndOneWithItIsServed) {
  int port = strata::runtime::find_free_port();
  TcpStoreOptions host = client_of(port);
  host.is_server = true;
  host.token = "the-job-token";
  auto server = make_tcp_store(host);
  server->set("secret", "value");
  for (std::string token : {"", "another-token"}) {
    TcpStoreOptions o = client_of(port);
    o.token = token;
    try {
      make_tcp_store(o);
      FAIL() << "no error for token '" << token << "'";
    } catch (const strata::CommError& e) {
      const std::string at = "[store] the rendezvous store at 127.0.0.1:" + std::to_string(port);
      // No token: started by hand beside a launched job. Another token:
      // another job given the same port.
      EXPECT_EQ(std::string(e.what()),
                token.empty()
                    ? at + " refused this process: it carries no job token (STRATA_JOB_TOKEN) and the store belongs "
                           "to a job whose launcher handed its workers one. Start every worker with strata launch, "
                           "or give each the job's STRATA_JOB_TOKEN"
                    : at + " belongs to another job (its job token is not this process's STRATA_JOB_TOKEN): the "
                           "port is in use by another strata job; give this job another port (--master-port or "
                           "MASTER_PORT), or leave both unset for a free port on one host; a job on several nodes "
                           "needs the same STRATA_JOB_TOKEN on every node");
    }
  }
  TcpStoreOptions member = client_of(port);
  member.token = "the-job-token";
  EXPECT_EQ(make_tcp_store(member)->get("secret"), "value");
}

// A foreign program on the port: listens, accepts, and then stays silent or
// writes `junk` to every connection.
class ForeignProgram {
 public:
  explicit ForeignProgram(std::string junk) : junk_(std::move(junk)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      while (true) {
        int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        if (!junk_.empty()) {
          ssize_t ignored = ::write(c, junk_.data(), junk_.size());
          (void)ignored;
        }
        clients_.push_back(c);
      }
    });
  }
  ~ForeignProgram() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
    for (int c : clients_) ::close(c);
  }
  int port() const { return port_; }

 private:
  std::string junk_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::vector<int> clients_;
};

std::string foreign_message(int port, const std::string& what) {
  return "[store] the program at 127.0.0.1:" + std::to_string(port) + " " + what +
         ": it is not strata's rendezvous store. Another program holds the port; choose another port (MASTER_PORT "
         "or --master-port) or stop that program";
}

// The error for a port held by a program that never answers the handshake.
void expect_silent_holder(const std::string& what, int port) {
  const std::string head = "[store] the program at 127.0.0.1:" + std::to_string(port) +
                           " accepted the connection but did not answer strata's handshake within ";
  EXPECT_EQ(what.rfind(head, 0), 0u) << what;
  EXPECT_NE(what.find(" ms: it is not strata's rendezvous store. Another program holds the port; choose another "
                      "port (MASTER_PORT or --master-port) or stop that program"),
            std::string::npos)
      << what;
}

TEST(RendezvousTest, ASilentProgramOnThePortIsAnErrorWithinTheTimeout) {
  ForeignProgram silent("");
  auto start = Clock::now();
  try {
    make_tcp_store(client_of(silent.port(), 2s));
    FAIL() << "no error";
  } catch (const strata::TimeoutError& e) {
    expect_silent_holder(e.what(), silent.port());
  }
  EXPECT_LT(seconds_since(start), 10.0);
}

TEST(RendezvousTest, AProgramAnsweringWithJunkIsAnErrorNotACrash) {
  // A length of 4 GiB, then garbage: c10d's client allocated it (bad_alloc).
  for (std::string junk : {std::string("\xff\xff\xff\xffgarbage", 11), std::string("\0\0\0\x05hello", 9),
                           std::string("HTTP/1.1 400 Bad Request\r\n\r\n")}) {
    ForeignProgram noisy(junk);
    auto start = Clock::now();
    try {
      make_tcp_store(client_of(noisy.port(), 5s));
      FAIL() << "no error";
    } catch (const strata::TimeoutError& e) {
      FAIL() << "a timeout instead of naming the junk: " << e.what();
    } catch (const strata::CommError& e) {
      EXPECT_EQ(std::string(e.what()),
                foreign_message(noisy.port(), "answered with bytes that are not strata's protocol"));
    }
    EXPECT_LT(seconds_since(start), 10.0);
  }
}

// A plain listening socket that never accepts: what another program that
// holds the port looks like to workers started by hand.
class HeldPort {
 public:
  explicit HeldPort(in_addr_t address, bool reuse) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (reuse) ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(address);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    EXPECT_EQ(::listen(fd_, 16), 0);
    socklen_t len = sizeof(addr);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
  }
  ~HeldPort() { ::close(fd_); }
  int port() const { return port_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// The variables a worker started by hand gets (torchrun names).
Environment by_hand(int rank, int port) {
  Environment env;
  env.rank = rank;
  env.world_size = 2;
  env.local_rank = rank;
  env.local_world_size = 2;
  env.master_addr = "127.0.0.1";
  env.master_port = port;
  return env;
}

TEST(RendezvousTest, RankZeroStartedByHandNamesAPortThatIsInUseAtOnce) {
  for (in_addr_t address : {INADDR_LOOPBACK, INADDR_ANY}) {
    for (bool reuse : {false, true}) {
      HeldPort held(address, reuse);
      auto start = Clock::now();
      try {
        strata::runtime::make_store(by_hand(0, held.port()), 60s);
        FAIL() << "no error";
      } catch (const strata::CommError& e) {
        EXPECT_EQ(std::string(e.what()),
                  "[store] cannot host the rendezvous store on 127.0.0.1:" + std::to_string(held.port()) +
                      ": the port is in use by another program; give this job another port (--master-port or "
                      "MASTER_PORT), or leave both unset for a free port on one host, or stop the program that "
                      "holds it");
      }
      EXPECT_LT(seconds_since(start), 3.0) << "rank 0 waited before naming the port in use";
    }
  }
}

// Note [Who holds a busy port]: two jobs given one port. The first job's
// store (hosted here, with its token) keeps serving its own ranks; every
// rank of the second job fails at once saying another strata job holds
// the port and how to choose one.
TEST(RendezvousTest, ASecondJobOnTheSamePortIsToldAnotherStrataJobHoldsIt) {
  const int port = strata::runtime::find_free_port();
  TcpStoreOptions first = client_of(port);
  first.is_server = true;
  first.token = "the-first-job";
  auto first_store = make_tcp_store(first);
  first_store->set("key", "value");
  auto start = Clock::now();
  auto result = strata::testing::run_workers(2, "rendezvous_as", {"9", "0", "0"},
                                             LaunchOptions().with_timeout_s(60).with_master_port(port));
  EXPECT_LT(seconds_since(start), 30.0);
  EXPECT_EQ(result.launch.exit_code, 1) << result.output;
  // Rank 0 cannot bind and finds a strata store there; rank 1 is refused
  // by it: the launcher reports whichever failed first, both say so.
  const std::string& error = result.launch.last_error;
  EXPECT_NE(error.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << error;
  EXPECT_NE(error.find("the port is in use by another strata job"), std::string::npos) << error;
  EXPECT_NE(error.find("give this job another port (--master-port or MASTER_PORT), or leave both unset for a free "
                       "port on one host"),
            std::string::npos)
      << error;
  EXPECT_EQ(result.output.find("Start workers with strata launch"), std::string::npos) << result.output;
  // The first job is untouched.
  EXPECT_EQ(first_store->get("key"), "value");
}

TEST(RendezvousTest, OtherRanksStartedByHandNameASilentHolderOfThePortWithinTheHandshakeLimit) {
  HeldPort held(INADDR_LOOPBACK, false);
  auto start = Clock::now();
  try {
    strata::runtime::make_store(by_hand(1, held.port()), 60s);
    FAIL() << "no error";
  } catch (const strata::TimeoutError& e) {
    expect_silent_holder(e.what(), held.port());
  }
  // Note [Handshake limit]: 5 s, where it was 15 s.
  EXPECT_LT(seconds_since(start), 12.0);
}

TEST(RendezvousTest, TheStoreSurvivesClientsThatSendJunk) {
  int port = strata::runtime::find_free_port();
  TcpStoreOptions host = client_of(port);
  host.is_server = true;
  auto server = make_tcp_store(host);
  server->set("k", "v");
  for (std::string junk : {std::string("\xff\xff\xff\xff", 4), std::string("\0\0\0\x01\x02", 5),
                           std::string("\0\0\0\x09\x01\x00\x00\x00\x00\x00\x00\x7f\xff", 13),
                           std::string("GET / HTTP/1.0\r\n\r\n")}) {
    int fd = raw_connect(port);
    ssize_t ignored = ::write(fd, junk.data(), junk.size());
    (void)ignored;
    char buffer[64];
    timeval tv{2, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ssize_t n = ::read(fd, buffer, sizeof(buffer));  // the store closes the connection (0) or says why
    EXPECT_GE(n, 0) << "the store kept a junk connection open";
    ::close(fd);
  }
  EXPECT_EQ(make_tcp_store(client_of(port))->get("k"), "v");
  EXPECT_EQ(server->add("n", 2), 2);
}

// A non-loopback IPv4 address of this host, or "" when it has none.
std::string external_address() {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "";
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN];
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof(text));
    if (std::string(text).rfind("127.", 0) != 0) found = text;
  }
  ::freeifaddrs(list);
  return found;
}

TEST(RendezvousTest, TheStoreListensOnlyOnTheMasterAddress) {
  std::string other = external_address();
  if (other.empty()) GTEST_SKIP() << "this host has no IPv4 address besides loopback";
  int port = strata::runtime::find_free_port();
  TcpStoreOptions host = client_of(port);
  host.is_server = true;  // on 127.0.0.1
  auto server = make_tcp_store(host);
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  ::inet_pton(AF_INET, other.c_str(), &addr.sin_addr);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  EXPECT_NE(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0)
      << "the store on 127.0.0.1 accepted a connection on " << other;
  ::close(fd);
}

TEST(RendezvousTest, AMasterAddressThatIsNotThisHostsIsNamed) {
  TcpStoreOptions host;
  host.is_server = true;
  host.host = "192.0.2.1";  // TEST-NET-1: never an address of this host
  host.port = strata::runtime::find_free_port();
  try {
    make_tcp_store(host);
    FAIL() << "no error";
  } catch (const strata::CommError& e) {
    EXPECT_EQ(std::string(e.what()), "[store] cannot host the rendezvous store on 192.0.2.1:" +
                                         std::to_string(host.port) +
                                         ": 192.0.2.1 is not an address of this host; set MASTER_ADDR "
                                         "(--master-addr) to the address of the host that runs rank 0");
  }
}

}  // namespace
