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

/// strata train's learning-rate schedule: a trainer::WarmupDecayLR
/// stepped after every optimizer step (Note [Warm-up and decay] in
/// trainer/scheduler.h), or none for a constant rate without warm-up.
struct LRSchedule {
  std::string kind = "constant";  ///< "constant", "cosine" or "linear"
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;  ///< cosine, linear: the step the decay ends at
  double min_lr = 0.0;      ///< cosine, linear: the rate it ends at
  /// False for a constant rate without warm-up: no scheduler at all, as
  /// before schedules existed, so those checkpoints resume unchanged.
  bool active() const { return kind != "constant" || warmup_steps > 0; }
  /// The scheduler's type name ("WarmupCosineLR"), "" when not active.
  std::string scheduler_name() const;
};

/// The GPT language model trained with AdamW; logs train_loss (progress
/// bar) and val_loss (synced over ranks).
class GPTJob : public TrainModule {
 public:
  /// `optimizer`: "adamw-fused" (strata::optim::AdamW, ATen's fused kernel)
  /// or "adamw" (torch::optim::AdamW's loop); their checkpoints are the same.
  GPTJob(const models::GPTConfig& config, std::string model_size, double lr, double weight_decay,
         std::string optimizer = "adamw-fused", LRSchedule schedule = {});
  at::Tensor training_step(const data::Batch& batch, int64_t batch_idx) override;
  at::Tensor validation_step(const data::Batch& batch, int64_t batch_idx) override;
  /// Logs the step's train_loss once the step ended (Note [One train_loss]).
  void on_train_batch_end(const at::Tensor& loss, const data::Batch& batch, int64_t batch_idx) override;
  OptimizerConfig configure_optimizers() override;
  /// Records the model preset; a checkpoint of another preset is refused.
  void on_save_checkpoint(nlohmann::json& extra) override;
  void on_load_checkpoint(const nlohmann::json& extra) override;

  models::GPT gpt{nullptr};

 private:
  std::string model_size_;
  int64_t last_logged_step_ = -1;
  double lr_;
  double weight_decay_;
  std::string optimizer_;
  LRSchedule schedule_;
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

/// Measures each optimizer step's throughput and logs it through the
/// Trainer (module log(), so every logger, callback_metrics and the
/// metrics file get the same values): tokens_per_s, samples_per_s and, when
/// the machine's matmul rate was measured, mfu (a fraction; Note [MFU of
/// strata train]). On rank 0 it also appends one JSON line per optimizer
/// step to --metrics-file ("" none): step (the global step after it), loss
/// (the train_loss the loggers get for it: the global batch's loss), lr
/// (the rate the step used), epoch, tokens_per_s, samples_per_s,
/// elapsed_s, mfu, and val_loss on the
/// line of the step a validation is filed under (Note [Validation in the
/// metrics file]), only there.
class MetricsFile : public trainer::Callback {
 public:
  /// `tokens_per_step` and `samples_per_step`: the global batch's tokens
  /// and windows.
  MetricsFile(std::string path, int64_t tokens_per_step, int64_t samples_per_step);
  std::string state_key() const override { return "MetricsFile"; }
  /// A new MetricsFile with `other`'s settings that has measured and
  /// written nothing (another rank's: Note [The Trainer's ranks as
  /// threads] in trainer/trainer.h).
  MetricsFile(const MetricsFile& other)
      : MetricsFile(other.path_, other.tokens_per_step_, other.samples_per_step_) {}
  /// Also measures the machine's matmul rate (Note [MFU of strata train]).
  void on_train_start(Trainer& trainer, TrainModule& module) override;
  void on_train_batch_start(Trainer& trainer, TrainModule& module, const data::Batch& batch,
                            int64_t batch_idx) override;
  void on_train_batch_end(Trainer& trainer, TrainModule& module, const at::Tensor& loss, const data::Batch& batch,
                          int64_t batch_idx) override;
  void on_validation_end(Trainer& trainer, TrainModule& module) override;
  /// Prints throughput and MFU on global rank 0.
  void on_train_end(Trainer& trainer, TrainModule& module) override;
  /// The last step's train_loss (NaN before a step).
  double last_loss() const { return last_loss_; }

 private:
  void write_pending();
  double step_lr_ = 0.0;     // the rate the step being run uses (read at its batches' start)
  nlohmann::json pending_;   // the last step's line, until its validation could run
  nlohmann::json next_val_;  // a validation inside an accumulation window: the next line's
  bool line_from_this_batch_ = false;
  std::string path_;
  std::ofstream out_;
  int64_t tokens_per_step_;
  int64_t samples_per_step_;
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

/// Samples text from the trained model at the end of fit (--sample-tokens)
/// and prints it on global rank 0 ("sample: ..."). Every rank samples the
/// same tokens (Note [Sampling on every rank] in gpt_job.cpp); none does
/// after a stop on a signal.
class Sample : public trainer::Callback {
 public:
  /// `prompt`: a 1-D tensor of token ids (on the CPU); `bytes`: the ids are
  /// bytes, printed as text (else as ids). `tokens` new tokens, top-k 40
  /// at temperature 0.8, drawn from a generator seeded with `seed`.
  Sample(int64_t tokens, uint64_t seed, at::Tensor prompt, bool bytes);
  std::string state_key() const override { return "Sample"; }
  void on_fit_end(Trainer& trainer, TrainModule& module) override;
  /// Replaces the prompt (before fit, so the ranks' copies get it).
  void set_prompt(at::Tensor prompt, bool bytes) {
    prompt_ = std::move(prompt);
    bytes_ = bytes;
  }
  /// What the last fit sampled, as printed ("" before one, or with no tokens).
  const std::string& text() const { return text_; }

 private:
  int64_t tokens_;
  uint64_t seed_;
  at::Tensor prompt_;
  bool bytes_;
  std::string text_;
};

/// "step-00000012": the name of a --ckpt-dir checkpoint.
std::string step_name(int64_t step);

}  // namespace strata::cli
