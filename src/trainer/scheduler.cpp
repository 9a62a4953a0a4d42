// Closed-form learning-rate schedulers (trainer/scheduler.h).
#include "strata/trainer/scheduler.h"

#include <torch/optim/optimizer.h>

#include <cmath>

#include "strata/core/error.h"
#include "strata/trainer/trainer_state.h"

namespace strata::trainer {

LRScheduler::LRScheduler(torch::optim::Optimizer& optimizer) : optimizer_(optimizer) {
  for (auto& group : optimizer_.param_groups()) base_lrs_.push_back(group.options().get_lr());
}

LRScheduler::~LRScheduler() = default;

void LRScheduler::step() {
  ++last_epoch_;
  apply();
}

void LRScheduler::apply() {
  auto& groups = optimizer_.param_groups();
  for (size_t i = 0; i < groups.size() && i < base_lrs_.size(); ++i) {
    groups[i].options().set_lr(lr_at(last_epoch_, base_lrs_[i]));
  }
}

std::vector<double> LRScheduler::get_last_lr() const {
  std::vector<double> out;
  for (auto& group : optimizer_.param_groups()) out.push_back(group.options().get_lr());
  return out;
}

nlohmann::json LRScheduler::state_dict() const {
  return {{"type", name()}, {"last_epoch", last_epoch_}, {"base_lrs", base_lrs_}};
}

void LRScheduler::load_state_dict(const nlohmann::json& state) {
  validate_scheduler_state(state, name() + " state");
  const std::string& type = state["type"].get_ref<const std::string&>();
  STRATA_CHECK(type == name(), CheckpointError, "[trainer] ", name(), " state type is \"", type,
               "\"; expected \"", name(), "\", the scheduler configure_optimizers made");
  const nlohmann::json& base = state["base_lrs"];
  STRATA_CHECK(base.size() == optimizer_.param_groups().size(), CheckpointError, "[trainer] ", name(),
               " state base_lrs lists ", base.size(), " rate(s); expected one per param group of its optimizer (",
               optimizer_.param_groups().size(), ")");
  base_lrs_ = base.get<std::vector<double>>();
  last_epoch_ = state["last_epoch"].get<int64_t>();
  apply();
}

LambdaLR::LambdaLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> lambda)
    : LRScheduler(optimizer), lambda_(std::move(lambda)) {
  STRATA_CHECK(static_cast<bool>(lambda_), ConfigError, "[trainer] LambdaLR needs a function");
  apply();
}

double LambdaLR::lr_at(int64_t step, double base_lr) const { return base_lr * lambda_(step); }

StepLR::StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma)
    : LRScheduler(optimizer), step_size_(step_size), gamma_(gamma) {
  STRATA_CHECK(step_size >= 1, ConfigError, "[trainer] StepLR step_size must be >= 1, got ", step_size);
  STRATA_CHECK(gamma > 0, ConfigError, "[trainer] StepLR gamma must be > 0, got ", gamma);
  apply();
}

double StepLR::lr_at(int64_t step, double base_lr) const {
  return base_lr * std::pow(gamma_, static_cast<double>(step / step_size_));
}

CosineAnnealingLR::CosineAnnealingLR(torch::optim::Optimizer& optimizer, int64_t t_max, double eta_min)
    : LRScheduler(optimizer), t_max_(t_max), eta_min_(eta_min) {
  STRATA_CHECK(t_max >= 1, ConfigError, "[trainer] CosineAnnealingLR t_max must be >= 1, got ", t_max);
  STRATA_CHECK(eta_min >= 0, ConfigError, "[trainer] CosineAnnealingLR eta_min must be >= 0, got ", eta_min);
  apply();
}

double CosineAnnealingLR::lr_at(int64_t step, double base_lr) const {
  const double t = static_cast<double>(std::min(step, t_max_));
  return eta_min_ + (base_lr - eta_min_) * (1.0 + std::cos(M_PI * t / static_cast<double>(t_max_))) / 2.0;
}

WarmupDecayLR::WarmupDecayLR(torch::optim::Optimizer& optimizer, Decay decay, int64_t warmup_steps,
                             int64_t decay_steps, double min_lr)
    : LRScheduler(optimizer), decay_(decay), warmup_steps_(warmup_steps), decay_steps_(decay_steps), min_lr_(min_lr) {
  STRATA_CHECK(warmup_steps >= 0, ConfigError, "[trainer] ", name(), " warmup_steps must be >= 0, got ",
               warmup_steps);
  if (decay != Decay::kConstant) {
    STRATA_CHECK(decay_steps > warmup_steps, ConfigError, "[trainer] ", name(), " decays over steps ", warmup_steps,
                 "..", decay_steps, ": decay_steps must be greater than warmup_steps (", warmup_steps, ")");
    STRATA_CHECK(min_lr >= 0 && std::isfinite(min_lr), ConfigError, "[trainer] ", name(),
                 " min_lr must be a finite number >= 0, got ", min_lr);
    for (const auto& group : optimizer.param_groups()) {
      const double base = group.options().get_lr();
      STRATA_CHECK(min_lr <= base, ConfigError, "[trainer] ", name(), " min_lr ", min_lr,
                   " is above the base learning rate ", base, " it decays from; give a min_lr <= ", base);
    }
  }
  apply();
}

std::string WarmupDecayLR::name() const {
  switch (decay_) {
    case Decay::kConstant: return "WarmupConstantLR";
    case Decay::kLinear: return "WarmupLinearLR";
    case Decay::kCosine: return "WarmupCosineLR";
  }
  return "WarmupDecayLR";
}

double WarmupDecayLR::lr_at(int64_t step, double base_lr) const {
  // Note [Warm-up and decay] (trainer/scheduler.h).
  if (step < warmup_steps_) return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps_);
  if (decay_ == Decay::kConstant) return base_lr;
  if (step >= decay_steps_) return min_lr_;
  const double p = static_cast<double>(step - warmup_steps_) / static_cast<double>(decay_steps_ - warmup_steps_);
  const double f = decay_ == Decay::kCosine ? (1.0 + std::cos(M_PI * p)) / 2.0 : 1.0 - p;
  return min_lr_ + (base_lr - min_lr_) * f;
}

}  // namespace strata::trainer
