// The lazy graph of a step: values recorded as they are computed and
// emitted as one StableHLO function when the step is marked (the lazy xla
// device's core; docs/xla.md, "The lazy graph").
//
// A Node is immutable once made and shared: a tensor's storage holds the
// node of its current value, the nodes that use it hold it as an input, and
// a node lives while anyone holds it. So recording needs no lock (backward
// records from autograd's device thread while the main thread holds other
// nodes), and a step's program is whatever the live outputs reach.
//
// Note [Graph parameters]
// A step's inputs are parameters of the emitted function: device buffers
// (weights, optimizer state, batches) and host scalars that change from
// step to step (learning rate, Adam's bias corrections), fed when the step
// runs, so the program text, and with it the compile cache's key, stays the
// same from step to step. Only structural constants (0, +-1, eps,
// exponents, -inf) are baked into the text, by the ops that emit them.
//
// Nothing here depends on LibTorch.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata/xla/client.h"
#include "strata/xla/stablehlo.h"

namespace strata::xla::lazy {

class Node;
using NodePtr = std::shared_ptr<const Node>;

/// Emits one op: its inputs' values in the function being built in, its
/// result out.
using EmitFn = std::function<stablehlo::Value(stablehlo::Function&, const std::vector<stablehlo::Value>&)>;

/// A value of the graph: a parameter (Note [Graph parameters]) or the
/// result of an op.
class Node {
 public:
  enum class Kind { kBuffer, kHostScalar, kOp };

  /// A device buffer fed to the step.
  static NodePtr buffer(std::shared_ptr<const Buffer> buffer, stablehlo::Type type);
  /// A host scalar fed to the step (a 0-dim value of `dtype`).
  static NodePtr host_scalar(double value, ElementType dtype);
  /// The result of `op` (a name for metrics and messages: "add", "mm")
  /// applied to `inputs`, of `type`, emitted by `emit`. Throws ConfigError
  /// for a null input or emitter.
  static NodePtr op(std::string op, std::vector<NodePtr> inputs, stablehlo::Type type, EmitFn emit);

  Kind kind() const { return kind_; }
  const stablehlo::Type& type() const { return type_; }
  const std::string& op_name() const { return op_; }
  const std::vector<NodePtr>& inputs() const { return inputs_; }
  const std::shared_ptr<const Buffer>& device_buffer() const { return buffer_; }
  double scalar() const { return scalar_; }
  const EmitFn& emitter() const { return emit_; }

