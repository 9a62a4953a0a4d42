// The Trainer's set-up around the loops: the launch (Note [One launch
// protocol] in strategies/placement.h), attaching a module and preparing
// it through the strategy (Strategy::setup(trainer)), the optimizers of
// configure_optimizers, and the loaders it builds from a DataSource.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <mutex>
#include <typeinfo>

#include "loops/evaluation_loop.h"
#include "loops/fit_loop.h"
#include "loops/predict_loop.h"
#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/data/distributed_sampler.h"
#include "strata/strategies/placement.h"
#include "strata/trainer/callbacks.h"
#include "strata/trainer/model_summary.h"
#include "strata/trainer/trainer.h"
#include "trainer_impl.h"

namespace strata {

using trainer::detail::warn;

namespace {

constexpr const char* kOneModule =
    "[trainer] this Trainer already runs another module; one Trainer trains one module (its strategy set that "
    "module up): create a new Trainer for this one";

// "[trainer] accelerator 'xla' with devices=2 runs the ranks as threads of
// this process, each with ", for the messages of what cannot be made for them.
std::string threads_note(const strategies::ResolvedPlacement& p) {
  return detail::cat("[trainer] accelerator '", p.accelerator->name(), "' with devices=", p.devices,
                     " runs the ranks as threads of this process, each with ");
}

// Rank r's module: the options' module_factory's, with `module`'s weights
// and hyperparameters (Note [The Trainer's ranks as threads]).
std::shared_ptr<TrainModule> module_for_rank(const TrainModule& module, const TrainerOptions& options,
                                             const strategies::ResolvedPlacement& p) {
  STRATA_CHECK(options.module_factory != nullptr, ConfigError, threads_note(p), "a module of its own, and no "
               "module_factory builds them: pass TrainerOptions::with_module_factory a function that returns a new "
               "module built as this one was (e.g. [=] { return std::make_shared<MyModule>(config); }); the "
               "Trainer copies this one's weights into it");
  std::shared_ptr<TrainModule> copy = options.module_factory();
  STRATA_CHECK(copy != nullptr, ConfigError, "[trainer] module_factory returned a null module");
  STRATA_CHECK(typeid(*copy) == typeid(module), ConfigError, "[trainer] module_factory returned a module of "
               "another class (", typeid(*copy).name(), ", not ", typeid(module).name(), "); return a new module "
               "of the class of the one passed");
  const auto copy_all = [&](const torch::OrderedDict<std::string, at::Tensor>& from,
                            const torch::OrderedDict<std::string, at::Tensor>& to, const char* what) {
    STRATA_CHECK(from.size() == to.size(), ConfigError, "[trainer] module_factory returned a module with ",
                 to.size(), " ", what, "s where the one passed has ", from.size(), "; build it as that one was");
    for (const auto& item : from) {
      const at::Tensor* target = to.find(item.key());
      STRATA_CHECK(target != nullptr && target->sizes() == item.value().sizes() &&
                       target->scalar_type() == item.value().scalar_type(),
                   ConfigError, "[trainer] module_factory returned a module whose ", what, " '", item.key(),
                   "' is missing or of another shape or type; build it as the one passed was");
      at::Tensor(*target).detach().copy_(item.value().detach());
    }
  };
  {
    torch::NoGradGuard no_grad;
    copy_all(module.named_parameters(), copy->named_parameters(), "parameter");
    copy_all(module.named_buffers(), copy->named_buffers(), "buffer");
  }
  copy->save_hyperparameters(module.hparams());
  return copy;
}

// A copy of `c` as one of `Classes` (trainer::detail::copy_as); null when
// it is none of them.
template <class... Classes>
trainer::CallbackPtr copy_as_one_of(const trainer::Callback& c) {
  trainer::CallbackPtr copy;
  ((copy = copy != nullptr ? copy : trainer::detail::copy_as<Classes>(c)), ...);
  return copy;
}

// Rank r's copy of callback `c` (Note [The Trainer's ranks as threads]):
// by the copier with_callback recorded, or as a built-in callback.
trainer::CallbackPtr callback_for_rank(const trainer::CallbackPtr& c, const TrainerOptions& options,
                                       const strategies::ResolvedPlacement& p) {
  const auto copier = options.callback_copiers.find(c.get());
  trainer::CallbackPtr copy = copier != options.callback_copiers.end() ? copier->second() : nullptr;
  if (copy == nullptr) {
    copy = copy_as_one_of<trainer::ModelCheckpoint, trainer::EarlyStopping, trainer::LearningRateMonitor,
                          trainer::Timer, trainer::ProgressBar>(*c);
  }
  STRATA_CHECK(copy != nullptr, ConfigError, threads_note(p), "its own callbacks, and the callback '", c->state_key(),
               "' cannot be copied for them: give its class a copy constructor (the implicit one will do) and pass "
               "it as TrainerOptions().with_callback(std::make_shared<MyCallback>(...)), which records how to copy "
               "it");
  return copy;
}

}  // namespace

Trainer::Trainer(const Trainer& primary, std::shared_ptr<strategies::Strategy> strategy)
    : options_(primary.options_), placement_(primary.placement_), strategy_(std::move(strategy)) {
  placement_.strategy = strategy_;
  loggers_ = primary.loggers_;  // written by rank 0 only
  for (const auto& c : primary.callbacks_) callbacks_.push_back(callback_for_rank(c, options_, placement_));
  make_loops();  // the options are the primary's: the same max_epochs
}

std::shared_ptr<TrainModule> Trainer::borrow(TrainModule& module) {
  return std::static_pointer_cast<TrainModule>(strategies::module_pointer(module));
}

void Trainer::forget_module(const TrainModule& module) {
  if (module_.get() != &module) return;
  if (strategy_->lightning_module().get() == &module) strategy_->connect(nullptr);
  // Borrowed (Note [Modules held by value]). module_set_up_ stays: the
  // strategy set this one up, so another is refused (kOneModule).
  module_.reset();
}

void Trainer::launch(const std::shared_ptr<TrainModule>& module, const RankCall& call) {
  if (placement_.thread_ranks() && strategies::detail::current_thread_rank() == nullptr) {
    run_on_thread_ranks(module, call);
    return;
  }
  const bool set_up_before = strategy_->launched();
  strategies::launch(placement_, "trainer", strategies::WorkerExit::kContinue, [&] {
    // The call that set the environment up tears it down with the Trainer,
    // also when the call fails.
    if (!set_up_before) owns_environment_ = true;
    call(*this, module);
    return nlohmann::json();
  });
}

void Trainer::run_on_thread_ranks(const std::shared_ptr<TrainModule>& module, const RankCall& call) {
  STRATA_CHECK(module != nullptr, ConfigError, "[trainer] got a null module");
  STRATA_CHECK(module_ ? module_ == module : !module_set_up_, ConfigError, kOneModule);
  if (!thread_ranks_) {
    auto ranks = std::make_unique<ThreadRanks>();
    ranks->job = std::make_unique<strategies::ThreadRankJob>(placement_, "trainer");
    for (int r = 1; r < ranks->job->size(); ++r) {
      ranks->trainers.push_back(std::unique_ptr<Trainer>(new Trainer(*this, ranks->job->strategy(r))));
    }
    thread_ranks_ = std::move(ranks);
  }
  ThreadRanks& ranks = *thread_ranks_;
  if (ranks.module != module) {
    // Made before any rank starts; a module's initialisation draws from the
    // CPU generator, which the ranks then find as a one-process run leaves it.
    at::Generator generator = at::detail::getDefaultCPUGenerator();
    at::Tensor state;
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      state = generator.get_state();
    }
    std::vector<std::shared_ptr<TrainModule>> modules;
    for (size_t r = 0; r < ranks.trainers.size(); ++r) {
      modules.push_back(module_for_rank(*module, options_, placement_));
    }
    {
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(state);
    }
    ranks.modules = std::move(modules);
    ranks.module = module;
  }
  ranks.job->run([&](int r) {
    if (r == 0) {
      call(*this, module);
      return nlohmann::json();
    }
    const size_t i = static_cast<size_t>(r - 1);
    call(*ranks.trainers[i], ranks.modules[i]);
    return nlohmann::json();
  });
}

