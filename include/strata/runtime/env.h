// Where this process stands in a multi-process job: its ranks, the world
// size and the rendezvous address, read from the environment variables a
// launcher sets (strata launch and torchrun's names, Open MPI's, SLURM's).
#pragma once

#include <map>
#include <string>

namespace strata::runtime {

/// Environment variables strata's launcher sets for each worker (the
/// torchrun names, so programs written for torchrun work unchanged).
inline constexpr const char* kEnvRank = "RANK";
inline constexpr const char* kEnvLocalRank = "LOCAL_RANK";
inline constexpr const char* kEnvWorldSize = "WORLD_SIZE";
inline constexpr const char* kEnvLocalWorldSize = "LOCAL_WORLD_SIZE";
inline constexpr const char* kEnvNodeRank = "NODE_RANK";
inline constexpr const char* kEnvMasterAddr = "MASTER_ADDR";
inline constexpr const char* kEnvMasterPort = "MASTER_PORT";
/// Rendezvous timeout in seconds (optional; strata's launcher passes its
/// --timeout through it).
inline constexpr const char* kEnvTimeout = "STRATA_TIMEOUT";
/// The job's token: workers show it to the rendezvous store, which refuses
/// a client without it (strata launch makes one per job).
inline constexpr const char* kEnvJobToken = "STRATA_JOB_TOKEN";

/// This process's place in the job.
struct Environment {
  int rank = 0;              ///< global rank, 0..world_size-1
  int local_rank = 0;        ///< rank among the workers on this host
  int world_size = 1;        ///< number of workers in the job
  int local_world_size = 1;  ///< number of workers on this host
  int node_rank = 0;         ///< index of this host, 0..num_nodes-1
  int num_nodes = 1;         ///< number of hosts (world_size / local_world_size)
  std::string master_addr = "127.0.0.1";  ///< host of global rank 0's store
  int master_port = 0;                    ///< port of that store (0: unset)
  int timeout_s = 0;  ///< rendezvous timeout from STRATA_TIMEOUT (0: unset)
  std::string job_token;  ///< STRATA_JOB_TOKEN ("": none)
  /// Which variables described the job: "strata" (torchrun names),
  /// "openmpi", "slurm", or "none" (a plain single process).
  std::string source = "none";

  /// True when a launcher (or MPI/SLURM) started this process as one of
  /// several workers; false for a plain single process.
  bool launched() const { return source != "none"; }

  /// Reads the process environment. Checks in order: torchrun-style names
  /// (RANK, WORLD_SIZE, ...), Open MPI (OMPI_COMM_WORLD_*), SLURM
  /// (SLURM_PROCID, ...). None set: a single process (rank 0 of 1).
  /// Throws ConfigError naming the variable when one is malformed or
  /// when a set of variables is incomplete (for example RANK without
  /// WORLD_SIZE), or when the values contradict each other.
  static Environment from_env();

  /// Same as from_env() but reads from `vars` instead of the process
  /// environment (for tests and for the launcher's own checks).
  static Environment from_map(const std::map<std::string, std::string>& vars);

  /// The torchrun-style variables that describe this environment, as the
  /// launcher passes them to a worker.
  std::map<std::string, std::string> to_vars() const;

  /// "rank R/W (local L/LW, node N/NN)" for messages.
  std::string describe() const;
};

}  // namespace strata::runtime
