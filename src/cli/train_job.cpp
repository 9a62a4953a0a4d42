// The job behind `strata train`: a Trainer user (Note [strata train is a
// Trainer user], train_config.cpp). The Trainer launches the workers; in
// each, it fits the GPT TrainModule (cli/gpt_job.h) on the training
// windows, validating on the held-out ones.
//
// Note [Same batches at every world size]
// The dataset is a fixed list of token windows; the distributed sampler
// deals a shuffled order round-robin to the ranks, and each rank takes
// batch_size / (world_size * grad_accum) windows per micro-batch. So the
// union of the ranks' k-th micro-batches is the k-th micro-batch a single
// process would take with batch_size / grad_accum, and the averaged
// gradients (hence losses and parameters) match single-process training.
// It holds for the fully-sharded strategy as well, and it makes a
// checkpoint's loader position mean the same batch at any world size, so
// a run resumes under another strategy or device count where it stopped.
#include "cli/train_job.h"

#include "cli/gpt_job.h"

#include <torch/nn/module.h>
#include <torch/optim/adamw.h>

#include <signal.h>
#include <unistd.h>

#include <cstdlib>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "strata/checkpoint/atomic.h"
#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/folder_lock.h"
#include "strata/checkpoint/input.h"
#include "strata/checkpoint/sharded.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/core/error.h"
#include "strata/core/interrupted.h"
#include "strata/core/module_hooks.h"
#include "strata/core/strings.h"
#include "strata/data/loader.h"
#include "strata/data/text_dataset.h"
#include "strata/data/token_file.h"
#include "strata/loggers/logger.h"
#include "strata/models/gpt.h"
#include "strata/runtime/heartbeat.h"
#include "strata/runtime/env.h"
#include "strata/runtime/slurm.h"
#include "strata/runtime/torchelastic.h"
#include "strata/strategies/placement.h"
#include "strata/trainer/callbacks.h"
#include "strata/trainer/trainer.h"
#include "strata/xla_device/device.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;


// Note [Validation split]: the last --val-fraction of the windows (in text
// order) are held out; the rest is the training set.
struct TrainData {
  std::shared_ptr<const data::Dataset> windows;  ///< data::TokenWindows (text) or data::TokenFile (ids)
  int64_t num_tokens = 0;
  std::shared_ptr<WindowRange> train;
  std::shared_ptr<WindowRange> val;  ///< null: no validation
  int64_t micro_global = 1;          ///< examples per micro-batch, over all ranks
};

TrainData load_train_data(const TrainConfig& config, int64_t seq_len) {
  TrainData out;
  if (config.token_data()) {
    // Note [Token files as data] (train_config.cpp).
    auto file = std::make_shared<data::TokenFile>(config.data, seq_len, config.vocab_size);
    out.num_tokens = file->num_tokens();
    out.windows = file;
  } else {
    auto text = std::make_shared<data::TokenWindows>(
        config.data.empty() ? std::string(data::kDefaultDataPath) : config.data, seq_len);
    out.num_tokens = text->num_tokens();
    out.windows = text;
  }
  const size_t total = out.windows->size();
  out.micro_global = config.batch_size / config.grad_accum;
  size_t n_val = config.val_every != 0 ? static_cast<size_t>(std::floor(config.val_fraction * total)) : 0;
  // The default (every 50 steps) holds out data only when it fills a batch.
  if (config.val_every == -1 && n_val < static_cast<size_t>(out.micro_global)) n_val = 0;
  out.train = std::make_shared<WindowRange>(out.windows, 0, total - n_val);
  STRATA_CHECK(out.train->size() / static_cast<size_t>(out.micro_global) >= static_cast<size_t>(config.grad_accum),
               ConfigError, "[train] the data holds ", out.train->size(), " training windows of ", seq_len,
               " tokens: too few for one step of --batch-size ", config.batch_size,
               "; use more data or a smaller batch");
  STRATA_CHECK(config.val_every <= 0 || n_val >= static_cast<size_t>(out.micro_global), ConfigError,
               "[train] --val-fraction ", config.val_fraction, " holds out ", n_val,
               " windows, fewer than one batch (", out.micro_global, "); raise it or lower --batch-size");
  if (n_val > 0) out.val = std::make_shared<WindowRange>(out.windows, total - n_val, total);
  return out;
}

