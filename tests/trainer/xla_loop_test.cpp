// The Trainer's and Fabric's loops on one xla device (XLA's CPU PJRT
// plugin): nothing is read inside a step (Note [No reads inside a lazy
// step] in strata/strategies/strategy.h), so each step runs as one program;
// the loss, the logged values and the clipped norm are those of the CPU;
// a NaN loss and a non-finite gradient norm are reported once the step has
// run. Each test skips, saying so, without a plugin.
#include <gtest/gtest.h>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/optim/adamw.h>

#include <cmath>
#include <limits>

#include "strata/fabric/fabric.h"
#include "strata/xla_device/device.h"
#include "support/errors.h"
#include "trainer_util.h"

namespace {

using namespace strata::testing;

/// A regression MLP that logs its loss and a statistic of its batch.
class Mlp : public strata::TrainModule {
 public:
  Mlp() {
    net = register_module("net", torch::nn::Sequential(torch::nn::Linear(4, 32), torch::nn::ReLU(),
                                                        torch::nn::Linear(32, 1)));
  }
  at::Tensor training_step(const strata::data::Batch& b, int64_t) override {
    at::Tensor loss = (net->forward(b.input) - b.target).pow(2).mean();
    if (nan_at_step > 0 && global_step() + 1 == nan_at_step) loss = loss * std::numeric_limits<double>::quiet_NaN();
    log("train_loss", loss, strata::LogOptions().with_on_epoch(true));
    log("target_max", b.target.abs().mean(), strata::LogOptions().with_on_epoch(true).with_reduce_fx("max"));
    return loss;
  }
  strata::OptimizerConfig configure_optimizers() override {
    return strata::OptimizerConfig(
        std::make_shared<torch::optim::AdamW>(parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.01)));
  }
  torch::nn::Sequential net{nullptr};
  int64_t nan_at_step = 0;
};

/// Records each step's loss as the Trainer read it (after the step).
class StepLosses : public strata::trainer::Callback {
 public:
  std::string state_key() const override { return "StepLosses"; }
  void on_train_batch_end(strata::Trainer& trainer, strata::TrainModule&, const at::Tensor&,
                          const strata::data::Batch&, int64_t) override {
    losses.push_back(trainer.last_loss());
  }
  std::vector<double> losses;
};

std::shared_ptr<strata::data::TensorDataset> regression(int64_t n) {
  at::Generator gen = at::detail::createCPUGenerator(3);
  at::Tensor x = at::randn({n, 4}, gen);
  return std::make_shared<strata::data::TensorDataset>(x, x.sum(1, true).sin());
}

struct TrainRun {
  std::vector<double> losses;
  strata::trainer::Metrics metrics;
  std::vector<at::Tensor> weights;
  strata::xla::Metrics device;
};

TrainRun fit(const std::string& accelerator, int64_t nan_at_step = 0) {
  at::manual_seed(5);
  auto module = std::make_shared<Mlp>();
  module->nan_at_step = nan_at_step;
  auto losses = std::make_shared<StepLosses>();
  strata::Trainer trainer(strata::TrainerOptions()
                              .with_accelerator(accelerator)
                              .with_strategy("single_device")
                              .with_max_epochs(2)
                              .with_gradient_clip_val(0.5)
                              .with_enable_progress_bar(false)
                              .with_enable_checkpointing(false)
                              .with_callbacks({losses}));
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  trainer.fit(module, strata::DataSource(regression(64), strata::DataOptions().with_batch_size(8)));
  TrainRun run{losses->losses, trainer.callback_metrics(), {}, strata::xla::metrics()};
  for (const at::Tensor& p : module->parameters()) run.weights.push_back(p.detach().cpu());
  return run;
}

double relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

