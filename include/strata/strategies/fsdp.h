// Fully-sharded data parallel training (Lightning Fabric's XLAFSDPStrategy).
//
// The auto-wrap policy splits the model into units; every parameter of a
// unit is flattened, zero-padded to a multiple of the world size and split
// into equal pieces, one per rank, so each rank keeps 1/N of parameters,
// gradients and optimizer state. Before a unit's forward its full
// parameters are all-gathered (in the compute dtype) and after it they are
// freed; before its backward they are gathered again, and its gradients
// are reduce-scattered (mean) into the shards. The next unit's gather is
// prefetched while the current one computes. docs/strategies.md has the
// details; Note [FSDP parameters] in src/strategies/fsdp/sharded_param.h the
// mechanics.
//
// Any module can be a unit, in a model whose forward calls its layers
// directly (`layers[i]->forward(x)`, a ModuleDict's entries, a module used
// twice, an LSTM): a unit is gathered on the first use of any of its
// parameters by an operator, and freed when the forward moves on to
// another unit (Note [Gather on first use] in
// src/strategies/fsdp/first_use.h). A unit's forward is also seen whole
// (the optional fast path: freed right after it, and needed to recompute
// a module in backward under activation checkpointing) where:
// - a torch::nn::Sequential calls it (each child, and the Sequential's own
//   forward, are routed through the hooks: core/container_calls.h);
// - the module's own forward runs through strata::hooked_forward (the
//   example GPT and MLP);
// - the caller opts in: `strata::call(fc1, x)` instead of `fc1->forward(x)`
//   (core/module_hooks.h). A checkpointed module called through its typed
//   forward is not recomputed; the first step's backward warns, naming it.
// What cannot be sharded (a parameter that shares memory with another, or
// one a module set up earlier sharded already) is refused at setup_module,
// naming the parameter by its path.
//
// Order of set-up, as in Lightning Fabric: build the model, setup_module, build
// the optimizer from the returned module's parameters (the shards),
// setup_optimizer.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <variant>
#include <vector>

#include "strata/checkpoint/state_dict.h"
#include "strata/strategies/options.h"
#include "strata/strategies/strategy.h"

namespace strata {
class ContainerRoutes;
}

namespace strata::strategies {

namespace detail {
class FSDPState;
struct Presharded;
}  // namespace detail

/// Module types by the name module.name() reports: the kTypeName of the
/// example models ("Block", "GPT"), or LibTorch's default, the demangled
/// class name ("torch::nn::LinearImpl"), which also matches by its short
/// form ("Linear", "Sequential").
using ModuleTypes = std::set<std::string>;

/// The predicate form of an auto-wrap policy. With recurse=true it answers
/// "descend into this module's children?"; with recurse=false "make this
/// module a unit?", given the number of its parameters' elements not
/// already in a unit below it (nonwrapped_numel).
using WrapPredicate = std::function<bool(const torch::nn::Module& module, bool recurse, int64_t nonwrapped_numel)>;

/// Which modules become units: none besides the root (monostate), the
/// instances of a set of types, or a predicate. The root is always a unit.
using AutoWrapPolicy = std::variant<std::monostate, ModuleTypes, WrapPredicate>;

/// A policy that makes every leaf module (no children) with parameters a
/// unit: each Linear, LayerNorm, Embedding, ... of a model.
WrapPredicate wrap_every_leaf();

/// Options of FSDPStrategy, with Lightning's XLAFSDPStrategy defaults.
struct FSDPOptions {
  AutoWrapPolicy auto_wrap_policy;
  /// Instances of these types recompute their forward during backward
  /// instead of keeping their activations (with or without auto-wrap).
  ModuleTypes activation_checkpointing_policy;
  /// kSharded (one file per rank) or kFull (one consolidated file).
  StateDictType state_dict_type = StateDictType::kSharded;
  /// Local ranks write their checkpoint files one after another.
  bool sequential_save = false;
  /// Free a unit's gathered parameters after its forward (gather them again
  /// for backward). false keeps them from forward to backward: more memory,
  /// one all-gather less per unit and step. The root unit is never freed
  /// between its forward and backward.
  bool reshard_after_forward = true;
  /// Gather the next unit's parameters while the current unit computes.
  bool prefetch = true;
  /// Overlap backward with its communication: gather the previous unit's
  /// parameters during a unit's backward (with prefetch) and keep one
  /// unit's gradient reduction running while backward goes on. Unset: on
  /// where the collectives run beside the computation (a GPU, the xla
  /// device), off on CPU workers, where every core computes, so overlap
  /// bought no time and cost two units' blocks of peak memory (Note
  /// [Overlap in backward] in src/strategies/fsdp/schedule.cpp).
  std::optional<bool> overlap_backward;
  /// dtype parameters are gathered and computed in; default: the
  /// precision's compute dtype (bf16 for bf16-mixed, fp32 otherwise).
  std::optional<c10::ScalarType> compute_dtype;
  /// dtype gradients are reduce-scattered in; default: the compute dtype.
  std::optional<c10::ScalarType> reduce_dtype;
  /// Broadcast parameters and buffers from rank 0 before sharding.
  bool sync_module_states = true;
  /// Check every collective across ranks and report communication per step.
  bool debug = false;
  /// Lightning's sync_batchnorm: BatchNorm layers normalise over the global
  /// batch of all ranks (Strategy::sync_batchnorm; Fabric and the Trainer
  /// register the layers after setup_module, a direct user calls
  /// apply_sync_batchnorm).
  bool sync_batchnorm = false;
  /// Accepted for Lightning's signature; when set, its size must equal the
  /// local world size.
  std::optional<std::vector<c10::Device>> parallel_devices;
  /// Accepted for Lightning's signature; must be empty (no CheckpointIO plugins).
  nlohmann::json checkpoint_io = nullptr;

