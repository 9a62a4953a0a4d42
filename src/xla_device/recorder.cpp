// The step recorder: running every live pending value of the xla device as
// one program, and the counters of the executors that compile and run it.
//
// Note [One program per step]
// Lowered kernels (lowerings.cpp) leave each written storage holding a
// pending node; nodes are immutable and shared, so recording needs no lock
// beyond the storage's own (backward records from autograd's device
// thread). sync_pending() gathers the pending value of every live storage,
// in the order the storages were created, so the same training loop emits
// the same program text every step and the compile cache hits; builds one
// program per device whose outputs are those values; runs it; and rebinds
// each storage to its result buffer. Everything pending runs together: a
// host read in the middle of a step (.item(), .cpu(), the CPU fallback)
// runs the whole recorded step, and the rest of the step starts from the
// results as device buffers, so no part of a graph runs twice. Syncs are
// serialised by one mutex. A storage written by another thread while its
// program ran keeps the newer value (bind_result checks the node).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "strata/core/error.h"
#include "strata/xla/error.h"
#include "strata/xla/lazy_graph.h"
#include "lazy_buffer.h"
#include "meeting.h"
#include "runtime.h"

namespace strata::xla::detail {
namespace {

std::mutex& sync_mutex() {
  static std::mutex m;
  return m;
}

std::shared_mutex& recording_mutex() {
  static auto* m = new std::shared_mutex();  // used until exit: never destroyed
  return *m;
}
thread_local int recording_depth = 0;  // RecordingScopes alive on this thread

struct Executors {
  std::mutex mutex;
  std::map<int, std::unique_ptr<lazy::Executor>> by_device;
  std::map<std::vector<int>, std::unique_ptr<lazy::Executor>> replicated;  // by the replicas' devices
  lazy::GraphMetrics baseline;  // the sums at the last reset
};

Executors& executors() {
  static auto* e = new Executors();  // used until exit: never destroyed
  return *e;
}

lazy::Executor& executor(int device_index) {
  auto& e = executors();
  std::lock_guard<std::mutex> lock(e.mutex);
  auto& slot = e.by_device[device_index];
  if (!slot) slot = std::make_unique<lazy::Executor>(shared_client(), pjrt_device(device_index));
  return *slot;
}

lazy::GraphMetrics summed_locked(Executors& e) {
  lazy::GraphMetrics sum;
  std::vector<const lazy::Executor*> all;
  for (const auto& [index, exec] : e.by_device) all.push_back(exec.get());
  for (const auto& [devices, exec] : e.replicated) all.push_back(exec.get());
  for (const lazy::Executor* exec : all) {
    const lazy::GraphMetrics m = exec->metrics();
    sum.compiles += m.compiles;
    sum.cache_hits += m.cache_hits;
    sum.executions += m.executions;
    sum.ops_executed += m.ops_executed;
    sum.compile_time += m.compile_time;
    sum.execute_time += m.execute_time;
    sum.emit_time += m.emit_time;
    sum.lookup_time += m.lookup_time;
    sum.structure_hits += m.structure_hits;
    sum.programs_emitted += m.programs_emitted;
    sum.host_scalars_fed += m.host_scalars_fed;
    sum.buffers_donated += m.buffers_donated;
    sum.compile_reasons.insert(sum.compile_reasons.end(), m.compile_reasons.begin(), m.compile_reasons.end());
  }
  return sum;
}

}  // namespace

RecordingScope::RecordingScope() {
  if (recording_depth++ == 0) recording_mutex().lock_shared();
}

RecordingScope::~RecordingScope() {
  if (--recording_depth == 0) recording_mutex().unlock_shared();
}

namespace {

// Runs `values` (all on devices outside any replication) as one program
// per device and returns each value's result.
void run_per_device(const std::vector<PendingValue>& values, const lazy::Donatable& donatable,
                    std::vector<std::shared_ptr<const Buffer>>& results, const std::vector<size_t>& members_of_all) {
  std::map<int, std::vector<size_t>> by_device;
  for (size_t i : members_of_all) by_device[values[i].device_index].push_back(i);
  for (const auto& [device_index, members] : by_device) {
    std::vector<lazy::NodePtr> outputs;
    outputs.reserve(members.size());
    for (size_t i : members) outputs.push_back(values[i].node);
    std::vector<Buffer> buffers = executor(device_index).run(outputs, donatable);
    for (size_t k = 0; k < members.size(); ++k)
      results[members[k]] = std::make_shared<const Buffer>(std::move(buffers[k]));
  }
}

lazy::Donatable donate_unshared() {
  return [](const lazy::Node& p) { return p.device_buffer().use_count() == 1; };
}

}  // namespace

// Note [Replicas in one process]
// A replication makes xla:d0, xla:d1, ... the replicas of one step: one
// thread records each (its current device is the replica's), their graphs
// meet in collectives (lazy::all_reduce and its kin, recorded through the
// device's comm backend), and they run as one replicated program. So a sync
// on a replica's thread (mark_step, a host read, the CPU fallback) is a
// collective of the replicas: it waits until every replica's thread has
// started one, then the last to arrive runs every pending value as one
// run_replicated execution (each replica's values in its storages' creation
// order, which is the same on every replica when they run the same code)
// and wakes the others; an error is every replica's. A replica that does
// not arrive within the replication's timeout is named in a TimeoutError;
// a program already running is waited for however long it takes. Values
// on other devices still run one program per device; a thread of no
// replica that needs a replica's pending value is refused, since the value
// runs only with its peers.
struct Replication {
  Replication(std::vector<int> d, std::chrono::milliseconds timeout)
      : devices(std::move(d)), meeting(devices.size(), timeout, [this](int k) {
          return "replica " + std::to_string(k) + " (xla:" + std::to_string(devices[static_cast<size_t>(k)]) + ")";
        }) {}

