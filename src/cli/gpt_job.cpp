// The GPT TrainModule and the callbacks of `strata train` (cli/gpt_job.h).
#include "cli/gpt_job.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adamw.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <limits>
#include <optional>
#include <utility>

#include "strata/core/error.h"
#include "strata/core/module_hooks.h"
#include "strata/optim/fused.h"
#include "strata/trainer/trainer.h"

namespace strata::cli {

std::string step_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "step-%08lld", static_cast<long long>(step));
  return buf;
}

std::string LRSchedule::scheduler_name() const {
  if (!active()) return "";
  if (kind == "cosine") return "WarmupCosineLR";
  if (kind == "linear") return "WarmupLinearLR";
  return "WarmupConstantLR";
}

GPTJob::GPTJob(const models::GPTConfig& config, std::string model_size, double lr, double weight_decay,
               std::string optimizer, LRSchedule schedule)
    : model_size_(std::move(model_size)),
      lr_(lr),
      weight_decay_(weight_decay),
      optimizer_(std::move(optimizer)),
      schedule_(std::move(schedule)) {
  gpt = register_module("model", models::GPT(config));
}

at::Tensor GPTJob::training_step(const data::Batch& batch, int64_t) {
  return gpt->loss(batch.input, batch.target).to(at::kFloat);
}

// Note [One train_loss]
// The loss of a step is logged once, after the step: its micro-batches'
// mean on each rank weighted by the rank's share of the global batch
// (Trainer::last_loss_weighted), averaged over the ranks, so it is the
// loss of the global batch. Every record of strata train reads this one
// value: the loggers' rows, the progress bar, --metrics-file and the
// final line.
void GPTJob::on_train_batch_end(const at::Tensor&, const data::Batch&, int64_t) {
  if (global_step() == last_logged_step_) return;  // inside an accumulation
  last_logged_step_ = global_step();
  log("train_loss", at::scalar_tensor(trainer()->last_loss_weighted(), at::kDouble),
      LogOptions().with_sync_dist(true).with_batch_size(1).with_prog_bar(true));
}

at::Tensor GPTJob::validation_step(const data::Batch& batch, int64_t) {
  log("val_loss", gpt->loss(batch.input, batch.target).to(at::kFloat),
      LogOptions().with_sync_dist(true).with_prog_bar(true));
  return {};
}

// The schedule's scheduler is stepped after every optimizer step
// (interval "step"), so its counter is the global step: the rate of step
// s + 1 is lr_at(s), and the Trainer's checkpoint keeps the counter.
OptimizerConfig GPTJob::configure_optimizers() {
  const auto options = torch::optim::AdamWOptions(lr_).weight_decay(weight_decay_);
  std::shared_ptr<torch::optim::Optimizer> optimizer;
  if (optimizer_ == "adamw") optimizer = std::make_shared<torch::optim::AdamW>(parameters(), options);
  else optimizer = std::make_shared<optim::AdamW>(parameters(), options);
  OptimizerConfig config(optimizer);
  if (!schedule_.active()) return config;
  using Decay = trainer::WarmupDecayLR::Decay;
  const Decay decay = schedule_.kind == "cosine"   ? Decay::kCosine
                      : schedule_.kind == "linear" ? Decay::kLinear
                                                   : Decay::kConstant;
  auto scheduler = std::make_shared<trainer::WarmupDecayLR>(*optimizer, decay, schedule_.warmup_steps,
                                                            schedule_.decay_steps, schedule_.min_lr);
  return config.with_scheduler(trainer::SchedulerConfig(std::move(scheduler)).with_interval("step"));
}

// The whole configuration travels with the checkpoint, so a reader (strata
// ckpt export) rebuilds the model from the checkpoint alone.
void GPTJob::on_save_checkpoint(nlohmann::json& extra) {
  extra["model_size"] = model_size_;
  extra["model_config"] = gpt->config().to_json();
}

void GPTJob::on_load_checkpoint(const nlohmann::json& extra) {
  const std::string saved =
      extra.is_object() && extra.contains("model_size") && extra["model_size"].is_string()
          ? extra["model_size"].get<std::string>()
          : std::string();
  STRATA_CHECK(saved == model_size_, ConfigError, "[train] the checkpoint holds a '", saved,
               "' model but --model-size is '", model_size_, "'");
  if (extra.contains("model_config")) {
    const nlohmann::json mine = gpt->config().to_json();
    STRATA_CHECK(extra["model_config"] == mine, ConfigError, "[train] the checkpoint holds a model configured as ",
                 extra["model_config"].dump().substr(0, 300), " but this run builds ", mine.dump(),
                 " (another --seq-len or --vocab-size?)");
  }
}

