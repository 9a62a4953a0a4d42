// The job behind `strata train`: a Trainer user. Fabric launches the
// workers; in each, a Trainer fits the GPT TrainModule (cli/gpt_job.h) on
// the training windows, validating on the held-out ones.
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

#include <unistd.h>

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
#include "strata/checkpoint/state.h"
#include "strata/core/error.h"
#include "strata/core/module_hooks.h"
#include "strata/core/strings.h"
#include "strata/data/loader.h"
#include "strata/data/text_dataset.h"
#include "strata/fabric/fabric.h"
#include "strata/models/gpt.h"
#include "strata/runtime/progress.h"
#include "strata/strategies/make_strategy.h"
#include "strata/trainer/callbacks.h"
#include "strata/trainer/csv_logger.h"
#include "strata/trainer/trainer.h"

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;


// Note [Which modules can be FSDP units]
// --wrap-policy names module types as module.name() reports them. FSDP
// gathers a unit's parameters around the unit's forward, which it sees
// where the forward runs through strata::hooked_forward (in the GPT: the
// model and its blocks, GPTImpl::unit_types()) or where the caller opts in
// with strata::call; the GPT calls its attention, MLP and LibTorch's
// layers as typed members. A unit of another type would fail at its first
// forward, inside the workers, so the CLI refuses it before launching.
struct GPTModuleTypes {
  std::set<std::string> all;    // every module type of the model
  std::set<std::string> units;  // those FSDP can make units
};

GPTModuleTypes gpt_module_types(const std::string& model_size) {
  models::GPTConfig config = models::GPTConfig::preset(model_size);
  config.with_n_layer(1).with_n_head(1).with_n_embd(8).with_block_size(2);  // the same module types, small
  models::GPT model(config);
  GPTModuleTypes types;
  for (const auto& m : model->modules(/*include_self=*/true)) types.all.insert(m->name());
  for (const std::string& type : models::GPTImpl::unit_types()) types.units.insert(type);
  return types;
}

