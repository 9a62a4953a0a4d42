// strata::optim's AdamW and Adam on the xla device (Note [One node per
// fused step] in src/xla_device/kernels_optim.cpp): each group's step is
// one call of the lowered fused kernel, recording a fraction of the nodes
// torch::optim's loop records, with no fallback and no compile after step
// 2, and after 20 steps the parameters equal those of the same optimizer
// on the CPU (ATen's fused CPU kernel) to rounding. Skips, saying so,
// without the CPU PJRT plugin.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "strata/optim/fused.h"
#include "strata/xla_device/device.h"
#include "xla_device/xla_device_test.h"

namespace {

using MakeOptimizer = std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>;

// A tiny MLP on `device`, from the same weights on every device.
torch::nn::Sequential mlp(c10::Device device) {
  torch::manual_seed(7);
  torch::nn::Sequential net(torch::nn::Linear(6, 8), torch::nn::Tanh(), torch::nn::Linear(8, 3));
  net->to(device);
  return net;
}

struct Trained {
  std::vector<at::Tensor> params;  // on the CPU, after the last step
  int64_t fused_calls = 0;         // calls of the lowered fused kernel
  int64_t step_nodes = 0;          // nodes the last optimizer step recorded
  int64_t compiles_after_step_2 = 0;
  std::map<std::string, int64_t> fallbacks;
};

Trained train(c10::Device device, const MakeOptimizer& make, const std::string& fused_op, int steps) {
  torch::nn::Sequential net = mlp(device);
  auto optimizer = make(net->parameters());
  torch::manual_seed(3);
  const at::Tensor x = torch::randn({5, 6}).to(device), y = torch::randn({5, 3}).to(device);
  const bool xla = device.type() != c10::kCPU;
  if (xla) {
    strata::xla::mark_step();
    strata::xla::reset_metrics();
  }
  Trained run;
  for (int i = 0; i < steps; ++i) {
    optimizer->zero_grad();
    torch::mse_loss(net->forward(x), y).backward();
    const int64_t before = xla ? strata::xla::metrics().nodes_recorded : 0;
    optimizer->step();
    if (!xla) continue;
    run.step_nodes = strata::xla::metrics().nodes_recorded - before;
    const int64_t compiles = strata::xla::metrics().compiles;
    strata::xla::mark_step();
    if (i >= 2) run.compiles_after_step_2 += strata::xla::metrics().compiles - compiles;
  }
  for (const auto& p : net->parameters()) run.params.push_back(p.detach().cpu());
  if (xla) {
    const auto m = strata::xla::metrics();
    run.fallbacks = m.fallbacks;
    auto it = m.lowered.find(fused_op);
    run.fused_calls = it == m.lowered.end() ? 0 : it->second;
  }
  return run;
}

class XlaFusedOptimizerTest : public strata::testing::XlaDeviceFixture {
 protected:
  void expect_fused_like_the_cpu(const MakeOptimizer& fused, const MakeOptimizer& loop, const std::string& op) {
    constexpr int kSteps = 20;
    const Trained cpu = train(c10::kCPU, fused, op, kSteps);
    const Trained xla = train(device_, fused, op, kSteps);
    const Trained per_op = train(device_, loop, op, 3);
    std::printf("%s: the fused step records %lld nodes, torch::optim's loop %lld\n", op.c_str(),
                static_cast<long long>(xla.step_nodes), static_cast<long long>(per_op.step_nodes));
    EXPECT_TRUE(xla.fallbacks.empty());
    EXPECT_EQ(xla.fused_calls, kSteps) << "one fused call per step (one group)";
    EXPECT_EQ(xla.compiles_after_step_2, 0);
    // One node computes the group's update; the others read each input and
    // bind each output (the loop records ~10 ops, each with its own, per
    // parameter).
    EXPECT_LT(xla.step_nodes * 2, per_op.step_nodes);
    ASSERT_EQ(xla.params.size(), cpu.params.size());
    for (size_t i = 0; i < cpu.params.size(); ++i) {
      const double scale = std::max(1.0, cpu.params[i].abs().max().item<double>());
      const double diff = (xla.params[i] - cpu.params[i]).abs().max().item<double>();
      // Note [Fused against the loop] in src/optim/fused.cpp: a few ulps a
      // step; a wrong formula is off by far more.
      EXPECT_LT(diff, 1e-5 * scale) << "parameter " << i;
    }
  }
};

TEST_F(XlaFusedOptimizerTest, AdamWIsOneNodePerGroupAndEqualsTheCpusFusedKernel) {
  expect_fused_like_the_cpu(
      [](std::vector<at::Tensor> p) {
        return std::make_unique<strata::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
      },
      [](std::vector<at::Tensor> p) {
        return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
      },
      "aten::_fused_adamw_");
}

TEST_F(XlaFusedOptimizerTest, AdamWithL2DecayAndAmsgradIsOneNodePerGroupAndEqualsTheCpusFusedKernel) {
  expect_fused_like_the_cpu(
      [](std::vector<at::Tensor> p) {
        return std::make_unique<strata::optim::Adam>(
            p, torch::optim::AdamOptions(1e-2).weight_decay(0.01).amsgrad(true).betas({0.8, 0.95}));
      },
      [](std::vector<at::Tensor> p) {
        return std::make_unique<torch::optim::Adam>(
            p, torch::optim::AdamOptions(1e-2).weight_decay(0.01).amsgrad(true).betas({0.8, 0.95}));
      },
      "aten::_fused_adam_");
}

TEST_F(XlaFusedOptimizerTest, SgdWithMomentumAndWeightDecayIsOneNodePerGroupAndEqualsTheCpusFusedKernel) {
  expect_fused_like_the_cpu(
      [](std::vector<at::Tensor> p) {
        return std::make_unique<strata::optim::SGD>(
            p, torch::optim::SGDOptions(0.05).momentum(0.9).dampening(0.1).weight_decay(0.01));
      },
      [](std::vector<at::Tensor> p) {
        return std::make_unique<torch::optim::SGD>(
            p, torch::optim::SGDOptions(0.05).momentum(0.9).dampening(0.1).weight_decay(0.01));
      },
      "aten::_fused_sgd_");
}

TEST_F(XlaFusedOptimizerTest, NesterovSgdIsOneNodePerGroupAndEqualsTheCpusFusedKernel) {
  expect_fused_like_the_cpu(
      [](std::vector<at::Tensor> p) {
        return std::make_unique<strata::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true));
      },
      [](std::vector<at::Tensor> p) {
        return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9).nesterov(true));
      },
      "aten::_fused_sgd_");
}

