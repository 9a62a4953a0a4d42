// The evaluation loop (evaluation_loop.h): validate() and test(), and the
// validations and the sanity validation inside fit.
#include "evaluation_loop.h"

#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <optional>

#include "../results.h"
#include "../trainer_impl.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/core/error.h"
#include "strata/core/module_hooks.h"
#include "strata/strategies/precision.h"

namespace strata::trainer::detail {

EvalMode::EvalMode(torch::nn::Module& module) : module_(module), was_training_(module.is_training()) {
  module_.eval();
}

EvalMode::~EvalMode() { module_.train(was_training_); }

EvaluationLoop::EvaluationLoop(Trainer& trainer) : trainer_(trainer) {}

Metrics EvaluationLoop::run(const DataSource& data, const std::string& stage) {
  Trainer& t = trainer_;
  std::shared_ptr<data::Loader> loader = t.make_loader(data, false, stage);
  const BatchLimit& limit = stage == "test" ? t.options_.limit_test_batches : t.options_.limit_val_batches;
  t.validating_ = stage == "validate";
  if (t.validating_) t.each_callback([&](Callback& c) { c.on_validation_start(t, *t.module_); });
  else t.each_callback([&](Callback& c) { c.on_test_start(t, *t.module_); });
  Metrics metrics = run_epoch(*loader, limit.of(static_cast<int64_t>(loader->size())), stage);
  if (t.validating_) t.each_callback([&](Callback& c) { c.on_validation_end(t, *t.module_); });
  else t.each_callback([&](Callback& c) { c.on_test_end(t, *t.module_); });
  return metrics;
}

void EvaluationLoop::run_in_fit(data::Loader& loader, int64_t limit, bool sanity) {
  // Note [Sanity validation]: before training, num_sanity_val_steps
  // batches run through the validation loop and its hooks with
  // sanity_checking() true, in Lightning's order (on_sanity_check_start,
  // the validation hooks, on_sanity_check_end); the random state is left
  // as it was, and the metrics are dropped afterwards, so nothing ranks,
  // stops or logs on them.
  Trainer& t = trainer_;
  at::Tensor rng_state;
  if (sanity) {
    t.sanity_checking_ = true;
    rng_state = checkpoint::cpu_rng_state();
    t.each_callback([&](Callback& c) { c.on_sanity_check_start(t, *t.module_); });
  }
  struct SanityReset {
    Trainer& t;
    ~SanityReset() { t.sanity_checking_ = false; }
  } sanity_reset{t};
  t.validating_ = true;
  t.each_callback([&](Callback& c) { c.on_validation_start(t, *t.module_); });
  run_epoch(loader, limit, "validate_in_fit");
  t.validating_ = false;
  t.each_callback([&](Callback& c) { c.on_validation_end(t, *t.module_); });
  if (sanity) {
    t.each_callback([&](Callback& c) { c.on_sanity_check_end(t, *t.module_); });
    checkpoint::set_cpu_rng_state(rng_state);
    t.callback_metrics_.clear();
    t.progress_bar_metrics_.clear();
    t.logged_metrics_.clear();
  }
}

Metrics EvaluationLoop::run_epoch(data::Loader& loader, int64_t limit, const std::string& stage) {
  Results results;
  results_ = &results;
  struct Reset {
    Results*& results;
    ~Reset() { results = nullptr; }
  } reset{results_};
  TrainModule& module = *trainer_.module_;
  EvalMode eval(module);
  torch::NoGradGuard no_grad;
  const bool test = stage == "test";
  if (test) module.on_test_epoch_start();
  else module.on_validation_epoch_start();
  loader.set_epoch(0);
  loader.reset();
  for (int64_t idx = 0; idx < limit; ++idx) {
    std::optional<data::Batch> batch = loader.next();
    if (!batch) break;
    if (!run_step(*batch, idx, stage)) return {};
  }
  if (test) module.on_test_epoch_end();
  else module.on_validation_epoch_end();
  return end_epoch(results, stage);
}

bool EvaluationLoop::run_step(const data::Batch& batch, int64_t batch_idx, const std::string& stage) {
  Trainer& t = trainer_;
  TrainModule& module = *t.module_;
  t.current_batch_size_ = batch.examples();
  t.current_share_ = batch.share(t.world_size());
  struct ShareReset {
    double& share;
    ~ShareReset() { share = 1.0; }
  } share_reset{t.current_share_};
  strategies::Precision::ForwardContext autocast(t.strategy_->precision());
  try {
    hooked_forward(module, batch.input, [&](const at::Tensor&) {
      at::Tensor out = stage == "test" ? module.test_step(batch, batch_idx) : module.validation_step(batch, batch_idx);
      return out.defined() ? out : at::zeros({});
    });
  } catch (const NotOverridden& missing) {
    // Every rank runs the same module, so every rank stops here together.
    if (stage == "validate_in_fit") {
      warn(t, "validation data was given but the module does not override validation_step; skipping "
              "validation");
      return false;
    }
    throw ConfigError(strata::detail::cat("[trainer] ", stage, "() needs the module to override ", missing.hook));
  }
  return true;
}

Metrics EvaluationLoop::end_epoch(Results& results, const std::string& stage) {
  Trainer& t = trainer_;
  Metrics log, bar, all;
  results.reduce_epoch(*t.strategy_, log, bar, all);
  for (const auto& [k, v] : all) t.callback_metrics_[k] = v;
  for (const auto& [k, v] : bar) t.progress_bar_metrics_[k] = v;
  // Inside fit at Lightning's step (log_step: global_step itself inside an
  // accumulation window); a sanity validation logs nothing.
  const int64_t step = stage == "validate_in_fit" ? t.log_step() : std::max<int64_t>(t.global_step() - 1, 0);
  if (!log.empty() && !t.sanity_checking_) t.log_to_loggers(log, step);
  return all;
}

}  // namespace strata::trainer::detail
