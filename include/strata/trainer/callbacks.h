// The Trainer's built-in callbacks, one header each under callbacks/:
// ModelCheckpoint (top-k by a metric, last, periodic), EarlyStopping,
// LearningRateMonitor, Timer (max_time) and the progress bar. The base
// class is in callback.h.
#pragma once

#include "strata/trainer/callbacks/early_stopping.h"
#include "strata/trainer/callbacks/learning_rate_monitor.h"
#include "strata/trainer/callbacks/model_checkpoint.h"
#include "strata/trainer/callbacks/progress_bar.h"
#include "strata/trainer/callbacks/timer.h"