// The overloads with a double learning rate (PyTorch's `fused=True` with
// a float lr) are lowered too: the rate is a host scalar of the program.
// `step(p, grad, t)` runs the kernel's step t on one parameter; three steps
// run on the CPU and on xla, and the parameter of each comes back with the
// calls `op` counted as lowered on xla.
struct ThreeSteps {
  at::Tensor cpu, xla;
  int64_t lowered = 0;
  bool fell_back = false;
};
ThreeSteps three_steps(c10::Device xla, const std::string& op,
                       const std::function<void(std::vector<at::Tensor>&, std::vector<at::Tensor>&, int)>& step) {
  torch::manual_seed(5);
  const at::Tensor p0 = torch::randn({4, 3}), g = torch::randn({4, 3});
  auto run = [&](c10::Device device) {
    std::vector<at::Tensor> p{p0.clone().to(device)}, grad{g.to(device)};
    for (int t = 1; t <= 3; ++t) {
      step(p, grad, t);
      if (device.type() != c10::kCPU) strata::xla::mark_step();
    }
    return p[0].cpu();
  };
  ThreeSteps out;
  out.cpu = run(c10::kCPU);
  strata::xla::reset_metrics();
  out.xla = run(xla);
  const auto m = strata::xla::metrics();
  out.fell_back = !m.fallbacks.empty();
  out.lowered = m.lowered.count(op) ? m.lowered.at(op) : 0;
  return out;
}

// Plain SGD (no momentum buffers), maximizing: bit for bit.
TEST_F(XlaFusedOptimizerTest, PlainSgdWithADoubleLearningRateStepsOnTheDeviceAsOnTheCpu) {
  const ThreeSteps r = three_steps(device_, "aten::_fused_sgd_", [](auto& p, auto& grad, int) {
    at::_fused_sgd_(p, grad, {}, 0.0, 0.0, 0.05, 0.0, false, /*maximize=*/true, false);
  });
  EXPECT_FALSE(r.fell_back);
  EXPECT_EQ(r.lowered, 3);
  EXPECT_TRUE(at::equal(r.xla, r.cpu)) << (r.xla - r.cpu).abs().max();
}

TEST_F(XlaFusedOptimizerTest, ADoubleLearningRateStepsOnTheDeviceAsOnTheCpu) {
  std::vector<at::Tensor> m, v;
  const ThreeSteps r = three_steps(device_, "aten::_fused_adamw_", [&](auto& p, auto& grad, int t) {
    if (t == 1) m = {at::zeros_like(p[0])}, v = {at::zeros_like(p[0])};
    std::vector<at::Tensor> steps{torch::scalar_tensor(t, torch::kFloat).to(p[0].device())};
    at::_fused_adamw_(p, grad, m, v, {}, steps, 0.05, 0.9, 0.999, 0.1, 1e-8, false, false);
  });
  EXPECT_FALSE(r.fell_back);
  EXPECT_EQ(r.lowered, 3);
  EXPECT_LT((r.xla - r.cpu).abs().max().item<double>(), 1e-5 * std::max(1.0, r.cpu.abs().max().item<double>()));
}

}  // namespace
