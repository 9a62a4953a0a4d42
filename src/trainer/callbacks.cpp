// LearningRateMonitor, Timer and ProgressBar (trainer/callbacks.h).
#include <sys/stat.h>
#include <torch/optim/optimizer.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <typeinfo>

#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/runtime/launcher.h"
#include "strata/trainer/callbacks.h"
#include "strata/trainer/trainer.h"
#include "strata/trainer/trainer_state.h"

namespace strata::trainer {

namespace {

// "AdamW" from LibTorch's type name "torch::optim::AdamW".
std::string optimizer_name(const torch::optim::Optimizer& optimizer) {
  const std::string name = typeid(optimizer).name();
  for (const char* known : {"AdamW", "Adam", "SGD", "RMSprop", "Adagrad", "LBFGS"}) {
    if (name.find(known) != std::string::npos) return known;
  }
  return "Optimizer";
}

std::string clock_text(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const int64_t s = static_cast<int64_t>(seconds);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  }
  return buf;
}

}  // namespace

// ---- LearningRateMonitor -----------------------------------------------------------

LearningRateMonitor::LearningRateMonitor(std::string logging_interval) : interval_(std::move(logging_interval)) {
  STRATA_CHECK(interval_ == "step" || interval_ == "epoch", ConfigError,
               "[trainer] LearningRateMonitor logging_interval must be 'step' or 'epoch', got '", interval_, "'");
}

Metrics LearningRateMonitor::learning_rates(const Trainer& trainer) {
  Metrics out;
  std::map<std::string, int> seen;
  for (const auto& optimizer : trainer.optimizers()) {
    std::string base = "lr-" + optimizer_name(*optimizer);
    for (const auto& s : trainer.lr_scheduler_configs()) {
      if (&s.scheduler->optimizer() == optimizer.get() && !s.name.empty()) base = s.name;
    }
    // Two optimizers of one type: "lr-SGD", "lr-SGD-1".
    const int count = seen[base]++;
    if (count > 0) base += "-" + std::to_string(count);
    const auto& groups = optimizer->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      out[g == 0 ? base : base + "/pg" + std::to_string(g + 1)] = groups[g].options().get_lr();
    }
  }
  return out;
}

// Note [When the LR monitor logs]
// As Lightning 2.6.6's LearningRateMonitor: with "step" it logs at each
// training batch's start, so every batch of an accumulation window logs
// the rate its step will use (accumulate_grad_batches=2 writes two rows a
// step), when that step's values reach the loggers (should_update_logs:
// the log_every_n_steps cadence, or should_stop), filed under the steps
// taken before it (log_step(), Lightning's _batches_that_stepped). With
// "epoch" it logs at each epoch's start under the steps taken so far, so
// the second epoch's rate after 3 steps is filed under step 3. Its rows
// hold the rates only (no "epoch"), and go to the loggers directly, as
// Lightning's do, so they are written at the loggers' next save, in the
// order logged (tests/trainer/lightning_loop_test.cpp compares the CSV
// with Lightning's for the same run).
void LearningRateMonitor::on_train_batch_start(Trainer& trainer, TrainModule&, const data::Batch&, int64_t) {
  if (interval_ != "step" || !trainer.is_global_zero() || !trainer.should_update_logs()) return;
  const Metrics rates = learning_rates(trainer);
  for (const auto& logger : trainer.loggers()) logger->log_metrics(rates, trainer.log_step());
}

void LearningRateMonitor::on_train_epoch_start(Trainer& trainer, TrainModule&) {
  if (interval_ != "epoch" || !trainer.is_global_zero()) return;
  const Metrics rates = learning_rates(trainer);
  for (const auto& logger : trainer.loggers()) logger->log_metrics(rates, trainer.log_step());
}

// ---- Timer ------------------------------------------------------------------------

Timer::Timer(std::chrono::milliseconds duration) : duration_(duration) {
  STRATA_CHECK(duration.count() >= 0, ConfigError, "[trainer] Timer duration must be >= 0");
}

double Timer::time_elapsed() const {
  double running = start_ ? std::chrono::duration<double>(std::chrono::steady_clock::now() - *start_).count() : 0.0;
  return offset_s_ + running;
}

void Timer::on_train_start(Trainer&, TrainModule&) { start_ = std::chrono::steady_clock::now(); }

void Timer::on_train_end(Trainer&, TrainModule&) {
  offset_s_ = time_elapsed();
  start_.reset();
}

void Timer::on_train_batch_end(Trainer& trainer, TrainModule&, const at::Tensor&, const data::Batch&, int64_t) {
  const bool over = time_elapsed() * 1000.0 >= static_cast<double>(duration_.count());
  // Rank 0's clock decides, so every rank stops after the same batch.
  if (trainer.strategy().broadcast(over, 0) && !trainer.should_stop) {
    trainer.should_stop = true;
    if (trainer.is_global_zero()) {
      log::info("[trainer] time limit reached (", clock_text(duration_.count() / 1000.0), "); stopping at step ",
                trainer.global_step());
    }
  }
}

nlohmann::json Timer::state_dict() const { return {{"time_elapsed", time_elapsed()}}; }

void Timer::load_state_dict(const nlohmann::json& state) {
  validate_timer_state(state, "Timer state");
  offset_s_ = state["time_elapsed"].get<double>();
}

// ---- ProgressBar ----------------------------------------------------------------------

