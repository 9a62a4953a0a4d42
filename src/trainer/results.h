// The values a TrainModule logs during one loop (Lightning's
// ResultCollection): each step's value, and the running reduction over the
// epoch, reduced across ranks when sync_dist.
//
// Note [Epoch reduction]
// "mean" keeps sum(value * batch_size) and sum(batch_size), so the epoch
// value is the mean over examples, however unevenly batches are sized;
// with sync_dist both sums are all-reduced (sum) before dividing, which
// makes it the mean over every rank's examples. "sum" sums, "max"/"min"
// keep the extreme; synced with the same op. Without sync_dist every rank
// keeps its own value (the loggers, on rank 0, see rank 0's).
#pragma once

#include <ATen/core/Tensor.h>

#include <map>
#include <string>

#include "strata/comm/backend.h"
#include "strata/trainer/logger.h"
#include "strata/trainer/train_module.h"

namespace strata::strategies {
class Strategy;
}

namespace strata::trainer::detail {

/// One logged name, with its options resolved for the hook that logged it.
struct ResultEntry {
  bool on_step = false;
  bool on_epoch = false;
  bool sync_dist = false;
  bool prog_bar = false;
  bool logger = true;
  comm::ReduceOp op = comm::ReduceOp::kMean;
  double step_value = 0.0;  // the latest step's value (synced when sync_dist)
  bool stepped = false;     // logged since the last take_step()
  double total = 0.0;       // sum (x batch size for mean), max or min
  double weight = 0.0;      // sum of batch sizes (mean) / count
};

class Results {
 public:
  /// Records `value` for `name`. `in_training`: the defaults of
  /// training_step (on_step) or of the evaluation steps (on_epoch).
  void log(strategies::Strategy& strategy, const std::string& name, const at::Tensor& value,
           const LogOptions& options, bool in_training, int64_t batch_size);
  /// The step values logged since the last call ("<name>_step" when also
  /// on_epoch), split into those for loggers, for the progress bar, and all.
  void take_step(Metrics& for_logger, Metrics& for_prog_bar, Metrics& all);
  /// Reduces the epoch values (a collective when any is sync_dist: every
  /// rank must call it with the same names logged) into
  /// "<name>_epoch" or "<name>"; clears the collection.
  void reduce_epoch(strategies::Strategy& strategy, Metrics& for_logger, Metrics& for_prog_bar, Metrics& all);
  bool empty() const { return entries_.empty(); }
  /// Names logged so far (for messages).
  std::string names() const;

 private:
  std::map<std::string, ResultEntry> entries_;
};

}  // namespace strata::trainer::detail
