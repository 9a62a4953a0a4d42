// Strategy::setup(trainer), seed 002's method, defined with the Trainer.
//
// Note [setup(trainer) lives with the Trainer]
// The strategies sit below the Trainer (DESIGN.md "Layers"): strategy.h
// only declares setup(Trainer&) against a forward declaration, and this
// file, in the Trainer's area, defines it. It is not virtual, so the
// strategies' objects never refer to it; what differs between strategies
// (setup_module, setup_optimizer) is virtual and is what it calls.
#include <torch/optim/optimizer.h>

#include "strata/core/error.h"
#include "strata/strategies/strategy.h"
#include "strata/trainer/trainer.h"

namespace strata::strategies {

void Strategy::setup(Trainer& trainer) {
  STRATA_CHECK(connected_ != nullptr, ConfigError, "[", name(),
               "] setup(trainer) before connect(module): connect the module to train first");
  if (!trainer.module_set_up_) {
    // The accelerator and precision are the strategy's own; the module is
    // placed (DDP: moved, synchronised, hooked; FSDP: sharded).
    connected_ = setup_module(connected_);
    trainer.module_set_up_ = true;
  }
  if (trainer.state_fn() == "fit" && trainer.optimizers_.empty()) {
    // Built after setup_module: FSDP's optimizers must see the shards.
    trainer.configure_optimizers_from_module();
    for (const auto& optimizer : trainer.optimizers_) setup_optimizer(*optimizer);
  }
}

}  // namespace strata::strategies
