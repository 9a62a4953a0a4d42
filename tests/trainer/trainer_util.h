// Modules, data and helpers shared by the Trainer's tests.
#pragma once

#include <ATen/ATen.h>
#include <unistd.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "strata/checkpoint/atomic.h"
#include "strata/checkpoint/safetensors.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/core/error.h"
#include "strata/data/dataset.h"
#include "strata/models/gpt.h"
#include "strata/strategies/ddp.h"
#include "strata/strategies/fsdp.h"
#include "strata/strategies/single_device.h"
#include "strata/trainer/callbacks.h"
#include "strata/trainer/trainer.h"
#include "strata/xla_device/device.h"

namespace strata::testing {

/// Random byte "text": 96 windows of 16 tokens, the same in every process
/// (tests/fabric/equivalence_test.cpp's data).
inline std::shared_ptr<data::TensorDataset> gpt_dataset(int64_t windows = 96) {
  at::Generator gen = at::detail::createCPUGenerator(7);
  at::Tensor tokens = at::randint(0, 256, {windows, 17}, gen, at::kLong);
  return std::make_shared<data::TensorDataset>(tokens.narrow(1, 0, 16).contiguous(),
                                               tokens.narrow(1, 1, 16).contiguous());
}

/// Examples whose input and target are their index: [i] -> [i].
inline std::shared_ptr<data::TensorDataset> index_dataset(int64_t n) {
  at::Tensor x = at::arange(n, at::kFloat).unsqueeze(1);
  return std::make_shared<data::TensorDataset>(x, x.clone());
}

inline models::GPTConfig tiny_gpt() { return models::GPTConfig::preset("tiny").with_block_size(16); }

/// The tiny GPT as a TrainModule, trained with SGD + momentum (see the
/// Note in tests/fabric/equivalence_test.cpp on why not Adam).
class LitGPT : public TrainModule {
 public:
  explicit LitGPT(double lr = 0.5) : lr_(lr) { gpt = register_module("model", models::GPT(tiny_gpt())); }
  at::Tensor training_step(const data::Batch& b, int64_t) override {
    at::Tensor loss = gpt->loss(b.input, b.target);
    log("train_loss", loss, LogOptions().with_on_epoch(true).with_sync_dist(true).with_prog_bar(true));
    return loss;
  }
  at::Tensor validation_step(const data::Batch& b, int64_t) override {
    at::Tensor loss = gpt->loss(b.input, b.target);
    log("val_loss", loss, LogOptions().with_sync_dist(true).with_prog_bar(true));
    return loss;
  }
  OptimizerConfig configure_optimizers() override {
    auto opt = std::make_shared<torch::optim::SGD>(parameters(),
                                                   torch::optim::SGDOptions(lr_).momentum(0.9).weight_decay(1e-4));
    OptimizerConfig config(opt);
    if (step_lr_) config.with_scheduler(trainer::SchedulerConfig(std::make_shared<trainer::StepLR>(*opt, 3, 0.5))
                                            .with_interval("step"));
    return config;
  }
  models::GPT gpt{nullptr};
  bool step_lr_ = true;

 private:
  double lr_;
};

/// Records every batch's loss, averaged over the ranks (a collective), and
/// each epoch's "train_loss_epoch" as the Trainer reduced it.
class LossRecorder : public trainer::Callback {
 public:
  std::string state_key() const override { return "LossRecorder"; }
  void on_train_batch_end(Trainer& trainer, TrainModule&, const at::Tensor& loss, const data::Batch&,
                          int64_t) override {
    losses.push_back(trainer.strategy().all_reduce(loss.detach()).item<double>());
  }
  void on_train_epoch_end(Trainer& trainer, TrainModule&) override {
    auto it = trainer.callback_metrics().find("train_loss_epoch");
    epoch_losses.push_back(it == trainer.callback_metrics().end() ? -1.0 : it->second);
  }
  std::vector<double> losses;
  std::vector<double> epoch_losses;
};

/// "ddp", "fsdp" (each Block a unit) or "fsdp-full" (full checkpoints).
inline std::shared_ptr<strategies::Strategy> strategy_for(const std::string& spec) {
  if (spec == "ddp") return std::make_shared<strategies::DDPStrategy>();
  if (spec == "single") return std::make_shared<strategies::SingleDeviceStrategy>();
  strategies::FSDPOptions options;
  options.with_auto_wrap_policy(strategies::ModuleTypes{"Block"});
  if (spec == "fsdp-full") options.with_state_dict_type("full");
  return std::make_shared<strategies::FSDPStrategy>(strategies::cpu_accelerator(), std::nullopt, options);
}

/// The full values of a module's parameters and buffers, named without
/// `prefix` (FSDP's shards gathered: every rank must call it).
inline checkpoint::NamedTensors full_state(torch::nn::Module& module, strategies::Strategy& strategy,
                                           const std::string& prefix = "") {
  auto* fsdp = dynamic_cast<strategies::FSDPStrategy*>(&strategy);
  checkpoint::NamedTensors out;
  for (auto& [name, tensor] : checkpoint::module_state(module)) {
    const bool is_param = module.named_parameters().contains(name);
    at::Tensor value = fsdp && is_param ? fsdp->full_parameter(name) : tensor.detach().clone();
    out.emplace_back(name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name, value);
  }
  return out;
}

/// Starts the xla device, false without a PJRT plugin. Call it before the
/// process's first backward (docs/xla.md): autograd counts each device's
/// threads once, at its first backward.
inline bool start_xla() {
  try {
    xla::find_plugin();
  } catch (const ConfigError&) {
    return false;
  }
  xla::init();
  return true;
}

/// A fresh folder under the temp folder, removed by the destructor.
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& tag) {
    path = (std::filesystem::temp_directory_path() /
            ("strata-trainer-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++)))
               .string();
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  static int& counter() {
    static int n = 0;
    return n;
  }
};

inline void write_json(const std::string& path, const nlohmann::json& value) { std::ofstream(path) << value.dump(); }
inline nlohmann::json read_json(const std::string& path) { return nlohmann::json::parse(std::ifstream(path)); }

}  // namespace strata::testing
