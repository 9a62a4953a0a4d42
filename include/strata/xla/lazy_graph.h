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
#include <type_traits>
#include <typeinfo>
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

/// Note [Programs known by their structure]
/// A steady training loop records the same graph every step, and emitting
/// its text to find the compiled program took most of the host's time
/// (docs/benchmarks.md). So each op node carries its identity: a hash of
/// its name, its result type, its emitter's type (which lambda, so which
/// call site) and the attributes that emitter bakes into the text. A
/// program's structure is then the hash of its walk: each node's identity
/// and where its inputs are, the parameters' kinds and types, the outputs
/// and the donations. The executor keeps, beside each compiled program,
/// the structures it was found under, and a later step of the same
/// structure runs it without emitting any text.
///
/// An identity is known, never guessed:
/// - an emitter that captures only plain values (an enum, a double, a
///   member-function pointer; a trivially copyable closure) is hashed with
///   its bytes, so every value it captured is part of the identity;
/// - one that captures a vector or a type names what it bakes in through
///   Attributes (op(name, inputs, type, attributes, emit));
/// - an op made from a std::function (EmitFn) has no identity, and a
///   graph that holds one is looked up by its text, as before.
/// A captured pointer would be hashed as an address, not as what it points
/// to, so emitters capture values. With STRATA_XLA_CHECK_KEYS=1 (the test
/// suite sets it), every program found by its structure is emitted as
/// well and its text compared with the text it was compiled from; a
/// difference is an Error naming both.

/// The attributes an op's emitter bakes into the program text beyond its
/// name, inputs and result type, hashed (Note [Programs known by their
/// structure]).
class Attributes {
 public:
  template <class T, std::enable_if_t<std::is_integral_v<T> || std::is_enum_v<T>, int> = 0>
  Attributes& add(T v) {
    return mix(static_cast<uint64_t>(v));
  }
  Attributes& add(double v);
  Attributes& add(const std::vector<int64_t>& v);
  Attributes& add(const std::vector<double>& v);
  Attributes& add(const std::vector<std::vector<int64_t>>& v);
  Attributes& add(const stablehlo::Type& t);
  Attributes& add(const std::string& s);
  /// `size` raw bytes (a trivially copyable emitter's captures).
  Attributes& add_bytes(const void* data, size_t size);
  uint64_t hash() const { return h_; }

 private:
  Attributes& mix(uint64_t v);
  uint64_t h_ = 0x9e3779b97f4a7c15ull;
};

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
  /// The same, with an identity (Note [Programs known by their
  /// structure]): `emit` is a closure that captures only plain values.
  template <class F, std::enable_if_t<std::is_class_v<std::decay_t<F>> &&
                                          std::is_trivially_copyable_v<std::decay_t<F>>, int> = 0>
  static NodePtr op(std::string op, std::vector<NodePtr> inputs, stablehlo::Type type, F&& emit) {
    Attributes attributes;
    attributes.add_bytes(&emit, sizeof(emit));
    return Node::op(std::move(op), std::move(inputs), std::move(type), std::move(attributes), std::forward<F>(emit));
  }
  /// The same, with an identity: `attributes` holds everything `emit`
  /// bakes into the text beyond the name, the inputs and `type`.
  template <class F>
  static NodePtr op(std::string op, std::vector<NodePtr> inputs, stablehlo::Type type, Attributes attributes,
                    F&& emit) {
    attributes.add(static_cast<int64_t>(typeid(std::decay_t<F>).hash_code()));
    return keyed(std::move(op), std::move(inputs), std::move(type), EmitFn(std::forward<F>(emit)), attributes.hash());
  }

  /// Made by the factories above only (one allocation with its count).
  class Private {
    explicit Private() = default;
    friend class Node;
  };
  explicit Node(Private) {}

  /// The hash of the op's name, type and attributes; 0 when unknown (an
  /// op made from an EmitFn). A parameter's says its kind and type.
  uint64_t identity() const { return identity_; }

  Kind kind() const { return kind_; }
  const stablehlo::Type& type() const { return type_; }
  const std::string& op_name() const { return op_; }
  const std::vector<NodePtr>& inputs() const { return inputs_; }
  const std::shared_ptr<const Buffer>& device_buffer() const { return buffer_; }
  double scalar() const { return scalar_; }
  const EmitFn& emitter() const { return emit_; }

 private:
  static std::shared_ptr<Node> make(std::string op, std::vector<NodePtr> inputs, stablehlo::Type type, EmitFn emit);
  static NodePtr keyed(std::string op, std::vector<NodePtr> inputs, stablehlo::Type type, EmitFn emit,
                       uint64_t attributes);
  Kind kind_ = Kind::kOp;
  uint64_t identity_ = 0;
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
  std::chrono::nanoseconds lookup_time{0};  ///< finding programs in the compile cache (hits and misses)
  /// Programs whose text a run needed (one per replica); not those
  /// emitted only to check a structure (STRATA_XLA_CHECK_KEYS).
  int64_t programs_emitted = 0;
  /// Runs that found their program by its structure, emitting no text
  /// (Note [Programs known by their structure]).
  int64_t structure_hits = 0;
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
    std::string key;  ///< the compile options, then the text from text_at on
    std::shared_ptr<const LoadedExecutable> executable;
    size_t text_at = 0;
    std::vector<uint64_t> structures;  ///< the structures it was found under
    size_t donated = 0;                ///< buffer parameters it consumes
  };
  using EntryRef = std::list<Entry>::iterator;
  /// The program of `program.text`, compiled where it is not cached;
  /// known by `structure` from then on where one is given.
  std::shared_ptr<const LoadedExecutable> compiled(const Program& program, const uint64_t* structure);
  /// Drops the least recently used programs past the capacity. Locked.
  void evict_locked();

  std::shared_ptr<const Client> client_;
  std::vector<Device> devices_;
  size_t capacity_;
  mutable std::mutex mutex_;
  std::list<Entry> lru_;  // most recent first
  std::unordered_map<std::string, EntryRef> index_;
  std::unordered_map<uint64_t, EntryRef> by_structure_;
  std::string last_compiled_;
  GraphMetrics metrics_;
};

}  // namespace strata::xla::lazy
