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
#include <chrono>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "strata/xla/lazy_graph.h"
#include "lazy_buffer.h"
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
  for (const auto& [index, exec] : e.by_device) {
    const lazy::GraphMetrics m = exec->metrics();
    sum.compiles += m.compiles;
    sum.cache_hits += m.cache_hits;
    sum.executions += m.executions;
    sum.ops_executed += m.ops_executed;
    sum.compile_time += m.compile_time;
    sum.execute_time += m.execute_time;
    sum.emit_time += m.emit_time;
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

bool sync_pending() {
  std::lock_guard<std::mutex> step(sync_mutex());
  // Note [Donating what only the step holds]
  std::unique_lock<std::shared_mutex> no_recording(recording_mutex(), std::defer_lock);
  if (recording_depth == 0) no_recording.lock();
  lazy::Donatable donatable;
  if (no_recording.owns_lock())
    donatable = [](const lazy::Node& p) { return p.device_buffer().use_count() == 1; };
  const std::vector<PendingValue> values = pending_values();
  if (values.empty()) return false;
  // One program per device, outputs in the storages' creation order.
  std::map<int, std::vector<size_t>> by_device;
  for (size_t i = 0; i < values.size(); ++i) by_device[values[i].device_index].push_back(i);
  std::vector<std::shared_ptr<const Buffer>> results(values.size());
  for (const auto& [device_index, members] : by_device) {
    std::vector<lazy::NodePtr> outputs;
    outputs.reserve(members.size());
    for (size_t i : members) outputs.push_back(values[i].node);
    std::vector<Buffer> buffers = executor(device_index).run(outputs, donatable);
    for (size_t k = 0; k < members.size(); ++k)
      results[members[k]] = std::make_shared<const Buffer>(std::move(buffers[k]));
  }
  bind_results(values, results);
  return true;
}

void graph_metrics(Metrics& out) {
  auto& e = executors();
  std::lock_guard<std::mutex> lock(e.mutex);
  const lazy::GraphMetrics now = summed_locked(e);
  const lazy::GraphMetrics& base = e.baseline;
  out.compiles = now.compiles - base.compiles;
  out.cache_hits = now.cache_hits - base.cache_hits;
  out.executions = now.executions - base.executions;
  out.nodes_executed = now.ops_executed - base.ops_executed;
  out.buffers_donated = now.buffers_donated - base.buffers_donated;
  out.compile_seconds = std::chrono::duration<double>(now.compile_time - base.compile_time).count();
  out.execute_seconds = std::chrono::duration<double>(now.execute_time - base.execute_time).count();
  out.trace_seconds += std::chrono::duration<double>(now.emit_time - base.emit_time).count();
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