 private:
  Node() = default;
  Kind kind_ = Kind::kOp;
  stablehlo::Type type_;
  std::string op_;
  std::vector<NodePtr> inputs_;
  std::shared_ptr<const Buffer> buffer_;
  double scalar_ = 0.0;
  EmitFn emit_;
};

/// One step's program: the module text and what feeds it.
struct Program {
  std::string text;                 ///< the module (the compile cache's key, with the options)
  std::vector<NodePtr> parameters;  ///< in argument order
  std::vector<NodePtr> outputs;     ///< in result order (as asked)
  size_t ops = 0;                   ///< op nodes emitted
  size_t donated = 0;               ///< buffer parameters donated to the program
  bool collective = false;          ///< it holds a collective (all_reduce, all_gather, reduce_scatter)
};

/// Whether the program may consume a buffer parameter (Note [Donating what
/// only the step holds]).
using Donatable = std::function<bool(const Node&)>;

/// Emits the function that computes `outputs` from the parameters they
/// reach, visiting each shared node once (a depth-first walk without
/// recursion, so a long chain of ops cannot overflow the stack). A
/// parameter asked for as an output is returned as it is. Throws
/// ConfigError for an empty or null output.
///
/// Note [Donating what only the step holds]
/// A buffer parameter for which `donatable` is true (and that is not itself
/// an output) is marked a buffer donor: XLA may write the program's results
/// into it, so a step that overwrites its parameters and optimizer state
/// needs no second copy of them. The caller answers true only for buffers
/// that nothing reads after the program (the xla device: buffers no live
/// storage holds any more, while no kernel records). Donation is part of
/// the text, and so of the compile cache's key.
/// `num_replicas` is written into the module: the replica count of the
/// Executor that runs it.
Program build_program(const std::vector<NodePtr>& outputs, const std::string& name = "strata_step",
                      const Donatable& donatable = nullptr, int64_t num_replicas = 1);

/// Note [Collectives in the step]
/// A collective is a node like any other: it reads its input on every
/// replica of a replicated program (Executor with several devices) and is
/// emitted as StableHLO's all_reduce, all_gather or reduce_scatter over
/// `groups` (replica ids; every group the same size), so the reduction
/// runs inside the compiled step, where XLA schedules it beside the
/// computation, as torch_xla's in-graph collectives do. Every replica
/// records the same ops in the same order (the data-parallel strategies'
/// contract), so every replica's program is the same text and each
/// collective meets its peers. Throws ConfigError for empty or uneven
/// groups, a dim out of range, or (reduce_scatter) a dim the group size
/// does not divide.
NodePtr all_reduce(const NodePtr& x, stablehlo::ReduceOp op, const stablehlo::ReplicaGroups& groups);
/// `x` from every replica of the group, joined along `dim` in replica order.
NodePtr all_gather(const NodePtr& x, int64_t dim, const stablehlo::ReplicaGroups& groups);
/// The reduction over the group, split along `dim`: replica i of the group
/// keeps part i.
NodePtr reduce_scatter(const NodePtr& x, int64_t dim, stablehlo::ReduceOp op, const stablehlo::ReplicaGroups& groups);

/// True when the graph of `outputs` holds a collective node.
bool has_collective(const std::vector<NodePtr>& outputs);

/// What differed between the program compiled last and a new one, for a
/// person: "the shapes" (only tensor types differ), "a constant baked into
/// the program" (only dense<...> literals), "the ops" (anything else), with
/// the first line that differs; "the first program" when `previous` is
/// empty.
std::string explain_difference(const std::string& previous, const std::string& next);

/// What the executor did, for strata::xla::metrics().
struct GraphMetrics {
  int64_t compiles = 0;
  int64_t cache_hits = 0;
  int64_t executions = 0;
  /// Why each new program was compiled (explain_difference), oldest first,
  /// the last 32 kept.
  std::vector<std::string> compile_reasons;
  std::chrono::nanoseconds compile_time{0};
  std::chrono::nanoseconds execute_time{0};
  std::chrono::nanoseconds emit_time{0};  ///< building programs' text from the graph
  int64_t host_scalars_fed = 0;
  int64_t ops_executed = 0;  ///< op nodes in the programs run (Program::ops)
  int64_t buffers_donated = 0;  ///< buffer parameters the programs run consumed
};

/// Compiles programs through a bounded least-recently-used cache keyed by
/// the module text and the compile options, and runs them on one device,
/// or replicated over several (replica r on devices[r]). Thread-safe.
class Executor {
 public:
  /// `capacity`: programs kept compiled (at least 1).
  Executor(std::shared_ptr<const Client> client, Device device, size_t capacity = 64);
  /// A replicated executor: its programs compile with num_replicas =
  /// devices.size() and replica r assigned to devices[r]. Throws
  /// ConfigError for no device or the same device twice.
  Executor(std::shared_ptr<const Client> client, std::vector<Device> devices, size_t capacity = 64);

  /// Builds, compiles (or finds) and runs the program of `outputs`, and
  /// returns one buffer per output, on the device. The parameters
  /// `donatable` picks are consumed (build_program). A one-device
  /// executor only.
  std::vector<Buffer> run(const std::vector<NodePtr>& outputs, const Donatable& donatable = nullptr);

  /// Runs one program over every device: `outputs[r]` is what replica r
  /// recorded (its own parameter buffers, on devices[r], and host
  /// scalars); every replica's program must be the same text (Note
  /// [Collectives in the step]), else ConfigError naming the first replica
  /// that differs and how. Returns the buffers of each replica's outputs.
  /// With `allow_independent`, replicas whose programs differ but hold no
  /// collective (each can run without its peers) are not an error: nothing
  /// runs and the result is empty, for the caller to run each replica's
  /// program on its own.
  std::vector<std::vector<Buffer>> run_replicated(const std::vector<std::vector<NodePtr>>& outputs,
                                                  const Donatable& donatable = nullptr,
                                                  bool allow_independent = false);

  /// The devices replica 0, 1, ... run on.
  const std::vector<Device>& devices() const { return devices_; }

  GraphMetrics metrics() const;
  size_t cached() const;

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<const LoadedExecutable> executable;
  };
  std::shared_ptr<const LoadedExecutable> compiled(const std::string& text);

  std::shared_ptr<const Client> client_;
  std::vector<Device> devices_;
  size_t capacity_;
  mutable std::mutex mutex_;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  std::string last_compiled_;
  GraphMetrics metrics_;
};

}  // namespace strata::xla::lazy
