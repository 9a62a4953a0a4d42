// What FSDPStrategy keeps for one module set up: its units in order, the
// schedule across them (prefetch, the root's reset before each forward,
// the order of gradient reductions, the end of a backward) and the
// lookups (parameter -> unit, module -> unit). Each unit's own state and
// transitions are in unit.h. Private to the strategies area; the
// strategy's public header only names it.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "strata/comm/group.h"
#include "strata/core/module_hooks.h"
#include "strata/strategies/fsdp.h"
#include "../grad_hooks.h"
#include "sharded_param.h"
#include "unit.h"

namespace strata::strategies::detail {

/// The units of one module set up, and the schedule that moves them.
class FSDPState : public std::enable_shared_from_this<FSDPState> {
 public:
  /// An empty state for `root_module` (build makes the units), whose units
  /// gather in `compute` and reduce in `reduce`, on `device` (which decides
  /// FSDPOptions::overlap_backward when unset).
  FSDPState(ModulePtr root_module, comm::Group group, const FSDPOptions& options, c10::ScalarType compute,
            c10::ScalarType reduce, c10::Device device);
  FSDPState(const FSDPState&) = delete;
  FSDPState& operator=(const FSDPState&) = delete;
  /// Note [Overlap in backward]: FSDPOptions::overlap_backward, resolved.
  bool overlaps_backward() const { return overlap_backward_; }

  // ---- construction (construction.cpp) ----
  /// Makes the units by the wrap policy and shards the parameters (those
  /// in `presharded` are sharded already; their entries are removed).
  /// Throws ConfigError, before anything changes, for a parameter FSDP
  /// cannot shard: one in `sharded_elsewhere` (the shards of the modules
  /// set up before) or sharded by them, or one sharing memory with another.
  void build(const FSDPOptions& options, Presharded* presharded,
             const std::unordered_set<const c10::TensorImpl*>& sharded_elsewhere);
  /// Moves every unit's shards to `device` (Note [Shards on the device]).
  void place_shards(c10::Device device);
  /// Removes the forward and gradient hooks.
  void unhook();

  // ---- around forward and backward (fsdp_state.cpp) ----
  /// Before unit u's forward seen through its hooks: the root's resets the
  /// step; every unit's gathers its parameters and prefetches the next
  /// unit's. The unit stays gathered until post_forward.
  void pre_forward(size_t u);
  /// After unit u's hooked forward: frees or reshards it, and hooks
  /// `outputs` so that the unit's backward gathers it again.
  void post_forward(size_t u, TensorList& outputs);
  /// Unit u's hooked forward threw: it no longer keeps the unit gathered.
  void forward_failed(size_t u) { --hooked_[u]; }
  /// An operator is about to read the parameters `uses` (index, and the
  /// empty storage it read) whose storage is empty: gathers their units
  /// (Note [Gather on first use]). In forward a unit's first use starts its
  /// forward (the order is recorded; the unit gathered before it is freed);
  /// in backward it refills the unit. Throws ConfigError for a view whose
  /// storage is no longer its parameter's.
  void gather_on_first_use(const std::vector<std::pair<size_t, const c10::StorageImpl*>>& uses);
  /// Reshards units gathered outside a training step (an evaluation
  /// without hooks leaves the last unit it used gathered).
  void reshard_idle();
  /// After loss.backward(): reduces what is left, waits for every
  /// reduction, reshards every unit and gets ready for the next step.
  void finalize_backward();
  /// Reshards every unit (teardown).
  void reshard_all();
  /// Turns gradient synchronisation off until the scope ends
  /// (no_backward_sync).
  Scope no_backward_sync();

