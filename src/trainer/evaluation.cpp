// The Trainer's evaluation loops: validation inside fit, validate(),
// test() and predict().
//
// Note [Prediction order]
// predict() splits the dataset with an unshuffled distributed sampler:
// rank r takes positions r, r + N, r + 2N, ... of 0..n-1 (padded by
// repeating the start). Every rank holds the same number of rows, so one
// all_gather gives [N, m, ...]; position j*N + r is row j of rank r, so
// transposing to [m, N, ...] and flattening puts the rows in dataset order,
// and the first n of them drop the padding.
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include "results.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/core/error.h"
#include "strata/core/module_hooks.h"
#include "strata/strategies/precision.h"
#include "strata/trainer/trainer.h"
#include "trainer_impl.h"

namespace strata {

using trainer::detail::warn;

namespace {

// Restores a module's training mode when the scope ends.
struct EvalMode {
  torch::nn::Module& module;
  bool was_training;
  explicit EvalMode(torch::nn::Module& m) : module(m), was_training(m.is_training()) { module.eval(); }
  ~EvalMode() { module.train(was_training); }
};

}  // namespace

trainer::Metrics Trainer::evaluation_loop(data::Loader& loader, int64_t limit, const std::string& stage) {
  trainer::detail::Results results;
  active_results_ = &results;
  struct Reset {
    Trainer& t;
    ~Reset() { t.active_results_ = nullptr; }
  } reset{*this};
  EvalMode eval(*module_);
  torch::NoGradGuard no_grad;
  const bool test = stage == "test";
  if (test) module_->on_test_epoch_start();
  else module_->on_validation_epoch_start();
  loader.set_epoch(0);
  loader.reset();
  for (int64_t idx = 0; idx < limit; ++idx) {
    std::optional<data::Batch> batch = loader.next();
    if (!batch) break;
    current_batch_size_ = batch->examples();
    current_share_ = batch->share(world_size());
    struct ShareReset {
      double& share;
      ~ShareReset() { share = 1.0; }
    } share_reset{current_share_};
    strategies::Precision::ForwardContext autocast(strategy_->precision());
    try {
      hooked_forward(*module_, batch->input, [&](const at::Tensor&) {
        at::Tensor out = test ? module_->test_step(*batch, idx) : module_->validation_step(*batch, idx);
        return out.defined() ? out : at::zeros({});
      });
    } catch (const trainer::detail::NotOverridden& missing) {
      // Every rank runs the same module, so every rank stops here together.
      if (stage == "validate_in_fit") {
        warn(*this, "validation data was given but the module does not override validation_step; skipping "
                    "validation");
        return {};
      }
      throw ConfigError(detail::cat("[trainer] ", stage, "() needs the module to override ", missing.hook));
    }
  }
  if (test) module_->on_test_epoch_end();
  else module_->on_validation_epoch_end();
  trainer::Metrics log, bar, all;
  results.reduce_epoch(*strategy_, log, bar, all);
  for (const auto& [k, v] : all) callback_metrics_[k] = v;
  for (const auto& [k, v] : bar) progress_bar_metrics_[k] = v;
  // Inside fit at Lightning's step (log_step: global_step itself inside an
  // accumulation window); a sanity validation logs nothing.
  const int64_t step = stage == "validate_in_fit" ? log_step() : std::max<int64_t>(global_step_ - 1, 0);
  if (!log.empty() && !sanity_checking_) log_to_loggers(log, step);
  return all;
}

void Trainer::run_validation(data::Loader& loader, int64_t limit, bool sanity) {
  // Note [Sanity validation]: before training, num_sanity_val_steps
  // batches run through the validation loop and its hooks with
  // sanity_checking() true, in Lightning's order (on_sanity_check_start,
  // the validation hooks, on_sanity_check_end); the random state is left
  // as it was, and the metrics are dropped afterwards, so nothing ranks,
  // stops or logs on them.
  at::Tensor rng_state;
  if (sanity) {
    sanity_checking_ = true;
    rng_state = checkpoint::cpu_rng_state();
    each_callback([&](trainer::Callback& c) { c.on_sanity_check_start(*this, *module_); });
  }
  struct SanityReset {
    Trainer& t;
    ~SanityReset() { t.sanity_checking_ = false; }
  } sanity_reset{*this};
  validating_ = true;
  each_callback([&](trainer::Callback& c) { c.on_validation_start(*this, *module_); });
  evaluation_loop(loader, limit, "validate_in_fit");
  validating_ = false;
  each_callback([&](trainer::Callback& c) { c.on_validation_end(*this, *module_); });
  if (sanity) {
    each_callback([&](trainer::Callback& c) { c.on_sanity_check_end(*this, *module_); });
    checkpoint::set_cpu_rng_state(rng_state);
    callback_metrics_.clear();
    progress_bar_metrics_.clear();
    logged_metrics_.clear();
  } else {
    ++validations_run_;
  }
}

trainer::Metrics Trainer::run_evaluation(std::shared_ptr<TrainModule> module, const DataSource& data,
                                         const std::string& stage, const std::string& ckpt_path) {
  trainer::Metrics metrics;
  launch(module, [&](Trainer& rank, const std::shared_ptr<TrainModule>& m) {
    trainer::Metrics out = rank.evaluate_here(m, data, stage, ckpt_path);
    if (&rank == this) metrics = out;
  });
  return metrics;
}

trainer::Metrics Trainer::evaluate_here(std::shared_ptr<TrainModule> module, const DataSource& data,
                                        const std::string& stage, const std::string& ckpt_path) {
  attach(std::move(module), stage);
  trainer::Metrics metrics;
  try {
    if (!ckpt_path.empty()) {
      std::string path = resolve_ckpt_path(ckpt_path);
      if (!path.empty()) restore(path, /*training=*/false);
    }
    std::shared_ptr<data::Loader> loader = make_loader(data, false, stage);
    const BatchLimit& limit = stage == "test" ? options_.limit_test_batches : options_.limit_val_batches;
    validating_ = stage == "validate";
    if (validating_) each_callback([&](trainer::Callback& c) { c.on_validation_start(*this, *module_); });
    else each_callback([&](trainer::Callback& c) { c.on_test_start(*this, *module_); });
    metrics = evaluation_loop(*loader, limit.of(static_cast<int64_t>(loader->size())), stage);
    if (validating_) each_callback([&](trainer::Callback& c) { c.on_validation_end(*this, *module_); });
    else each_callback([&](trainer::Callback& c) { c.on_test_end(*this, *module_); });
  } catch (const std::exception& e) {
    each_callback([&](trainer::Callback& c) { c.on_exception(*this, *module_, e); });
    detach(stage, "failed");
    throw;
  }
  detach(stage, "success");
  return metrics;
}

trainer::Metrics Trainer::validate(std::shared_ptr<TrainModule> module, const DataSource& data,
                                   const std::string& ckpt_path) {
  return run_evaluation(std::move(module), data, "validate", ckpt_path);
}

trainer::Metrics Trainer::test(std::shared_ptr<TrainModule> module, const DataSource& data,
                               const std::string& ckpt_path) {
  return run_evaluation(std::move(module), data, "test", ckpt_path);
}

at::Tensor Trainer::predict(std::shared_ptr<TrainModule> module, const DataSource& data,
                            const std::string& ckpt_path) {
  // Each rank's own rows (an undefined tensor for thread ranks other than
  // this one's: they stay on their threads).
  at::Tensor result;
  launch(module, [&](Trainer& rank, const std::shared_ptr<TrainModule>& m) {
    at::Tensor out = rank.predict_here(m, data, ckpt_path);
    if (&rank == this) result = out;
  });
  return result;
}

at::Tensor Trainer::predict_here(std::shared_ptr<TrainModule> module, const DataSource& data,
                                 const std::string& ckpt_path) {
  STRATA_CHECK(data.dataset() != nullptr || world_size() == 1, ConfigError,
               "[trainer] predict on ", world_size(), " ranks needs a DataSource built from a dataset, so the "
               "Trainer knows which example each rank's rows are (see Note [Prediction order])");
  attach(std::move(module), "predict");
  at::Tensor result;
  try {
    if (!ckpt_path.empty()) {
      std::string path = resolve_ckpt_path(ckpt_path);
      if (!path.empty()) restore(path, /*training=*/false);
    }
    std::shared_ptr<data::Loader> loader = make_loader(data, false, "predict");
    const int64_t limit = options_.limit_predict_batches.of(static_cast<int64_t>(loader->size()));
    EvalMode eval(*module_);
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> rows;
    loader->set_epoch(0);
    loader->reset();
    for (int64_t idx = 0; idx < limit; ++idx) {
      std::optional<data::Batch> batch = loader->next();
      if (!batch) break;
      current_batch_size_ = batch->size();
      at::Tensor out;
      strategies::Precision::ForwardContext autocast(strategy_->precision());
      try {
        hooked_forward(*module_, batch->input, [&](const at::Tensor&) {
          out = module_->predict_step(*batch, idx);
          return out.defined() ? out : at::zeros({});
        });
      } catch (const trainer::detail::NotOverridden&) {
        throw ConfigError("[trainer] predict() needs the module to override predict_step");
      }
      STRATA_CHECK(out.defined() && out.dim() >= 1 && out.size(0) == batch->size(), ConfigError,
                   "[trainer] predict_step must return one row per example (dim 0 = ", batch->size(),
                   "), got ", out.defined() ? detail::cat(out.sizes()) : std::string("an undefined tensor"),
                   " at batch ", idx);
      rows.push_back(out.detach().cpu());
    }
    STRATA_CHECK(!rows.empty(), ConfigError, "[trainer] predict: the data yields no batch");
    at::Tensor local = at::cat(rows, 0).contiguous();
    int64_t total = data.dataset() ? static_cast<int64_t>(data.dataset()->size()) : local.size(0);
    if (world_size() == 1) {
      result = local.narrow(0, 0, std::min(total, local.size(0)));
    } else {
      // Note [Prediction order].
      at::Tensor gathered = strategy_->all_gather(local);  // [N, m, ...]
      if (is_global_zero()) {
        at::Tensor ordered = gathered.transpose(0, 1).contiguous();
        std::vector<int64_t> shape{ordered.size(0) * ordered.size(1)};
        for (int64_t d = 2; d < ordered.dim(); ++d) shape.push_back(ordered.size(d));
        ordered = ordered.reshape(shape);
        result = ordered.narrow(0, 0, std::min(total, ordered.size(0))).clone();
      }
    }
  } catch (const std::exception& e) {
    each_callback([&](trainer::Callback& c) { c.on_exception(*this, *module_, e); });
    detach("predict", "failed");
    throw;
  }
  detach("predict", "success");
  return result;
}

}  // namespace strata