WindowRange::WindowRange(std::shared_ptr<const data::Dataset> all, size_t begin, size_t end)
    : all_(std::move(all)), begin_(begin), end_(end) {
  STRATA_ASSERT(all_ && begin_ <= end_ && end_ <= all_->size(), "window range out of the dataset");
}

data::Example WindowRange::get(size_t index) const {
  STRATA_CHECK(index < size(), ConfigError, "[data] window ", index, " is out of range (", size(), " windows)");
  return all_->get(begin_ + index);
}

double gpt_flops_per_token(const models::GPTConfig& config) {
  const double d = static_cast<double>(config.n_embd);
  const double layers = static_cast<double>(config.n_layer);
  const double matmul_weights = layers * 12.0 * d * d + static_cast<double>(config.vocab_size) * d;
  return 6.0 * matmul_weights + 12.0 * layers * static_cast<double>(config.block_size) * d;
}

double measure_matmul_gflops() {
  constexpr int64_t n = 512;
  // A private generator: the run's random state (saved in checkpoints) must
  // not depend on this measurement.
  at::Generator gen = at::detail::createCPUGenerator(12345);
  at::Tensor a = at::randn({n, n}, gen), b = at::randn({n, n}, gen), c = at::empty({n, n});
  for (int i = 0; i < 4; ++i) at::mm_out(c, a, b);  // the thread pool and the kernels warm up
  // The fastest of a few products: the rate the machine can reach. A
  // median on a busy machine measures its neighbours, and made MFU read
  // above 100%.
  double fastest = std::numeric_limits<double>::infinity();
  for (int i = 0; i < 12; ++i) {
    auto t = std::chrono::steady_clock::now();
    at::mm_out(c, a, b);
    fastest = std::min(fastest, std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count());
  }
  return 2.0 * n * n * n / std::max(fastest, 1e-9) / 1e9;
}

MetricsFile::MetricsFile(std::string path, int64_t tokens_per_step, int64_t samples_per_step)
    : path_(std::move(path)),
      tokens_per_step_(tokens_per_step),
      samples_per_step_(samples_per_step),
      last_loss_(std::numeric_limits<double>::quiet_NaN()) {}

// Note [MFU of strata train]
// Model FLOP utilisation: the model's training FLOP/s (gpt_flops_per_token
// times the tokens of the median step) over the machine's fp32 matmul
// rate, measured here at the start: every rank times a few 512^3 products
// on its own threads at the same time (as the ranks will compute during
// training) and the rates are summed over ranks. About 0.1 s, so measured
// afresh each run: a rate cached on a shared machine would be stale. CPU
// only; bf16-mixed runs are divided by the same fp32 rate.
void MetricsFile::on_train_start(Trainer& trainer, TrainModule& module) {
  if (auto* job = dynamic_cast<GPTJob*>(&module)) flops_per_token_ = gpt_flops_per_token(job->gpt->config());
  if (trainer.strategy().root_device().is_cpu()) {
    at::Tensor rate = at::full({1}, measure_matmul_gflops(), at::kDouble);
    machine_gflops_ = trainer.strategy().all_reduce(rate, comm::ReduceOp::kSum).item<double>();
  }
  step_s_.clear();
  start_ = last_ = std::chrono::steady_clock::now();
  last_step_ = trainer.global_step();
  if (trainer.is_global_zero() && !path_.empty()) {
    out_.open(path_, std::ios::app);
    STRATA_CHECK(out_.good(), ConfigError, "[train] cannot open --metrics-file ", path_, " for appending");
  }
}

void MetricsFile::on_train_batch_start(Trainer& trainer, TrainModule&, const data::Batch&, int64_t) {
  line_from_this_batch_ = false;
  // A step scheduler sets the next step's rate once a step ends: the rate
  // this step uses is the one its batches start with.
  if (!trainer.optimizers().empty()) step_lr_ = trainer.optimizers().front()->param_groups()[0].options().get_lr();
}