void Trainer::setup_strategy() {
  STRATA_CHECK(strategy_->lightning_module() != nullptr, ConfigError, "[", strategy_->name(),
               "] setup(trainer) before connect(module): connect the module to train first");
  if (!module_set_up_) {
    // The accelerator and precision are the strategy's own; the module is
    // placed (DDP: moved, synchronised, hooked; FSDP: sharded).
    strategy_->connect(strategy_->setup_module(strategy_->lightning_module()));
    strategy_->apply_sync_batchnorm(*strategy_->lightning_module());
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
  STRATA_CHECK(module_ ? module_ == module : !module_set_up_, ConfigError, kOneModule);
  STRATA_CHECK(stage_.empty(), ConfigError, "[trainer] ", stage, " was called while ", stage_,
               " is running; the loops do not nest");
  module_ = module;
  module_->trainer_ = this;
  stage_ = stage;
  should_stop = false;
  strategy_->connect(module_);
  // Lightning's ModelSummary at the start of fit; counted before the
  // strategy sets the module up (FSDP leaves each rank a slice).
  if (stage == "fit" && options_.enable_model_summary && !module_set_up_ && is_global_zero()) {
    const std::string table = trainer::summarize(*module_, options_.precision.value_or("32-true")).table();
    size_t begin = 0;
    while (begin <= table.size()) {
      const size_t end = std::min(table.find('\n', begin), table.size());
      log::info(table.substr(begin, end - begin));
      begin = end + 1;
    }
  }
  setup_strategy();
  each_callback([&](trainer::Callback& c) { c.setup(*this, *module_, stage); });
}

void Trainer::detach(const std::string& stage, const std::string& status) {
  if (is_global_zero()) {
    for (const auto& logger : loggers_) {
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
  STRATA_CHECK(!loader || !placement_.thread_ranks(), ConfigError, "[trainer] the ", what, " data is a loader, "
               "but the ranks are threads of this process (accelerator '", placement_.accelerator->name(),
               "', devices=", placement_.devices, ") and would share it: pass a dataset, which the Trainer "
               "splits among the ranks");
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
    // overfit_batches trains on the same first batches every epoch (Note [Debug runs]).
    const bool shuffle = train && o.shuffle && !(options_.overfit_batches.value > 0);
    data::DistributedSampler sampler(source.dataset()->size(), world, global_rank(), shuffle, o.seed,
                                     o.drop_last, /*repeat_to_even=*/what == "predict");
    loader = std::make_shared<data::DataLoader>(source.dataset(), sampler, static_cast<size_t>(o.batch_size / world),
                                                o.drop_last);
  }
  return strategy_->process_dataloader(loader);
}

}  // namespace strata