// Note [strata train's hyperparameters]
// The run's configuration, typed, as the module's hyperparameters: the
// loggers write them (hparams.yaml, TensorBoard's HPARAMS tab) and the
// checkpoint keeps them, so `strata ckpt export --format lightning` hands
// them to load_from_checkpoint as a LightningModule's init arguments
// (model_config builds the GPT).
trainer::Hyperparams train_hparams(const TrainConfig& config, const models::GPTConfig& model, Trainer& run) {
  trainer::Hyperparams h = {{"model_size", config.model_size},
                   {"model_config", model.to_json()},
                   {"lr", config.lr},
                   {"lr_schedule", config.lr_schedule},
                   {"warmup_steps", config.warmup_steps},
                   {"weight_decay", config.weight_decay},
                   {"batch_size", config.batch_size},
                   {"seq_len", model.block_size},
                   {"grad_accum", config.grad_accum},
                   {"grad_clip", config.grad_clip},
                   {"optimizer", config.optimizer},
                   {"attention", config.attention},
                   {"max_steps", config.max_steps},
                   {"max_epochs", config.max_epochs},
                   {"seed", config.seed},
                   {"accelerator", config.accelerator},
                   {"strategy", run.strategy().name()},
                   {"devices", config.devices},
                   {"num_nodes", config.num_nodes},
                   {"world_size", run.placement().world_size},
                   {"precision", config.precision},
                   {"val_every", config.val_every == 0 ? int64_t{0} : config.validation_interval()},
                   {"val_batches", config.val_batches},
                   {"log_every", config.log_every},
                   {"data", config.data.empty() ? std::string(data::kDefaultDataPath) : config.data}};
  if (config.lr_schedule != "constant") {
    const LRSchedule schedule = config.schedule();
    h["lr_decay_steps"] = schedule.decay_steps;
    h["min_lr"] = schedule.min_lr;
  }
  if (config.sharded()) {
    h["state_dict_type"] = config.checkpoint_layout();
    h["activation_checkpointing"] = config.activation_checkpointing;
  }
  return h;
}

// How a run's flags ask for the schedule a scheduler type name stands for.
std::string schedule_flags(const std::string& scheduler) {
  if (scheduler.empty()) return "no schedule (--lr-schedule constant without --warmup-steps)";
  if (scheduler == "WarmupCosineLR") return "--lr-schedule cosine";
  if (scheduler == "WarmupLinearLR") return "--lr-schedule linear";
  if (scheduler == "WarmupConstantLR") return "--lr-schedule constant with --warmup-steps";
  return "a " + scheduler + " scheduler";
}

// Note [strata train's learning-rate schedule] (train_config.cpp): the
// checkpoint's scheduler must be of the kind this run makes, or the
// Trainer would refuse it in its own terms (a count of schedulers, a type
// name); said here in the flags' terms. A checkpoint that cannot be read
// is left to the Trainer, which names what is wrong with it.
void check_resume_schedule(const std::string& path, const TrainConfig& config) {
  std::string saved;
  try {
    const checkpoint::CheckpointReader reader = checkpoint::CheckpointReader::open(path);
    const nlohmann::json& schedulers = reader.metadata().at("entries").at("trainer").at("value").at("lr_schedulers");
    if (!schedulers.is_array() || schedulers.size() > 1) return;
    if (schedulers.size() == 1) saved = schedulers[0].at("type").get<std::string>();
  } catch (const std::exception&) {
    return;
  }
  const std::string wanted = config.schedule().scheduler_name();
  STRATA_CHECK(saved == wanted, ConfigError, "[train] ", path, " was trained with ", schedule_flags(saved),
               ", but this run asks for ", schedule_flags(wanted),
               "; resume with the schedule flags it was trained with (the schedule is saved with the step)");
}

// SLURM_RESTART_COUNT: how often SLURM requeued this job (0 when unset).
int slurm_restart_count() {
  const char* text = std::getenv("SLURM_RESTART_COUNT");
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  STRATA_CHECK(*end == '\0' && value >= 0 && value <= 1000000, ConfigError, "[train] SLURM_RESTART_COUNT='", text,
               "' is not a count (SLURM sets it when it requeues a job)");
  return static_cast<int>(value);
}

