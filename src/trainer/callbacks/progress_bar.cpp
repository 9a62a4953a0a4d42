// ProgressBar (trainer/callbacks/progress_bar.h).
#include "strata/trainer/callbacks/progress_bar.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "shared.h"
#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/runtime/launcher.h"
#include "strata/trainer/trainer.h"
#include "strata/trainer/trainer_state.h"

namespace strata::trainer {

using detail::clock_text;

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
