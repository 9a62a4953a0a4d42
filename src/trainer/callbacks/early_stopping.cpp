// EarlyStopping (trainer/callbacks/early_stopping.h): stops fit when a
// monitored metric stops improving; rank 0's value decides (Note [Rank 0
// decides] in callbacks/shared.h).
#include "strata/trainer/callbacks/early_stopping.h"

#include <cmath>
#include <limits>

#include "shared.h"
#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/strategies/strategy.h"
#include "strata/trainer/trainer.h"
#include "strata/trainer/trainer_state.h"

namespace strata::trainer {

using detail::check_mode;
using detail::monitored;

EarlyStopping::EarlyStopping(EarlyStoppingOptions options) : options_(std::move(options)) {
  STRATA_CHECK(!options_.monitor.empty(), ConfigError, "[trainer] EarlyStopping needs a monitor (a logged metric)");
  check_mode(options_.mode, "EarlyStopping");
  STRATA_CHECK(options_.patience >= 0, ConfigError, "[trainer] EarlyStopping patience must be >= 0, got ",
               options_.patience);
  STRATA_CHECK(std::isfinite(options_.min_delta), ConfigError, "[trainer] EarlyStopping min_delta must be finite");
  best_ = options_.mode == "min" ? std::numeric_limits<double>::infinity() : -std::numeric_limits<double>::infinity();
}

std::string EarlyStopping::state_key() const {
  return "EarlyStopping{monitor=" + options_.monitor + ", mode=" + options_.mode + "}";
}

void EarlyStopping::on_validation_end(Trainer& trainer, TrainModule&) {
  // Not on the sanity validation's values, nor under fast_dev_run (Lightning's).
  if (trainer.state_fn() != "fit" || trainer.sanity_checking() || options_.check_on_train_epoch_end) return;
  validated_ = true;
  if (trainer.fast_dev_run() == 0) check(trainer);
}

void EarlyStopping::on_train_epoch_end(Trainer& trainer, TrainModule&) {
  const bool validated = validated_;
  validated_ = false;
  if (trainer.fast_dev_run() > 0) return;
  // Without validation data the epoch's end is the check; with it, an
  // epoch that did not validate (check_val_every_n_epoch > 1, an interval
  // that did not come round) is not checked, as in Lightning.
  if (options_.check_on_train_epoch_end || (!validated && trainer.num_val_batches() == 0)) check(trainer);
}

void EarlyStopping::check(Trainer& trainer) {
  const double current = monitored(trainer, options_.monitor, "EarlyStopping");
  const double delta = std::abs(options_.min_delta);
  bool stop = false;
  if (!std::isfinite(current)) {
    stop = true;
  } else if (options_.mode == "min" ? current < best_ - delta : current > best_ + delta) {
    best_ = current;
    wait_ = 0;
  } else if (++wait_ >= options_.patience) {
    stop = true;
  }
  stop = trainer.strategy().reduce_boolean_decision(stop, /*all=*/false);  // Note [Rank 0 decides]
  if (stop && !trainer.should_stop) {
    trainer.should_stop = true;
    stopped_step_ = trainer.global_step();
    stopped_epoch_ = trainer.current_epoch();
    if (trainer.is_global_zero()) {
      log::info("[trainer] early stopping: ", options_.monitor, " did not improve for ", wait_, " check(s) (best ",
                best_, "); stopping at step ", stopped_step_);
    }
  }
}

nlohmann::json EarlyStopping::state_dict() const {
  // JSON has no infinity: an unset best is null.
  return {{"wait_count", wait_},
          {"best_score", std::isfinite(best_) ? nlohmann::json(best_) : nlohmann::json(nullptr)},
          {"stopped_step", stopped_step_},
          {"stopped_epoch", stopped_epoch_}};
}

void EarlyStopping::load_state_dict(const nlohmann::json& state) {
  validate_early_stopping_state(state, "EarlyStopping state");
  wait_ = state["wait_count"].get<int64_t>();
  if (state["best_score"].is_number()) best_ = state["best_score"].get<double>();
  stopped_step_ = state["stopped_step"].get<int64_t>();
  stopped_epoch_ = state.contains("stopped_epoch") ? state["stopped_epoch"].get<int64_t>() : 0;  // absent: older
}

}  // namespace strata::trainer