namespace {

// Note [Redraws through the launcher] (runtime/supervisor.cpp): a worker
// whose stdout is a pipe to a launcher on a terminal redraws as on one;
// the launcher says so with STRATA_LAUNCHER_TTY=1. The pipe check keeps a
// program that inherited the variable but writes to a file from drawing.
bool stdout_is_terminal() {
  if (::isatty(STDOUT_FILENO) != 0) return true;
  const char* launcher_tty = std::getenv(runtime::kEnvLauncherTty);
  if (launcher_tty == nullptr || std::strcmp(launcher_tty, "1") != 0) return false;
  struct stat info {};
  return ::fstat(STDOUT_FILENO, &info) == 0 && S_ISFIFO(info.st_mode);
}

}  // namespace

ProgressBar::ProgressBar(std::optional<bool> out_is_terminal)
    : tty_(out_is_terminal.value_or(stdout_is_terminal())) {}

std::string ProgressBar::line(const Trainer& trainer, double steps_per_s, double eta_s) {
  const TrainerOptions& o = trainer.options();
  std::string out = "epoch " + std::to_string(trainer.current_epoch());
  if (o.max_epochs && *o.max_epochs > 0) out += "/" + std::to_string(*o.max_epochs - 1);
  out += " | batch " + std::to_string(trainer.batch_idx()) + "/" + std::to_string(trainer.num_training_batches());
  out += " | step " + std::to_string(trainer.global_step());
  if (o.max_steps > 0) out += "/" + std::to_string(o.max_steps);
  char buf[64];
  // The loss shown is the one the loggers get when the module puts
  // "train_loss" on the bar (one value everywhere); else this rank's.
  const auto& shown = trainer.progress_bar_metrics();
  const auto logged_loss = shown.find("train_loss");
  const double loss = logged_loss != shown.end() ? logged_loss->second : trainer.last_loss();
  if (std::isfinite(loss)) {
    std::snprintf(buf, sizeof(buf), " | loss %.4f", loss);
    out += buf;
  }
  for (const auto& [name, value] : shown) {
    if (name == "train_loss") continue;
    std::snprintf(buf, sizeof(buf), " %.4g", value);
    out += " | " + name + buf;
  }
  if (steps_per_s > 0) {
    std::snprintf(buf, sizeof(buf), " | %.2f it/s", steps_per_s);
    out += buf;
  }
  if (eta_s >= 0) out += " | eta " + clock_text(eta_s);
  return out;
}

void ProgressBar::print(const std::string& text, bool final_line) {
  if (tty_) {
    std::cout << "\r" << text << "\033[K";
    if (final_line) std::cout << "\n";
    std::cout << std::flush;
    line_open_ = !final_line;
  } else {
    std::cout << text << std::endl;
  }
}

void ProgressBar::on_train_start(Trainer& trainer, TrainModule&) {
  start_ = std::chrono::steady_clock::now();
  first_step_ = trainer.global_step();
}

void ProgressBar::on_train_batch_end(Trainer& trainer, TrainModule&, const at::Tensor&, const data::Batch&, int64_t) {
  if (!trainer.is_global_zero()) return;
  const int64_t done = trainer.global_step() - first_step_;
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = done > 0 && elapsed > 0 ? done / elapsed : 0.0;
  // The steps left: to max_steps, or to the end of max_epochs.
  const TrainerOptions& o = trainer.options();
  int64_t total = o.max_steps > 0 ? o.max_steps : -1;
  if (total < 0 && o.max_epochs && *o.max_epochs > 0) {
    const int64_t per_epoch = (trainer.num_training_batches() + o.accumulate_grad_batches - 1) / o.accumulate_grad_batches;
    total = *o.max_epochs * per_epoch;
  }
  const double eta = rate > 0 && total >= 0 ? std::max<int64_t>(total - trainer.global_step(), 0) / rate : -1.0;
  if (tty_) {
    print(line(trainer, rate, eta), false);
  } else if (trainer.global_step() > first_step_ && trainer.global_step() != last_printed_step_ &&
             (trainer.global_step() % o.log_every_n_steps == 0 || trainer.global_step() == first_step_ + 1)) {
    last_printed_step_ = trainer.global_step();
    print(line(trainer, rate, eta), true);
  }
}

void ProgressBar::on_train_epoch_end(Trainer& trainer, TrainModule&) {
  if (!trainer.is_global_zero()) return;
  print(line(trainer, 0.0, -1.0), true);
}

void ProgressBar::on_validation_end(Trainer& trainer, TrainModule&) {
  if (!trainer.is_global_zero() || trainer.state_fn() != "fit" || trainer.sanity_checking()) return;
  std::string text = "validation at step " + std::to_string(trainer.global_step()) + ":";
  char buf[64];
  for (const auto& [name, value] : trainer.callback_metrics()) {
    if (name.rfind("val", 0) != 0) continue;
    std::snprintf(buf, sizeof(buf), " %s %.4f", name.c_str(), value);
    text += buf;
  }
  if (tty_ && line_open_) std::cout << "\n";
  line_open_ = false;
  std::cout << text << std::endl;
}

void ProgressBar::on_train_end(Trainer& trainer, TrainModule&) {
  if (!trainer.is_global_zero()) return;
  if (tty_ && line_open_) std::cout << std::endl;
  line_open_ = false;
}

}  // namespace strata::trainer