// The strategy object for --strategy fsdp (and ddp --debug); null: let
// Fabric make the named strategy with its defaults.
std::shared_ptr<strategies::Strategy> make_train_strategy(const TrainConfig& config) {
  if (config.strategy != "fsdp" && !(config.strategy == "ddp" && config.debug)) return nullptr;
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

// The strategy and its settings, for the line that starts the run.
std::string describe_strategy(const TrainConfig& config, const std::string& name) {
  if (name != "fsdp") return name;
  std::set<std::string> units = config.wrap_types();
  std::string out = "fsdp (units: " + (units.empty() ? std::string("the whole model") : join(units));
  if (config.activation_checkpointing) out += ", activation checkpointing";
  out += ", " + config.checkpoint_layout() + " checkpoints";
  if (config.sequential_save) out += " saved sequentially";
  return out + ")";
}

nlohmann::json train_worker(Fabric& fabric, const TrainConfig& config,
                            std::shared_ptr<strategies::Strategy> fabric_strategy_) {
  const int world = fabric.world_size();
  STRATA_CHECK(config.batch_size % (world * config.grad_accum) == 0, ConfigError, "[train] --batch-size ",
               config.batch_size, " must be divisible by world size (", world, ") x --grad-accum (",
               config.grad_accum, ") so every rank takes equal micro-batches");

  models::GPTConfig model_config = models::GPTConfig::preset(config.model_size);
  if (config.seq_len > 0) model_config.block_size = config.seq_len;
  const int64_t seq_len = model_config.block_size;
  auto windows = std::make_shared<data::TokenWindows>(
      config.data.empty() ? std::string(data::kDefaultDataPath) : config.data, seq_len);
  // Note [Validation split]: the last --val-fraction of the windows (in
  // text order) are held out; the rest is the training set.
  const size_t total = windows->size();
  const int64_t micro_global = config.batch_size / config.grad_accum;  // examples per micro-batch, all ranks
  size_t n_val = config.val_every != 0 ? static_cast<size_t>(std::floor(config.val_fraction * total)) : 0;
  int64_t val_every = config.val_every;
  if (val_every == -1) {
    // Default: validate every 50 steps when the held-out part fills a batch.
    val_every = 50;
    if (n_val < static_cast<size_t>(micro_global)) n_val = 0;
  }
  auto train_set = std::make_shared<WindowRange>(windows, 0, total - n_val);
  STRATA_CHECK(train_set->size() / static_cast<size_t>(micro_global) >= static_cast<size_t>(config.grad_accum),
               ConfigError, "[train] the data holds ", train_set->size(), " training windows of ", seq_len,
               " tokens: too few for one step of --batch-size ", config.batch_size,
               "; use more data or a smaller batch");
  STRATA_CHECK(config.val_every <= 0 || n_val >= static_cast<size_t>(micro_global), ConfigError,
               "[train] --val-fraction ",
               config.val_fraction, " holds out ", n_val, " windows, fewer than one batch (", micro_global,
               "); raise it or lower --batch-size");

  // Identical initialisation on every rank (and DDP broadcasts from rank 0).
  Fabric::seed_everything(config.seed);
  auto job = std::make_shared<GPTJob>(model_config, config.model_size, config.lr, config.weight_decay);
  const int64_t num_parameters = job->gpt->num_parameters();  // before FSDP leaves each rank a shard

  std::string resume_path;
  if (config.resume == "latest" || config.resume == "last") {
    resume_path = latest_checkpoint(config.ckpt_dir);
    if (resume_path.empty()) fabric.print("--resume ", config.resume, ": no complete checkpoint in --ckpt-dir '",
                                          config.ckpt_dir, "'; starting from scratch");
  } else {
    resume_path = config.resume;
  }

  TrainerOptions options;
  options.with_strategy(std::move(fabric_strategy_))
      .with_accelerator(config.accelerator)
      .with_precision(config.precision)
      .with_max_steps(config.max_steps)
      .with_accumulate_grad_batches(config.grad_accum)
      .with_log_every_n_steps(config.log_every)
      .with_enable_checkpointing(false);
  if (config.max_epochs > 0) options.with_max_epochs(config.max_epochs);
  if (config.grad_clip > 0) options.with_gradient_clip_val(config.grad_clip);
  if (n_val > 0) {
    options.with_val_check_interval(val_every)
        .with_check_val_every_n_epoch(0)
        .with_limit_val_batches(config.val_batches);
  }
  auto metrics = std::make_shared<MetricsFile>(fabric.is_global_zero() ? config.metrics_file : std::string(),
                                               config.batch_size * seq_len);
  options.with_callback(metrics).with_callback(
      std::make_shared<FinalSave>(config.ckpt_dir, config.ckpt_every, resume_path));
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
  if (!config.logger.empty() && fabric.is_global_zero()) {
    options.with_logger(trainer::make_logger(config.logger, config.log_dir.empty() ? "runs" : config.log_dir, "train"));
  }
  Trainer trainer(options);
  fabric.print("training a ", config.model_size, " GPT (", num_parameters, " parameters) on ",
               windows->num_tokens(), " tokens with ", describe_strategy(config, fabric.strategy().name()), " on ",
               world, " worker(s), ", config.precision, ", global batch ", config.batch_size, " x ", seq_len,
               " tokens", n_val > 0 ? detail::cat(", ", n_val, " windows held out for validation") : std::string());
  trainer.fit(job, DataSource(train_set, DataOptions().with_batch_size(micro_global).with_shuffle(true)
                                             .with_seed(config.seed).with_drop_last(true)),
              n_val > 0 ? std::optional<DataSource>(DataSource(std::make_shared<WindowRange>(windows, total - n_val, total),
                                                               DataOptions().with_batch_size(micro_global)))
                        : std::nullopt,
              resume_path);

  // Note [Sampling under FSDP]
  // A sharded model's forward gathers each unit's parameters from every
  // rank, so under FSDP every rank samples, with the same seed (the same
  // tokens, hence the same forwards and collectives), and rank 0 prints.
  // Replicated strategies sample on rank 0 alone.
  const bool sharded = fabric.strategy().shards_parameters();
  if (config.sample_tokens > 0 && (sharded || fabric.is_global_zero())) {
    torch::NoGradGuard no_grad;
    job->eval();
    at::Generator generator = at::detail::createCPUGenerator(config.seed);
    at::Tensor prompt = models::encode_bytes("The ").to(fabric.device());
    at::Tensor out;
    // Through the TrainModule's forward hooks, as the Trainer runs its
    // steps: under FSDP the module is the root unit, gathered around it.
    hooked_forward(*job, prompt, [&](const at::Tensor& p) {
      out = job->gpt->generate(p, config.sample_tokens, 0.8, 40, generator);
      return out;
    });
    if (fabric.is_global_zero()) std::cout << "sample: " << models::decode_bytes(out.cpu()) << std::endl;
  }
  const double loss = metrics->last_loss();
  nlohmann::json result{{"steps", trainer.global_step()}, {"loss", loss}};
  auto val = trainer.callback_metrics().find("val_loss");
  if (val != trainer.callback_metrics().end()) result["val_loss"] = val->second;
  return result;
}

}  // namespace

