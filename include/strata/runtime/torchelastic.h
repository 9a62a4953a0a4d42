// Running under torchrun / TorchElastic (Note [Workers of torchrun] in
// torchelastic.cpp): the variables its agent sets, joining the agent's own
// c10d store, and the error file its failure summary reads.
#pragma once

#include <chrono>
#include <exception>
#include <map>
#include <memory>
#include <string>

namespace strata::runtime {

class Store;
struct Environment;

/// What torchrun's agent told this worker (TORCHELASTIC_* variables).
struct ElasticRun {
  std::string run_id;       ///< TORCHELASTIC_RUN_ID ("": not under torchrun)
  int restart_count = 0;    ///< TORCHELASTIC_RESTART_COUNT: 0 first, 1 after one restart, ...
  int max_restarts = 0;     ///< TORCHELASTIC_MAX_RESTARTS
  bool agent_store = false; ///< TORCHELASTIC_USE_AGENT_STORE=True: the agent hosts a c10d store on MASTER_PORT
  std::string error_file;   ///< TORCHELASTIC_ERROR_FILE ("": none)

  /// True when torchrun (or another TorchElastic agent) started this worker.
  bool active() const { return !run_id.empty(); }

  /// Reads the process environment. Throws ConfigError naming a malformed
  /// variable (a count that is not a number from 0 to 1000000, a run id
  /// longer than 256 bytes, a TORCHELASTIC_USE_AGENT_STORE other than
  /// True/False).
  static ElasticRun from_env();
  /// The same from `vars` (tests).
  static ElasticRun from_map(const std::map<std::string, std::string>& vars);
};

/// The rendezvous store of a worker whose agent hosts one (elastic.agent_store):
/// a client of torchrun's c10d TCPStore on env.master_addr:env.master_port
/// (LibTorch's own client), under the prefix "strata/<run id>/attempt-<restart
/// count>" so that a restarted group never reads an earlier attempt's keys;
/// every rank claims its rank there (two workers with one rank fail, naming
/// it) and waits for all of them (join_ranks). Throws CommError when the
/// store cannot be reached in `timeout`, TimeoutError naming the ranks that
/// never joined.
std::shared_ptr<Store> make_agent_store(const Environment& env, const ElasticRun& elastic,
                                        std::chrono::milliseconds timeout);

/// Writes `what` to TORCHELASTIC_ERROR_FILE in the JSON layout torchrun's
/// failure summary reads (torch.distributed.elastic's ErrorHandler:
/// {"message": {"message": "<type>: <what>", "extraInfo": {"py_callstack":
/// ..., "timestamp": "<seconds>"}}}), atomically; does nothing when the
/// variable is unset. `type` names the error ("strata::ConfigError").
/// Never throws (it runs while a process is failing).
void record_error_file(const std::string& type, const std::string& what) noexcept;

/// record_error_file for `error`, its type demangled.
void record_error_file(const std::exception& error) noexcept;

/// Under TorchElastic with an error file, makes an exception that escapes
/// a worker's main() (std::terminate) record itself in that file before
/// the previous terminate handler runs, so torchrun's summary names it for
/// any program, not only `strata`. Idempotent; nothing elsewhere.
void record_uncaught_errors();

}  // namespace strata::runtime
