// The training loop behind `strata train`.
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

namespace strata::cli {
namespace {

using Clock = std::chrono::steady_clock;

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

// Note [Which modules can be FSDP units]
// --wrap-policy names module types as module.name() reports them. FSDP
// gathers a unit's parameters in hooks around the unit's forward, and a
// LibTorch C++ module has such hooks only where its forward runs through
// strata::hooked_forward: in the GPT, the model and its blocks, not the
// attention, the MLP or LibTorch's layers. A unit of another type would
// fail at its first forward with a shape error, so the valid types are
// found by running a forward of a one-layer copy of the model with hooks
// that record which modules ran them, and the others are refused up front.
class RecordingHooks : public ForwardHooks {
 public:
  explicit RecordingHooks(std::set<std::string>& ran) : ran_(ran) {}
  TensorList run(torch::nn::Module& module, const TensorList& inputs, const ForwardFn& body) override {
    ran_.insert(module.name());
    return body(inputs);
  }

 private:
  std::set<std::string>& ran_;
};

struct GPTModuleTypes {
  std::set<std::string> all;    // every module type of the model
  std::set<std::string> units;  // those whose forward runs through hooked_forward
};

GPTModuleTypes gpt_module_types(const std::string& model_size) {
  models::GPTConfig config = models::GPTConfig::preset(model_size);
  config.n_layer(1).n_head(1).n_embd(8).block_size(2);  // the same module types, small
  models::GPT model(config);
  GPTModuleTypes types;
  std::vector<std::shared_ptr<torch::nn::Module>> modules = model->modules(/*include_self=*/true);
  auto hooks = std::make_shared<RecordingHooks>(types.units);
  struct Unhook {
    const std::vector<std::shared_ptr<torch::nn::Module>>& modules;
    ~Unhook() {
      for (const auto& m : modules) set_forward_hooks(*m, nullptr);
    }
  } unhook{modules};
  for (const auto& m : modules) {
    types.all.insert(m->name());
    set_forward_hooks(*m, hooks);
  }
  torch::NoGradGuard no_grad;
  model->forward(at::zeros({1, 1}, at::kLong));
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

std::string format_duration(double seconds) {
  int64_t s = static_cast<int64_t>(std::max(0.0, seconds));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  return buf;
}

// Progress on rank 0: a live line on a terminal, plain lines otherwise.
// Steps count from the start of the run (a resumed run shows "step 11/20"),
// the ETA from the steps this process trained.
class Progress {
 public:
  Progress(int64_t first, int64_t total, int64_t log_every)
      : first_(first), total_(total), log_every_(log_every), tty_(::isatty(1) != 0) {}

  void update(int64_t step, double loss, double tokens_per_s, double elapsed) {
    int64_t done = step - first_;
    double eta = done > 0 ? elapsed / done * (total_ - step) : 0.0;
    char line[160];
    std::snprintf(line, sizeof(line), "step %lld/%lld | loss %.4f | %.1fk tok/s | elapsed %s | eta %s",
                  static_cast<long long>(step), static_cast<long long>(total_), loss, tokens_per_s / 1000.0,
                  format_duration(elapsed).c_str(), format_duration(eta).c_str());
    if (tty_) {
      std::cout << "\r" << line << "\033[K" << std::flush;
      if (step == total_) std::cout << "\n";
    } else if (step % log_every_ == 0 || step == total_ || step == first_ + 1) {
      std::cout << line << std::endl;
    }
  }

 private:
  int64_t first_;
  int64_t total_;
  int64_t log_every_;
  bool tty_;
};

nlohmann::json train_worker(Fabric& fabric, const TrainConfig& config) {
  const int world = fabric.world_size();
  STRATA_CHECK(config.batch_size % (world * config.grad_accum) == 0, ConfigError, "[train] --batch-size ",
               config.batch_size, " must be divisible by world size (", world, ") x --grad-accum (",
               config.grad_accum, ") so every rank takes equal micro-batches");
  const int64_t micro_batch = config.batch_size / (world * config.grad_accum);

  models::GPTConfig model_config = models::GPTConfig::preset(config.model_size);
  if (config.seq_len > 0) model_config.block_size(config.seq_len);
  const int64_t seq_len = model_config.block_size();
  auto dataset = std::make_shared<data::TokenWindows>(
      config.data.empty() ? std::string(data::kDefaultDataPath) : config.data, seq_len);

  // Identical initialisation on every rank (and DDP broadcasts from rank 0).
  Fabric::seed_everything(config.seed);
  models::GPT model(model_config);
  const int64_t num_parameters = model->num_parameters();  // FSDP leaves each rank a shard of them
  fabric.setup_module(model);
  torch::optim::AdamW optimizer(model->parameters(),
                                torch::optim::AdamWOptions(config.lr).weight_decay(config.weight_decay));
  fabric.setup_optimizer(optimizer);

  data::DistributedSampler sampler(dataset->size(), world, fabric.global_rank(), /*shuffle=*/true, config.seed);
  auto loader = std::make_shared<data::DataLoader>(dataset, sampler, micro_batch, /*drop_last=*/true);
  STRATA_CHECK(loader->size() >= static_cast<size_t>(config.grad_accum), ConfigError, "[train] the data holds ",
               dataset->size(), " windows of ", seq_len, " tokens: too few for one step of --batch-size ",
               config.batch_size, "; use more data or a smaller batch");

  int64_t step = 0;
  strategies::State state{{"model", model},
                          {"optimizer", optimizer},
                          {"step", 0},
                          {"loader", nlohmann::json(data::LoaderState{})},
                          {"model_size", config.model_size},
                          {"model_config", model_config.to_json()},
                          {"rng", checkpoint::cpu_rng_state()}};
  if (!config.resume.empty()) {
    std::string path = config.resume == "latest" ? latest_checkpoint(config.ckpt_dir) : config.resume;
    STRATA_CHECK(!path.empty(), ConfigError, "[train] --resume latest: no complete checkpoint in --ckpt-dir '",
                 config.ckpt_dir, "'");
    fabric.load(path, state);
    STRATA_CHECK(state.at("model_size").get<std::string>() == config.model_size, ConfigError, "[train] ", path,
                 " holds a '", state.at("model_size").get<std::string>(), "' model but --model-size is '",
                 config.model_size, "'");
    STRATA_CHECK(state.at("model_config").value() == model_config.to_json(), ConfigError, "[train] ", path,
                 " holds a model configured as ", state.at("model_config").value().dump(), " but this run builds ",
                 model_config.to_json().dump(), " (another --seq-len?)");
    step = state.at("step").get<int64_t>();
    loader->load_state(state.at("loader").value().get<data::LoaderState>());
    checkpoint::set_cpu_rng_state(state.at("rng").tensor());
    fabric.print("resumed from ", path, " at step ", step);
  }
  std::shared_ptr<data::Loader> batches = fabric.setup_dataloader(loader);
  uint64_t epoch = loader->state().epoch;
  batches->set_epoch(epoch);

  auto next_batch = [&]() -> data::Batch {
    std::optional<data::Batch> batch = batches->next();
    if (!batch) {  // end of epoch: reshuffle and go on
      batches->set_epoch(++epoch);
      batches->reset();
      batch = batches->next();
    }
    STRATA_ASSERT(batch.has_value(), "the loader yielded no batch after a new epoch");
    return *batch;
  };

  auto save = [&](int64_t at_step) {
    state.at("step") = strategies::StateValue(nlohmann::json(at_step));
    state.at("loader") = strategies::StateValue(nlohmann::json(batches->state()));
    state.at("rng") = strategies::StateValue(checkpoint::cpu_rng_state());
    std::string path = (std::filesystem::path(config.ckpt_dir) / step_name(at_step)).string();
    fabric.save(path, state);
    fabric.print("saved checkpoint ", path);
  };

  std::ofstream metrics;
  if (fabric.is_global_zero() && !config.metrics_file.empty()) {
    std::filesystem::path parent = std::filesystem::path(config.metrics_file).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    metrics.open(config.metrics_file, std::ios::app);
    STRATA_CHECK(metrics.good(), ConfigError, "[train] cannot open --metrics-file ", config.metrics_file,
                 " for appending: ", ec ? ec.message() : std::string("check the path and its permissions"));
  }
  fabric.print("training a ", config.model_size, " GPT (", num_parameters, " parameters) on ",
               dataset->num_tokens(), " tokens with ", describe_strategy(config, fabric.strategy().name()), " on ",
               world, " worker(s), ",
               config.precision, ", global batch ", config.batch_size, " x ", seq_len, " tokens");

  Progress progress(step, config.max_steps, config.log_every);
  const auto start = Clock::now();
  auto last = start;
  double loss_value = std::nan("");
  while (step < config.max_steps) {
    runtime::report_step(step + 1);  // for the launcher's stuck-rank report
    at::Tensor step_loss = at::zeros({}, at::kFloat);
    for (int64_t micro = 0; micro < config.grad_accum; ++micro) {
      data::Batch batch = next_batch();
      bool sync = micro == config.grad_accum - 1;
      strategies::Scope no_sync = fabric.no_backward_sync(*model, !sync);
      at::Tensor loss;
      {
        auto autocast = fabric.autocast();
        loss = model->loss(batch.input, batch.target);
      }
      loss = loss.to(at::kFloat) / static_cast<double>(config.grad_accum);
      fabric.backward(loss);
      step_loss += loss.detach();
    }
    if (config.grad_clip > 0) fabric.clip_gradients(*model, optimizer, config.grad_clip);
    fabric.strategy().optimizer_step(optimizer);
    optimizer.zero_grad();
    ++step;
    loss_value = fabric.all_reduce(step_loss).item<double>();

    auto now = Clock::now();
    double step_s = std::chrono::duration<double>(now - last).count();
    last = now;
    double tokens_per_s = static_cast<double>(config.batch_size * seq_len) / std::max(step_s, 1e-9);
    double elapsed = std::chrono::duration<double>(now - start).count();
    if (fabric.is_global_zero()) {
      progress.update(step, loss_value, tokens_per_s, elapsed);
      if (metrics.is_open()) {
        metrics << nlohmann::json{{"step", step},     {"loss", loss_value},          {"lr", config.lr},
                                  {"epoch", epoch},   {"tokens_per_s", tokens_per_s}, {"elapsed_s", elapsed}}
                       .dump()
                << "\n";
        metrics.flush();
        STRATA_CHECK(metrics.good(), Error, "[train] writing --metrics-file ", config.metrics_file, " failed at step ",
                     step, " (is the disk full?)");
      }
    }
    if (!config.ckpt_dir.empty() && config.ckpt_every > 0 && step % config.ckpt_every == 0) save(step);
  }
  if (!config.ckpt_dir.empty() && (config.ckpt_every == 0 || step % config.ckpt_every != 0)) save(step);

  // Note [Sampling under FSDP]
  // A sharded model's forward gathers each unit's parameters from every
  // rank, so under FSDP every rank samples, with the same seed (the same
  // tokens, hence the same forwards and collectives), and rank 0 prints.
  // Replicated strategies sample on rank 0 alone.
  const bool sharded = fabric.strategy().shards_parameters();
  if (config.sample_tokens > 0 && (sharded || fabric.is_global_zero())) {
    torch::NoGradGuard no_grad;
    model->eval();
    at::Generator generator = at::detail::createCPUGenerator(config.seed);
    at::Tensor prompt = models::encode_bytes("The ").to(fabric.device());
    at::Tensor out = model->generate(prompt, config.sample_tokens, 0.8, 40, generator);
    if (fabric.is_global_zero()) std::cout << "sample: " << models::decode_bytes(out.cpu()) << std::endl;
  }
  return {{"steps", step}, {"loss", loss_value}};
}

}  // namespace

void TrainConfig::validate() const {
  STRATA_CHECK(devices >= 1, ConfigError, "[train] --devices must be >= 1, got ", devices);
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
  STRATA_CHECK(resume != "latest" || !ckpt_dir.empty(), ConfigError,
               "[train] --resume latest needs --ckpt-dir to look in");
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
                 "' modules cannot be FSDP units: their forward does not run through strata::hooked_forward, so "
                 "their parameters would never be gathered. Types that can: ",
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

int run_train(const TrainConfig& config) {
  config.validate();
  check_paths(config);
  FabricOptions options;
  options.with_accelerator(config.accelerator)
      .with_devices(config.devices)
      .with_num_nodes(config.num_nodes)
      .with_precision(config.precision);
  if (std::shared_ptr<strategies::Strategy> strategy = make_train_strategy(config)) {
    options.with_strategy(strategy);
  } else {
    options.with_strategy(config.strategy);
  }
  Fabric fabric(options);
  nlohmann::json result;
  try {
    result = fabric.launch([&](Fabric& f) { return train_worker(f, config); });
  } catch (const LaunchError& e) {
    // Interrupted: exit as `strata launch` does (130 for SIGINT, 143 for
    // SIGTERM), with the launcher's report.
    const std::string what = e.what();
    for (auto [name, code] : {std::pair<const char*, int>{"SIGINT", 130}, {"SIGTERM", 143}}) {
      if (what.find(std::string("the launcher received ") + name) != std::string::npos) {
        std::cerr << "strata: " << what << std::endl;
        return code;
      }
    }
    throw;
  }
  if (!runtime::Environment::from_env().launched()) {
    // No loss when a run resumed at its last step (NaN travels as null).
    nlohmann::json loss = result.value("loss", nlohmann::json());
    std::cout << "done: " << result.value("steps", 0) << " steps, final loss ";
    if (loss.is_number() && std::isfinite(loss.get<double>())) {
      std::cout << loss.get<double>() << std::endl;
    } else {
      std::cout << "none (no step ran)" << std::endl;
    }
  }
  return 0;
}

}  // namespace strata::cli