// Note [Throughput through the Trainer's logging]
// Each step's tokens/s, samples/s and MFU are logged with the module's
// log() from here (a callback's on_train_batch_end, whose values the
// Trainer files under the step that just ended, Note [Values logged in
// on_train_batch_end]), so the CSV, TensorBoard and JSON-lines loggers get
// them at the same steps and cadence as train_loss, and the metrics file
// writes the very values logged. Each rank times its own steps; rank 0's
// values are the ones the loggers write (no collective: the ranks step
// together, and a sync would cost a round trip per step). The first step
// includes the warm-up; the closing throughput line leaves it out.
void MetricsFile::on_train_batch_end(Trainer& trainer, TrainModule& module, const at::Tensor&, const data::Batch&,
                                     int64_t) {
  if (trainer.global_step() == last_step_) return;  // inside an accumulation
  last_step_ = trainer.global_step();
  // Note [One train_loss] in this file: the value the loggers get.
  auto logged = trainer.callback_metrics().find("train_loss");
  last_loss_ = logged != trainer.callback_metrics().end() ? logged->second : std::numeric_limits<double>::quiet_NaN();
  const auto now = std::chrono::steady_clock::now();
  const double step_s = std::max(std::chrono::duration<double>(now - last_).count(), 1e-9);
  const bool first = last_ == start_;
  last_ = now;
  if (!first) step_s_.push_back(step_s);  // the first step warms up
  const double tokens_per_s = static_cast<double>(tokens_per_step_) / step_s;
  const double samples_per_s = static_cast<double>(samples_per_step_) / step_s;
  const LogOptions per_step = LogOptions().with_on_step(true).with_on_epoch(false).with_batch_size(1);
  module.log("tokens_per_s", tokens_per_s, per_step);
  module.log("samples_per_s", samples_per_s, per_step);
  std::optional<double> mfu;
  if (flops_per_token_ > 0 && machine_gflops_ > 0) {
    mfu = flops_per_token_ * static_cast<double>(tokens_per_step_) / step_s / 1e9 / machine_gflops_;
    module.log("mfu", *mfu, per_step);
  }
  if (!out_.is_open()) return;
  write_pending();
  pending_ = nlohmann::json{{"step", trainer.global_step()},
                            {"loss", last_loss_},
                            {"lr", step_lr_},
                            {"epoch", trainer.current_epoch()},
                            {"tokens_per_s", tokens_per_s},
                            {"samples_per_s", samples_per_s},
                            {"elapsed_s", std::chrono::duration<double>(now - start_).count()}};
  if (mfu) pending_["mfu"] = *mfu;
  if (!next_val_.is_null()) pending_["val_loss"] = std::exchange(next_val_, nullptr);
  line_from_this_batch_ = true;
}

// Note [Validation in the metrics file]
// A validation's val_loss goes on the line of the step the loggers file it
// under, once: the line of the step that just ended when the validation
// followed a batch that stepped (the line waits for it), else, inside an
// accumulation window, the next step's line (the loggers' step index is
// the line's step - 1).
void MetricsFile::on_validation_end(Trainer& trainer, TrainModule&) {
  if (trainer.state_fn() != "fit" || trainer.sanity_checking() || !out_.is_open()) return;
  auto val = trainer.callback_metrics().find("val_loss");
  if (val == trainer.callback_metrics().end()) return;
  if (line_from_this_batch_ && !pending_.is_null()) {
    pending_["val_loss"] = val->second;
    write_pending();
  } else {
    next_val_ = val->second;
  }
}

void MetricsFile::write_pending() {
  if (pending_.is_null()) return;
  out_ << pending_.dump() << "\n";
  out_.flush();
  STRATA_CHECK(out_.good(), Error, "[train] writing --metrics-file ", path_, " failed at step ", pending_["step"].dump(),
               " (is the disk full?)");
  pending_ = nullptr;
}

