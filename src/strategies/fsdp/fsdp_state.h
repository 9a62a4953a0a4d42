// The state FSDPStrategy keeps: its units, their sharded parameters, and
// the transitions of each unit around forward and backward. Private to
// the strategies area; the strategy's public header only names it.
//
// Unit state machine (the two enums of Unit; Note [FSDP parameters] for
// what "sharded" means for a parameter):
//
//   sharded state                          training state
//   -------------                          --------------
//           unshard + wait_for_unshard       kIdle --pre_forward--> kForward
//   kSharded -----------------------> kUnsharded   (the root's pre_forward puts
//      ^    <------ reshard ----------/  |  ^       every unit back to kIdle)
//      |                                 |  |    kForward --every gradient in--> kPostBackward
//      |  reshard   free_after_forward   |  |    kPostBackward --finalize_backward--> kForward
//      |                                 v  |
//      +-------- kShardedPostForward ----+--+  (wait_for_unshard refills the storage
//                                               that autograd's saved views point at)
//
// An all-gather may be in flight (unshard started it, a prefetch or the
// unit's own forward); wait_for_unshard finishes it, reshard finishes an
// unused one so that every rank's collectives stay in the same order.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata/comm/group.h"
#include "strata/core/module_hooks.h"
#include "strata/strategies/fsdp.h"
#include "../grad_hooks.h"
#include "collectives.h"
#include "sharded_param.h"

namespace strata::strategies::detail {

/// Where a unit's parameters are.
enum class ShardedState {
  kSharded,             ///< compute tensors are 0-element; only the shards exist
  kShardedPostForward,  ///< full shapes kept, storage freed: autograd's saved views wait for a refill
  kUnsharded,           ///< compute tensors hold the full values
};

/// Where a unit is in this step.
enum class TrainingState {
  kIdle,          ///< its forward has not run since the root's forward began
  kForward,       ///< its forward ran in this step
  kPostBackward,  ///< every gradient of its trainable parameters arrived in this backward
};

/// One unit: a module whose parameters are gathered and freed together.
struct Unit {
  torch::nn::Module* module = nullptr;
  std::string name;  ///< path from the root ("" for the root)
  std::string type;  ///< module.name()
  bool root = false;
  std::optional<size_t> parent;  ///< the nearest unit around this one
  std::vector<size_t> params;
  int64_t shard_numel = 0;
  at::Tensor flat_shard;  ///< the shards of params, back to back
  std::vector<int64_t> segments;  ///< each parameter's chunk: the layout of the unit's blocks
  at::Tensor grad_block;  ///< its full gradients while its backward runs (Note [Gradient blocks])
  size_t trainable = 0;   ///< trainable parameters
  size_t grads_ready = 0; ///< of which the gradient arrived in this backward
  ShardedState sharded_state = ShardedState::kSharded;
  TrainingState training_state = TrainingState::kIdle;
  std::optional<AllGatherWork> unshard_work;
  std::optional<ReduceScatterWork> reduce_work;
};

/// Parameters sharded while the model was built (module_sharded_context),
/// by the TensorImpl of the shard put in the module's dictionary.
struct Presharded {
  struct Entry {
    at::Tensor compute;          ///< the module's own tensor, now empty
    std::vector<int64_t> shape;  ///< its full shape
    bool trainable = false;
    GradAccumulator accumulator;  ///< made while it was full-sized
  };
  std::unordered_map<const c10::TensorImpl*, Entry> by_shard;
};

/// What FSDPStrategy knows once a module is set up.
class FSDPState : public std::enable_shared_from_this<FSDPState> {
 public:
  FSDPState(comm::Group group, const FSDPOptions& options, c10::ScalarType compute, c10::ScalarType reduce);

  // ---- construction (construction.cpp) ----
  /// Makes the units by the wrap policy and shards the parameters (those
  /// in `presharded` are sharded already; their entries are removed).
  void build(torch::nn::Module& root_module, const FSDPOptions& options, Presharded* presharded);
  /// Removes the forward and gradient hooks.
  void unhook();

  // ---- the unit's transitions (unit.cpp) ----
  /// Starts the all-gather of unit u's parameters (nothing when they are
  /// unsharded or being gathered).
  void unshard(size_t u);
  /// Finishes unit u's all-gather (starting it if needed): kUnsharded.
  void wait_for_unshard(size_t u);
  /// Back to kSharded (finishing an unused all-gather first).
  void reshard(size_t u);
  /// kUnsharded -> kShardedPostForward: frees the full values' storage.
  void free_after_forward(size_t u);
  void pre_forward(size_t u);
  void post_forward(size_t u, TensorList& outputs);
  void pre_backward(size_t u);
  /// The gradient hook of params[param]; true when it counted (sync on).
  bool post_backward(size_t param);
  /// After loss.backward(): reduces what is left, waits for every
  /// reduction, reshards every unit and gets ready for the next step.
  void finalize_backward();
  /// Throws a ConfigError explaining `error` when units that never started
  /// their forward may be why it failed; returns otherwise.
  void explain_failed_forward(const c10::Error& error) const;

  // ---- the schedule (schedule.cpp) ----
  /// The unit to gather while unit u computes (Note [Prefetch order]).
  std::optional<size_t> prefetch_target(size_t u, bool backward) const;
  /// `order`, then every unit not in it, by index.
  std::vector<size_t> with_the_rest(std::vector<size_t> order) const;
  /// Starts the reductions of complete units, in the fixed order
  /// (Note [Reduction order]); `all`: every unit counts as complete.
  void launch_ready_reductions(bool all);

  // ---- lookups ----
  /// The parameter an optimizer state tensor "<param name>.<state name>"
  /// belongs to, or null.
  const ShardedParam* param_of_state(const std::string& state_name) const;
  /// The full value of a tensor sharded like `p`; a collective.
  at::Tensor gather_full(const ShardedParam& p, const at::Tensor& piece);

  GradHooks grad_hooks;  ///< Note [Gradient hooks]
  comm::Group group;
  int world = 1;
  int rank = 0;
  c10::ScalarType compute_dtype;
  c10::ScalarType reduce_dtype;
  bool reshard_after_forward = true;
  bool prefetch = true;
  ModulePtr root_module;
  std::vector<ShardedParam> params;
  std::unordered_map<std::string, size_t> param_index;  ///< params by name
  std::vector<Unit> units;
  size_t root = 0;
  std::vector<torch::nn::Module*> checkpointed;  ///< checkpointed modules that are not units
  std::vector<size_t> forward_order, last_forward_order;
  bool sync = true;

 private:
  std::vector<ShardedParam*> params_of(const Unit& unit);
  void shard_param(size_t i, const FSDPOptions& options);
  void launch_reduction(size_t u);
  void complete_reduction(size_t u);

  std::vector<size_t> reduction_order_;  ///< this backward's, made at its first reduction
  size_t next_reduction_ = 0;
  std::deque<size_t> in_flight_;  ///< units whose reduce-scatter runs, oldest first
};

}  // namespace strata::strategies::detail
