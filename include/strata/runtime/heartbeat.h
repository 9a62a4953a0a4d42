// What a worker is doing, for its launcher's stuck-rank detection: the
// training step, and the collective it is in. The collectives layer and
// the training loop report here; a heartbeat thread publishes the record
// to the launcher a few times per --hang-timeout (Note [Heartbeats]).
// Cheap: a mutex and a few stores per call; nothing at all when the
// process was not started by strata's launcher.
#pragma once

#include <cstdint>
#include <string>

namespace strata::runtime {

/// The launcher passes the heartbeat channel's file descriptor and the
/// interval through these variables.
inline constexpr const char* kEnvHeartbeatFd = "STRATA_HEARTBEAT_FD";
inline constexpr const char* kEnvHeartbeatMs = "STRATA_HEARTBEAT_MS";

/// The training loop's current step.
void report_step(int64_t step);

/// Marks this process as inside collective `label` (e.g. "all_reduce #12")
/// for the scope's lifetime.
class CollectiveScope {
 public:
  explicit CollectiveScope(const std::string& label);
  ~CollectiveScope();
  CollectiveScope(const CollectiveScope&) = delete;
  CollectiveScope& operator=(const CollectiveScope&) = delete;
};

/// One heartbeat as the launcher reads it.
struct Heartbeat {
  int64_t events = 0;   ///< changes so far (steps, collectives entered or left)
  int64_t step = -1;    ///< last reported step (-1: none)
  bool in_collective = false;
  std::string label;    ///< the collective it is in, or was last in ("" none)
  /// Parses one line; false when it is not a heartbeat.
  static bool parse(const std::string& line, Heartbeat& out);
  std::string to_line() const;
};

}  // namespace strata::runtime