void MetricsFile::on_train_end(Trainer& trainer, TrainModule&) {
  if (out_.is_open()) write_pending();
  if (!trainer.is_global_zero() || step_s_.empty()) return;
  std::vector<double> sorted = step_s_;
  std::sort(sorted.begin(), sorted.end());
  const double median_s = sorted[sorted.size() / 2];
  const double tokens_per_s = static_cast<double>(tokens_per_step_) / median_s;
  char buf[320];
  std::snprintf(buf, sizeof(buf), "throughput: %.0f tokens/s (median of %zu steps, %.3f s each)", tokens_per_s,
                sorted.size(), median_s);
  std::string text = buf;
  if (flops_per_token_ > 0 && machine_gflops_ > 0) {
    const double model_gflops = flops_per_token_ * tokens_per_s / 1e9;
    std::snprintf(buf, sizeof(buf), "; model %.1f GFLOP/s, MFU %.1f%% of the %.1f GFLOP/s fp32 matmul rate measured at "
                  "start-up (%d rank%s)", model_gflops, 100.0 * model_gflops / machine_gflops_, machine_gflops_,
                  trainer.world_size(), trainer.world_size() == 1 ? "" : "s");
    text += buf;
  } else if (flops_per_token_ > 0) {
    text += "; MFU: no matmul rate measured for this device";
  }
  std::cout << text << std::endl;
}

Sample::Sample(int64_t tokens, uint64_t seed, at::Tensor prompt, bool bytes)
    : tokens_(tokens), seed_(seed), prompt_(std::move(prompt)), bytes_(bytes) {}

// Note [Sampling on every rank]
// A forward of the trained model may need every rank: under fsdp and
// xla_fsdp each unit's parameters are gathered from all of them, and on
// several xla devices every sync of a replica (a host read, the CPU
// fallback that multinomial takes) is a meeting of the replicas, whose
// programs must be one text (Note [Replicas in one process] in
// src/xla_device/recorder.cpp). So the sample runs inside fit, in
// on_fit_end, on every rank, each with a generator seeded alike: the
// ranks draw the same tokens, hence run the same forwards, collectives
// and host reads in the same order, and every rank reads its result back
// (rank 0 prints it). Sampling after fit returned ran on rank 0 alone: the
// other ranks had ended (as threads of the xla process, or as processes
// waiting in teardown), and under xla_fsdp rank 0's gathers were
// recorded into a program run without its peers, which XLA refused
// (replica_id < replica_count). Reading the result on rank 0 alone fails
// the same way: that read is a step end that the other replicas, having
// finished, never reach.
void Sample::on_fit_end(Trainer& trainer, TrainModule& module) {
  text_.clear();
  if (tokens_ <= 0 || trainer.stop_signal() != 0) return;
  auto* job = dynamic_cast<GPTJob*>(&module);
  STRATA_ASSERT(job != nullptr, "the Sample callback samples a GPTJob");
  torch::NoGradGuard no_grad;
  const bool was_training = job->is_training();
  job->eval();
  at::Generator generator = at::detail::createCPUGenerator(seed_);
  at::Tensor prompt = prompt_.to(trainer.strategy().root_device());
  at::Tensor out;
  // Through the TrainModule's forward hooks, as the Trainer runs its
  // steps: under FSDP the module is the root unit, gathered around it.
  hooked_forward(*job, prompt, [&](const at::Tensor& p) {
    out = job->gpt->generate(p, tokens_, 0.8, 40, generator);
    return out;
  });
  const at::Tensor ids = out.cpu();  // on every rank (above)
  job->train(was_training);
  if (bytes_) {
    text_ = models::decode_bytes(ids);
  } else {
    for (int64_t i = 0; i < ids.numel(); ++i) text_ += (i ? " " : "") + std::to_string(ids[i].item<int64_t>());
  }
  if (trainer.is_global_zero()) std::cout << (bytes_ ? "sample: " : "sample (token ids): ") << text_ << std::endl;
}

FinalSave::FinalSave(std::string dir, int64_t every) : dir_(std::move(dir)), every_(every) {}

void FinalSave::on_train_start(Trainer& trainer, TrainModule&) {
  if (!trainer.ckpt_path().empty() && trainer.is_global_zero()) {
    std::cout << "resumed from " << trainer.ckpt_path() << " at step " << trainer.global_step() << std::endl;
  }
}

void FinalSave::on_train_end(Trainer& trainer, TrainModule&) {
  if (dir_.empty()) return;
  // Saved by the periodic checkpoint, which also saves the step a stop on a
  // signal ended at (Note [Stopping on a signal]).
  if (every_ > 0 && (trainer.global_step() % every_ == 0 || trainer.stop_signal() != 0)) return;
  const std::string path = (std::filesystem::path(dir_) / step_name(trainer.global_step())).string();
  trainer.save_checkpoint(path);
  if (trainer.is_global_zero()) std::cout << "saved checkpoint " << path << std::endl;
}

}  // namespace strata::cli
