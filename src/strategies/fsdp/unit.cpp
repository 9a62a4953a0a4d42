// The transitions of an FSDP unit around forward and backward (the state
// machine drawn in state.h).
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "buffer_cache.h"
#include "state.h"
#include "strata/core/error.h"

namespace strata::strategies::detail {

std::vector<ShardedParam*> FSDPState::params_of(const Unit& unit) {
  std::vector<ShardedParam*> out;
  out.reserve(unit.params.size());
  for (size_t i : unit.params) out.push_back(&params[i]);
  return out;
}

void FSDPState::unshard(size_t u) {
  Unit& unit = units[u];
  if (unit.sharded_state == ShardedState::kUnsharded || unit.unshard_work) return;
  const int64_t numel = world * unit.shard_numel;
  // After forward the block's storage is kept (empty) for autograd's saved
  // views: the gather refills it. Otherwise a fresh block.
  at::Tensor block = unit.sharded_state == ShardedState::kShardedPostForward && !unit.params.empty()
                         ? params[unit.params.front()].reallocate_storage(numel)
                         : empty_buffer({numel}, unit.flat_shard.options().dtype(compute_dtype));
  unit.unshard_work = start_all_gather(group, unit.flat_shard, block, unit.segments, compute_dtype);
}

void FSDPState::wait_for_unshard(size_t u) {
  Unit& unit = units[u];
  if (unit.sharded_state == ShardedState::kUnsharded) return;
  unshard(u);
  const bool refill = unit.sharded_state == ShardedState::kShardedPostForward;
  finish_all_gather(*unit.unshard_work, params_of(unit), world, refill);
  unit.unshard_work.reset();
  unit.sharded_state = ShardedState::kUnsharded;
}

void FSDPState::free_after_forward(size_t u) {
  Unit& unit = units[u];
  if (unit.sharded_state != ShardedState::kUnsharded) return;
  for (size_t i : unit.params) params[i].free_storage();
  unit.sharded_state = ShardedState::kShardedPostForward;
}

void FSDPState::reshard(size_t u) {
  Unit& unit = units[u];
  if (unit.unshard_work) {  // a prefetch nobody used: finish it so the group stays in order
    unit.unshard_work->work->wait();
    unit.unshard_work.reset();
    // A refill nobody used: empty the storage again.
    if (unit.sharded_state == ShardedState::kShardedPostForward && !unit.params.empty()) {
      params[unit.params.front()].free_storage();
    }
  }
  if (unit.sharded_state == ShardedState::kSharded) return;
  for (size_t i : unit.params) params[i].reshard(compute_dtype);
  unit.sharded_state = ShardedState::kSharded;
}

void FSDPState::explain_failed_forward(const c10::Error& error) const {
  std::string idle, first;
  for (const Unit& unit : units) {
    if (unit.training_state != TrainingState::kIdle || unit.params.empty() ||
        unit.sharded_state == ShardedState::kUnsharded) {
      continue;
    }
    idle += (idle.empty() ? "" : ", ") + ("'" + unit.name + "' (" + unit.type + ")");
    if (first.empty()) first = unit.name.substr(unit.name.rfind('.') + 1);
  }
  if (idle.empty()) return;
  std::string what = error.what_without_backtrace();
  throw ConfigError("[fsdp] the forward failed: " + what.substr(0, what.find('\n')) +
                    ". Under FSDP a unit's parameters are empty until its forward starts through strata's hooks; "
                    "units whose forward had not started: " + idle + ". strata sees the calls a torch::nn::Sequential "
                    "makes, but not a direct call of a module's typed forward: opt in where the model calls it, "
                    "with strata::call(" + first + ", x) instead of " + first + "->forward(x) "
                    "(strata/core/module_hooks.h), or run that module's forward through strata::hooked_forward");
}

void FSDPState::pre_forward(size_t u) {
  Unit& unit = units[u];
  if (unit.root) {
    grad_hooks.check_no_stray_backward("fsdp");
    forward_order.clear();
    for (Unit& other : units) other.training_state = TrainingState::kIdle;
  } else {
    // The units around this one must be computing: their parameters may be
    // used around this forward. One that is not never ran hooked_forward.
    for (std::optional<size_t> a = unit.parent; a; a = units[*a].parent) {
      // The root's forward starts every step, even without parameters.
      const Unit& around = units[*a];
      if (around.training_state != TrainingState::kIdle || (around.params.empty() && !around.root) ||
          around.sharded_state == ShardedState::kUnsharded) {
        continue;
      }
      std::string which = around.root ? "the module passed to setup_module (" + around.type + ")"
                                      : "unit '" + around.name + "' (" + around.type + ")";
      std::string call = around.root ? "model" : around.name.substr(around.name.rfind('.') + 1);
      throw ConfigError("[fsdp] the forward of unit '" + unit.name + "' ran, but the forward of " + which +
                        " around it did not go through strata's hooks, so it never started. strata sees the calls a "
                        "torch::nn::Sequential makes, but not a direct call of a module's typed forward: call it as "
                        "strata::call(" + call + ", x) instead of " + call + "->forward(x) "
                        "(strata/core/module_hooks.h), or run its forward through strata::hooked_forward");
    }
  }
  wait_for_unshard(u);
  if (unit.training_state == TrainingState::kIdle) {
    forward_order.push_back(u);
    unit.training_state = TrainingState::kForward;
  }
  if (prefetch && c10::GradMode::is_enabled()) {
    std::optional<size_t> next = prefetch_target(u, /*backward=*/false);
    if (next && units[*next].sharded_state != ShardedState::kUnsharded) unshard(*next);
  }
}

void FSDPState::post_forward(size_t u, TensorList& outputs) {
  Unit& unit = units[u];
  bool backward_follows = false;
  for (const at::Tensor& output : outputs) {
    backward_follows = backward_follows || (output.defined() && output.requires_grad());
  }
  backward_follows = backward_follows && c10::GradMode::is_enabled();
  if (!backward_follows) {
    // No backward will come for this forward (evaluation): reshard now.
    reshard(u);
    return;
  }
  if (!unit.root && reshard_after_forward) free_after_forward(u);
  // The gradient of the unit's outputs arrives just before the unit's own
  // backward: gather its parameters again then (at the first of them).
  std::weak_ptr<FSDPState> weak = weak_from_this();
  for (at::Tensor& output : outputs) {
    if (!output.defined() || !output.requires_grad()) continue;
    output.register_hook([weak, u](const at::Tensor& grad) {
      if (auto state = weak.lock()) state->pre_backward(u);
      return grad;
    });
  }
}

void FSDPState::pre_backward(size_t u) {
  // A late output gradient (an output that no parameter fed): the unit's
  // backward is over.
  if (units[u].training_state == TrainingState::kPostBackward) return;
  wait_for_unshard(u);
  if (prefetch) {
    std::optional<size_t> previous = prefetch_target(u, /*backward=*/true);
    if (previous && units[*previous].sharded_state == ShardedState::kShardedPostForward) unshard(*previous);
  }
}

bool FSDPState::post_backward(size_t i) {
  ShardedParam& p = params[i];
  Unit& unit = units[p.unit];
  // Every gradient autograd adds until the unit's reduction starts goes to
  // the unit's block (Note [Gradient blocks]); under no_backward_sync they
  // stay on the compute tensors, where the next synchronised backward adds.
  if (sync && unit.training_state != TrainingState::kPostBackward) {
    place_gradient(p, unit.grad_block, params_of(unit), world, unit.shard_numel, reduce_dtype);
  }
  if (p.grad_ready) return false;
  p.grad_ready = true;
  if (++unit.grads_ready < unit.trainable) return sync;
  // Every gradient of the unit is in: its parameters are not needed again
  // in this backward.
  unit.training_state = TrainingState::kPostBackward;
  if (!sync) {
    reshard(p.unit);
    return false;
  }
  launch_ready_reductions(/*all=*/false);
  return true;
}

void FSDPState::finalize_backward() {
  // A module whose forward did not run since the last backward (on every
  // rank alike) had no part in this one: its gradients stay as they were.
  if (sync && !forward_order.empty()) launch_ready_reductions(/*all=*/true);  // what did not arrive counts as zero
  for (size_t u : in_flight_) complete_reduction(u);
  in_flight_.clear();
  for (size_t u = 0; u < units.size(); ++u) reshard(u);
  for (ShardedParam& p : params) p.grad_ready = false;
  for (Unit& unit : units) {
    unit.grads_ready = 0;
    if (unit.training_state == TrainingState::kPostBackward) unit.training_state = TrainingState::kForward;
  }
  next_reduction_ = 0;
  reduction_order_.clear();
  grad_hooks.end_backward();
  if (!forward_order.empty()) last_forward_order = forward_order;
  forward_order.clear();
}

}  // namespace strata::strategies::detail
