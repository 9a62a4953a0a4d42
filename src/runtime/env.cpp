// Reads a worker's place in the job from the environment: the torchrun
// names strata's launcher sets, or Open MPI's, or SLURM's. Every variable
// is checked; a malformed, missing or contradictory one is a ConfigError
// that names it and says what to set.
#include "strata/runtime/env.h"

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <optional>

#include "strata/core/error.h"
#include "strata/runtime/slurm.h"

extern char** environ;

namespace strata::runtime {
namespace {

using Vars = std::map<std::string, std::string>;

// Note [Default ports under MPI and SLURM]
// torchrun-style launchers pass MASTER_PORT; mpirun and srun do not, and the
// ranks cannot agree on a free port without a store. When MASTER_PORT is
// unset we fall back to a port every rank can compute: under SLURM
// 15000 + the last four digits of the job id (Lightning's choice, so two
// jobs sharing a node rarely collide), under Open MPI torchrun's 29500.
constexpr int kDefaultMpiPort = 29500;
constexpr int kSlurmPortBase = 15000;

std::optional<std::string> lookup(const Vars& vars, const std::string& name) {
  auto it = vars.find(name);
  if (it == vars.end()) return std::nullopt;
  return it->second;
}

bool has(const Vars& vars, const std::string& name) { return vars.count(name) != 0; }

// Parses a whole string as a decimal int; throws ConfigError naming `name`.
int parse_int(const std::string& name, const std::string& text) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  long value = std::strtol(begin, &end, 10);
  bool ok = !text.empty() && end == begin + text.size() && errno == 0 && value >= INT_MIN && value <= INT_MAX &&
            !std::isspace(static_cast<unsigned char>(text[0]));
  STRATA_CHECK(ok, ConfigError, "[env] ", name, "='", text, "' is not an integer");
  return static_cast<int>(value);
}

std::optional<int> optional_int(const Vars& vars, const std::string& name) {
  auto text = lookup(vars, name);
  if (!text) return std::nullopt;
  return parse_int(name, *text);
}

int required_int(const Vars& vars, const std::string& name, const std::string& because, const std::string& meaning) {
  auto text = lookup(vars, name);
  STRATA_CHECK(text.has_value(), ConfigError, "[env] ", because, " but ", name, " is not; set ", name, " to ",
               meaning);
  return parse_int(name, *text);
}

void check_positive(const char* name, int value) {
  STRATA_CHECK(value >= 1, ConfigError, "[env] ", name, "=", value, " must be at least 1");
}

// The variable names one source uses, so that checks name what the user set.
struct Names {
  const char* rank;
  const char* world_size;
  const char* local_rank;
  const char* local_world_size;
  const char* node_rank;
  const char* num_nodes;
};

// Checks that the values agree with each other; throws naming the variables.
void check_consistent(const Environment& env, const Names& names) {
  STRATA_CHECK(env.world_size >= 1, ConfigError, "[env] ", names.world_size, "=", env.world_size,
               " must be at least 1");
  STRATA_CHECK(env.rank >= 0 && env.rank < env.world_size, ConfigError, "[env] ", names.rank, "=", env.rank,
               " is outside 0..", env.world_size - 1, " (", names.world_size, "=", env.world_size,
               "); each worker needs a distinct rank below the world size");
  STRATA_CHECK(env.local_world_size >= 1 && env.local_world_size <= env.world_size, ConfigError, "[env] ",
               names.local_world_size, "=", env.local_world_size, " must be between 1 and ", names.world_size, "=",
               env.world_size);
  STRATA_CHECK(env.local_rank >= 0 && env.local_rank < env.local_world_size, ConfigError, "[env] ", names.local_rank,
               "=", env.local_rank, " is outside 0..", env.local_world_size - 1, " (", names.local_world_size, "=",
               env.local_world_size, ")");
  STRATA_CHECK(env.num_nodes >= 1, ConfigError, "[env] ", names.num_nodes, "=", env.num_nodes, " must be at least 1");
  STRATA_CHECK(env.node_rank >= 0 && env.node_rank < env.num_nodes, ConfigError, "[env] ", names.node_rank, "=",
               env.node_rank, " is outside 0..", env.num_nodes - 1, " (", env.num_nodes, " nodes)");
  STRATA_CHECK(env.master_port >= 0 && env.master_port <= 65535, ConfigError, "[env] MASTER_PORT=", env.master_port,
               " is not a TCP port (1..65535)");
  STRATA_CHECK(env.timeout_s >= 0, ConfigError, "[env] ", kEnvTimeout, "=", env.timeout_s,
               " must be a positive number of seconds");
  STRATA_CHECK(!env.master_addr.empty(), ConfigError, "[env] MASTER_ADDR is set but empty; set it to the host of rank 0");
}

// MASTER_ADDR, MASTER_PORT and STRATA_TIMEOUT, shared by every source.
void read_common(const Vars& vars, Environment& env) {
  if (auto addr = lookup(vars, kEnvMasterAddr)) env.master_addr = *addr;
  if (auto token = lookup(vars, kEnvJobToken)) env.job_token = *token;
  if (auto port = optional_int(vars, kEnvMasterPort)) {
    STRATA_CHECK(*port >= 1 && *port <= 65535, ConfigError, "[env] MASTER_PORT=", *port,
                 " is not a TCP port (1..65535)");
    env.master_port = *port;
  }
  if (auto timeout = optional_int(vars, kEnvTimeout)) {
    STRATA_CHECK(*timeout > 0, ConfigError, "[env] ", kEnvTimeout, "=", *timeout,
                 " must be a positive number of seconds");
    env.timeout_s = *timeout;
  }
}

// A job that spans hosts needs MASTER_ADDR: 127.0.0.1 would be wrong.
void require_master_addr_when_multinode(const Vars& vars, const Environment& env, const char* source) {
  STRATA_CHECK(env.num_nodes == 1 || has(vars, kEnvMasterAddr), ConfigError, "[env] the ", source, " job spans ",
               env.num_nodes, " nodes but MASTER_ADDR is not set; set MASTER_ADDR to the host name or address of "
               "the node that runs rank 0");
}

Environment from_torchrun(const Vars& vars) {
  Environment env;
  env.source = "strata";
  const std::string because = has(vars, kEnvRank) ? "RANK is set" : "a launcher variable is set";
  env.rank = required_int(vars, kEnvRank, has(vars, kEnvWorldSize) ? "WORLD_SIZE is set" : because,
                          "this worker's global rank (0..WORLD_SIZE-1)");
  env.world_size = required_int(vars, kEnvWorldSize, because, "the number of workers");
  check_positive(kEnvWorldSize, env.world_size);
  env.local_world_size = optional_int(vars, kEnvLocalWorldSize).value_or(env.world_size);
  check_positive(kEnvLocalWorldSize, env.local_world_size);
  env.local_rank = optional_int(vars, kEnvLocalRank).value_or(env.rank % env.local_world_size);
  env.num_nodes = (env.world_size + env.local_world_size - 1) / env.local_world_size;
  env.node_rank = optional_int(vars, kEnvNodeRank).value_or(env.rank / env.local_world_size);
  read_common(vars, env);
  check_consistent(env, {kEnvRank, kEnvWorldSize, kEnvLocalRank, kEnvLocalWorldSize, kEnvNodeRank,
                         "the number of nodes (WORLD_SIZE/LOCAL_WORLD_SIZE)"});
  return env;
}

Environment from_openmpi(const Vars& vars) {
  Environment env;
  env.source = "openmpi";
  const std::string because =
      has(vars, "OMPI_COMM_WORLD_RANK") ? "OMPI_COMM_WORLD_RANK is set" : "OMPI_COMM_WORLD_SIZE is set";
  env.rank = required_int(vars, "OMPI_COMM_WORLD_RANK", because, "this process's rank (mpirun sets it)");
  env.world_size = required_int(vars, "OMPI_COMM_WORLD_SIZE", because, "the number of processes (mpirun sets it)");
  check_positive("OMPI_COMM_WORLD_SIZE", env.world_size);
  env.local_world_size = optional_int(vars, "OMPI_COMM_WORLD_LOCAL_SIZE").value_or(env.world_size);
  check_positive("OMPI_COMM_WORLD_LOCAL_SIZE", env.local_world_size);
  env.local_rank = optional_int(vars, "OMPI_COMM_WORLD_LOCAL_RANK").value_or(env.rank % env.local_world_size);
  env.num_nodes = (env.world_size + env.local_world_size - 1) / env.local_world_size;
  env.node_rank = env.rank / env.local_world_size;
  env.master_port = kDefaultMpiPort;  // Note [Default ports under MPI and SLURM]
  read_common(vars, env);
  check_consistent(env, {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                         "OMPI_COMM_WORLD_LOCAL_SIZE", "the node index (rank / local size)", "the number of nodes"});
  require_master_addr_when_multinode(vars, env, "Open MPI");
  return env;
}

Environment from_slurm(const Vars& vars) {
  Environment env;
  env.source = "slurm";
  const std::string because = "SLURM_PROCID is set";
  env.rank = parse_int("SLURM_PROCID", *lookup(vars, "SLURM_PROCID"));
  env.world_size = required_int(vars, "SLURM_NTASKS", because, "the number of tasks (srun --ntasks)");
  check_positive("SLURM_NTASKS", env.world_size);
  env.num_nodes = optional_int(vars, "SLURM_NNODES").value_or(1);
  check_positive("SLURM_NNODES", env.num_nodes);
  if (auto per_node = optional_int(vars, "SLURM_NTASKS_PER_NODE")) {
    env.local_world_size = *per_node;
  } else {
    STRATA_CHECK(env.world_size % env.num_nodes == 0, ConfigError, "[env] SLURM_NTASKS=", env.world_size,
                 " tasks do not divide evenly over SLURM_NNODES=", env.num_nodes,
                 " nodes and SLURM_NTASKS_PER_NODE is not set; run srun with --ntasks-per-node");
    env.local_world_size = env.world_size / env.num_nodes;
  }
  check_positive("SLURM_NTASKS_PER_NODE", env.local_world_size);
  env.local_rank = optional_int(vars, "SLURM_LOCALID").value_or(env.rank % env.local_world_size);
  env.node_rank = optional_int(vars, "SLURM_NODEID").value_or(env.rank / env.local_world_size);
  // Note [Default ports under MPI and SLURM]
  env.master_port = kDefaultMpiPort;
  if (auto job = lookup(vars, "SLURM_JOB_ID")) {
    int id = parse_int("SLURM_JOB_ID", *job);
    env.master_port = kSlurmPortBase + id % 10000;
  }
  read_common(vars, env);
  check_consistent(env, {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", "SLURM_NODEID",
                         "SLURM_NNODES"});
  // Note [MASTER_ADDR under SLURM]
  // srun says where every task runs but not where rank 0's store listens;
  // task 0 runs on the first host of the step's node list, so that host
  // is MASTER_ADDR unless the user set one. The step's list
  // (SLURM_STEP_NODELIST) comes first: a step on part of the allocation
  // starts on its own first node; the job's (SLURM_JOB_NODELIST, or the
  // older SLURM_NODELIST) is the same list for a step over the whole
  // allocation, and what a hand-written environment sets. A job on one
  // node keeps 127.0.0.1: every task is on this host.
  if (env.num_nodes > 1 && !has(vars, kEnvMasterAddr)) {
    for (const char* name : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}) {
      if (auto list = lookup(vars, name)) {
        env.master_addr = first_host(*list, name);
        return env;
      }
    }
  }
  STRATA_CHECK(env.num_nodes == 1 || has(vars, kEnvMasterAddr), ConfigError, "[env] the SLURM job spans ",
               env.num_nodes, " nodes but neither SLURM_JOB_NODELIST nor MASTER_ADDR is set; srun sets "
               "SLURM_JOB_NODELIST, else set MASTER_ADDR to the host name or address of the node that runs rank 0");
  return env;
}

