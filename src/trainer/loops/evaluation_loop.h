// The evaluation loop (Lightning's _EvaluationLoop): the validation and
// test batches of validate() and test(), the validations inside fit and
// the sanity validation before its training. Internal: the Trainer owns
// one; TrainModule::log writes into its results while it runs.
#pragma once

#include <cstdint>
#include <string>

#include "strata/data/loader.h"
#include "strata/trainer/trainer.h"

namespace torch::nn {
class Module;
}

namespace strata::trainer::detail {

class Results;

/// The module in eval mode for a scope; its training mode restored after.
class EvalMode {
 public:
  explicit EvalMode(torch::nn::Module& module);
  ~EvalMode();
  EvalMode(const EvalMode&) = delete;
  EvalMode& operator=(const EvalMode&) = delete;

 private:
  torch::nn::Module& module_;
  bool was_training_;
};

/// One evaluation at a time: validate(), test(), or a validation of fit.
class EvaluationLoop {
 public:
  explicit EvaluationLoop(Trainer& trainer);
  EvaluationLoop(const EvaluationLoop&) = delete;
  EvaluationLoop& operator=(const EvaluationLoop&) = delete;

  /// validate() or test() (`stage`) on `data`, with the stage's start and
  /// end hooks; the epoch's metrics.
  Metrics run(const DataSource& data, const std::string& stage);
  /// A validation inside fit on `limit` batches of `loader`, with its
  /// hooks; `sanity`: the sanity validation before training (Note [Sanity
  /// validation]).
  void run_in_fit(data::Loader& loader, int64_t limit, bool sanity);
  /// The results the running loop logs into; null when none runs.
  Results* results() const { return results_; }

 private:
  /// The batches and the epoch hooks: the epoch's metrics. `stage`:
  /// "validate", "test" or "validate_in_fit".
  Metrics run_epoch(data::Loader& loader, int64_t limit, const std::string& stage);
  /// One batch through validation_step or test_step; false when fit's
  /// module has no validation_step (the validation is skipped).
  bool run_step(const data::Batch& batch, int64_t batch_idx, const std::string& stage);
  /// The epoch's values reduced into the Trainer's metrics and logged.
  Metrics end_epoch(Results& results, const std::string& stage);

  Trainer& trainer_;
  Results* results_ = nullptr;  // the running loop's, while it runs
};

}  // namespace strata::trainer::detail
