// FSDPState around forward and backward: the root's reset of the step, the
// check that the units around a unit are computing, the prefetch of the
// next unit, the hooks that start a unit's backward and count its
// gradients, and the end of the backward; then the lookups.
#include "fsdp_state.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include "strata/core/error.h"

namespace strata::strategies::detail {

void FSDPState::root_pre_forward() {
  grad_hooks_.check_no_stray_backward("fsdp");
  forward_order_.clear();
  for (Unit& unit : units_) unit.reset_training_state();
}

// The units around unit u must be computing: their parameters may be used
// around its forward. One that is not never ran hooked_forward.
void FSDPState::check_units_around(size_t u) const {
  const Unit& unit = units_[u];
  for (std::optional<size_t> a = unit.parent(); a; a = units_[*a].parent()) {
    // The root's forward starts every step, even without parameters.
    const Unit& around = units_[*a];
    if (around.training_state() != TrainingState::kIdle || (around.params().empty() && !around.is_root()) ||
        around.sharded_state() == ShardedState::kUnsharded) {
      continue;
    }
    std::string which = around.is_root() ? "the module passed to setup_module (" + around.type() + ")"
                                         : "unit '" + around.name() + "' (" + around.type() + ")";
    std::string call = around.is_root() ? "model" : around.name().substr(around.name().rfind('.') + 1);
    throw ConfigError("[fsdp] the forward of unit '" + unit.name() + "' ran, but the forward of " + which +
                      " around it did not go through strata's hooks, so it never started. strata sees the calls a "
                      "torch::nn::Sequential makes, but not a direct call of a module's typed forward: call it as "
                      "strata::call(" + call + ", x) instead of " + call + "->forward(x) "
                      "(strata/core/module_hooks.h), or run its forward through strata::hooked_forward");
  }
}

void FSDPState::pre_forward(size_t u) {
  Unit& unit = units_[u];
  if (unit.is_root()) {
    root_pre_forward();
  } else {
    check_units_around(u);
  }
  if (unit.pre_forward()) forward_order_.push_back(u);
  if (prefetch_ && c10::GradMode::is_enabled()) {
    std::optional<size_t> next = prefetch_target(u, /*backward=*/false);
    if (next) units_[*next].unshard();  // nothing when it is unsharded already
  }
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

void FSDPState::explain_failed_forward(const c10::Error& error) const {
  std::string idle, first;
  for (const Unit& unit : units_) {
    if (unit.training_state() != TrainingState::kIdle || unit.params().empty() ||
        unit.sharded_state() == ShardedState::kUnsharded) {
      continue;
    }
    idle += (idle.empty() ? "" : ", ") + ("'" + unit.name() + "' (" + unit.type() + ")");
    if (first.empty()) first = unit.name().substr(unit.name().rfind('.') + 1);
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
