// The main job: train the example GPT on byte-level text with the Trainer.
// TrainConfig is filled by `strata train`'s parser (train_command.cpp) and
// is independent of it; trainer_options maps it to TrainerOptions.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "cli/gpt_job.h"
#include "strata/trainer/trainer.h"

namespace strata::cli {

/// Every knob of `strata train`. Defaults make the README's demo.
struct TrainConfig {
  /// Longest --seq-len (attention's memory grows with its square).
  static constexpr int64_t kMaxSeqLen = 4096;
  /// Most --sample-tokens: the sample is text for a person to read.
  static constexpr int64_t kMaxSampleTokens = 4096;
  /// Largest --vocab-size: every id a uint16 token file can hold (0..65535).
  static constexpr int64_t kMaxVocabSize = 65536;
  // placement
  std::string accelerator = "cpu";
  std::string pjrt_plugin;  ///< --accelerator xla: the plugin to load ("": STRATA_PJRT_PLUGIN or the venv's)
  std::string strategy = "ddp";  ///< ddp, fsdp, single_device
  int devices = 2;
  int num_nodes = 1;
  std::string precision = "32-true";
  bool debug = false;
  /// Under SLURM: on SIGUSR1 (sbatch --signal=USR1@90) the job saves, stops
  /// and global rank 0 requeues it (scontrol requeue); Note [Stopping on a
  /// signal].
  bool requeue = false;
  // fully-sharded training (--strategy fsdp and xla_fsdp only)
  std::string wrap_policy;  ///< comma-separated module types made FSDP units; "none": only the root; "": Block
  bool activation_checkpointing = false;  ///< recompute every transformer block during backward
  std::string state_dict_type;  ///< "full" or "sharded"; "": the strategy's own (fsdp, xla_fsdp: sharded; others: full)
  bool sequential_save = false;  ///< local ranks write their checkpoint shards one after another
  // model and data
  std::string model_size = "small";
  std::string data;  ///< text file or folder, or a token file (.bin); empty: the default text
  int64_t vocab_size = 0;  ///< a token file's vocabulary (required for one, refused for text)
  int64_t seq_len = 0;  ///< 0: the model's block size
  // optimisation
  int64_t max_steps = 300;
  int64_t batch_size = 32;  ///< global: over all ranks and accumulation steps
  int64_t grad_accum = 1;
  double lr = 2e-3;  ///< docs/data.md, "The default learning rate": stable at 1 and 2 workers
  /// The learning-rate schedule (Note [Warm-up and decay] in
  /// trainer/scheduler.h): "constant", "cosine" or "linear".
  std::string lr_schedule = "constant";
  int64_t warmup_steps = 0;          ///< steps of linear warm-up to --lr
  int64_t lr_decay_steps = 0;        ///< the step the decay ends at (0: --max-steps)
  std::optional<double> min_lr;      ///< the rate the decay ends at (unset: --lr / 10)
  double weight_decay = 0.0;
  double grad_clip = 1.0;  ///< max global gradient norm; 0 disables
  std::string optimizer = "adamw-fused";  ///< or "adamw" (torch::optim's loop)
  std::string attention = "explicit";     ///< or "sdpa" (GPTConfig::attention)
  uint64_t seed = 1337;
  // checkpoints and logs
  std::string ckpt_dir;
  int64_t ckpt_every = 0;  ///< 0: only at the end (when ckpt_dir is set)
  std::string resume;      ///< a checkpoint path, or "latest"
  std::string metrics_file;
  int64_t log_every = 10;
  int64_t sample_tokens = 200;  ///< text sampled at the end (0: none)
  // the Trainer's extras
  int64_t max_epochs = 0;      ///< 0: no epoch limit (max_steps decides)
  /// Validate every K optimizer steps on the held-out windows; 0: never;
  /// -1 (default): every 50 steps when the data leaves a batch to hold out.
  int64_t val_every = -1;
  double val_fraction = 0.1;   ///< share of the windows held out for validation
  int64_t val_batches = 10;    ///< batches per validation
  int64_t early_stopping = 0;  ///< patience in validations (0: off)
  int64_t save_top_k = 0;      ///< keep the k best by val_loss in <ckpt-dir>/best (0: off)
  std::string logger;          ///< "", or "csv", "jsonl", "tensorboard", "mlflow" (a comma-separated list: several)
  std::string log_dir = "runs";  ///< where --logger writes (<log-dir>/train/version_N)
  std::string mlflow_uri;      ///< --logger mlflow's tracking server ("": MLFLOW_TRACKING_URI)
  std::string mlflow_experiment = "lightning_logs";  ///< --logger mlflow's experiment

  /// Throws ConfigError naming the first bad value (an FSDP-only flag
  /// with another strategy names the flag).
  void validate() const;
  /// Throws ConfigError unless --batch-size divides into equal
  /// micro-batches for `world` ranks and --grad-accum.
  void check_world(int world) const;
  /// Optimizer steps between validations: --val-every, 50 for its default.
  int64_t validation_interval() const;

  /// The module types --wrap-policy makes FSDP units: {"Block"} when
  /// empty, {} for "none". Throws ConfigError for a name that is not a
  /// module type of the GPT, or one that cannot be a unit (listing those
  /// that can).
  std::set<std::string> wrap_types() const;
  /// "full" or "sharded": state_dict_type, or the strategy's default.
  std::string checkpoint_layout() const;
  /// --strategy shards the model: fsdp or xla_fsdp (the FSDP flags apply).
  bool sharded() const;
  /// --data is a token file (its name ends in .bin; Note [Token files as data]).
  bool token_data() const;
  /// The schedule the flags ask for, resolved (decay over --max-steps, to
  /// --lr / 10, unless given).
  LRSchedule schedule() const;
  /// Throws ConfigError for a bad schedule: an unknown --lr-schedule, a
  /// negative step count, --min-lr outside [0, --lr], no step left to
  /// decay over, or a decay's flag with the constant schedule.
  void check_schedule() const;
};

/// The Trainer's options for `config` (Note [strata train is a Trainer
/// user]): a function of its arguments alone, apart from the logger
/// picking its version folder. `rank_zero`: this process is global rank 0,
/// the one that writes logs (the launching process is rank 0).
TrainerOptions trainer_options(const TrainConfig& config, bool rank_zero);

/// The GPT `config` trains: the --model-size preset with --seq-len,
/// --attention and a token file's vocabulary.
models::GPTConfig gpt_config(const TrainConfig& config);

/// A new, freshly initialised GPTJob for `config` (the module every rank
/// trains; the Trainer's module_factory for ranks run as threads).
std::shared_ptr<GPTJob> make_gpt_job(const TrainConfig& config);

/// "fsdp (units: Block, sharded checkpoints)": the strategy and its
/// settings, for the line that starts the run.
std::string describe_strategy(const TrainConfig& config, const std::string& name);

/// Runs the job (the Trainer launches the workers) and returns the process
/// exit code: 0, or the launcher's status when the workers failed.
int run_train(const TrainConfig& config);

/// The newest complete checkpoint "step-NNNNNNNN" in `dir`, or "" when none.
std::string latest_checkpoint(const std::string& dir);

}  // namespace strata::cli