void TrainConfig::validate() const {
  STRATA_CHECK(devices >= 1, ConfigError, "[train] --devices must be >= 1 (or -1: every visible GPU, one worker on the CPU), got ",
               devices);
  STRATA_CHECK(num_nodes >= 1, ConfigError, "[train] --num-nodes must be >= 1, got ", num_nodes);
  STRATA_CHECK(max_steps >= 1, ConfigError, "[train] --max-steps must be >= 1, got ", max_steps);
  STRATA_CHECK(batch_size >= 1, ConfigError, "[train] --batch-size must be >= 1, got ", batch_size);
  STRATA_CHECK(grad_accum >= 1, ConfigError, "[train] --grad-accum must be >= 1, got ", grad_accum);
  STRATA_CHECK(lr > 0 && lr <= 10, ConfigError, "[train] --lr must be a number in (0, 10], got ", lr);
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
  STRATA_CHECK(logger.empty() || logger == "csv" || logger == "jsonl" || logger == "tensorboard", ConfigError, "[train] --logger '", logger,
               "' is not one of csv, jsonl, tensorboard");
  int world = devices * num_nodes;
  STRATA_CHECK(batch_size % (world * grad_accum) == 0, ConfigError, "[train] --batch-size ", batch_size,
               " must be divisible by devices x num-nodes (", world, ") x --grad-accum (", grad_accum, ")");
  models::GPTConfig::preset(model_size);  // throws for an unknown size

  const bool fsdp = strategy == "fsdp";
  auto fsdp_only = [&](bool given, const char* flag) {
    STRATA_CHECK(!given || fsdp, ConfigError, "[train] ", flag, " applies only to --strategy fsdp, but --strategy is '",
                 strategy, "'; drop ", flag, " or train with --strategy fsdp");
  };
  fsdp_only(!wrap_policy.empty(), "--wrap-policy");
  fsdp_only(activation_checkpointing, "--activation-checkpointing");
  fsdp_only(sequential_save, "--sequential-save");
  STRATA_CHECK(state_dict_type.empty() || state_dict_type == "full" || state_dict_type == "sharded", ConfigError,
               "[train] --state-dict-type must be 'full' or 'sharded', got '", state_dict_type, "'");
  STRATA_CHECK(fsdp || state_dict_type != "sharded", ConfigError,
               "[train] --state-dict-type sharded needs --strategy fsdp: with --strategy '", strategy,
               "' every rank holds the whole model and rank 0 writes one full checkpoint; drop the flag or pass "
               "--state-dict-type full");
  if (fsdp) wrap_types();  // throws for a type that cannot be a unit
}

