// TrainModule: default steps and log() (trainer/train_module.h).
#include "strata/trainer/train_module.h"

#include <ATen/ATen.h>

#include "strata/core/error.h"
#include "strata/trainer/trainer.h"

namespace strata {

TrainModule::TrainModule() = default;

TrainModule::~TrainModule() {
  // A Trainer that outlives its module (one held by value: Note [Modules
  // held by value] in strategies/strategy.h) must not reach back into it.
  if (trainer_ != nullptr) trainer_->forget_module(*this);
  trainer_ = nullptr;
}

at::Tensor TrainModule::validation_step(const data::Batch&, int64_t) {
  throw trainer::detail::NotOverridden{"validation_step"};
}

at::Tensor TrainModule::test_step(const data::Batch&, int64_t) { throw trainer::detail::NotOverridden{"test_step"}; }

at::Tensor TrainModule::predict_step(const data::Batch&, int64_t) {
  throw trainer::detail::NotOverridden{"predict_step"};
}

void TrainModule::log(const std::string& name, const at::Tensor& value, const LogOptions& options) {
  STRATA_CHECK(trainer_ != nullptr, ConfigError, "[trainer] log('", name,
               "') was called on a module no Trainer is running; log inside a step or hook");
  trainer_->record_log(name, value, options);
}

void TrainModule::log(const std::string& name, double value, const LogOptions& options) {
  log(name, at::scalar_tensor(value, at::kDouble), options);
}

void TrainModule::log_dict(const std::map<std::string, at::Tensor>& values, const LogOptions& options) {
  for (const auto& [name, value] : values) log(name, value, options);
}

int64_t TrainModule::current_epoch() const { return trainer_ ? trainer_->current_epoch() : 0; }

int64_t TrainModule::global_step() const { return trainer_ ? trainer_->global_step() : 0; }

}  // namespace strata
