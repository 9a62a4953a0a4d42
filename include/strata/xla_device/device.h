// The `xla` device: LibTorch tensors whose storage lives in PJRT buffers.
//
// strata registers LibTorch's PrivateUse1 device under the name "xla" (on
// the first call of init() or device(), never at library load, so a process
// that does not use it is unchanged). A tensor on `xla:i` owns an ordinary
// storage whose bytes are a PJRT buffer on the plugin's device i; a write
// rebinds the storage to a new buffer (XLA buffers are immutable), so views,
// in-place ops, `Module::to` and the optimizers work as on any device.
//
// The device is lazy for the ops it lowers (element-wise arithmetic, mm and
// addmm, relu, sums and means, mse_loss, fills and copies: docs/xla.md,
// "The xla device"): their kernels record nodes of a graph instead of
// computing, and mark_step() compiles (once per distinct program) and runs
// the step. Every other op runs through a CPU fallback: the pending step is
// run first, the op's xla inputs are copied to the host, LibTorch's CPU
// kernel runs, and the outputs are uploaded. Each op that falls back is
// counted in metrics() and reported once; STRATA_XLA_FALLBACK=error makes a
// fallback an error.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace strata::xla {

/// Where find_plugin() looked, and what it found.
struct PluginSearch {
  std::string path;                ///< the plugin chosen; empty when none was found
  std::string source;              ///< "STRATA_PJRT_PLUGIN" or the folder it was found in
  std::vector<std::string> looked;  ///< every path tried, in order
};

/// The PJRT plugin the device uses: STRATA_PJRT_PLUGIN when set (it must
/// exist), else a CPU plugin installed in the Python environment's wheels
/// (the site-packages of the LibTorch wheel strata runs on, $VIRTUAL_ENV,
/// $STRATA_VENV, $STRATA_PYTHON's venv). Throws ConfigError listing where it
/// looked when none is found.
PluginSearch find_plugin();

/// Registers the "xla" device (once per process; later calls return at
/// once): the PrivateUse1 name, its device guard, hooks, allocator and
/// kernels, and creates the PJRT client of find_plugin(). Call it (or
/// device()) before the process's first backward pass: LibTorch's autograd
/// engine counts each device's threads once, at its first backward.
/// Throws ConfigError when the process already registered another
/// PrivateUse1 backend, or when no plugin is found; XlaError when the plugin
/// cannot be loaded or its client created.
void init();

/// Whether init() has completed in this process.
bool is_initialized();

/// The number of devices the plugin's client addresses (calls init()).
int device_count();

/// The LibTorch device `xla:index` (calls init()). Throws ConfigError when
/// `index` is not below device_count().
c10::Device device(int index = 0);

/// The step boundary: runs every live storage's pending value as one
/// program per device (compiled once per distinct program text, cached),
/// rebinds each storage to its result buffer, and releases the host copies
/// the fallback kept, so state between steps lives in device buffers.
/// Reading a pending tensor on the host (.cpu(), .item(), printing) and the
/// CPU fallback sync the same way, so a step's partial graph never runs
/// twice. Thread-safe. A no-op before init(). Throws XlaError when the
/// plugin refuses to compile or run the program.
void mark_step();

/// Defers a check to the end of the step: the next mark_step(), after
/// running the step, reads `ok` (a one-element bool tensor, usually on an
/// xla device and pending) and throws strata::Error(`message`) when it is
/// false. So a step can check a value it computes (a gradient norm is
/// finite) without reading it inside the step, which would run the step
/// as two programs (Note [No reads inside a lazy step] in
/// strata/strategies/accelerator.h). Checks run in the order registered; the
/// first that fails throws, and the rest are dropped with it.
void check_after_step(const at::Tensor& ok, std::string message);

/// What the device did since the process started (or reset_metrics()).
struct Metrics {
  /// Ops that ran through the CPU fallback, by operator name
  /// ("aten::addmm", "aten::add.Tensor"), with their call counts.
  std::map<std::string, int64_t> fallbacks;
  int64_t host_to_device_count = 0;  ///< buffers uploaded
  int64_t host_to_device_bytes = 0;
  int64_t device_to_host_count = 0;  ///< buffers downloaded
  int64_t device_to_host_bytes = 0;
  /// mark_step() calls that ran a step (a mark with nothing recorded since
  /// the last one, as the device loader's after the Trainer's, is none).
  int64_t steps = 0;
  /// Ops recorded into the lazy graph by lowered kernels, by operator name.
  std::map<std::string, int64_t> lowered;
  int64_t nodes_recorded = 0;  ///< graph nodes those kernels made
  int64_t compiles = 0;        ///< programs compiled (a new program text)
  int64_t cache_hits = 0;      ///< programs found compiled
  /// Of the cache hits, those found by the graph's structure, without
  /// emitting the program's text (Note [Programs known by their structure]
  /// in strata/xla/lazy_graph.h).
  int64_t structure_hits = 0;
  int64_t programs_emitted = 0;  ///< programs whose text was built
  int64_t executions = 0;      ///< programs run (mark_step and syncs)
  int64_t nodes_executed = 0;  ///< op nodes in the programs run
  /// Buffers the programs consumed (their memory reused for the results):
  /// the old values of the parameters and optimizer state a step rewrote.
  int64_t buffers_donated = 0;
  /// Why each program was compiled (what differed from the one before),
  /// oldest first, the last 32 kept.
  std::vector<std::string> compile_reasons;
  /// Time in the lowered kernels recording the graph, and in emitting
  /// each program's text from it (tracing): record + emit.
  double trace_seconds = 0;
  double emit_seconds = 0;    ///< of trace_seconds, emitting programs' text
  double lookup_seconds = 0;  ///< finding programs in the compile cache
  double compile_seconds = 0;  ///< compiling new programs
  double execute_seconds = 0;  ///< running programs
  /// Uploads and downloads of storages (host scalars fed to a program are
  /// part of execute_seconds).
  double transfer_seconds = 0;

  /// Total fallback calls over every op.
  int64_t fallback_calls() const;
};

/// A snapshot of the counters.
Metrics metrics();

/// One line for a person: programs compiled (and the time), cache hits,
/// executions, fallbacks (by op, the most frequent first), and the time in
/// tracing, execution and transfers, with the bytes moved.
std::string summary(const Metrics& metrics);

/// Sets every counter to zero. Ops already reported stay reported.
void reset_metrics();

}  // namespace strata::xla