std::set<std::string> TrainConfig::wrap_types() const {
  if (wrap_policy.empty()) return {models::BlockImpl::kTypeName};
  if (wrap_policy == "none") return {};
  GPTModuleTypes types = gpt_module_types(model_size);
  std::set<std::string> out;
  std::stringstream list(wrap_policy);
  for (std::string name; std::getline(list, name, ',');) {
    size_t begin = name.find_first_not_of(' '), end = name.find_last_not_of(' ');
    name = begin == std::string::npos ? "" : name.substr(begin, end - begin + 1);
    STRATA_CHECK(!name.empty(), ConfigError, "[train] --wrap-policy '", wrap_policy,
                 "' has an empty entry; give comma-separated module types, e.g. Block");
    STRATA_CHECK(types.all.count(name) > 0, ConfigError, "[train] --wrap-policy: '", name,
                 "' is not a module type of the GPT; its types are: ", join(types.all),
                 " (or pass 'none' for a single unit)");
    STRATA_CHECK(types.units.count(name) > 0, ConfigError, "[train] --wrap-policy: '", name,
                 "' modules cannot be FSDP units: the GPT calls their forward as a typed member, not through "
                 "strata::hooked_forward, so their parameters would never be gathered. Types that can: ",
                 join(types.units), " (or 'none')");
    out.insert(name);
  }
  return out;
}

std::string TrainConfig::checkpoint_layout() const {
  if (!state_dict_type.empty()) return state_dict_type;
  return strategy == "fsdp" ? "sharded" : "full";
}

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

int run_train(const TrainConfig& requested) {
  // --devices -1: one worker per visible GPU; more GPUs than there are is
  // refused before any worker starts (Note [Device placement]).
  TrainConfig config = requested;
  STRATA_CHECK(config.devices == -1 || config.devices >= 1, ConfigError,
               "[train] --devices must be >= 1 (or -1: every visible GPU, one worker on the CPU), got ", config.devices);
  config.devices = strategies::resolve_devices(*strategies::make_accelerator(config.accelerator), config.devices);
  config.validate();
  check_paths(config);
  // One job per --ckpt-dir (Note [One job per checkpoint folder]): held until
  // run_train returns by the process that launches the workers, or by rank 0
  // when the launcher is not strata train (strata launch, srun).
  checkpoint::FolderLock ckpt_lock;
  if (!config.ckpt_dir.empty()) {
    const runtime::Environment env = runtime::Environment::from_env();
    if (!env.launched())
      ckpt_lock = checkpoint::FolderLock::acquire(config.ckpt_dir, "--ckpt-dir");
    else if (env.rank == 0)
      ckpt_lock = checkpoint::FolderLock::acquire_in_worker(config.ckpt_dir, "--ckpt-dir");
  }
  FabricOptions options;
  options.with_accelerator(config.accelerator)
      .with_devices(config.devices)
      .with_num_nodes(config.num_nodes)
      .with_precision(config.precision);
  // One strategy object for Fabric (which launches the workers) and the
  // Trainer inside them (which finds it launched and runs in place).
  std::shared_ptr<strategies::Strategy> strategy = make_train_strategy(config);
  if (!strategy) {
    auto accelerator = strategies::make_accelerator(config.accelerator);
    runtime::Environment env = runtime::Environment::from_env();
    strategy = strategies::make_strategy(config.strategy, accelerator,
                                         strategies::Precision::parse(config.precision, accelerator->name()),
                                         env.launched() ? env.world_size : config.devices * config.num_nodes);
  }
  options.with_strategy(strategy);
  Fabric fabric(options);
  nlohmann::json result;
  try {
    result = fabric.launch([&](Fabric& f) { return train_worker(f, config, strategy); });
  } catch (const LaunchError& e) {
    // The workers ran and ended badly: exit as `strata launch` does, with
    // the launcher's status (the rank's code, 128+N for a signal, 124, 130
    // or 143 when interrupted; Note [Launch outcomes]) and its report.
    if (!e.outcome()) throw;
    std::cerr << (e.outcome()->interrupted() ? "strata: " : "strata: error: ") << e.what() << std::endl;
    return e.outcome()->exit_code;
  }
  if (!runtime::Environment::from_env().launched()) {
    // No loss when a run resumed at its last step (NaN travels as null).
    nlohmann::json loss = result.value("loss", nlohmann::json());
    std::cout << "done: " << result.value("steps", 0) << " steps, final loss ";
    if (loss.is_number() && std::isfinite(loss.get<double>())) {
      std::cout << loss.get<double>();
    } else {
      std::cout << "none (no step ran)";
    }
    nlohmann::json val = result.value("val_loss", nlohmann::json());
    if (val.is_number()) std::cout << ", validation loss " << val.get<double>();
    std::cout << std::endl;
  }
  return 0;
}

}  // namespace strata::cli
