// Strategy::reduce_boolean_decision: one vote per rank, the Trainer's way
// of making callbacks (early stopping, checkpoint top-k) agree on all ranks.
#include <ATen/ATen.h>

#include "strata/strategies/strategy.h"

namespace strata::strategies {

bool Strategy::reduce_boolean_decision(bool decision, bool all) {
  at::Tensor votes = at::scalar_tensor(decision ? 1.0 : 0.0, at::kFloat);
  at::Tensor total = all_reduce(votes, comm::ReduceOp::kSum);
  const int yes = static_cast<int>(total.item<float>() + 0.5f);
  return all ? yes == world_size() : yes > 0;
}

}  // namespace strata::strategies
