// The process-wide state of the xla device, shared by its sources: the
// PJRT client, the current device of each thread, the generators, and the
// counters behind strata::xla::metrics().
#pragma once

#include <ATen/core/Generator.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "strata/xla/client.h"
#include "strata/xla_device/device.h"

namespace torch {
class Library;
}

namespace strata::xla::detail {

/// The client made by init(); throws XlaError before init().
const Client& client();
/// The client's addressable device `index`; throws ConfigError when out
/// of range.
const Device& pjrt_device(int index);
int addressable_device_count();

/// This thread's current xla device (the device guard's).
c10::DeviceIndex current_device();
void set_current_device(c10::DeviceIndex index);

/// The default generator of xla:`index` (-1: the current device).
/// Note [Generators on the host]: a CPU generator, since the random ops run
/// through the CPU fallback.
const at::Generator& default_generator(c10::DeviceIndex index);

/// Counts one transfer of `bytes` that took `took`.
void count_upload(size_t bytes, std::chrono::nanoseconds took);
void count_download(size_t bytes, std::chrono::nanoseconds took);
/// Counts a fallback of `op`; true on its first one in this process.
bool count_fallback(const std::string& op);
/// Counts one op recorded into the lazy graph by a lowered kernel `op`
/// ("aten::add.out") that made `nodes` graph nodes in `took`.
void count_lowered(const char* op, int64_t nodes, std::chrono::nanoseconds took);

/// The shared PJRT client made by init().
std::shared_ptr<const Client> shared_client();

/// Runs every live pending value of every device as one program per
/// device and rebinds their storages to the results (recorder.cpp; Note
/// [One program per step]); on a replica's thread, a collective of the
/// replicas that runs theirs as one replicated program (Note [Replicas in
/// one process]). A no-op when nothing is pending; true when this call ran
/// a program (on a replica, the call that ran it for all).
bool sync_pending();
/// True when xla:`index` is a replica of the running replicated step
/// (recorder.cpp): its values are its own thread's to run and read.
bool is_replica_device(c10::DeviceIndex index);

/// Makes xla:devices[r] replica r of one replicated step (Note [Replicas
/// in one process] in recorder.cpp) while the returned object lives; a
/// replica missing for `timeout` at a step's end is a TimeoutError. Throws
/// ConfigError for no device, a device out of range or given twice, a
/// timeout <= 0, or another replication still alive.
struct Replication;
class Meeting;
std::shared_ptr<Replication> start_replication(const std::vector<int>& devices, std::chrono::milliseconds timeout);
/// Where the replicas meet at the end of each step (to abort them, hear
/// of their waits, count their steps: meeting.h).
Meeting& step_ends(Replication& replication);
/// Note [Paused replicas] (recorder.cpp).
void pause_replication(Replication& replication, bool paused);
/// True while `replication` is paused.
bool replication_paused(const Replication& replication);

/// Held by each lowered kernel while it records (the Recorder of
/// lowering.h): a shared hold on the step, so that sync_pending, which takes
/// it exclusively, never runs between a kernel's reading of its inputs'
/// nodes and its writing of its output's (Note [Donating what only the
/// step holds] in recorder.cpp). Re-entrant on one thread; a sync a kernel
/// starts on its own thread runs without the exclusive hold, and donates
/// nothing.
class RecordingScope {
 public:
  RecordingScope();
  ~RecordingScope();
  RecordingScope(const RecordingScope&) = delete;
  RecordingScope& operator=(const RecordingScope&) = delete;
};

/// The graph counters of every device's executor since the last
/// reset_metrics() (recorder.cpp): filled into `out`.
void graph_metrics(Metrics& out);
void reset_graph_metrics();

/// The boxed CPU fallback every op without a lowering takes (kernels.cpp,
/// Note [The CPU fallback]); lowered kernels call it when a case is not
/// lowered.
void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

/// Throws XlaError: `op` got `t`, a tensor of another device (not a 0-dim
/// CPU scalar), beside xla tensors (kernels.cpp).
[[noreturn]] void throw_other_device(const std::string& op, const at::Tensor& t);

/// Registers the aten kernels and the fallback on PrivateUse1 (kernels.cpp).
void register_kernels();
/// Records the copy of the xla tensor `src` into the xla tensor `dst` (a
/// cast and a broadcast) when both are lowerable (Note [What is lowered]
/// in lowerings.cpp); false, having changed nothing, when not.
bool lower_copy(const at::Tensor& src, const at::Tensor& dst);
/// Registers the lowered kernels (lowerings.cpp) on `library`.
void register_lowerings(torch::Library& library);

}  // namespace strata::xla::detail
