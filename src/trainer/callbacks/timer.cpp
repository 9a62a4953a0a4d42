// Timer (trainer/callbacks/timer.h): the Trainer's max_time.
#include "strata/trainer/callbacks/timer.h"

#include "shared.h"
#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/trainer/trainer.h"
#include "strata/trainer/trainer_state.h"

namespace strata::trainer {

using detail::clock_text;

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

}  // namespace strata::trainer
