// The Trainer's set-up around the loops: the launch (Note [One launch
// protocol] in strategies/placement.h), attaching a module and preparing
// it through the strategy (Strategy::setup(trainer)), the optimizers of
// configure_optimizers, and the loaders it builds from a DataSource.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include "strata/core/error.h"
#include "strata/data/distributed_sampler.h"
#include "strata/strategies/placement.h"
#include "strata/trainer/callbacks.h"
#include "strata/trainer/trainer.h"
#include "trainer_impl.h"

namespace strata {

using trainer::detail::warn;

bool Trainer::launch(const std::function<nlohmann::json()>& call, nlohmann::json& remote) {
  const bool set_up_before = strategy_->launched();
  bool ran_here = false;
  remote = strategies::launch(placement_, "trainer", strategies::WorkerExit::kContinue, [&] {
    ran_here = true;
    // The call that set the environment up tears it down with the Trainer,
    // also when the call fails.
    if (!set_up_before) owns_environment_ = true;
    return call();
  });
  spawned_ = !ran_here;
  return ran_here;
}

void Trainer::setup_strategy() {
  STRATA_CHECK(strategy_->lightning_module() != nullptr, ConfigError, "[", strategy_->name(),
               "] setup(trainer) before connect(module): connect the module to train first");
  if (!module_set_up_) {
    // The accelerator and precision are the strategy's own; the module is
    // placed (DDP: moved, synchronised, hooked; FSDP: sharded).
    strategy_->connect(strategy_->setup_module(strategy_->lightning_module()));
    module_set_up_ = true;
  }
  if (stage_ == "fit" && optimizers_.empty()) {
    // Built after setup_module: FSDP's optimizers must see the shards.
    configure_optimizers_from_module();
    for (const auto& optimizer : optimizers_) strategy_->setup_optimizer(*optimizer);
  }
}

void Trainer::attach(std::shared_ptr<TrainModule> module, const std::string& stage) {
  STRATA_CHECK(module != nullptr, ConfigError, "[trainer] ", stage, " got a null module");
  STRATA_CHECK(!module_ || module_ == module, ConfigError,
               "[trainer] this Trainer already runs another module; one Trainer trains one module (its strategy "
               "set that module up): create a new Trainer for this one");
  STRATA_CHECK(stage_.empty(), ConfigError, "[trainer] ", stage, " was called while ", stage_,
               " is running; the loops do not nest");
  module_ = module;
  module_->trainer_ = this;
  stage_ = stage;
  should_stop = false;
  strategy_->connect(module_);
  setup_strategy();
  each_callback([&](trainer::Callback& c) { c.setup(*this, *module_, stage); });
}

void Trainer::detach(const std::string& stage, const std::string& status) {
  if (is_global_zero()) {
    for (const auto& logger : options_.loggers) {
      try {
        logger->finalize(status);
      } catch (const std::exception& e) {
        if (status == "success") throw;
        warn(*this, std::string("a logger failed to finalize: ") + e.what());
      }
    }
  }
  if (module_) each_callback([&](trainer::Callback& c) { c.teardown(*this, *module_, stage); });
  stage_.clear();
  validating_ = false;
}

void Trainer::configure_optimizers_from_module() {
  OptimizerConfig config = module_->configure_optimizers();
  STRATA_CHECK(!config.optimizers.empty(), ConfigError,
               "[trainer] configure_optimizers() returned no optimizer; return at least one, e.g. "
               "strata::OptimizerConfig(std::make_shared<torch::optim::AdamW>(parameters(), "
               "torch::optim::AdamWOptions(1e-3)))");
  for (size_t i = 0; i < config.optimizers.size(); ++i) {
    STRATA_CHECK(config.optimizers[i] != nullptr, ConfigError, "[trainer] configure_optimizers() returned a null "
                 "optimizer at index ", i);
    STRATA_CHECK(!config.optimizers[i]->param_groups().empty(), ConfigError,
                 "[trainer] configure_optimizers(): optimizer ", i, " has no parameters");
  }
  for (size_t i = 0; i < config.schedulers.size(); ++i) {
    const trainer::SchedulerConfig& s = config.schedulers[i];
    STRATA_CHECK(s.scheduler != nullptr, ConfigError, "[trainer] configure_optimizers(): scheduler ", i, " is null");
    STRATA_CHECK(s.interval == "step" || s.interval == "epoch", ConfigError,
                 "[trainer] configure_optimizers(): scheduler ", i, " has interval '", s.interval,
                 "'; use 'step' or 'epoch'");
    STRATA_CHECK(s.frequency >= 1, ConfigError, "[trainer] configure_optimizers(): scheduler ", i,
                 " has frequency ", s.frequency, "; use 1 or more");
    bool known = false;
    for (const auto& o : config.optimizers) known = known || o.get() == &s.scheduler->optimizer();
    STRATA_CHECK(known, ConfigError, "[trainer] configure_optimizers(): scheduler ", i,
                 " steps an optimizer that configure_optimizers did not return");
  }
  optimizers_ = std::move(config.optimizers);
  schedulers_ = std::move(config.schedulers);
}

std::shared_ptr<data::Loader> Trainer::make_loader(const DataSource& source, bool train, const std::string& what) {
  std::shared_ptr<data::Loader> loader = source.loader();
  if (!loader) {
    STRATA_CHECK(source.dataset() != nullptr, ConfigError, "[trainer] the ", what,
                 " data has neither a dataset nor a loader");
    const DataOptions& o = source.options();
    const int world = world_size();
    STRATA_CHECK(o.batch_size >= 1 && o.batch_size % world == 0, ConfigError, "[trainer] the ", what,
                 " batch_size ", o.batch_size, " must be a positive multiple of the world size (", world,
                 "): each rank takes batch_size / world_size examples per step");
    // Note [Unequal shares]: no example is repeated to even out the ranks,
    // so every global batch is the one a single process takes. predict()
    // keeps PyTorch's padding, which Note [Prediction order] drops.
    data::DistributedSampler sampler(source.dataset()->size(), world, global_rank(), train && o.shuffle, o.seed,
                                     o.drop_last, /*repeat_to_even=*/what == "predict");
    loader = std::make_shared<data::DataLoader>(source.dataset(), sampler, static_cast<size_t>(o.batch_size / world),
                                                o.drop_last);
  }
  return strategy_->process_dataloader(loader);
}

}  // namespace strata