// Note [SLURM tasks and the batch script]
// SLURM exports SLURM_PROCID, SLURM_NTASKS and the rest to the job's batch
// script (and to salloc's shell) as well as to the tasks srun starts; only
// srun's tasks also get a step id (SLURM_STEP_ID, or SLURM_STEPID in older
// releases). Taking the batch script for task 0 of SLURM_NTASKS tasks
// would leave `strata train --devices 2` there waiting for tasks that never
// start, until the rendezvous times out. So a process without a step id is
// what it is, a single process: strata starts the workers it asks for
// itself, on this node (a job over several nodes is refused at once: one
// process cannot start the other nodes' workers; srun can). A step of one
// task (`srun -n1`, `srun --pty bash`) is a single process too, which may
// likewise start workers of its own.
bool srun_task(const Vars& vars) {
  if (!has(vars, "SLURM_PROCID")) return false;
  if (!has(vars, "SLURM_STEP_ID") && !has(vars, "SLURM_STEPID")) return false;
  auto tasks = lookup(vars, "SLURM_NTASKS");
  return !tasks || *tasks != "1";
}

}  // namespace

Environment Environment::from_map(const Vars& vars) {
  if (has(vars, kEnvRank) || has(vars, kEnvWorldSize) || has(vars, kEnvLocalRank) ||
      has(vars, kEnvLocalWorldSize)) {
    return from_torchrun(vars);
  }
  if (has(vars, "OMPI_COMM_WORLD_RANK") || has(vars, "OMPI_COMM_WORLD_SIZE")) return from_openmpi(vars);
  if (srun_task(vars)) return from_slurm(vars);
  Environment env;
  read_common(vars, env);
  return env;
}

Environment Environment::from_env() {
  Vars vars;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string text(*entry);
    auto eq = text.find('=');
    if (eq == std::string::npos) continue;
    vars.emplace(text.substr(0, eq), text.substr(eq + 1));
  }
  return from_map(vars);
}

Vars Environment::to_vars() const {
  Vars vars{{kEnvRank, std::to_string(rank)},
            {kEnvLocalRank, std::to_string(local_rank)},
            {kEnvWorldSize, std::to_string(world_size)},
            {kEnvLocalWorldSize, std::to_string(local_world_size)},
            {kEnvNodeRank, std::to_string(node_rank)},
            {kEnvMasterAddr, master_addr}};
  if (master_port != 0) vars[kEnvMasterPort] = std::to_string(master_port);
  if (timeout_s != 0) vars[kEnvTimeout] = std::to_string(timeout_s);
  if (!job_token.empty()) vars[kEnvJobToken] = job_token;
  return vars;
}

std::string Environment::describe() const {
  return detail::cat("rank ", rank, "/", world_size, " (local ", local_rank, "/", local_world_size, ", node ",
                     node_rank, "/", num_nodes, ")");
}

}  // namespace strata::runtime
