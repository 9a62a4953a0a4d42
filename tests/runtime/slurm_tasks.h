// Starting processes as srun starts a job step's tasks, without SLURM: each
// gets the variables srun exports (SLURM_PROCID, SLURM_NTASKS, the node
// list, ...) and none of the launcher variables of the test's own process.
// For tests of strata under SLURM (runtime/slurm_test.cpp, threads_test.cpp,
// runtime/slurm_train_test.cpp).
#pragma once

#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

extern char** environ;

namespace strata::testing {

/// A step of `nodes` x `tasks_per_node` tasks, as `srun -N nodes
/// --ntasks-per-node tasks_per_node` starts it.
struct SrunStep {
  int nodes = 1;
  int tasks_per_node = 1;
  std::string nodelist = "localhost";  ///< SLURM_JOB_NODELIST
  std::string job_id = "1";            ///< SLURM_JOB_ID (MASTER_PORT = 15000 + its last 4 digits)

  /// What srun exports to task `rank`.
  std::map<std::string, std::string> vars(int rank) const {
    return {{"SLURM_JOB_ID", job_id},
            {"SLURM_STEP_ID", "0"},
            {"SLURM_JOB_NODELIST", nodelist},
            {"SLURM_NODELIST", nodelist},
            {"SLURM_NNODES", std::to_string(nodes)},
            {"SLURM_NTASKS", std::to_string(nodes * tasks_per_node)},
            {"SLURM_NTASKS_PER_NODE", std::to_string(tasks_per_node)},
            {"SLURM_PROCID", std::to_string(rank)},
            {"SLURM_NODEID", std::to_string(rank / tasks_per_node)},
            {"SLURM_LOCALID", std::to_string(rank % tasks_per_node)}};
  }
};

/// A SLURM job id whose default port (15000 + id % 10000, Note [Default
/// ports under MPI and SLURM]) is free on loopback now.
inline std::string job_id_with_free_port() {
  for (int k = 0; k < 10000; ++k) {
    const int offset = (static_cast<int>(::getpid()) + 7 * k) % 10000;
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(15000 + offset));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(fd);
    if (free) return std::to_string(70000 + offset);
  }
  return "1";
}

/// This process's environment without any launcher's variables (strata's,
/// torchrun's, Open MPI's, SLURM's, the thread count), plus `vars`.
inline std::vector<std::string> task_environment(const std::map<std::string, std::string>& vars) {
  static const char* const kDropped[] = {"RANK",        "LOCAL_RANK",      "WORLD_SIZE",       "LOCAL_WORLD_SIZE",
                                         "NODE_RANK",   "MASTER_ADDR",     "MASTER_PORT",      "STRATA_JOB_TOKEN",
                                         "OMP_NUM_THREADS", "STRATA_HOST_ID", "STRATA_TIMEOUT"};
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    const std::string entry(*e);
    const std::string name = entry.substr(0, entry.find('='));
    bool drop = name.rfind("SLURM_", 0) == 0 || name.rfind("OMPI_", 0) == 0 || name.rfind("TORCHELASTIC_", 0) == 0;
    for (const char* d : kDropped) drop = drop || name == d;
    if (!drop) out.push_back(entry);
  }
  for (const auto& [name, value] : vars) out.push_back(name + "=" + value);
  return out;
}

/// A started task: its pid and the file with its stdout and stderr.
struct Task {
  pid_t pid = -1;
  std::string log;
};

/// Starts `argv` (argv[0] a path) with exactly `env`, output to `log`.
inline Task start_task(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                       const std::string& log) {
  Task t;
  t.log = log;
  t.pid = ::fork();
  if (t.pid == 0) {
    int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    std::vector<char*> cargv, cenv;
    for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    for (const std::string& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
    cenv.push_back(nullptr);
    ::execve(cargv[0], cargv.data(), cenv.data());
    ::_exit(127);
  }
  return t;
}

/// Waits up to `limit` for the task; its exit status (128+signal when
/// killed), or -1 after killing it when it still ran.
inline int wait_task(Task& t, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (std::chrono::steady_clock::now() < deadline) {
    if (::waitpid(t.pid, &status, WNOHANG) == t.pid) {
      t.pid = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(t.pid, SIGKILL);
  ::waitpid(t.pid, &status, 0);
  t.pid = -1;
  return -1;
}

inline std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

}  // namespace strata::testing