  FSDPOptions& with_auto_wrap_policy(AutoWrapPolicy p) { auto_wrap_policy = std::move(p); return *this; }
  FSDPOptions& with_activation_checkpointing_policy(ModuleTypes t) { activation_checkpointing_policy = std::move(t); return *this; }
  FSDPOptions& with_state_dict_type(StateDictType t) { state_dict_type = t; return *this; }
  /// Parses "full" or "sharded" (ConfigError otherwise).
  FSDPOptions& with_state_dict_type(const std::string& t) { state_dict_type = parse_state_dict_type(t); return *this; }
  FSDPOptions& with_sequential_save(bool s) { sequential_save = s; return *this; }
  FSDPOptions& with_reshard_after_forward(bool r) { reshard_after_forward = r; return *this; }
  FSDPOptions& with_prefetch(bool p) { prefetch = p; return *this; }
  FSDPOptions& with_overlap_backward(bool o) { overlap_backward = o; return *this; }
  FSDPOptions& with_compute_dtype(c10::ScalarType d) { compute_dtype = d; return *this; }
  FSDPOptions& with_reduce_dtype(c10::ScalarType d) { reduce_dtype = d; return *this; }
  FSDPOptions& with_sync_module_states(bool s) { sync_module_states = s; return *this; }
  FSDPOptions& with_debug(bool d) { debug = d; return *this; }
  FSDPOptions& with_sync_batchnorm(bool s) { sync_batchnorm = s; return *this; }
  FSDPOptions& with_parallel_devices(std::vector<c10::Device> d) { parallel_devices = std::move(d); return *this; }
};

/// What setup_module made of a model (for tests, reports and tools).
struct FSDPUnitInfo {
  std::string name;                 ///< the unit module's path ("" for the root)
  std::vector<std::string> params;  ///< full names of the parameters it shards
  int64_t numel = 0;                ///< their elements, unpadded
  int64_t shard_numel = 0;          ///< this rank's padded shard, elements
};

/// The fully-sharded strategy.
class FSDPStrategy : public Strategy {
 public:
  /// Throws ConfigError for checkpoint_io plugins and for a compute dtype
  /// the precision cannot feed.
  explicit FSDPStrategy(std::shared_ptr<Accelerator> accelerator = cpu_accelerator(),
                        std::optional<Precision> precision = std::nullopt, FSDPOptions options = {});
  ~FSDPStrategy() override;

  std::string name() const override { return "fsdp"; }
  bool shards_parameters() const override { return true; }
  const FSDPOptions& options() const { return options_; }
  bool sync_batchnorm() const override { return options_.sync_batchnorm || Strategy::sync_batchnorm(); }
  /// "full" or "sharded".
  std::string state_dict_type() const { return to_string(options_.state_dict_type); }
  bool sequential_save() const { return options_.sequential_save; }

  void setup_environment() override;
  /// Checks the compute dtype against the new precision, then sets it.
  void set_precision(Precision precision) override;
  /// Splits the module into units by the auto-wrap policy, shards every
  /// unit's parameters (module->parameters() then returns this rank's
  /// shards, under the same names) and installs the forward and gradient
  /// hooks. Several modules may be set up, each with its own units; a
  /// module set up already is returned as it is (with a warning).
  ModulePtr setup_module(ModulePtr module) override;
  /// Accepts only an optimizer over the sharded parameters of the module
  /// returned by setup_module; otherwise ConfigError saying to create the
  /// optimizer after setup_module.
  void setup_optimizer(torch::optim::Optimizer& optimizer) override;
  /// Always refuses (ConfigError): the optimizer must be built from the
  /// sharded parameters, so set up the module first.
  ModulePtr setup_module_and_optimizers(ModulePtr module,
                                        const std::vector<torch::optim::Optimizer*>& optimizers) override;
  /// Nothing: sharding places the parameters.
  void module_to_device(torch::nn::Module& module) override;
  /// Scope in which models are created. empty_init=true: parameters are
  /// left uninitialised (LibTorch's init functions do nothing), to be loaded.
  Scope module_init_context(std::optional<bool> empty_init = std::nullopt) override;
  /// Scope in which models are created sharded: each unit is sharded as
  /// soon as it is built (see docs/strategies.md), so no rank holds the
  /// whole unsharded model at once. Needs the process group (launch first).
  Scope module_sharded_context();

