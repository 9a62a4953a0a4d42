// `strata train`'s job as a Trainer user: the example GPT as a TrainModule,
// and the callbacks that keep the tool's own outputs (the --metrics-file
// lines, the final checkpoint, the resume note).
#pragma once

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "strata/data/dataset.h"
#include "strata/models/gpt.h"
#include "strata/trainer/callback.h"
#include "strata/trainer/train_module.h"

namespace strata::cli {

/// The GPT language model trained with AdamW; logs train_loss (progress
/// bar) and val_loss (synced over ranks).
class GPTJob : public TrainModule {
 public:
  GPTJob(const models::GPTConfig& config, std::string model_size, double lr, double weight_decay);
  at::Tensor training_step(const data::Batch& batch, int64_t batch_idx) override;
  at::Tensor validation_step(const data::Batch& batch, int64_t batch_idx) override;
  OptimizerConfig configure_optimizers() override;
  /// Records the model preset; a checkpoint of another preset is refused.
  void on_save_checkpoint(nlohmann::json& extra) override;
  void on_load_checkpoint(const nlohmann::json& extra) override;

  models::GPT gpt{nullptr};

 private:
  std::string model_size_;
  double lr_;
  double weight_decay_;
};

/// Windows [begin, end) of another dataset (the training and validation
/// splits of the text).
class WindowRange : public data::Dataset {
 public:
  WindowRange(std::shared_ptr<const data::Dataset> all, size_t begin, size_t end);
  size_t size() const override { return end_ - begin_; }
  data::Example get(size_t index) const override;

 private:
  std::shared_ptr<const data::Dataset> all_;
  size_t begin_, end_;
};

/// Appends one JSON line per optimizer step to --metrics-file (rank 0):
/// step, loss (the step's loss averaged over ranks), lr, epoch,
/// tokens_per_s, elapsed_s, and val_loss (the latest validation's, once one ran:
/// a validation at step K shows from step K + 1 on).
class MetricsFile : public trainer::Callback {
 public:
  MetricsFile(std::string path, int64_t tokens_per_step);
  std::string state_key() const override { return "MetricsFile"; }
  /// Also measures the machine's matmul rate (Note [MFU of strata train]).
  void on_train_start(Trainer& trainer, TrainModule& module) override;
  void on_train_batch_end(Trainer& trainer, TrainModule& module, const at::Tensor& loss, const data::Batch& batch,
                          int64_t batch_idx) override;
  /// Prints throughput and MFU on global rank 0.
  void on_train_end(Trainer& trainer, TrainModule& module) override;
  /// The last step's loss averaged over ranks (NaN before a step).
  double last_loss() const { return last_loss_; }

 private:
  std::string path_;
  std::ofstream out_;
  int64_t tokens_per_step_;
  int64_t last_step_ = -1;
  double last_loss_;
  double flops_per_token_ = 0.0;  ///< 0: not a GPTJob
  double machine_gflops_ = 0.0;   ///< 0: not measured (not on CPU)
  std::vector<double> step_s_;    ///< seconds of each step after the first
  std::chrono::steady_clock::time_point start_, last_;
};

/// Training FLOPs per token of a GPT: 6 per matmul weight (12 d^2 per
/// layer and the vocab x d head) plus 12 L T d for attention's two T x T
/// matmuls (Note [Model FLOPs] in bench/tables.py).
double gpt_flops_per_token(const models::GPTConfig& config);

/// This process's fp32 matmul rate in GFLOP/s on its intra-op threads: the
/// median of 9 timed 512 x 512 x 512 products, about 0.1 s.
double measure_matmul_gflops();

/// Saves "step-NNNNNNNN" in --ckpt-dir at the end of training unless the
/// last step was saved already, and says where a resumed run started
/// (Trainer::ckpt_path).
class FinalSave : public trainer::Callback {
 public:
  FinalSave(std::string dir, int64_t every);
  std::string state_key() const override { return "FinalSave"; }
  void on_train_start(Trainer& trainer, TrainModule& module) override;
  void on_train_end(Trainer& trainer, TrainModule& module) override;

 private:
  std::string dir_;
  int64_t every_;
};

/// "step-00000012": the name of a --ckpt-dir checkpoint.
std::string step_name(int64_t step);

}  // namespace strata::cli