  std::vector<int> devices;  // replica r runs on xla:devices[r]
  lazy::Executor* executor = nullptr;  // owned by executors()
  Meeting meeting;  // the ends of the steps
  std::atomic<bool> in_scope{false};  // an arrival came from inside a kernel's recording
  std::atomic<bool> paused{false};    // Note [Paused replicas]

  int replica_of(int device) const {
    for (size_t r = 0; r < devices.size(); ++r)
      if (devices[r] == device) return static_cast<int>(r);
    return -1;
  }
};

namespace {

std::mutex replication_mutex;
std::weak_ptr<Replication> active;  // at most one at a time, owned by its ReplicaGroup

// Note [Paused replicas]
// Between two runs of the replicas' threads (a Trainer's calls: Note [The
// Trainer's ranks as threads] in trainer/trainer.h) nobody records a
// replicated step, and the caller may use a replica's device as a device
// of its own: rank 0's model after fit, on the calling thread. So a paused
// replication makes no sync a collective; its devices run one program per
// device, as without a replication. What the pause left pending runs, per
// device, before the replicas resume, so their next steps start even. A
// collective of the replicas' xla tensors is refused while paused (the
// replicas' backend, replicas.cpp): it would run in a program of one
// device, without the peers its replica groups name, which XLA rejects
// only when the program runs (RET_CHECK replica_id < replica_count), far
// from the call. A sharded model's forward gathers so: under xla_fsdp the
// model is used inside a call that runs on every rank.
std::shared_ptr<Replication> active_replication() {
  std::lock_guard<std::mutex> lock(replication_mutex);
  std::shared_ptr<Replication> rep = active.lock();
  return rep && !rep->paused ? rep : nullptr;
}

std::string device_list(const std::vector<int>& devices) {
  std::string out;
  for (int d : devices) out += (out.empty() ? "xla:" : ", xla:") + std::to_string(d);
  return out;
}

// The runner's part: every pending value, the replicas' as one replicated
// program. True when a program ran.
bool run_step(Replication* rep, bool in_scope) {
  std::lock_guard<std::mutex> step(sync_mutex());
  // Note [Donating what only the step holds]
  std::unique_lock<std::shared_mutex> no_recording(recording_mutex(), std::defer_lock);
  if (!in_scope) no_recording.lock();
  const lazy::Donatable donatable = no_recording.owns_lock() ? donate_unshared() : nullptr;
  const std::vector<PendingValue> values = pending_values();
  if (values.empty()) return false;
  std::vector<std::vector<size_t>> of_replica(rep ? rep->devices.size() : 0);
  std::vector<size_t> others;
  for (size_t i = 0; i < values.size(); ++i) {
    const int r = rep ? rep->replica_of(values[i].device_index) : -1;
    if (r >= 0) of_replica[static_cast<size_t>(r)].push_back(i);
    else others.push_back(i);
  }
  std::vector<std::shared_ptr<const Buffer>> results(values.size());
  run_per_device(values, donatable, results, others);
  bool any = false;
  for (const auto& members : of_replica) any = any || !members.empty();
  if (any) {
    std::vector<std::vector<lazy::NodePtr>> outputs(of_replica.size());
    for (size_t r = 0; r < of_replica.size(); ++r)
      for (size_t i : of_replica[r]) outputs[r].push_back(values[i].node);
    std::vector<std::vector<Buffer>> buffers;
    const auto empty = std::find_if(outputs.begin(), outputs.end(), [](const auto& o) { return o.empty(); });
    if (empty == outputs.end()) {
      buffers = rep->executor->run_replicated(outputs, donatable, /*allow_independent=*/true);
    } else {
      for (size_t r = 0; r < outputs.size(); ++r) {
        STRATA_CHECK(!lazy::has_collective(outputs[r]), ConfigError, "[xla] replica ", r, " (xla:", rep->devices[r],
                     ") ends a step that holds a collective, but replica ", empty - outputs.begin(), " (xla:",
                     rep->devices[static_cast<size_t>(empty - outputs.begin())],
                     ") recorded nothing: every replica must record the same collectives");
      }
    }
    if (buffers.empty()) {
      // Note [Replicas that record different steps]
      // Replicas whose steps differ but hold no collective (a rank's own
      // extra work, a broadcast's source that computed what it sends) need
      // no peer: each runs its program on its own device.
      for (size_t r = 0; r < of_replica.size(); ++r)
        buffers.push_back(outputs[r].empty() ? std::vector<Buffer>{}
                                             : executor(rep->devices[r]).run(outputs[r], donatable));
    }
    for (size_t r = 0; r < of_replica.size(); ++r)
      for (size_t k = 0; k < of_replica[r].size(); ++k)
        results[of_replica[r][k]] = std::make_shared<const Buffer>(std::move(buffers[r][k]));
  }
  bind_results(values, results);
  return true;
}

bool sync_replica(Replication& rep, int r) {
  if (recording_depth > 0) rep.in_scope = true;
  bool ran = false;
  rep.meeting.meet(r, "the end of a step", [&] { ran = run_step(&rep, rep.in_scope.exchange(false)); });
  return ran;
}

}  // namespace

std::shared_ptr<Replication> start_replication(const std::vector<int>& devices, std::chrono::milliseconds timeout) {
  STRATA_CHECK(!devices.empty(), ConfigError, "[xla] a replicated step needs at least one device");
  STRATA_CHECK(timeout.count() > 0, ConfigError, "[xla] the replicas' timeout must be positive, got ",
               timeout.count(), " ms");
  std::vector<Device> pjrt;
  for (size_t r = 0; r < devices.size(); ++r) {
    pjrt.push_back(pjrt_device(devices[r]));  // ConfigError when out of range
    for (size_t k = 0; k < r; ++k)
      STRATA_CHECK(devices[k] != devices[r], ConfigError, "[xla] xla:", devices[r],
                   " is given twice as a replica's device (", device_list(devices), ")");
  }
  std::lock_guard<std::mutex> lock(replication_mutex);
  if (std::shared_ptr<Replication> other = active.lock()) {
    throw ConfigError("[xla] the devices " + device_list(other->devices) + " are replicas of a step already; one "
                      "replicated step at a time in a process (end the other strategy, or use its devices)");
  }
  auto rep = std::make_shared<Replication>(devices, timeout);
  {
    auto& e = executors();
    std::lock_guard<std::mutex> executors_lock(e.mutex);
    auto& slot = e.replicated[devices];
    if (!slot) slot = std::make_unique<lazy::Executor>(shared_client(), pjrt);
    rep->executor = slot.get();
  }
  active = rep;
  return rep;
}

Meeting& step_ends(Replication& replication) { return replication.meeting; }

void pause_replication(Replication& replication, bool paused) {
  if (!paused && replication.paused) sync_pending();  // while still paused: per device
  replication.paused = paused;
}

bool replication_paused(const Replication& replication) { return replication.paused; }

bool is_replica_device(c10::DeviceIndex index) {
  std::shared_ptr<Replication> rep = active_replication();
  return rep && rep->replica_of(index) >= 0;
}

bool sync_pending() {
  if (std::shared_ptr<Replication> rep = active_replication()) {
    const int r = rep->replica_of(current_device());
    if (r >= 0) return sync_replica(*rep, r);
    // A thread of no replica: what is pending on the replicas' devices is
    // theirs to run.
    for (const PendingValue& v : pending_values()) {
      STRATA_CHECK(rep->replica_of(v.device_index) < 0, xla::XlaError, "[xla] a value of xla:", v.device_index,
                   " is pending in a replicated step, and only the thread of that replica can run it (a thread "
                   "whose current device is xla:", v.device_index, "), at the same point as its peers");
    }
  }
  return run_step(nullptr, recording_depth > 0);
}

void graph_metrics(Metrics& out) {
  auto& e = executors();
  std::lock_guard<std::mutex> lock(e.mutex);
  const lazy::GraphMetrics now = summed_locked(e);
  const lazy::GraphMetrics& base = e.baseline;
  out.compiles = now.compiles - base.compiles;
  out.cache_hits = now.cache_hits - base.cache_hits;
  out.structure_hits = now.structure_hits - base.structure_hits;
  out.programs_emitted = now.programs_emitted - base.programs_emitted;
  out.executions = now.executions - base.executions;
  out.nodes_executed = now.ops_executed - base.ops_executed;
  out.buffers_donated = now.buffers_donated - base.buffers_donated;
  out.compile_seconds = std::chrono::duration<double>(now.compile_time - base.compile_time).count();
  out.execute_seconds = std::chrono::duration<double>(now.execute_time - base.execute_time).count();
  out.emit_seconds = std::chrono::duration<double>(now.emit_time - base.emit_time).count();
  out.trace_seconds += out.emit_seconds;
  out.lookup_seconds = std::chrono::duration<double>(now.lookup_time - base.lookup_time).count();
  // The reasons of the compiles since the reset, as far as they are kept.
  const size_t since = static_cast<size_t>(out.compiles);
  const size_t kept = std::min(since, now.compile_reasons.size());
  out.compile_reasons.assign(now.compile_reasons.end() - static_cast<std::ptrdiff_t>(kept), now.compile_reasons.end());
}

void reset_graph_metrics() {
  auto& e = executors();
  std::lock_guard<std::mutex> lock(e.mutex);
  e.baseline = summed_locked(e);
}

}  // namespace strata::xla::detail