// The job in a process that trains (a worker, or the only process): the
// data, the model, fit, the sample and the closing line on global rank 0.
void train_here(Trainer& trainer, const TrainConfig& config) {
  const int64_t seq_len = gpt_config(config).block_size;
  TrainData data = load_train_data(config, seq_len);
  if (config.token_data()) {
    // The sample continues the data's first id, and prints ids: strata has
    // no tokenizer to turn them back into text.
    for (const auto& callback : trainer.callbacks()) {
      if (auto sample = std::dynamic_pointer_cast<Sample>(callback)) {
        sample->set_prompt(std::static_pointer_cast<const data::TokenFile>(data.windows)->ids(0, 1), false);
      }
    }
  }

  // Identical initialisation on every rank (and DDP broadcasts from rank 0).
  strategies::seed_everything(config.seed);
  std::shared_ptr<GPTJob> job = make_gpt_job(config);
  job->save_hyperparameters(train_hparams(config, job->gpt->config(), trainer));
  const int64_t num_parameters = job->gpt->num_parameters();  // before FSDP leaves each rank a shard

  const bool rank_zero = runtime::Environment::from_env().rank == 0;
  // Note [Workers of torchrun]: after an elastic restart the group resumes
  // from the newest complete checkpoint without being told, as a run given
  // --resume latest does.
  // So does a SLURM job that was requeued (--requeue, or by the cluster).
  std::string resume = config.resume;
  const runtime::ElasticRun elastic = runtime::ElasticRun::from_env();
  const int slurm_restarts = slurm_restart_count();
  if (resume.empty() && (elastic.restart_count > 0 || slurm_restarts > 0) && !config.ckpt_dir.empty()) {
    resume = "latest";
    if (rank_zero && elastic.restart_count > 0) {
      std::cout << "torchrun restart " << elastic.restart_count << " of " << elastic.max_restarts
                << ": resuming from the newest complete checkpoint in --ckpt-dir" << std::endl;
    } else if (rank_zero) {
      std::cout << "SLURM restart " << slurm_restarts
                << " of this job: resuming from the newest complete checkpoint in --ckpt-dir" << std::endl;
    }
  }
  std::string resume_path;
  if (resume == "latest" || resume == "last") {
    resume_path = latest_checkpoint(config.ckpt_dir);
    if (resume_path.empty() && rank_zero) {
      std::cout << "--resume " << resume << ": no complete checkpoint in --ckpt-dir '" << config.ckpt_dir
                << "'; starting from scratch" << std::endl;
    }
  } else {
    resume_path = resume;
  }
  if (!resume_path.empty()) check_resume_schedule(resume_path, config);
  if (rank_zero) {
    std::cout << "training a " << config.model_size << " GPT (" << num_parameters << " parameters) on "
              << data.num_tokens << (config.token_data() ? " token ids (vocabulary " +
                                                                std::to_string(config.vocab_size) + ")"
                                                          : std::string(" tokens"))
              << " with " << describe_strategy(config, trainer.strategy().name())
              << " on " << trainer.placement().world_size << " worker(s), " << config.precision << ", global batch "
              << config.batch_size << " x " << seq_len << " tokens"
              << (data.val ? detail::cat(", ", data.val->size(), " windows held out for validation") : std::string())
              << std::endl;
  }
  trainer.fit(job,
              DataSource(data.train, DataOptions().with_batch_size(data.micro_global).with_shuffle(true)
                                         .with_seed(config.seed).with_drop_last(true)),
              data.val ? std::optional<DataSource>(DataSource(data.val, DataOptions().with_batch_size(data.micro_global)))
                       : std::nullopt,
              resume_path);
  if (!trainer.is_global_zero()) return;
  // The step's loss averaged over ranks; none when a run resumed at its last step.
  double loss = std::numeric_limits<double>::quiet_NaN();
  for (const auto& callback : trainer.callbacks()) {
    if (auto metrics = std::dynamic_pointer_cast<MetricsFile>(callback)) loss = metrics->last_loss();
  }
  std::cout << "done: " << trainer.global_step() << " steps, final loss ";
  if (std::isfinite(loss)) std::cout << loss;
  else std::cout << "none (no step ran)";
  auto val = trainer.callback_metrics().find("val_loss");
  if (val != trainer.callback_metrics().end()) std::cout << ", validation loss " << val->second;
  std::cout << std::endl;
  // What the xla device did (docs/xla.md, "Reading the metrics"): the
  // compiles, the fallbacks and where the time went.
  if (trainer.strategy().accelerator().name() == "xla") std::cout << "xla: " << xla::summary(xla::metrics()) << std::endl;
}

}  // namespace

