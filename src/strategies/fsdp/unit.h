// One FSDP unit (the counterpart of FSDP2's FSDPParamGroup): a module
// whose parameters are gathered and freed together, with its own state and
// the transitions it makes around forward and backward. Which unit moves
// when, and in what order across units, is FSDPState's (fsdp_state.h).
// Private to the strategies area.
//
// Unit state machine (Note [FSDP parameters] for what "sharded" means for
// a parameter). Sharded state, where the parameters are:
//
//   kSharded ---- unshard + wait_for_unshard ----> kUnsharded
//      ^ ^                                           |    ^
//      | +---------------- reshard ------------------+    |
//      |                                             |    | wait_for_unshard
//      |                               post_forward  |    | (refills the storage that
//      |                              (free_storage) v    |  autograd's saved views point at)
//      +------------------ reshard -------------- kStorageFreed
//
// Every state keeps the full shapes; kSharded and kStorageFreed hold 0
// bytes (kStorageFreed keeps the storage that autograd's saved views share).
// Training state, where the unit is in this step:
//
//   kIdle --pre_forward (with grad mode on)--> kForward
//   kForward --post_backward (its last gradient)--> kPostBackward
//   kForward, kPostBackward --finalize_backward--> kIdle
//   any --reset_training_state (the root's hooked pre_forward, for every unit)--> kIdle
//
// An all-gather may be in flight (unshard started it, for a prefetch or for
// the unit's own forward); wait_for_unshard finishes it, reshard finishes an
// unused one so that every rank's collectives stay in the same order.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "strata/comm/group.h"
#include "strata/core/module_hooks.h"
#include "collectives.h"
#include "sharded_param.h"

namespace strata::strategies::detail {

/// Where a unit's parameters are.
enum class ShardedState {
  kSharded,       ///< compute tensors hold 0 bytes (full shapes); only the shards exist
  kStorageFreed,  ///< full shapes kept, storage freed: autograd's saved views wait for a refill
  kUnsharded,     ///< compute tensors hold the full values
};

/// Where a unit is in this step.
enum class TrainingState {
  kIdle,          ///< its forward has not run since the root's forward began
  kForward,       ///< its forward ran in this step
  kPostBackward,  ///< every gradient of its trainable parameters arrived in this backward
};

/// What one gradient's arrival meant to its unit (Unit::post_backward).
enum class GradientArrival {
  kRepeat,        ///< the parameter's gradient had arrived already in this backward
  kCounted,       ///< counted; the unit still waits for others
  kUnitComplete,  ///< the last one: the unit is kPostBackward
};

/// What the units of one FSDPState share: owned by the state, which
/// outlives its units; each unit keeps a reference.
struct UnitContext {
  comm::Group group;
  int world = 1;
  c10::ScalarType compute_dtype = c10::kFloat;  ///< of the gathered parameters
  c10::ScalarType reduce_dtype = c10::kFloat;   ///< of the gradients reduced
  bool reshard_after_forward = true;            ///< free a non-root unit's storage after its forward
};

/// One unit: its parameters (in FSDPState's list), their flat shard, and
/// the collectives and states around them.
class Unit {
 public:
  /// The unit of `module` (at path `name` from the root, "" for the root)
  /// over `params`, each of which names this unit: lays out their shards
  /// back to back (setting each one's offset) in a zeroed fp32 flat shard.
  /// The shards' values are put in by the caller (FSDPState::build).
  Unit(UnitContext& context, torch::nn::Module& module, std::string name, bool root, std::optional<size_t> parent,
       std::vector<ShardedParam*> params);

  torch::nn::Module& module() const { return *module_; }
  const std::string& name() const { return name_; }
  /// module.name(), for reports.
  const std::string& type() const { return type_; }
  bool is_root() const { return root_; }
  /// The nearest unit around this one (none for the root).
  std::optional<size_t> parent() const { return parent_; }
  const std::vector<ShardedParam*>& params() const { return params_; }
  int64_t shard_numel() const { return shard_numel_; }
  ShardedState sharded_state() const { return sharded_state_; }
  TrainingState training_state() const { return training_state_; }
  /// Gradients of trainable parameters that arrived in this backward.
  size_t grads_ready() const { return grads_ready_; }
  /// Trainable parameters.
  size_t trainable() const { return trainable_; }

  /// The place of `p` (one of this unit's) in the flat shard.
  at::Tensor shard_view(const ShardedParam& p) const;
  /// Moves the flat shard to `device` (Note [Shards on the device]).
  void move_shards_to(c10::Device device);

  // ---- sharded state ----
  /// Starts the all-gather of the parameters (nothing when they are
  /// unsharded or being gathered).
  void unshard();
  /// Finishes the all-gather (starting it if needed): kUnsharded.
  void wait_for_unshard();
  /// Back to kSharded (finishing an unused all-gather first).
  void reshard();
  /// kUnsharded -> kStorageFreed: frees the full values' storage.
  void free_storage();

  // ---- around forward and backward ----
  /// Back to kIdle (the root's pre_forward does it for every unit).
  void reset_training_state() { training_state_ = TrainingState::kIdle; }
  /// Gathers the parameters for the forward; true when this is the unit's
  /// first forward in this step that a backward may follow (kIdle ->
  /// kForward, with grad mode on).
  bool pre_forward();
  /// After the forward that produced `outputs`: reshards when no backward
  /// follows (evaluation) and returns false; otherwise frees the storage
  /// when the context asks (never the root's, nor with `keep_gathered`:
  /// Note [The last unit stays gathered] in fsdp_state.cpp) and returns true.
  bool post_forward(const TensorList& outputs, bool keep_gathered = false);
  /// Before the unit's backward (the first gradient of its outputs):
  /// gathers the parameters again; false when its backward was over already.
  bool pre_backward();
  /// The gradient of `p` (one of this unit's) was accumulated: with `sync`,
  /// places it in the unit's gradient block (Note [Gradient blocks]), and
  /// counts it. The last one makes the unit kPostBackward; without `sync`
  /// the unit then reshards.
  GradientArrival post_backward(ShardedParam& p, bool sync);
  /// Starts the reduce-scatter of the gradient block, then reshards.
  void start_reduction();
  /// Waits for the reduce-scatter and adds its result to the shards' gradients.
  void finish_reduction();
  /// After the backward: reshards and gets ready for the next step
  /// (kIdle).
  void finalize_backward();

 private:
  UnitContext& context_;
  torch::nn::Module* module_;
  std::string name_;
  std::string type_;
  bool root_;
  std::optional<size_t> parent_;
  std::vector<ShardedParam*> params_;
  int64_t shard_numel_ = 0;
  at::Tensor flat_shard_;          ///< the shards of params_, back to back
  std::vector<int64_t> segments_;  ///< each parameter's chunk: the layout of the unit's blocks
  at::Tensor grad_block_;          ///< its full gradients while its backward runs (Note [Gradient blocks])
  size_t trainable_ = 0;
  size_t grads_ready_ = 0;
  ShardedState sharded_state_ = ShardedState::kSharded;
  TrainingState training_state_ = TrainingState::kIdle;
  std::optional<AllGatherWork> unshard_work_;
  std::optional<ReduceScatterWork> reduce_work_;
};

}  // namespace strata::strategies::detail