TEST(XlaLoopTest, TheTrainerRunsEachStepAsOneProgramAndGivesTheCpuResult) {
  if (!start_xla()) GTEST_SKIP() << "no PJRT plugin for the xla device";
  const TrainRun cpu = fit("cpu");
  const TrainRun xla = fit("xla");
  ASSERT_EQ(cpu.losses.size(), 16u);
  ASSERT_EQ(xla.losses.size(), cpu.losses.size());
  // XLA's CPU kernels fuse and order sums their own way: f32 rounding per
  // step, which AdamW carries on (Note [GPT tolerances] in
  // tests/xla_device/gpt_test.cpp).
  EXPECT_LE(relative(xla.losses.front(), cpu.losses.front()), 1e-5);
  for (size_t i = 0; i < cpu.losses.size(); ++i)
    EXPECT_LE(relative(xla.losses[i], cpu.losses[i]), 1e-3) << "step " << i + 1;
  for (const char* name : {"train_loss_epoch", "train_loss_step", "target_max_epoch"})
    EXPECT_LE(relative(xla.metrics.at(name), cpu.metrics.at(name)), 1e-3) << name;
  for (size_t i = 0; i < cpu.weights.size(); ++i)
    EXPECT_TRUE(at::allclose(xla.weights[i], cpu.weights[i], 1e-3, 1e-5)) << "parameter " << i;
  // Forward, backward, the clipping's norm and its scaling, AdamW, the
  // loss sums and the logged values: one program a step, compiled in the
  // first two steps (the second has AdamW's state as inputs), then reused.
  EXPECT_EQ(xla.device.executions, 16) << strata::xla::summary(xla.device);
  EXPECT_LE(xla.device.compiles, 2) << strata::xla::summary(xla.device);
  EXPECT_TRUE(xla.device.fallbacks.empty()) << strata::xla::summary(xla.device);
}

TEST(XlaLoopTest, ANanLossIsReportedOnceItsStepHasRun) {
  if (!start_xla()) GTEST_SKIP() << "no PJRT plugin for the xla device";
  const std::string message = error_message([] { fit("xla", /*nan_at_step=*/3); });
  EXPECT_NE(message.find("[trainer] the loss is NaN or infinite at step 3 (epoch 0, batch 2); on the xla device the loss is "
                         "read after the step ran"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("the last checkpoint saved stays untouched"), std::string::npos) << message;
}

// Fabric on xla: the loader marks each step when the next batch is taken,
// and clip_gradients' error_if_nonfinite is checked there.
TEST(XlaLoopTest, FabricsLoaderMarksEachStepAndANonFiniteNormFailsThere) {
  if (!start_xla()) GTEST_SKIP() << "no PJRT plugin for the xla device";
  strata::Fabric fabric(strata::FabricOptions().with_accelerator("xla").with_strategy("single_device"));
  fabric.launch([](strata::Fabric& f) {
    at::manual_seed(5);
    torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 1));
    f.setup_module(model);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
    f.setup_optimizer(optimizer);
    auto loader = f.setup_dataloader(std::make_shared<strata::data::DataLoader>(regression(32), 8));
    strata::xla::mark_step();
    strata::xla::reset_metrics();
    int64_t steps = 0;
    at::Tensor loss;
    for (const strata::data::Batch& batch : *loader) {
      ASSERT_EQ(strata::xla::metrics().executions, steps) << "the loader marked the step before";
      loss = (model->forward(batch.input) - batch.target).pow(2).mean();
      f.backward(loss);
      const at::Tensor norm = f.clip_gradients(*model, optimizer, strata::ClipByNorm{0.5});
      optimizer.step();
      optimizer.zero_grad();
      ++steps;
      EXPECT_EQ(norm.device().str(), "xla:0");
    }
    EXPECT_EQ(steps, 4);
    EXPECT_EQ(strata::xla::metrics().executions, 4) << "the end of the pass marked the last step";
    EXPECT_TRUE(std::isfinite(loss.item<double>()));

    // An infinite gradient: clipping does not read the norm inside the
    // step; the loader's mark runs the step and then reports it.
    loader->reset();
    auto batch = loader->next();
    ASSERT_TRUE(batch.has_value());
    f.backward((model->forward(batch->input) * std::numeric_limits<double>::infinity()).sum());
    f.clip_gradients(*model, optimizer, strata::ClipByNorm{0.5});
    const std::string message = error_message([&] { loader->next(); });
    EXPECT_EQ(message, "[single_device] the total norm of order 2.000000 of the gradients is non-finite, so it "
                       "cannot be clipped; pass error_if_nonfinite=false to clip anyway (read when the step was "
                       "marked, after it ran)");
    // The check was dropped with its error: the next step runs.
    optimizer.zero_grad();
    strata::xla::mark_step();
  });
}

}  // namespace