// Note [Which checkpoint --resume latest takes]
// Candidates are the directories "step-<digits>" (any width: step-100000000
// and later are longer than the 8 digits step_name pads to), ordered by the
// step number, newest first. The first that opens and verifies (metadata,
// files, checksums: StateReader::open + verify_checksums) is taken; a newer
// one that fails is reported and skipped, so one damaged save falls back to
// the previous checkpoint instead of ending the run. Staging directories
// left by killed saves are removed first (remove_stale_staging).
std::string latest_checkpoint(const std::string& dir) {
  std::error_code ec;
  if (dir.empty() || !std::filesystem::is_directory(dir, ec)) return "";
  try {
    checkpoint::remove_stale_staging(dir);
  } catch (const std::exception&) {
  }
  std::vector<std::pair<uint64_t, std::string>> candidates;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() < 6 || name.size() > 5 + 19 || name.rfind("step-", 0) != 0) continue;
    if (name.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    if (!checkpoint::is_complete(entry.path().string())) continue;
    candidates.emplace_back(std::stoull(name.substr(5)), entry.path().string());
  }
  std::sort(candidates.begin(), candidates.end(), std::greater<>());
  for (const auto& [step, path] : candidates) {
    try {
      checkpoint::StateReader::open(path).verify_checksums();
      return path;
    } catch (const CheckpointError& e) {
      checkpoint::warn(::strata::detail::cat("--resume latest: skipping ", path, ", which fails verification (",
                                             e.what(), "); falling back to the previous checkpoint"));
    }
  }
  return "";
}

// Note [Check paths first]
// An unwritable --ckpt-dir or --metrics-file fails before any worker
// starts, not at the first save after minutes of training: the folder is
// made and a file is written in it and removed; the metrics file is opened
// for appending.
void check_paths(const TrainConfig& config) {
  namespace fs = std::filesystem;
  if (!config.ckpt_dir.empty()) {
    std::error_code ec;
    fs::create_directories(config.ckpt_dir, ec);
    STRATA_CHECK(!ec, ConfigError, "[train] --ckpt-dir '", config.ckpt_dir, "' cannot be created: ", ec.message());
    fs::path probe = fs::path(config.ckpt_dir) / (".strata-write-check-" + std::to_string(::getpid()));
    std::ofstream out(probe);
    out << "ok";
    out.close();
    const bool written = !out.fail();
    fs::remove(probe, ec);
    STRATA_CHECK(written, ConfigError, "[train] --ckpt-dir '", config.ckpt_dir,
                 "' is not writable; choose a folder you can write to");
  }
  if (!config.metrics_file.empty()) {
    fs::path parent = fs::path(config.metrics_file).parent_path();
    std::error_code ec;
    if (!parent.empty()) fs::create_directories(parent, ec);
    std::ofstream out(config.metrics_file, std::ios::app);
    STRATA_CHECK(out.good(), ConfigError, "[train] cannot open --metrics-file ", config.metrics_file,
                 " for appending: ", ec ? ec.message() : std::string("check the path and its permissions"));
  }
}

int run_train(const TrainConfig& config) {
  config.validate();
  // The xla device reads its plugin from the environment when it starts.
  if (!config.pjrt_plugin.empty()) ::setenv("STRATA_PJRT_PLUGIN", config.pjrt_plugin.c_str(), 1);
  const runtime::Environment env = runtime::Environment::from_env();
  Trainer trainer(trainer_options(config, /*rank_zero=*/env.rank == 0));
  config.check_world(trainer.placement().world_size);
  check_paths(config);
  // One job per --ckpt-dir (Note [One job per checkpoint folder]): held until
  // run_train returns by the process that launches the workers, or by rank 0
  // when the launcher is not strata train (strata launch, srun).
  checkpoint::FolderLock ckpt_lock;
  if (!config.ckpt_dir.empty()) {
    if (!env.launched())
      ckpt_lock = checkpoint::FolderLock::acquire(config.ckpt_dir, "--ckpt-dir");
    else if (env.rank == 0)
      ckpt_lock = checkpoint::FolderLock::acquire_in_worker(config.ckpt_dir, "--ckpt-dir");
  }
  try {
    // Without a launcher, this process becomes rank 0 at fit and starts the
    // others, which run this whole job from the start as ranks of their own
    // (Note [The launching process is rank 0] in strategies/launchers/subprocess.h).
    train_here(trainer, config);
  } catch (const Interrupted& e) {
    // Note [Stopping on a signal]: SLURM's warning; the step is saved, the
    // job goes back to the queue and resumes from it.
    if (config.requeue && e.signal() == SIGUSR1 && env.rank == 0) {
      const runtime::RequeueResult requeued = runtime::slurm_requeue();
      std::cerr << "strata: --requeue: " << requeued.message << std::endl;
    }
    throw;
  } catch (const LaunchError& e) {
    // The workers ran and ended badly: exit as `strata launch` does, with
    // the launcher's status (the rank's code, 128+N for a signal, 124, 130
    // or 143 when interrupted; Note [Launch outcomes]) and its report.
    if (!e.outcome()) throw;
    std::cerr << (e.outcome()->interrupted() ? "strata: " : "strata: error: ") << e.what() << std::endl;
    return e.outcome()->exit_code;
  }
  return 0;
}

}  // namespace strata::cli
