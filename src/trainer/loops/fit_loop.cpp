// The epochs of fit (fit_loop.h): the fit's state reset, the restore of a
// checkpoint's loop position, the sanity validation, the epoch loop until
// max_epochs, max_steps or a stop, and the ranks' vote on a stop signal.
#include "fit_loop.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <csignal>

#include "evaluation_loop.h"
#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/runtime/stop_signal.h"

namespace strata::trainer::detail {

FitLoop::FitLoop(Trainer& trainer) : trainer_(trainer), epoch_loop_(trainer, *this) {
  // Lightning's defaults: 1000 epochs unless a step limit is given.
  const TrainerOptions& o = trainer_.options_;
  if (o.max_epochs) max_epochs_ = *o.max_epochs;
  else max_epochs_ = o.max_steps == -1 ? 1000 : -1;
}

bool FitLoop::step_limit_reached() const {
  const int64_t max_steps = trainer_.options_.max_steps;
  return max_steps >= 0 && epoch_loop_.global_step() >= max_steps;
}

bool FitLoop::validates_this_epoch() const {
  const std::optional<int64_t>& every = trainer_.options_.check_val_every_n_epoch;
  return num_val_batches_ > 0 && (!every || (epoch_ + 1) % *every == 0);
}

void FitLoop::reset(const DataSource& train, const data::Loader* val_loader) {
  train_is_dataset_ = train.dataset() != nullptr;
  epoch_ = 0;
  epoch_loop_.reset_fit();
  resume_position_ = 0;
  trainer_.resume_path_.clear();
  stopped_inside_epoch_ = false;
  validations_run_ = 0;
  num_val_batches_ =
      val_loader ? trainer_.options_.limit_val_batches.of(static_cast<int64_t>(val_loader->size())) : 0;
}

void FitLoop::run(const DataSource& train, const std::optional<DataSource>& val, const std::string& ckpt_path) {
  Trainer& t = trainer_;
  stop_signal_ = 0;
  std::shared_ptr<data::Loader> train_loader = t.make_loader(train, true, "training");
  std::shared_ptr<data::Loader> val_loader = val ? t.make_loader(*val, false, "validation") : nullptr;
  reset(train, val_loader.get());
  if (!ckpt_path.empty()) {
    std::string path = t.resolve_ckpt_path(ckpt_path);
    if (!path.empty()) t.restore(path, /*training=*/true);
  }
  if (t.is_global_zero()) {
    for (const auto& logger : t.loggers_) logger->log_hyperparams(t.module_->hparams());
  }
  t.each_callback([&](Callback& c) { c.on_fit_start(t, *t.module_); });
  t.module_->on_fit_start();
  const int64_t sanity_val_steps = t.options_.num_sanity_val_steps;
  const int64_t sanity_batches =
      sanity_val_steps == -1 ? num_val_batches_ : std::min(sanity_val_steps, num_val_batches_);
  if (sanity_batches > 0) t.evaluation_loop_->run_in_fit(*val_loader, sanity_batches, /*sanity=*/true);
  // limit_train_batches=0 turns training off (Lightning skips the fit loop
  // and its hooks); data that yields no batch is an error
  // (TrainingEpochLoop::run).
  if (t.options_.limit_train_batches.value != 0) run_epochs(*train_loader, val_loader.get());
  t.module_->on_fit_end();
  t.each_callback([&](Callback& c) { c.on_fit_end(t, *t.module_); });
}

void FitLoop::run_epochs(data::Loader& train_loader, data::Loader* val_loader) {
  Trainer& t = trainer_;
  t.each_callback([&](Callback& c) { c.on_train_start(t, *t.module_); });
  t.module_->on_train_start();
  t.module_->train();
  while (!t.should_stop) {
    if (max_epochs_ >= 0 && epoch_ >= max_epochs_) break;
    if (step_limit_reached()) break;
    const bool finished = epoch_loop_.run(train_loader, val_loader);
    if (!finished) {
      // Note [Epochs stopped inside]: Lightning ends a stopped epoch as
      // any other and counts it, so current_epoch() says the next one;
      // epoch_ keeps the loop position, which a checkpoint saved from
      // here on (on_train_end) resumes from.
      stopped_inside_epoch_ = true;
      break;
    }
    // The next epoch has not begun: a checkpoint from here on (on_train_end)
    // resumes at its first batch.
    ++epoch_;
    epoch_loop_.next_epoch();
  }
  t.module_->on_train_end();
  t.each_callback([&](Callback& c) { c.on_train_end(t, *t.module_); });
}

void FitLoop::run_validation(data::Loader& loader) {
  trainer_.evaluation_loop_->run_in_fit(loader, num_val_batches_, /*sanity=*/false);
  ++validations_run_;
}

void FitLoop::restore(int64_t epoch, int64_t global_step, int64_t position, nlohmann::json results) {
  epoch_ = epoch;
  resume_position_ = position;
  resume_results_ = std::move(results);
  epoch_loop_.reset_fit(global_step);
}

int64_t FitLoop::checked_resume_position(int64_t batches) {
  // Note [Resuming from untrusted state] in trainer_checkpoint.cpp.
  const int64_t position = resume_position_;
  resume_position_ = 0;
  // Every rank counts the same batches (a global count), so every rank
  // throws together.
  STRATA_CHECK(position <= batches, CheckpointError, "[trainer] ", trainer_.resume_path_,
               ": trainer state loops.fit.batches_done is ", position, "; expected an integer from 0 to ", batches,
               ", the batches of an epoch of this training data (after limit_train_batches): the checkpoint was "
               "written for other data, or is damaged; resume from a checkpoint of this run");
  return position;
}

nlohmann::json FitLoop::take_resume_results() {
  nlohmann::json results = std::move(resume_results_);
  resume_results_ = nlohmann::json();
  return results;
}

void FitLoop::agree_on_stop_signal() {
  // Every rank votes after the same step, so all stop after it together,
  // and with the same signal: one sent to every task (srun, a pod's
  // SIGTERM) may reach a rank only after the vote, and a rank that
  // guessed would exit with another code and skip SIGUSR1's requeue.
  // A stop outranks SIGUSR1's save-and-requeue: SIGTERM, SIGINT, SIGUSR1.
  const int mine = runtime::pending_stop_signal();
  const int vote = mine == 0 ? 0 : mine == SIGUSR1 ? 1 : mine == SIGINT ? 2 : 3;
  const at::Tensor votes = at::scalar_tensor(static_cast<double>(vote), at::kFloat);
  const int agreed =
      static_cast<int>(trainer_.strategy_->all_reduce(votes, comm::ReduceOp::kMax).item<float>() + 0.5f);
  if (agreed <= 0) return;
  stop_signal_ = agreed == 1 ? SIGUSR1 : agreed == 2 ? SIGINT : SIGTERM;
  trainer_.should_stop = true;
  if (trainer_.is_global_zero()) {
    log::warning("[trainer] ", runtime::stop_signal_name(stop_signal_), ": stopping after step ",
                 epoch_loop_.global_step(), " and saving; a second SIGINT or SIGTERM stops at once without saving");
  }
}

}  // namespace strata::trainer::detail
