// Replicas of one step in one process: N xla devices driven by N threads of
// one process (the CPU plugin's devices, a TPU host's chips), each recording
// the same step on its own device, their collectives compiled into the
// step. The `xla` and `xla_fsdp` strategies stand on it; it is usable on
// its own:
//
//   strata::xla::ReplicaGroup replicas({0, 1});
//   // on thread r, with xla:r as its current device:
//   strata::comm::Group group(replicas.backend(r));
//   group.all_reduce(grad);          // recorded into the step, not run
//   strata::xla::mark_step();        // every replica's thread: one replicated program
//
// Note [Replicas in one process] (src/xla_device/recorder.cpp) says how the
// step runs; Note [Collectives of the replicas] (src/xla_device/replicas.cpp)
// what each collective records.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm/backend.h"

namespace strata::xla {

/// xla:devices[r] as replica r of one step, for as long as the group (or a
/// backend of it) lives. While it does, a sync on a thread whose current
/// device is a replica's (mark_step, a host read) is a collective of the
/// replicas; one replicated step at a time in a process.
class ReplicaGroup {
 public:
  /// Throws ConfigError for no device, a device the plugin does not have or
  /// one given twice, a timeout <= 0, or another group still alive.
  /// `timeout`: how long a replica waits for its peers at a step's end or
  /// a host collective (a TimeoutError names the missing replicas).
  explicit ReplicaGroup(std::vector<int> devices, std::chrono::milliseconds timeout = std::chrono::minutes(30));

  int size() const;
  /// The xla device index of each replica.
  const std::vector<int>& devices() const;

  /// The collectives backend of replica `rank` (name "xla"), for a
  /// comm::Group; called from that replica's thread. On xla tensors of its
  /// device every collective is recorded into the step (Note
  /// [Collectives of the replicas]); on CPU tensors (the Group's object
  /// and byte transfers) it runs at once between the replicas' threads.
  /// Throws ConfigError for a rank out of range.
  std::shared_ptr<comm::Backend> backend(int rank) const;

  /// Calls on_wait(r) whenever replica r is about to wait for its peers (a
  /// step's end, a host collective, a barrier), on the waiting thread with
  /// no lock held (Note [Ranks start one at a time] in placement.cpp).
  void set_on_wait(std::function<void(int)> on_wait);

  /// The steps the replicas have ended together so far (each mark_step,
  /// or host read, that all of them reached).
  int64_t steps() const;

  /// Pauses the group between runs of the replicas' threads, or resumes
  /// it (Note [Paused replicas] in src/xla_device/recorder.cpp): while
  /// paused, no sync is a collective, and any thread may use the replicas'
  /// devices one at a time. Resuming first runs what the pause left
  /// pending.
  void pause(bool paused);

  /// Replica `rank`'s thread has ended its work (until the next resume):
  /// a replica that waits for it, now or later, fails at once with a
  /// CommError naming both (Note [Replicas that wait apart] in
  /// src/xla_device/meeting.cpp). Replicas that wait at different points
  /// where none can go on fail the same way.
  void finish(int rank);

  /// Stops the replicas after one failed: every wait for a peer (a step's
  /// end, a host collective, a barrier), now or later, throws
  /// CommError(`reason`) instead of waiting for the timeout.
  void abort(const std::string& reason);

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace strata::xla
