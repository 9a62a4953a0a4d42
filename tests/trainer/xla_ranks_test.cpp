// The Trainer on several xla devices of XLA's CPU plugin: the ranks are
// threads of the test process (Note [The Trainer's ranks as threads] in
// strata/trainer/trainer.h), each with its own Trainer, module and
// callbacks. `xla` and `xla_fsdp` at 2 devices train the tiny GPT as one
// process does on the whole batch, their checkpoints load on the CPU, and
// what cannot be copied for the other ranks is refused with a message.
// Each test skips, saying so, without a plugin.
#include <gtest/gtest.h>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <filesystem>
#include <mutex>

#include "strata/xla_device/device.h"
#include "support/errors.h"
#include "trainer_util.h"

namespace {

using namespace strata::testing;

/// Each rank's parameters at the end of fit, on the CPU: the copies of
/// this callback (its implicit copy constructor's) share one record.
class RankParameters : public strata::trainer::Callback {
 public:
  struct Record {
    std::mutex mutex;
    std::map<int, std::vector<at::Tensor>> by_rank;
  };
  explicit RankParameters(std::shared_ptr<Record> record = std::make_shared<Record>()) : record(std::move(record)) {}
  std::string state_key() const override { return "RankParameters"; }
  void on_train_end(strata::Trainer& trainer, strata::TrainModule& module) override {
    std::vector<at::Tensor> values;
    for (const at::Tensor& p : module.parameters()) values.push_back(p.detach().cpu());
    std::lock_guard<std::mutex> lock(record->mutex);
    record->by_rank[trainer.global_rank()] = std::move(values);
  }
  std::shared_ptr<Record> record;
};

struct FitRun {
  std::vector<double> losses;  // each batch's, averaged over the ranks
  std::vector<double> epoch_losses;
  double val_loss = NAN;
  int64_t global_step = 0;
  std::map<int, std::vector<at::Tensor>> parameters;
  std::string checkpoint;  // saved after fit, from the calling thread
};

strata::DataSource train_data() {
  return strata::DataSource(gpt_dataset(32), strata::DataOptions().with_batch_size(8));
}
strata::DataSource val_data() { return strata::DataSource(gpt_dataset(16), strata::DataOptions().with_batch_size(8)); }

FitRun fit(const std::string& accelerator, const std::string& strategy, int devices, const std::string& folder) {
  at::manual_seed(7);
  auto module = std::make_shared<LitGPT>();
  auto losses = std::make_shared<LossRecorder>();
  auto parameters = std::make_shared<RankParameters>();
  strata::Trainer trainer(strata::TrainerOptions()
                              .with_accelerator(accelerator)
                              .with_devices(devices)
                              .with_strategy(strategy)
                              .with_max_epochs(2)
                              .with_enable_progress_bar(false)
                              .with_enable_checkpointing(false)
                              .with_module_factory([] { return std::make_shared<LitGPT>(); })
                              .with_callback(losses)
                              .with_callback(parameters));
  trainer.fit(module, train_data(), val_data());
  FitRun run{losses->losses, losses->epoch_losses, trainer.callback_metrics().at("val_loss"), trainer.global_step(),
          parameters->record->by_rank, folder + "/end"};
  trainer.save_checkpoint(run.checkpoint);
  return run;
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

void expect_like_the_cpu(const FitRun& xla, const FitRun& cpu) {
  ASSERT_EQ(cpu.losses.size(), 8u);
  ASSERT_EQ(xla.losses.size(), cpu.losses.size());
  EXPECT_EQ(xla.global_step, cpu.global_step);
  // XLA's CPU kernels order their sums their own way: f32 rounding per
  // step, carried on by the momentum (Note [GPT tolerances] in
  // tests/xla_device/gpt_test.cpp).
  EXPECT_LE(relative(xla.losses.front(), cpu.losses.front()), 1e-5);
  for (size_t i = 0; i < cpu.losses.size(); ++i)
    EXPECT_LE(relative(xla.losses[i], cpu.losses[i]), 1e-3) << "step " << i + 1;
  ASSERT_EQ(xla.epoch_losses.size(), cpu.epoch_losses.size());
  for (size_t i = 0; i < cpu.epoch_losses.size(); ++i)
    EXPECT_LE(relative(xla.epoch_losses[i], cpu.epoch_losses[i]), 1e-3) << "epoch " << i;
  EXPECT_LE(relative(xla.val_loss, cpu.val_loss), 1e-3);
}

// The checkpoint saved after fit, validated by a one-process CPU Trainer.
double val_loss_on_the_cpu(const std::string& checkpoint) {
  strata::Trainer trainer(strata::TrainerOptions()
                              .with_accelerator("cpu")
                              .with_strategy("single_device")
                              .with_enable_progress_bar(false)
                              .with_enable_checkpointing(false));
  return trainer.validate(std::make_shared<LitGPT>(), val_data(), checkpoint).at("val_loss");
}

TEST(XlaRanksTest, XlaAtTwoDevicesTrainsAsOneProcessOnTheWholeBatch) {
  if (!start_xla()) GTEST_SKIP() << "no PJRT plugin for the xla device";
  TempDir dir("xla-ranks");
  const FitRun cpu = fit("cpu", "single_device", 1, dir.path + "/cpu");
  const FitRun xla = fit("xla", "xla", 2, dir.path + "/xla");
  expect_like_the_cpu(xla, cpu);
  // Every rank ran its own module and callbacks; DDP keeps the replicas equal.
  ASSERT_EQ(xla.parameters.size(), 2u);
  ASSERT_EQ(xla.parameters.at(0).size(), cpu.parameters.at(0).size());
  for (size_t i = 0; i < xla.parameters.at(0).size(); ++i) {
    EXPECT_TRUE(at::equal(xla.parameters.at(0)[i], xla.parameters.at(1)[i])) << "parameter " << i;
    EXPECT_TRUE(at::allclose(xla.parameters.at(0)[i], cpu.parameters.at(0)[i], 1e-3, 1e-5)) << "parameter " << i;
  }
  // The checkpoint is the CPU's kind: a one-process CPU Trainer reads it.
  EXPECT_LE(relative(val_loss_on_the_cpu(xla.checkpoint), cpu.val_loss), 1e-3);
}

TEST(XlaRanksTest, XlaFsdpAtTwoDevicesTrainsAsOneProcessAndItsShardedCheckpointLoadsOnTheCpu) {
  if (!start_xla()) GTEST_SKIP() << "no PJRT plugin for the xla device";
  TempDir dir("xla-fsdp-ranks");
  const FitRun cpu = fit("cpu", "single_device", 1, dir.path + "/cpu");
  const FitRun xla = fit("xla", "xla_fsdp", 2, dir.path + "/xla");
  expect_like_the_cpu(xla, cpu);
  // Each rank holds half of every parameter (the root unit's shards).
  int64_t total = 0;
  for (const at::Tensor& p : cpu.parameters.at(0)) total += p.numel();
  for (int r = 0; r < 2; ++r) {
    int64_t held = 0;
    for (const at::Tensor& p : xla.parameters.at(r)) held += p.numel();
    EXPECT_LE(held, total / 2 + 64) << "rank " << r;
    EXPECT_GE(held, total / 2 - 64) << "rank " << r;
  }
  // Sharded, written by two ranks, read by one.
  EXPECT_LE(relative(val_loss_on_the_cpu(xla.checkpoint), cpu.val_loss), 1e-3);
}

// Note [Paused replicas] (src/xla_device/recorder.cpp): after fit, rank
// 0's module may run on xla:0 from the calling thread, but a module that
// xla_fsdp shards gathers its parameters from every rank in its forward,
// and the other ranks' threads have ended. The gather is refused where it
// is recorded, naming the way out, instead of failing in XLA when a
// one-device program runs it (RET_CHECK replica_id < replica_count, at
// the Trainer's teardown: strata train's sample after fit did this).
TEST(XlaRanksTest, AShardedForwardBetweenCallsIsRefusedWhereItGathers) {
  if (!start_xla()) GTEST_SKIP() << "no PJRT plugin for the xla device";
  at::manual_seed(7);
  auto module = std::make_shared<LitGPT>();
  strata::Trainer trainer(strata::TrainerOptions()
                              .with_accelerator("xla")
                              .with_devices(2)
                              .with_strategy("xla_fsdp")
                              .with_max_steps(1)
                              .with_enable_progress_bar(false)
                              .with_enable_checkpointing(false)
                              .with_enable_model_summary(false)
                              .with_module_factory([] { return std::make_shared<LitGPT>(); }));
  trainer.fit(module, train_data());
  const std::string message = error_message<strata::ConfigError>([&] {
    torch::NoGradGuard no_grad;
    at::Tensor prompt = at::zeros({1, 4}, at::kLong).to(trainer.strategy().root_device());
    module->gpt->forward(prompt).cpu();
  });
  EXPECT_NE(message.find("[xla] all_gather of replica 0 while the replicas are paused (between two runs of their "
                         "threads, e.g. after Trainer::fit returned)"),
            std::string::npos)
      << message;
}

/// A small module.
class Regression : public strata::TrainModule {
 public:
  Regression() { layer = register_module("layer", torch::nn::Linear(2, 1)); }
  at::Tensor training_step(const strata::data::Batch& b, int64_t) override {
    return (layer->forward(b.input) - b.target).pow(2).mean();
  }
  strata::OptimizerConfig configure_optimizers() override {
    return strata::OptimizerConfig(std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1)));
  }
  torch::nn::Linear layer{nullptr};
};

