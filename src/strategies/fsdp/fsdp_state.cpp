// FSDPState around forward and backward: the root's reset of the step,
// the start of a unit's forward (hooked, or on the first use of its
// parameters), the prefetch of the next unit, the hooks that start a
// unit's backward and count its gradients, and the end of the backward;
// then the lookups.
#include "fsdp_state.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/graph_task.h>

#include <algorithm>

#include "strata/core/error.h"

namespace strata::strategies::detail {

void FSDPState::root_pre_forward() {
  grad_hooks_.check_no_stray_backward("fsdp");
  forward_order_.clear();
  current_.reset();
  for (Unit& unit : units_) unit.reset_training_state();
}

// Note [Free when the next unit starts]
// A unit whose forward is not seen through hooks has no end of forward
// that FSDP could see. Its parameters are freed instead when the forward
// moves on to another unit (the first use of that unit's parameters): for
// a model that calls its blocks one after another that is the same
// moment. A unit whose hooked forward is still running stays gathered (its
// children run inside it), as do the root and the units that the operator
// at hand reads; a use of the root's own parameters (the head after the
// last block) does not count as a start, so the last unit of the forward
// stays gathered for its backward (Note [The last unit stays gathered]).
// Freeing too early costs an all-gather, never correctness: a unit used
// again (a parent after its children, a module called twice) is refilled
// on its next use, as in backward. In an evaluation (no grad) a unit is
// resharded instead of freed, and the last one by reshard_idle or at the
// end of the next step.
void FSDPState::start_forward(size_t u, const std::vector<size_t>& busy) {
  // The root is never freed, and its use between units (or the head after
  // the last one) does not end the current unit's forward.
  if (!units_[u].is_root()) {
    if (current_ && *current_ != u && hooked_[*current_] == 0 &&
        std::find(busy.begin(), busy.end(), *current_) == busy.end()) {
      Unit& previous = units_[*current_];
      if (c10::GradMode::is_enabled()) {
        if (context_.reshard_after_forward) previous.free_storage();
      } else if (previous.sharded_state() == ShardedState::kUnsharded) {
        // Resharding a freed unit would strand the storage that autograd's
        // saved views share; a gathered one keeps its values in them.
        previous.reshard();
      }
    }
    current_ = u;
  }
  Unit& unit = units_[u];
  if (forward_order_.empty() && unit.training_state() == TrainingState::kIdle && c10::GradMode::is_enabled()) {
    grad_hooks_.check_no_stray_backward("fsdp");
  }
  if (!unit.pre_forward()) return;  // not its first forward in this step (or no grad): prefetched already
  forward_order_.push_back(u);
  if (prefetch_) {
    std::optional<size_t> next = prefetch_target(u, /*backward=*/false);
    if (next) units_[*next].unshard();  // nothing when it is unsharded already
  }
}

void FSDPState::pre_forward(size_t u) {
  if (units_[u].is_root()) root_pre_forward();
  ++hooked_[u];
  start_forward(u, {});
}

void FSDPState::gather_on_first_use(const std::vector<std::pair<size_t, const c10::StorageImpl*>>& uses) {
  std::vector<size_t> units;
  for (const auto& [i, storage] : uses) {
    const ShardedParam& p = params_[i];
    STRATA_CHECK(p.compute.storage().unsafeGetStorageImpl() == storage, ConfigError,
                 "[fsdp] an operator read a view of a parameter of unit '", units_[p.unit].name(), "' (",
                 units_[p.unit].type(), ") that was taken while the unit was gathered and kept after it was sharded "
                 "again, so its values "
                 "are gone. Take views of a parameter inside the forward that uses them, not across steps or "
                 "after the unit's backward");
    if (std::find(units.begin(), units.end(), p.unit) == units.end()) units.push_back(p.unit);
  }
  // On autograd's threads (and on this one while it runs a backward) a
  // graph task is current: the use is a saved tensor's.
  const bool backward = torch::autograd::get_current_graph_task_id() != -1;
  for (size_t u : units) {
    if (backward) {
      pre_backward(u);
      units_[u].wait_for_unshard();  // also after its backward ended (a use without a gradient)
    } else {
      start_forward(u, units);
    }
  }
}

void FSDPState::reshard_idle() {
  for (Unit& unit : units_) {
    if (unit.training_state() == TrainingState::kIdle) unit.reshard();
  }
  current_.reset();
}

// Note [The last unit stays gathered]
// The unit whose forward started last in the last step is the first whose
// backward runs: only the root's remainder of forward (for a GPT: the
// final norm, the head and the loss) and its backward come between. Freeing
// its storage after forward would make backward gather it again at once;
// it stays gathered instead, one all-gather fewer a step, as FSDP2 keeps
// the root. The training peak does not grow: backward starts with the unit
// gathered either way, and the root's remainder holds no more than that
// unit's own backward does. The first step has no order yet and frees it.
void FSDPState::post_forward(size_t u, TensorList& outputs) {
  --hooked_[u];
  const bool backward_next = !last_forward_order_.empty() && last_forward_order_.back() == u;
  if (!units_[u].post_forward(outputs, /*keep_gathered=*/backward_next)) return;
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
  if (!units_[u].pre_backward() || !prefetch_ || !overlap_backward_) return;  // Note [Overlap in backward]
  std::optional<size_t> previous = prefetch_target(u, /*backward=*/true);
  if (previous && units_[*previous].sharded_state() == ShardedState::kStorageFreed) units_[*previous].unshard();
}

bool FSDPState::post_backward(size_t i) {
  ShardedParam& p = params_[i];
  switch (units_[p.unit].post_backward(p, sync_)) {
    case GradientArrival::kRepeat:
      return false;
    case GradientArrival::kCounted:
      return sync_;
    case GradientArrival::kUnitComplete:
      break;
  }
  if (!sync_) return false;
  launch_ready_reductions(/*all=*/false);
  return true;
}

void FSDPState::finalize_backward() {
  // A module whose forward did not run since the last backward (on every
  // rank alike) had no part in this one: its gradients stay as they were.
  if (sync_ && !forward_order_.empty()) launch_ready_reductions(/*all=*/true);  // what did not arrive counts as zero
  for (size_t u : in_flight_) units_[u].finish_reduction();
  in_flight_.clear();
  for (Unit& unit : units_) unit.finalize_backward();
  next_reduction_ = 0;
  reduction_order_.clear();
  grad_hooks_.end_backward();
  if (!forward_order_.empty()) last_forward_order_ = forward_order_;
  forward_order_.clear();
  current_.reset();
}

void FSDPState::reshard_all() {
  for (Unit& unit : units_) unit.reshard();
}

Scope FSDPState::no_backward_sync() {
  std::shared_ptr<FSDPState> self = shared_from_this();
  const bool previous = sync_;
  sync_ = false;
  return Scope([self, previous] { self->sync_ = previous; });
}

std::optional<size_t> FSDPState::unit_of(const torch::nn::Module& module) const {
  auto it = unit_index_.find(&module);
  if (it == unit_index_.end()) return std::nullopt;
  return it->second;
}

std::vector<size_t> FSDPState::units_in_forward_order() const { return with_the_rest(last_forward_order_); }

const ShardedParam* FSDPState::param(const std::string& name) const {
  auto it = param_index_.find(name);
  return it == param_index_.end() ? nullptr : &params_[it->second];
}

const ShardedParam* FSDPState::param_of_state(const std::string& state_name) const {
  size_t dot = state_name.rfind('.');
  if (dot == std::string::npos) return nullptr;
  return param(state_name.substr(0, dot));
}

at::Tensor FSDPState::gather_full(const ShardedParam& p, const at::Tensor& piece) {
  return detail::gather_full(context_.group, p, piece);
}

}  // namespace strata::strategies::detail
