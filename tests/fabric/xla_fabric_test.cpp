// Fabric on the `xla` accelerator (one PJRT device, the CPU plugin of the
// test environment): the single-device strategy places the module and the
// batches on xla:0, and training there gives the CPU's result; a job of
// several workers and a precision the device lacks are refused before
// anything starts.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adamw.h>

#include "strata/core/error.h"
#include "strata/fabric/fabric.h"
#include "strata/xla/device.h"
#include "support/errors.h"

namespace {

using strata::Fabric;
using strata::FabricOptions;

bool have_plugin() {
  try {
    return !strata::xla::find_plugin().path.empty();
  } catch (const strata::ConfigError&) {
    return false;
  }
}

// Five AdamW steps of a small MLP through Fabric; returns the losses and
// the final weights (on the CPU).
std::pair<std::vector<double>, std::vector<at::Tensor>> train(const std::string& accelerator) {
  Fabric fabric(FabricOptions().with_accelerator(accelerator).with_strategy("single_device"));
  std::vector<double> losses;
  std::vector<at::Tensor> weights;
  // One device: launch() runs in place, so the results come back by reference.
  fabric.launch([&](Fabric& f) {
    at::manual_seed(7);
    torch::nn::Sequential model(torch::nn::Linear(6, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
    f.setup_module(model);
    torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
    f.setup_optimizer(optimizer);
    at::manual_seed(11);
    const at::Tensor x = at::randn({5, 8, 6});
    const at::Tensor y = at::randn({5, 8, 3});
    for (int64_t step = 0; step < 5; ++step) {
      at::Tensor loss = at::mse_loss(model->forward(x[step].to(f.device())), y[step].to(f.device()));
      f.backward(loss);
      optimizer.step();
      optimizer.zero_grad();
      losses.push_back(loss.item<double>());
    }
    for (const at::Tensor& p : model->parameters()) weights.push_back(p.detach().cpu());
    EXPECT_EQ(f.device().str(), accelerator == "xla" ? "xla:0" : "cpu");
  });
  return {losses, weights};
}

TEST(XlaFabricTest, TrainingOnOneXlaDeviceGivesTheCpuResult) {
  if (!have_plugin()) GTEST_SKIP() << "no PJRT plugin found (set STRATA_PJRT_PLUGIN)";
  // Before this process's first backward: autograd counts each device's
  // threads once, at its first backward (docs/xla.md).
  strata::xla::init();
  const auto [cpu_losses, cpu_weights] = train("cpu");
  const auto [xla_losses, xla_weights] = train("xla");
  ASSERT_EQ(xla_losses.size(), cpu_losses.size());
  // Ops without a lowering run LibTorch's CPU kernels (bit for bit); lowered
  // ops run XLA's, which may fuse and reorder a sum: a few ulps per step,
  // grown by Adam over 5 steps to well under 1e-4 relative.
  for (size_t i = 0; i < cpu_losses.size(); ++i) EXPECT_NEAR(xla_losses[i], cpu_losses[i], 1e-4 * std::abs(cpu_losses[i]));
  ASSERT_EQ(xla_weights.size(), cpu_weights.size());
  for (size_t i = 0; i < cpu_weights.size(); ++i) {
    EXPECT_TRUE(at::allclose(xla_weights[i], cpu_weights[i], 1e-4, 1e-6))
        << "parameter " << i << " differs by " << (xla_weights[i] - cpu_weights[i]).abs().max().item<double>();
  }
}

TEST(XlaFabricTest, SeveralWorkersAndUnsupportedPrecisionsAreRefusedBeforeAnyStart) {
  if (!have_plugin()) GTEST_SKIP() << "no PJRT plugin found (set STRATA_PJRT_PLUGIN)";
  const std::string many = strata::testing::error_message(
      [] { Fabric f(FabricOptions().with_accelerator("xla").with_devices(1).with_num_nodes(2)); });
  EXPECT_NE(many.find("[fabric] accelerator 'xla' trains on one device for now"), std::string::npos) << many;
  // bf16 is lowered (tests/xla_device/bf16_test.cpp); f16 is not.
  const std::string f16 = strata::testing::error_message(
      [] { Fabric f(FabricOptions().with_accelerator("xla").with_precision("16-mixed")); });
  EXPECT_EQ(f16, "[precision] '16-mixed' is not supported on xla yet; choose 32-true, bf16-mixed or bf16-true");
  const std::string f16_true = strata::testing::error_message(
      [] { Fabric f(FabricOptions().with_accelerator("xla").with_precision("16-true")); });
  EXPECT_EQ(f16_true, "[precision] '16-true' is not supported on xla yet; choose 32-true, bf16-mixed or bf16-true");
  for (const char* accepted : {"bf16-mixed", "bf16-true"}) {
    Fabric f(FabricOptions().with_accelerator("xla").with_precision(accepted));
    EXPECT_EQ(f.strategy().precision().name(), accepted);
  }
  const auto mixed = strata::strategies::Precision::parse("bf16-mixed", "xla");
  EXPECT_TRUE(mixed.autocast());
  EXPECT_EQ(mixed.param_dtype(), at::kFloat);
  const auto pure = strata::strategies::Precision::parse("bf16-true", "xla");
  EXPECT_FALSE(pure.autocast());
  EXPECT_EQ(pure.param_dtype(), at::kBFloat16);
}

}  // namespace
