// The FSDP schedule: which unit to prefetch, and the order and number of
// gradient reductions in flight.
#include "fsdp_state.h"

namespace strata::strategies::detail {

// Note [Prefetch order]
// Each step records the order in which units ran their forward. While unit
// u computes its forward, the unit that ran right after u gets gathered;
// while u computes its backward (units go backward in the reverse order),
// the one that ran right before u. The order of this step is used once it
// is at least as long as the last step's (it is then complete: in backward,
// or in a forward that already passed the last step's units); until then
// the last step's order, since this step's forward is still being
// recorded. The first step has no order yet, so it prefetches nothing
// before each unit has run once.
std::optional<size_t> FSDPState::prefetch_target(size_t u, bool backward) const {
  const std::vector<size_t>& order =
      forward_order_.size() >= last_forward_order_.size() ? forward_order_ : last_forward_order_;
  const int direction = backward ? -1 : +1;
  for (size_t k = 0; k < order.size(); ++k) {
    if (order[k] != u) continue;
    int64_t next = static_cast<int64_t>(k) + direction;
    if (next < 0 || next >= static_cast<int64_t>(order.size())) return std::nullopt;
    return order[static_cast<size_t>(next)];
  }
  return std::nullopt;
}

std::vector<size_t> FSDPState::with_the_rest(std::vector<size_t> order) const {
  std::vector<bool> listed(units_.size(), false);
  for (size_t u : order) listed[u] = true;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (!listed[u]) order.push_back(u);
  }
  return order;
}

// Note [Reduction order]
// Reduce-scatters start in one fixed order on every rank: the reverse of
// this step's forward order (the order backward completes units in), then
// the units that did not run, by index. A unit's reduction starts once it
// is complete and every unit before it has started, so ranks never
// disagree on the order of collectives, even when some gradient is missing
// on some rank (finalize_backward then starts the rest, missing gradients
// counting as zero).
void FSDPState::launch_ready_reductions(bool all) {
  if (reduction_order_.empty()) reduction_order_ = with_the_rest({forward_order_.rbegin(), forward_order_.rend()});
  while (next_reduction_ < reduction_order_.size()) {
    const size_t u = reduction_order_[next_reduction_];
    const Unit& unit = units_[u];
    if (unit.trainable() > 0 && !all && unit.training_state() != TrainingState::kPostBackward) break;
    if (unit.trainable() > 0) launch_reduction(u);
    ++next_reduction_;
  }
}

// Note [Overlap in backward]
// With overlap (GPUs, the xla device), a unit's backward runs while the
// previous unit's parameters are gathered (the backward prefetch) and the
// next unit's gradients are reduce-scattered (one reduction in flight).
// Each costs a unit's full block of memory at the end of backward, where
// the training peak is. On CPU workers every core computes (the launcher
// gives each worker cores / workers threads), so a collective's copies
// take a core from the computation whenever they run: measured on GPT
// large at 2 ranks (2 cores), without either the step took the same time
// (1213-1220 ms against 1211-1269) and the peak fell from 856 to 800 MB;
// at 4 ranks from 559-568 to 512 MB (2388 ms against 2482); GPT medium's
// steps stayed within the runs' spread (995-1018 ms against 1009-1079). So
// on the CPU the default is to run backward's collectives in order: the
// gather just before the unit's backward, the reduction to its end before
// the backward moves on. FSDPOptions::overlap_backward chooses either way.
void FSDPState::launch_reduction(size_t u) {
  units_[u].start_reduction();  // and reshards the unit
  // Note [One reduction in flight]: each reduction holds a unit's full
  // gradient block until it is done. Waiting for the previous one before
  // the next starts keeps one block in flight, as FSDP2 does; measured on
  // 2 ranks, a second in flight saved no time (GPT medium) and cost a
  // block of peak memory (GPT large: 27 MB). Without overlap, none stays.
  in_flight_.push_back(u);
  while (in_flight_.size() > (overlap_backward_ ? 1u : 0u)) {
    units_[in_flight_.front()].finish_reduction();
    in_flight_.pop_front();
  }
}

}  // namespace strata::strategies::detail