  // ---- lookups (fsdp_state.cpp) ----
  const ModulePtr& root_module() const { return root_module_; }
  /// False once a root module held by value is gone (Note [Modules held by
  /// value] in strategies/strategy.h); always true for an owned one.
  bool root_alive() const { return !borrowed(root_module_) || !root_life_.expired(); }
  /// For a root held by value: watches its lifetime through the hooks set
  /// on it (call after setting them).
  void watch_root();
  /// The units, the root last.
  const std::vector<Unit>& units() const { return units_; }
  /// The unit whose module is `module`, if any.
  std::optional<size_t> unit_of(const torch::nn::Module& module) const;
  /// Every unit, those of the last forward in its order first, then the
  /// rest by index (for reports).
  std::vector<size_t> units_in_forward_order() const;
  std::vector<ShardedParam>& params() { return params_; }
  const std::vector<ShardedParam>& params() const { return params_; }
  /// The parameter named `name` (its first full name), or null.
  const ShardedParam* param(const std::string& name) const;
  /// The parameter an optimizer state tensor "<param name>.<state name>"
  /// belongs to, or null.
  const ShardedParam* param_of_state(const std::string& state_name) const;
  /// Checkpointed modules that are not units.
  const std::vector<torch::nn::Module*>& checkpointed() const { return checkpointed_; }
  /// Records a checkpointed module that is not a unit (its hooks go at unhook).
  void add_checkpointed(torch::nn::Module* module) { checkpointed_.push_back(module); }
  int world() const { return context_.world; }
  int rank() const { return rank_; }
  c10::ScalarType compute_dtype() const { return context_.compute_dtype; }
  /// The full value of a tensor sharded like `p`; a collective.
  at::Tensor gather_full(const ShardedParam& p, const at::Tensor& piece);

 private:
  // construction.cpp
  void shard_param(size_t i, const FSDPOptions& options);
  // fsdp_state.cpp
  void root_pre_forward();
  /// Unit u's forward starts (hooked or on first use): gathers it, records
  /// it and prefetches the next; frees the unit gathered before it unless
  /// that one is among `busy` (Note [Free when the next unit starts]).
  void start_forward(size_t u, const std::vector<size_t>& busy);
  void pre_backward(size_t u);
  /// The gradient hook of params_[i]; true when it counted (sync on).
  bool post_backward(size_t i);
  // schedule.cpp
  /// The unit to gather while unit u computes (Note [Prefetch order]).
  std::optional<size_t> prefetch_target(size_t u, bool backward) const;
  /// `order`, then every unit not in it, by index.
  std::vector<size_t> with_the_rest(std::vector<size_t> order) const;
  /// Starts the reductions of complete units, in the fixed order
  /// (Note [Reduction order]); `all`: every unit counts as complete.
  void launch_ready_reductions(bool all);
  void launch_reduction(size_t u);

  UnitContext context_;  ///< shared by units_, so declared before them
  int rank_ = 0;
  bool prefetch_ = true;
  bool overlap_backward_ = true;  ///< Note [Overlap in backward]
  bool sync_ = true;  ///< gradients reduced in this backward (no_backward_sync turns it off)
  ModulePtr root_module_;
  std::vector<ModulePtr> root_children_;  ///< a borrowed root's children, kept past the root
  std::weak_ptr<const torch::nn::Module> root_life_;  ///< expires with a borrowed root
  GradHooks grad_hooks_;  ///< Note [Gradient hooks]
  std::vector<ShardedParam> params_;
  std::unordered_map<std::string, size_t> param_index_;  ///< params_ by name
  std::vector<Unit> units_;
  std::unordered_map<const torch::nn::Module*, size_t> unit_index_;  ///< units_ by module
  size_t root_ = 0;
  std::vector<torch::nn::Module*> checkpointed_;
  std::optional<size_t> current_;  ///< the unit gathered last in forward
  std::vector<int> hooked_;        ///< per unit: its hooked forwards running (they keep it gathered)
  std::vector<size_t> forward_order_;       ///< this step's, so far
  std::vector<size_t> last_forward_order_;  ///< the last complete step's
  std::vector<size_t> reduction_order_;     ///< this backward's, made at its first reduction
  size_t next_reduction_ = 0;
  std::deque<size_t> in_flight_;  ///< units whose reduce-scatter runs, oldest first
};

}  // namespace strata::strategies::detail
