// Learning-rate schedulers the Trainer steps and checkpoints.
//
// LibTorch's own schedulers keep their position in private members, so a
// checkpoint could not restore them; these compute each rate in closed
// form from the base rate and a step counter (PyTorch's `last_epoch`),
// which is all their state, so a resumed run sets exactly the rates an
// uninterrupted one would.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace strata::trainer {

/// Base of a scheduler of one optimizer's param groups. Construction sets
/// every group's rate to lr_at(0, base) (the base rates are the groups'
/// rates at construction); step() advances the counter and sets
/// lr_at(counter, base).
class LRScheduler {
 public:
  explicit LRScheduler(torch::optim::Optimizer& optimizer);
  virtual ~LRScheduler();
  LRScheduler(const LRScheduler&) = delete;
  LRScheduler& operator=(const LRScheduler&) = delete;

  /// Advances one step (or epoch) and sets the new rates.
  void step();
  /// The rates set last, one per param group.
  std::vector<double> get_last_lr() const;
  /// Steps taken.
  int64_t last_epoch() const { return last_epoch_; }
  torch::optim::Optimizer& optimizer() const { return optimizer_; }
  /// Short type name for logs ("StepLR").
  virtual std::string name() const = 0;

  /// {"type", "last_epoch", "base_lrs"}.
  nlohmann::json state_dict() const;
  /// Restores state_dict() and sets the rates it implies. Throws
  /// CheckpointError for another type, a count of base rates other than
  /// the param groups', or values out of range.
  void load_state_dict(const nlohmann::json& state);

 protected:
  /// The rate of a group with base rate `base_lr` after `step` steps.
  virtual double lr_at(int64_t step, double base_lr) const = 0;
  /// Sets every group's rate for the current counter. Derived constructors
  /// call it once their own members are set.
  void apply();

 private:
  torch::optim::Optimizer& optimizer_;
  std::vector<double> base_lrs_;
  int64_t last_epoch_ = 0;
};

/// lr = base * lambda(step).
class LambdaLR : public LRScheduler {
 public:
  /// Throws ConfigError when `lambda` is empty.
  LambdaLR(torch::optim::Optimizer& optimizer, std::function<double(int64_t)> lambda);
  std::string name() const override { return "LambdaLR"; }

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  std::function<double(int64_t)> lambda_;
};

/// lr = base * gamma ^ floor(step / step_size).
class StepLR : public LRScheduler {
 public:
  /// Throws ConfigError for step_size < 1 or gamma <= 0.
  StepLR(torch::optim::Optimizer& optimizer, int64_t step_size, double gamma = 0.1);
  std::string name() const override { return "StepLR"; }

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  int64_t step_size_;
  double gamma_;
};

/// lr = eta_min + (base - eta_min) * (1 + cos(pi * step / t_max)) / 2,
/// held at eta_min after t_max steps.
class CosineAnnealingLR : public LRScheduler {
 public:
  /// Throws ConfigError for t_max < 1 or eta_min < 0.
  CosineAnnealingLR(torch::optim::Optimizer& optimizer, int64_t t_max, double eta_min = 0.0);
  std::string name() const override { return "CosineAnnealingLR"; }

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  int64_t t_max_;
  double eta_min_;
};

/// Note [Warm-up and decay]
/// The schedule GPT training uses (llm.c's and nanoGPT's): a linear
/// warm-up, then a decay to a floor. After s steps (the counter, which
/// the Trainer advances once per optimizer step with interval "step"):
///   s < warmup_steps:                base * (s + 1) / warmup_steps
///   warmup_steps <= s < decay_steps: min_lr + (base - min_lr) * f(p),
///                                    p = (s - warmup_steps) / (decay_steps - warmup_steps)
///   s >= decay_steps:                min_lr
/// with f(p) = (1 + cos(pi p)) / 2 (kCosine) or 1 - p (kLinear). kConstant
/// holds the base rate after the warm-up (decay_steps and min_lr unused).
/// So the first step uses base / warmup_steps, step warmup_steps the full
/// base rate, and a run of decay_steps steps ends at min_lr. The rate is a
/// function of the counter alone: a resumed run sets exactly the rates an
/// uninterrupted one does.
class WarmupDecayLR : public LRScheduler {
 public:
  enum class Decay { kConstant, kLinear, kCosine };
  /// Throws ConfigError for warmup_steps < 0, min_lr < 0 or above a base
  /// rate, and (kLinear, kCosine) decay_steps <= warmup_steps.
  WarmupDecayLR(torch::optim::Optimizer& optimizer, Decay decay, int64_t warmup_steps, int64_t decay_steps = 0,
                double min_lr = 0.0);
  /// "WarmupConstantLR", "WarmupLinearLR" or "WarmupCosineLR": a
  /// checkpoint of one shape does not load into a run of another.
  std::string name() const override;

 protected:
  double lr_at(int64_t step, double base_lr) const override;

 private:
  Decay decay_;
  int64_t warmup_steps_;
  int64_t decay_steps_;
  double min_lr_;
};

/// A scheduler and when the Trainer steps it (Lightning's lr_scheduler
/// config): every `frequency` optimizer steps ("step") or epochs ("epoch").
struct SchedulerConfig {
  std::shared_ptr<LRScheduler> scheduler;
  std::string interval = "epoch";  ///< "step" or "epoch"
  int64_t frequency = 1;
  std::string name;  ///< name for the LR monitor; default "lr-<Optimizer>"

  SchedulerConfig() = default;
  explicit SchedulerConfig(std::shared_ptr<LRScheduler> s) : scheduler(std::move(s)) {}
  SchedulerConfig& with_interval(std::string i) { interval = std::move(i); return *this; }
  SchedulerConfig& with_frequency(int64_t f) { frequency = f; return *this; }
  SchedulerConfig& with_name(std::string n) { name = std::move(n); return *this; }
};

}  // namespace strata::trainer
