// `strata train`'s flags: their checks (TrainConfig::validate) and the
// one function that maps them to the Trainer's options (trainer_options).
// The job that runs the Trainer is train_job.cpp.
#include "cli/train_job.h"

#include "cli/gpt_job.h"

#include <cstdlib>
#include <filesystem>
#include <sstream>

#include "strata/core/error.h"
#include "strata/core/strings.h"
#include "strata/data/token_file.h"
#include "strata/loggers/file_logger.h"
#include "strata/loggers/make_logger.h"
#include "strata/loggers/mlflow_logger.h"
#include "strata/models/gpt.h"
#include "strata/strategies/make_strategy.h"
#include "strata/trainer/callbacks.h"

namespace strata::cli {
namespace {

// "csv,tensorboard" -> {"csv", "tensorboard"}; "" -> {}.
std::vector<std::string> logger_kinds(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start < list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    out.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  if (!list.empty() && list.back() == ',') out.push_back("");
  return out;
}

// Note [Which modules can be FSDP units]
// --wrap-policy names module types as module.name() reports them. Any of
// the GPT's types can be a unit: FSDP gathers a unit on the first use of
// its parameters (Note [Gather on first use] in
// src/strategies/fsdp/first_use.h), wherever its forward is called from.
// A name that is not a type of the model would make no unit, so the CLI
// refuses it before launching.

// Every module type of the GPT of `model_size`.
std::set<std::string> gpt_module_types(const std::string& model_size) {
  models::GPTConfig config = models::GPTConfig::preset(model_size);
  config.with_n_layer(1).with_n_head(1).with_n_embd(8).with_block_size(2);  // the same module types, small
  models::GPT model(config);
  std::set<std::string> types;
  for (const auto& m : model->modules(/*include_self=*/true)) types.insert(m->name());
  return types;
}

// Note [The FSDP flags under xla_fsdp]
// XLAFSDPStrategy's own parameters are FSDP's (auto_wrap_policy,
// activation_checkpointing_policy, state_dict_type="sharded" by default,
// sequential_save), and strata's xla_fsdp is FSDP whose collectives are
// recorded into the xla step (strategies/xla.h). So --wrap-policy,
// --activation-checkpointing, --state-dict-type and --sequential-save mean
// the same under fsdp and xla_fsdp, build the strategy object the same way,
// and both save sharded checkpoints unless told otherwise; a sharded
// checkpoint of either resumes under the other, at any world size.

// The strategy object for --strategy fsdp and xla_fsdp (and ddp --debug);
// null: the Trainer makes the named strategy with its defaults.
std::shared_ptr<strategies::Strategy> make_train_strategy(const TrainConfig& config) {
  if (!config.sharded() && !(config.strategy == "ddp" && config.debug)) return nullptr;
  auto accelerator = strategies::make_accelerator(config.accelerator);
  strategies::StrategyOptions options;
  options.with_kind(config.strategy)
      .with_accelerator(accelerator)
      .with_precision(strategies::Precision::parse(config.precision, accelerator->name()))
      .with_ddp(strategies::DDPOptions().with_debug(config.debug));
  strategies::ModuleTypes units = config.wrap_types();
  if (!units.empty()) options.fsdp.with_auto_wrap_policy(units);
  if (config.activation_checkpointing) {
    options.fsdp.with_activation_checkpointing_policy({models::BlockImpl::kTypeName});
  }
  options.fsdp.with_state_dict_type(config.checkpoint_layout())
      .with_sequential_save(config.sequential_save)
      .with_debug(config.debug);
  return strategies::make_strategy(options);
}

}  // namespace

// The strategy and its settings, for the line that starts the run.
std::string describe_strategy(const TrainConfig& config, const std::string& name) {
  if (name != "fsdp" && name != "xla_fsdp") return name;
  std::set<std::string> units = config.wrap_types();
  std::string out = name + " (units: " + (units.empty() ? std::string("the whole model") : join(units));
  if (config.activation_checkpointing) out += ", activation checkpointing";
  out += ", " + config.checkpoint_layout() + " checkpoints";
  if (config.sequential_save) out += " saved sequentially";
  return out + ")";
}


void TrainConfig::validate() const {
  STRATA_CHECK(devices == -1 || devices >= 1, ConfigError,
               "[train] --devices must be >= 1 (or -1: every visible GPU, one worker on the CPU), got ", devices);
  STRATA_CHECK(num_nodes >= 1, ConfigError, "[train] --num-nodes must be >= 1, got ", num_nodes);
  STRATA_CHECK(max_steps >= 1, ConfigError, "[train] --max-steps must be >= 1, got ", max_steps);
  STRATA_CHECK(batch_size >= 1, ConfigError, "[train] --batch-size must be >= 1, got ", batch_size);
  STRATA_CHECK(grad_accum >= 1, ConfigError, "[train] --grad-accum must be >= 1, got ", grad_accum);
  STRATA_CHECK(lr > 0 && lr <= 10, ConfigError, "[train] --lr must be a number in (0, 10], got ", lr);
  check_schedule();
  STRATA_CHECK(weight_decay >= 0 && weight_decay <= 10, ConfigError,
               "[train] --weight-decay must be a number in [0, 10], got ", weight_decay);
  STRATA_CHECK(grad_clip >= 0 && grad_clip <= 1e6, ConfigError,
               "[train] --grad-clip must be a number in [0, 1e+06] (0 disables), got ", grad_clip);
  STRATA_CHECK(seq_len >= 0 && seq_len <= kMaxSeqLen, ConfigError, "[train] --seq-len must be an integer in 1..",
               kMaxSeqLen, ", got ", seq_len);
  STRATA_CHECK(sample_tokens >= 0 && sample_tokens <= kMaxSampleTokens, ConfigError,
               "[train] --sample-tokens must be an integer in 0..", kMaxSampleTokens, ", got ", sample_tokens);
  STRATA_CHECK(ckpt_every >= 0, ConfigError, "[train] --ckpt-every must be >= 0, got ", ckpt_every);
  STRATA_CHECK(log_every >= 1, ConfigError, "[train] --log-every must be >= 1, got ", log_every);
  STRATA_CHECK((resume != "latest" && resume != "last") || !ckpt_dir.empty(), ConfigError,
               "[train] --resume ", resume, " needs --ckpt-dir to look in");
  STRATA_CHECK(max_epochs >= 0, ConfigError, "[train] --max-epochs must be >= 0, got ", max_epochs);
  STRATA_CHECK(val_every >= -1, ConfigError, "[train] --val-every must be >= 0 (0: no validation), got ", val_every);
  STRATA_CHECK(val_fraction > 0 && val_fraction <= 0.5, ConfigError,
               "[train] --val-fraction must be a number in (0, 0.5], got ", val_fraction);
  STRATA_CHECK(val_batches >= 1, ConfigError, "[train] --val-batches must be >= 1, got ", val_batches);
  STRATA_CHECK(early_stopping >= 0, ConfigError, "[train] --early-stopping must be >= 0, got ", early_stopping);
  STRATA_CHECK(save_top_k >= 0, ConfigError, "[train] --save-top-k must be >= 0, got ", save_top_k);
  STRATA_CHECK((early_stopping == 0 && save_top_k == 0) || val_every != 0, ConfigError, "[train] ",
               early_stopping ? "--early-stopping" : "--save-top-k",
               " watches val_loss, but --val-every 0 turns validation off; drop one of them");
  STRATA_CHECK(save_top_k == 0 || !ckpt_dir.empty(), ConfigError,
               "[train] --save-top-k needs --ckpt-dir (the best checkpoints go to <ckpt-dir>/best)");
  bool mlflow = false;
  for (const std::string& kind : logger_kinds(logger)) {
    STRATA_CHECK(kind == "csv" || kind == "jsonl" || kind == "tensorboard" || kind == "mlflow", ConfigError,
                 "[train] --logger '", kind, "' is not one of csv, jsonl, tensorboard, mlflow (several: a "
                 "comma-separated list, e.g. csv,tensorboard)");
    mlflow |= kind == "mlflow";
  }
  STRATA_CHECK(mlflow || (mlflow_uri.empty() && mlflow_experiment == "lightning_logs"), ConfigError, "[train] ",
               mlflow_uri.empty() ? "--mlflow-experiment" : "--mlflow-uri",
               " applies only to --logger mlflow; add mlflow to --logger or drop the flag");
  if (mlflow) {
    // Checked here, before any worker starts; the logger checks the
    // address itself when rank 0 builds it.
    const char* env_uri = std::getenv("MLFLOW_TRACKING_URI");
    const std::string uri = !mlflow_uri.empty() ? mlflow_uri : env_uri ? std::string(env_uri) : std::string();
    STRATA_CHECK(!uri.empty(), ConfigError,
                 "[train] --logger mlflow needs a tracking server: pass --mlflow-uri http://HOST:PORT or set "
                 "MLFLOW_TRACKING_URI");
    STRATA_CHECK(uri.rfind("http://", 0) == 0 || uri.rfind("https://", 0) == 0, ConfigError, "[train] ",
                 mlflow_uri.empty() ? "MLFLOW_TRACKING_URI" : "--mlflow-uri", " '", uri.substr(0, 200),
                 "' is not an http:// or https:// address of an MLflow tracking server");
    STRATA_CHECK(!mlflow_experiment.empty() && mlflow_experiment.size() <= 500, ConfigError,
                 "[train] --mlflow-experiment must be 1 to 500 bytes, got ", mlflow_experiment.size());
  }
  models::GPTConfig::preset(model_size);  // throws for an unknown size
  // Note [Token files as data]
  // --data FILE.bin is nanoGPT's train.bin: uint16 token ids of some
  // tokenizer, memory-mapped (data::TokenFile). The model's vocabulary is
  // --vocab-size, which the file cannot say, so it is required; every id is
  // checked against it when the file opens. Text (any other name) is bytes,
  // a vocabulary of 256. Validation holds out the file's last windows, as
  // for text.
  if (token_data()) {
    STRATA_CHECK(vocab_size >= 1, ConfigError, "[train] --data ", data, " is a token file (a .bin of uint16 ids), "
                 "which needs --vocab-size, the vocabulary size of the tokenizer that wrote it (GPT-2's: 50257)");
    STRATA_CHECK(vocab_size <= kMaxVocabSize, ConfigError, "[train] --vocab-size must be in 1..", kMaxVocabSize,
                 ", got ", vocab_size);
  } else {
    STRATA_CHECK(vocab_size == 0, ConfigError, "[train] --vocab-size applies to a token file (--data FILE.bin of "
                 "uint16 ids), but the data is text, read as bytes (a vocabulary of 256); drop --vocab-size or "
                 "pass a .bin file");
  }

  STRATA_CHECK(pjrt_plugin.empty() || accelerator == "xla", ConfigError, "[train] --pjrt-plugin applies only to "
               "--accelerator xla, but --accelerator is '", accelerator, "'; drop one of them");
  // Note [The FSDP flags under xla_fsdp]
  const bool fsdp = sharded();
  auto fsdp_only = [&](bool given, const char* flag) {
    STRATA_CHECK(!given || fsdp, ConfigError, "[train] ", flag,
                 " applies only to --strategy fsdp or xla_fsdp, but --strategy is '", strategy, "'; drop ", flag,
                 " or train with --strategy fsdp (xla_fsdp with --accelerator xla)");
  };
  fsdp_only(!wrap_policy.empty(), "--wrap-policy");
  fsdp_only(activation_checkpointing, "--activation-checkpointing");
  fsdp_only(sequential_save, "--sequential-save");
  STRATA_CHECK(state_dict_type.empty() || state_dict_type == "full" || state_dict_type == "sharded", ConfigError,
               "[train] --state-dict-type must be 'full' or 'sharded', got '", state_dict_type, "'");
  STRATA_CHECK(fsdp || state_dict_type != "sharded", ConfigError,
               "[train] --state-dict-type sharded needs --strategy fsdp or xla_fsdp: with --strategy '", strategy,
               "' every rank holds the whole model and rank 0 writes one full checkpoint; drop the flag or pass "
               "--state-dict-type full");
  if (fsdp) wrap_types();  // throws for a type that cannot be a unit
}

std::set<std::string> TrainConfig::wrap_types() const {
  if (wrap_policy.empty()) return {models::BlockImpl::kTypeName};
  if (wrap_policy == "none") return {};
  const std::set<std::string> types = gpt_module_types(model_size);
  std::set<std::string> out;
  std::stringstream list(wrap_policy);
  for (std::string name; std::getline(list, name, ',');) {
    size_t begin = name.find_first_not_of(' '), end = name.find_last_not_of(' ');
    name = begin == std::string::npos ? "" : name.substr(begin, end - begin + 1);
    STRATA_CHECK(!name.empty(), ConfigError, "[train] --wrap-policy '", wrap_policy,
                 "' has an empty entry; give comma-separated module types, e.g. Block");
    STRATA_CHECK(types.count(name) > 0, ConfigError, "[train] --wrap-policy: '", name,
                 "' is not a module type of the GPT; its types are: ", join(types),
                 " (or pass 'none' for a single unit)");
    out.insert(name);
  }
  return out;
}

std::string TrainConfig::checkpoint_layout() const {
  if (!state_dict_type.empty()) return state_dict_type;
  return sharded() ? "sharded" : "full";  // the seeds' default: XLAFSDPStrategy(state_dict_type="sharded")
}

bool TrainConfig::token_data() const { return data::is_token_file(data); }

bool TrainConfig::sharded() const { return strategy == "fsdp" || strategy == "xla_fsdp"; }

// Note [strata train's learning-rate schedule]
// --lr-schedule cosine|linear warms up linearly over --warmup-steps, then
// decays from --lr to --min-lr (default --lr / 10, nanoGPT's choice after
// Chinchilla) at step --lr-decay-steps (default --max-steps), and holds
// --min-lr after it; constant holds --lr after the warm-up. The rates are
// trainer::WarmupDecayLR's (Note [Warm-up and decay] in
// trainer/scheduler.h), a function of the step alone, and the Trainer's
// checkpoint keeps the step: a run of N steps equals one of N/2 steps
// (with --lr-decay-steps N) resumed for the other N/2. A resumed run
// follows the schedule its own flags give from the step it resumes at;
// the scheduler's kind must be the checkpoint's (check_resume_schedule).
void TrainConfig::check_schedule() const {
  STRATA_CHECK(lr_schedule == "constant" || lr_schedule == "cosine" || lr_schedule == "linear", ConfigError,
               "[train] --lr-schedule '", lr_schedule, "' is not one of constant, cosine, linear");
  STRATA_CHECK(warmup_steps >= 0, ConfigError, "[train] --warmup-steps must be >= 0 (0: no warm-up), got ",
               warmup_steps);
  STRATA_CHECK(lr_decay_steps >= 0, ConfigError, "[train] --lr-decay-steps must be >= 0 (0: --max-steps), got ",
               lr_decay_steps);
  if (lr_schedule == "constant") {
    STRATA_CHECK(!min_lr && lr_decay_steps == 0, ConfigError, "[train] ", min_lr ? "--min-lr" : "--lr-decay-steps",
                 " applies to --lr-schedule cosine or linear, but the schedule is constant (--lr after the "
                 "warm-up); drop the flag or choose a decay");
    return;
  }
  if (min_lr) {
    STRATA_CHECK(*min_lr >= 0, ConfigError, "[train] --min-lr must be >= 0, got ", *min_lr);
    STRATA_CHECK(*min_lr <= lr, ConfigError, "[train] --min-lr ", *min_lr, " is above --lr ", lr,
                 ": the schedule decays from --lr down to --min-lr; give a --min-lr <= --lr");
  }
  const LRSchedule s = schedule();
  STRATA_CHECK(s.decay_steps > warmup_steps, ConfigError, "[train] --warmup-steps ", warmup_steps,
               " leaves no step to decay over: the ", lr_schedule, " decay would end at step ", s.decay_steps,
               lr_decay_steps > 0 ? " (--lr-decay-steps)" : " (--max-steps)",
               "; use fewer warm-up steps or decay over more steps");
}

LRSchedule TrainConfig::schedule() const {
  LRSchedule s;
  s.kind = lr_schedule;
  s.warmup_steps = warmup_steps;
  if (lr_schedule != "constant") {
    s.decay_steps = lr_decay_steps > 0 ? lr_decay_steps : max_steps;
    s.min_lr = min_lr.value_or(lr / 10);
  }
  return s;
}

void TrainConfig::check_world(int world) const {
  STRATA_CHECK(batch_size % (static_cast<int64_t>(world) * grad_accum) == 0, ConfigError, "[train] --batch-size ",
               batch_size, " must be divisible by the world size (", world, ": --devices x --num-nodes, or the "
               "launcher's workers) x --grad-accum (", grad_accum, ") so every rank takes equal micro-batches");
}

int64_t TrainConfig::validation_interval() const { return val_every == -1 ? 50 : val_every; }

// Note [strata train is a Trainer user]
// Every flag becomes a field of TrainerOptions here and nowhere else: the
// placement (accelerator, devices, nodes, strategy, precision), the loop
// (steps, epochs, accumulation, clipping, logging, validation) and the
// callbacks (metrics file, final save, the sample, periodic and best
// checkpoints, early stopping) and logger. The Trainer then launches the workers, as for any
// Trainer user. Validation settings are given whenever --val-every is not
// 0; they only act when the job passes held-out data to fit.
models::GPTConfig gpt_config(const TrainConfig& config) {
  models::GPTConfig model_config = models::GPTConfig::preset(config.model_size);
  if (config.seq_len > 0) model_config.block_size = config.seq_len;
  model_config.attention = config.attention;
  if (config.token_data()) model_config.vocab_size = config.vocab_size;
  return model_config;
}

std::shared_ptr<GPTJob> make_gpt_job(const TrainConfig& config) {
  return std::make_shared<GPTJob>(gpt_config(config), config.model_size, config.lr, config.weight_decay,
                                  config.optimizer, config.schedule());
}

TrainerOptions trainer_options(const TrainConfig& config, bool rank_zero) {
  TrainerOptions options;
  // Note [The Trainer's ranks as threads]: the other ranks' modules.
  options.with_module_factory([config] { return make_gpt_job(config); });
  options.with_accelerator(config.accelerator)
      .with_devices(config.devices)
      .with_num_nodes(config.num_nodes)
      .with_precision(config.precision)
      .with_max_steps(config.max_steps)
      .with_accumulate_grad_batches(config.grad_accum)
      .with_log_every_n_steps(config.log_every)
      .with_enable_checkpointing(false);
  if (std::shared_ptr<strategies::Strategy> strategy = make_train_strategy(config)) {
    options.with_strategy(std::move(strategy));
  } else {
    options.with_strategy(config.strategy);
  }
  if (config.max_epochs > 0) options.with_max_epochs(config.max_epochs);
  if (config.grad_clip > 0) options.with_gradient_clip_val(config.grad_clip);
  if (config.val_every != 0) {
    // Every --val-every optimizer steps of the run: Lightning's
    // check_val_every_n_epoch=None, which counts batches across epochs.
    options.with_val_check_interval(config.validation_interval() * config.grad_accum)
        .with_check_val_every_n_epoch(kValidateAcrossEpochs)
        .with_limit_val_batches(config.val_batches);
  }
  const int64_t seq_len = config.seq_len > 0 ? config.seq_len : models::GPTConfig::preset(config.model_size).block_size;
  options.with_callback(std::make_shared<MetricsFile>(config.metrics_file, config.batch_size * seq_len,
                                                      config.batch_size))
      .with_callback(std::make_shared<FinalSave>(config.ckpt_dir, config.ckpt_every))
      .with_callback(std::make_shared<Sample>(config.sample_tokens, config.seed, models::encode_bytes("The "),
                                              /*bytes=*/true));
  if (!config.ckpt_dir.empty() && config.ckpt_every > 0) {
    options.with_callback(std::make_shared<trainer::ModelCheckpoint>(trainer::ModelCheckpointOptions()
                                                                         .with_dirpath(config.ckpt_dir)
                                                                         .with_filename("step-{step:08d}")
                                                                         .with_auto_insert_metric_name(false)
                                                                         .with_file_extension("")
                                                                         .with_save_top_k(-1)
                                                                         .with_every_n_train_steps(config.ckpt_every)));
  }
  if (config.save_top_k > 0) {
    options.with_callback(std::make_shared<trainer::ModelCheckpoint>(
        trainer::ModelCheckpointOptions()
            .with_dirpath((std::filesystem::path(config.ckpt_dir) / "best").string())
            .with_filename("step-{step:08d}-val_loss-{val_loss:.4f}")
            .with_auto_insert_metric_name(false)
            .with_file_extension("")
            .with_monitor("val_loss")
            .with_save_top_k(config.save_top_k)));
  }
  if (config.early_stopping > 0) {
    options.with_callback(std::make_shared<trainer::EarlyStopping>(
        trainer::EarlyStoppingOptions().with_monitor("val_loss").with_patience(config.early_stopping)));
  }
  // Only global rank 0 writes logs; the logger picks its version folder
  // when built, so other ranks build none.
  // Several loggers share one version folder, as Lightning's loggers of a run do.
  if (!config.logger.empty() && rank_zero) {
    const std::string root = config.log_dir.empty() ? "runs" : config.log_dir;
    const std::string dir = trainer::versioned_log_dir(root, "train", std::nullopt);
    const int64_t version = std::stoll(std::filesystem::path(dir).filename().string().substr(8));
    for (const std::string& kind : logger_kinds(config.logger)) {
      if (kind == "mlflow") {
        // The MLflow run is named after the version folder the file
        // loggers of the same run write ("train/version_3").
        options.with_logger(std::make_shared<trainer::MLFlowLogger>(
            trainer::MLFlowOptions()
                .with_tracking_uri(config.mlflow_uri)
                .with_experiment_name(config.mlflow_experiment)
                .with_run_name("train/version_" + std::to_string(version))));
        continue;
      }
      options.with_logger(trainer::make_logger(kind, root, "train", version));
    }
  }
  // With loggers, the learning rate is logged each logging step ("lr-AdamW"),
  // as a Lightning run with LearningRateMonitor() does. Every rank gets the
  // callback (only global rank 0 logs), so their callback lists match.
  if (!config.logger.empty()) options.with_callback(std::make_shared<trainer::LearningRateMonitor>("step"));
  return options;
}

}  // namespace strata::cli
