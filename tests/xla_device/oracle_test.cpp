// Every program the xla device emits for the example models' training steps
// also parses and runs on a second XLA, JAX's CPU backend, as it ran on
// the CPU plugin (tests/xla_device/jax_replay.h): the GPT in f32 with
// clipping, under bf16-mixed autocast, with dropout, and the MLP with
// AdamW, amsgrad Adam and Nesterov SGD. Each program is replayed with the
// arguments its first run had, and its results must be the ones the
// plugin returned. Skips without the plugin, and without jax.
#include <gtest/gtest.h>
#include <torch/nn.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim.h>

#include "strata/models/gpt.h"
#include "xla_device/jax_replay.h"
#include "xla_device/xla_device_test.h"

namespace strata::testing {
namespace {

class XlaOracleTest : public XlaDeviceFixture {};


// The steps whose programs are checked: two of each (step 0 makes the
// optimizer's state, step 1 is the steady one).
void run_the_example_steps(const c10::Device& device) {
  auto gpt_steps = [&](const strata::models::GPTConfig& config, bool autocast, bool clip) {
    torch::manual_seed(1);
    strata::models::GPT model(config);
    model->to(device);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
    for (int step = 0; step < 2; ++step) {
      opt.zero_grad();
      const at::Tensor x = torch::randint(config.vocab_size, {2, 16}, torch::kLong).to(device);
      const at::Tensor y = torch::randint(config.vocab_size, {2, 16}, torch::kLong).to(device);
      at::Tensor loss;
      if (autocast) {
        Autocast guard(device.type());
        loss = model->loss(x, y);
      } else {
        loss = model->loss(x, y);
      }
      loss.backward();
      if (clip) torch::nn::utils::clip_grad_norm_(model->parameters(), 0.5);
      opt.step();
      strata::xla::mark_step();
    }
  };
  const auto tiny = strata::models::GPTConfig::preset("tiny");
  gpt_steps(tiny, false, true);
  gpt_steps(tiny, true, false);
  gpt_steps(strata::models::GPTConfig::preset("tiny").with_dropout(0.1), false, false);

  auto mlp_steps = [&](auto make_optimizer) {
    torch::manual_seed(2);
    auto model = std::make_shared<Mlp>();
    model->to(device);
    auto opt = make_optimizer(model->parameters());
    for (int step = 0; step < 2; ++step) {
      opt->zero_grad();
      at::Tensor loss = torch::mse_loss(model->forward(torch::randn({8, 6}).to(device)), torch::randn({8, 3}).to(device));
      loss.backward();
      opt->step();
      strata::xla::mark_step();
    }
  };
  mlp_steps([](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2));
  });
  mlp_steps([](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::Adam>(p, torch::optim::AdamOptions(1e-2).amsgrad(true));
  });
  mlp_steps([](std::vector<at::Tensor> p) {
    return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(1e-2).momentum(0.9).nesterov(true));
  });
}

TEST_F(XlaOracleTest, EveryProgramOfTheExampleStepsRunsOnJaxAsOnThePlugin) {
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  const JaxReplay replay = replay_on_jax("example-steps", [&] { run_the_example_steps(device_); });
  EXPECT_EQ(strata::xla::metrics().fallback_calls(), 0);
  if (!replay.skipped.empty()) GTEST_SKIP() << replay.skipped;
  std::printf("%zu distinct programs replayed on jax %s\n", replay.cases.size(), replay.jax.c_str());
  // Two programs a clipped GPT step, one a step otherwise; step 0 and step
  // 1 differ (the optimizer's state is made in step 0).
  EXPECT_GE(replay.cases.size(), 10u);
  expect_all_agree(replay);
}

}  // namespace
}  // namespace strata::testing