  void backward(const at::Tensor& loss) override;
  Scope no_backward_sync(torch::nn::Module& module, bool enabled = true) override;

  void teardown() override;

  /// The units of the modules set up (module by module, in set-up order),
  /// in the order their forward first ran (registration order before the
  /// first forward).
  std::vector<FSDPUnitInfo> units() const;
  /// Whether `module`'s backward overlaps its collectives
  /// (FSDPOptions::overlap_backward, resolved for its device); ConfigError
  /// for a module this strategy did not set up.
  bool overlaps_backward(const torch::nn::Module& module) const;
  /// Host memory of FSDP's buffer cache (its units' gathered parameters
  /// and gather and reduce buffers, kept between uses; Note [FSDP's buffer
  /// cache]): `held`, all its blocks; `idle`, those waiting for the next
  /// use, freed at teardown. For memory reports.
  struct BufferBytes {
    size_t held = 0;
    size_t idle = 0;
  };
  static BufferBytes buffer_bytes();
  /// Gathers the full value of a parameter of the modules set up, by its
  /// full name (every rank must call it). For tests and tools. Throws
  /// ConfigError when no module set up has it, or when several do (pass
  /// the module then).
  at::Tensor full_parameter(const std::string& name);
  /// The same for a parameter of `module`, one that setup_module returned.
  at::Tensor full_parameter(const torch::nn::Module& module, const std::string& name);
  /// Scope in which `module` (one setup_module returned) holds its full
  /// parameters (PyTorch's summon_full_params): named_parameters() and the
  /// typed members (fc->weight) are the whole fp32 tensors, and with
  /// `with_grads` their gradients are the full (averaged) gradients. On
  /// leaving, with `writeback` the values (changed in place or not) go back
  /// to the shards; the gradients shown are dropped, the shards' own are
  /// kept. Every rank must enter it (a collective), between training steps;
  /// it costs the whole model's memory on every rank. Throws ConfigError for
  /// a module not set up, or inside a forward or backward.
  Scope summon_full_params(torch::nn::Module& module, bool writeback = true, bool with_grads = false);
  /// The optimizer's whole state, gathered on `rank` (the others get only
  /// the JSON part): tensors "<param name>.<state>" at the parameters' full
  /// shapes, and the JSON of checkpoint::optimizer_state (types, options,
  /// Adam's step), as one process training the whole model would hold it.
  /// Every rank must call it.
  checkpoint::OptimizerState full_optimizer_state(torch::optim::Optimizer& optimizer, int rank = 0);

 protected:
  at::Tensor reduce_norm(const at::Tensor& local, bool is_max) override;
  /// Refuses a state without the module set up; then plans as the base does.
  SavePlan plan_save(const State& state, const StateFilter& filter) override;
  /// The module set up: its parameters sharded, its buffers whole.
  void plan_module_entry(const std::string& key, torch::nn::Module& module, const StateFilter& filter,
                         SavePlan& plan) override;
  /// Optimizer state of sharded parameters: sharded like the parameter.
  void plan_optimizer_entry(const std::string& key, torch::optim::Optimizer& optimizer,
                            const std::vector<std::pair<std::string, at::Tensor>>& tensors, const StateFilter& filter,
                            SavePlan& plan) override;
  bool sharded_state_dict() const override { return options_.state_dict_type == StateDictType::kSharded; }
  bool sequential_checkpoint_writes() const override { return options_.sequential_save; }
  /// The module set up: each rank reads only its slices (any saved layout
  /// and world size); other modules: whole.
  void load_module_entry(const checkpoint::StateReader& reader, const std::string& key, torch::nn::Module& module,
                         bool strict, const std::string& source) override;
  /// Optimizer state of sharded parameters: this rank's slices, padded.
  std::vector<std::pair<std::string, at::Tensor>> read_optimizer_tensors(const checkpoint::StateReader& reader,
                                                                         const std::string& key,
                                                                         torch::optim::Optimizer& optimizer) override;

 private:
  /// The state of the module set up as `module`, or null.
  detail::FSDPState* state_of(const torch::nn::Module& module) const;
  /// Drops the states of modules held by value that are gone (Note
  /// [Modules held by value] in strategies/strategy.h).
  void forget_gone_modules();
  /// The state whose shards `optimizer` updates, or null.
  detail::FSDPState* state_of(const torch::optim::Optimizer& optimizer) const;

  FSDPOptions options_;
  std::vector<std::shared_ptr<detail::FSDPState>> states_;  ///< one per module set up (src/strategies/fsdp/fsdp_state.h)
  int64_t step_ = 0;
  std::shared_ptr<detail::Presharded> presharded_;  ///< units sharded by module_sharded_context
  std::vector<std::unique_ptr<ContainerRoutes>> routes_;  ///< Sequentials' calls routed, per module set up
};

}  // namespace strata::strategies
