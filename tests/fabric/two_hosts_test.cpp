// Two hosts on one machine: two network namespaces joined by a veth pair,
// one `strata launch` in each as node 0 and node 1. Training a few steps
// over them gives the single-host result; killing node 1 is reported by
// node 0, which exits. Needs root (as CI runs) and `ip netns`; skips with
// the reason otherwise. Only private addresses, inside namespaces the test
// makes and removes on every exit path.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

std::string strata_binary() {
  const char* dir = std::getenv("STRATA_BINARY_DIR");
  return std::string(dir ? dir : ".") + "/strata";
}

int shell(const std::string& command) {
  int status = std::system((command + " >/dev/null 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

// A child process with its output in a file.
struct Node {
  pid_t pid = -1;
  std::string log;
};

Node start(const std::vector<std::string>& argv, const std::string& log) {
  Node n;
  n.log = log;
  n.pid = ::fork();
  if (n.pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> cargv;
    for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    ::execvp(cargv[0], cargv.data());
    ::_exit(127);
  }
  return n;
}

// Waits up to `limit` for the node; returns its exit status, or -1 (and
// kills it) when it is still running.
int wait_for(Node& n, std::chrono::seconds limit) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(n.pid, &status, WNOHANG) == n.pid) {
      n.pid = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(50ms);
  }
  ::kill(n.pid, SIGKILL);
  ::waitpid(n.pid, &status, 0);
  n.pid = -1;
  return -1;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::vector<double> losses(const std::string& metrics_file) {
  std::vector<double> out;
  std::ifstream in(metrics_file);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return out;
}

class TwoHostsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string id = std::to_string(::getpid() % 100000);
    ns_[0] = "strata-h0-" + id;
    ns_[1] = "strata-h1-" + id;
    veth_[0] = "sva" + id;
    veth_[1] = "svb" + id;
    subnet_ = "10.213." + std::to_string(::getpid() % 250) + ".";
    dir_ = fs::temp_directory_path() / ("strata-two-hosts-" + id);
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    if (::geteuid() != 0) GTEST_SKIP() << "needs root to create network namespaces (CI runs as root)";
    if (shell("ip -V") != 0) GTEST_SKIP() << "the ip tool (iproute2) is missing; scripts/install-deps.sh installs it";
    for (int i = 0; i < 2; ++i) {
      if (shell("ip netns add " + ns_[i]) != 0) {
        GTEST_SKIP() << "cannot create network namespace " << ns_[i] << " (`ip netns add` failed: no permission in "
                     << "this container?)";
      }
      made_[i] = true;
    }
    std::vector<std::string> steps = {
        "ip link add " + veth_[0] + " netns " + ns_[0] + " type veth peer name " + veth_[1] + " netns " + ns_[1]};
    for (int i = 0; i < 2; ++i) {
      const std::string in = "ip netns exec " + ns_[i] + " ";
      steps.push_back(in + "ip addr add " + address(i) + "/24 dev " + veth_[i]);
      steps.push_back(in + "ip link set " + veth_[i] + " up");
      steps.push_back(in + "ip link set lo up");
    }
    for (const std::string& step : steps) {
      if (shell(step) != 0) GTEST_SKIP() << "cannot set up the namespaces: `" << step << "` failed";
    }
  }

  void TearDown() override {
    for (Node* n : {&nodes_[0], &nodes_[1]}) {
      if (n->pid > 0) {
        ::kill(n->pid, SIGKILL);
        ::waitpid(n->pid, nullptr, 0);
      }
    }
    for (int i = 0; i < 2; ++i)
      if (made_[i]) shell("ip netns del " + ns_[i]);  // takes the veth pair with it
    fs::remove_all(dir_);
  }

  std::string address(int i) const { return subnet_ + std::to_string(i + 1); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  // `strata launch` as node `i` of 2, one worker, running `strata train`.
  Node launch_node(int i, int port, const std::vector<std::string>& train_args, const std::string& log) {
    std::vector<std::string> argv = {"ip", "netns", "exec", ns_[i], strata_binary(), "launch", "--nnodes", "2",
                                     "--node-rank", std::to_string(i), "-n", "1", "--master-addr", address(0),
                                     "--master-port", std::to_string(port), "--timeout", "60", "--",
                                     strata_binary(), "train", "--num-nodes", "2", "--devices", "1"};
    argv.insert(argv.end(), train_args.begin(), train_args.end());
    return start(argv, log);
  }

  std::string ns_[2], veth_[2], subnet_;
  bool made_[2] = {false, false};
  Node nodes_[2];
  fs::path dir_;
};

const std::vector<std::string> kTrain = {"--model-size", "tiny", "--batch-size", "8", "--lr", "3e-3",
                                         "--sample-tokens", "0", "--log-every", "1", "--seed", "3"};

TEST_F(TwoHostsTest, TwoNodesTrainLikeOneHostAndNodeZeroReportsALostNode) {
  // The single-host reference: two workers on this host.
  std::vector<std::string> ref = {strata_binary(), "train", "--devices", "2", "--max-steps", "4", "--metrics-file",
                                  path("ref.jsonl")};
  ref.insert(ref.end(), kTrain.begin(), kTrain.end());
  Node single = start(ref, path("ref.log"));
  ASSERT_EQ(wait_for(single, 300s), 0) << read_file(path("ref.log"));

  const int port = 29000 + ::getpid() % 1000;
  std::vector<std::string> args = kTrain;
  args.insert(args.end(), {"--max-steps", "4", "--metrics-file", path("two.jsonl")});
  nodes_[1] = launch_node(1, port, args, path("node1.log"));
  nodes_[0] = launch_node(0, port, args, path("node0.log"));
  EXPECT_EQ(wait_for(nodes_[0], 300s), 0) << read_file(path("node0.log"));
  EXPECT_EQ(wait_for(nodes_[1], 300s), 0) << read_file(path("node1.log"));
  std::vector<double> a = losses(path("ref.jsonl")), b = losses(path("two.jsonl"));
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u) << read_file(path("node0.log"));
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << "step " << i + 1;

  // A long run; once node 0 has logged a step, node 1 dies whole.
  std::vector<std::string> long_args = kTrain;
  long_args.insert(long_args.end(), {"--max-steps", "100000", "--metrics-file", path("long.jsonl")});
  nodes_[1] = launch_node(1, port + 1, long_args, path("long1.log"));
  nodes_[0] = launch_node(0, port + 1, long_args, path("long0.log"));
  auto deadline = std::chrono::steady_clock::now() + 300s;
  while (losses(path("long.jsonl")).size() < 2 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(100ms);
  ASSERT_GE(losses(path("long.jsonl")).size(), 2u) << read_file(path("long0.log"));
  ::kill(nodes_[1].pid, SIGKILL);  // its worker follows (PR_SET_PDEATHSIG)
  wait_for(nodes_[1], 10s);
  auto killed = std::chrono::steady_clock::now();
  int status = wait_for(nodes_[0], 120s);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  std::string log0 = read_file(path("long0.log"));
  EXPECT_NE(status, -1) << "node 0 still ran 120 s after node 1 died:\n" << log0;
  EXPECT_NE(status, 0) << log0;
  EXPECT_NE(log0.find("[launcher] rank 0 "), std::string::npos) << log0;
  std::cout << "[ measured ] node 0 reported the lost node and exited " << seconds << " s after it died\n";
}

}  // namespace
