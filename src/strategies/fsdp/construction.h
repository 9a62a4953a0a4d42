// Sharding a model while it is built (module_sharded_context). Private to
// the strategies area.
#pragma once

#include <memory>

#include "state.h"

namespace strata::strategies::detail {

/// The module_built handler of module_sharded_context: shards each module
/// the policy makes a unit as soon as it is built, keeping this rank's
/// pieces in `presharded` for setup_module to adopt.
ModuleBuiltHandler shard_when_built(std::shared_ptr<Presharded> presharded, AutoWrapPolicy policy, int world,
                                    int rank, c10::ScalarType compute);

}  // namespace strata::strategies::detail