/// A callback of a class that cannot be copied.
class NoCopy : public strata::trainer::Callback {
 public:
  NoCopy() = default;
  NoCopy(const NoCopy&) = delete;
  std::string state_key() const override { return "NoCopy"; }
};

/// A callback of a copyable class.
class Copyable : public strata::trainer::Callback {
 public:
  std::string state_key() const override { return "Copyable"; }
};

std::string fit_message(strata::TrainerOptions options, bool as_loader) {
  return error_message([&] {
    strata::Trainer trainer(options.with_accelerator("xla")
                                .with_devices(2)
                                .with_max_epochs(1)
                                .with_enable_progress_bar(false)
                                .with_enable_checkpointing(false));
    auto module = std::make_shared<Regression>();
    auto data = std::make_shared<strata::data::TensorDataset>(at::ones({4, 2}), at::ones({4, 1}));
    if (as_loader) {
      trainer.fit(module, strata::DataSource(std::make_shared<strata::data::DataLoader>(data, 2)));
    } else {
      trainer.fit(module, strata::DataSource(data, strata::DataOptions().with_batch_size(2)));
    }
  });
}

TEST(XlaRanksTest, WhatCannotBeCopiedForTheOtherRanksIsRefusedWithAMessage) {
  if (!start_xla()) GTEST_SKIP() << "no PJRT plugin for the xla device";
  const auto factory = [] { return std::make_shared<Regression>(); };
  std::string message = fit_message(strata::TrainerOptions(), false);
  EXPECT_NE(message.find("[trainer] accelerator 'xla' with devices=2 runs the ranks as threads of this process, each "
                         "with a module of its own, and no module_factory builds them: pass "
                         "TrainerOptions::with_module_factory"),
            std::string::npos)
      << message;
  message = fit_message(strata::TrainerOptions().with_module_factory([] { return std::make_shared<LitGPT>(); }), false);
  EXPECT_NE(message.find("[trainer] module_factory returned a module of another class"), std::string::npos) << message;
  // A copyable callback given through the vector of callbacks, with its
  // class's type gone, cannot be copied; through with_callback it can.
  const std::vector<strata::trainer::CallbackPtr> erased{std::make_shared<Copyable>()};
  message = fit_message(strata::TrainerOptions().with_module_factory(factory).with_callbacks(erased), false);
  EXPECT_NE(message.find("[trainer] accelerator 'xla' with devices=2 runs the ranks as threads of this process, each "
                         "with its own callbacks, and the callback 'Copyable' cannot be copied for them"),
            std::string::npos)
      << message;
  message = fit_message(strata::TrainerOptions().with_module_factory(factory).with_callback(std::make_shared<NoCopy>()),
                        false);
  EXPECT_NE(message.find("the callback 'NoCopy' cannot be copied for them: give its class a copy constructor"),
            std::string::npos)
      << message;
  message = fit_message(strata::TrainerOptions().with_module_factory(factory).with_callback(std::make_shared<Copyable>()),
                        true);
  EXPECT_NE(message.find("[trainer] the training data is a loader, but the ranks are threads of this process "
                         "(accelerator 'xla', devices=2) and would share it: pass a dataset"),
            std::string::npos)
      << message;
}

}  // namespace
