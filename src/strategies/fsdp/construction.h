// Sharding a model while it is built (module_sharded_context). Private to
// the strategies area.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "../grad_hooks.h"
#include "fsdp_state.h"

namespace strata::strategies::detail {

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

/// The module_built handler of module_sharded_context: shards each module
/// the policy makes a unit as soon as it is built, keeping this rank's
/// pieces in `presharded` for setup_module to adopt.
ModuleBuiltHandler shard_when_built(std::shared_ptr<Presharded> presharded, AutoWrapPolicy policy, int world,
                                    int rank, c10::ScalarType compute);

}  // namespace strata::strategies::detail
