// The prediction loop (Lightning's _PredictionLoop): predict_step over the
// batches of predict(), each rank's rows gathered on global rank 0 in the
// dataset's order. Internal: the Trainer owns one.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "strata/data/loader.h"
#include "strata/trainer/trainer.h"

namespace strata::trainer::detail {

/// One predict() at a time.
class PredictLoop {
 public:
  explicit PredictLoop(Trainer& trainer);
  PredictLoop(const PredictLoop&) = delete;
  PredictLoop& operator=(const PredictLoop&) = delete;

  /// predict_step's rows for `data`: on global rank 0 every example's, in
  /// the dataset's order; an undefined tensor on the other ranks.
  at::Tensor run(const DataSource& data);

 private:
  /// predict_step over `limit` batches of `loader`, into predictions_.
  void run_batches(data::Loader& loader, int64_t limit);
  /// This rank's rows, or with several ranks rank 0's gather of them all
  /// (Note [Prediction order]); `total`: the examples of the data.
  at::Tensor gather(const at::Tensor& local, int64_t total);

  Trainer& trainer_;
  std::vector<at::Tensor> predictions_;  // each batch's rows, on the CPU
};

}  // namespace strata::trainer::detail
