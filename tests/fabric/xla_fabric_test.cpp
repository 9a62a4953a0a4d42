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

#include <chrono>

#include "strata/core/error.h"
#include "strata/fabric/fabric.h"
#include "strata/strategies/xla.h"
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
      [] { Fabric f(FabricOptions().with_accelerator("xla").with_devices(2).with_num_nodes(2)); });
  EXPECT_NE(many.find("[fabric] accelerator 'xla' runs the ranks of a host as threads of one process, on one host "
                      "for now; got num_nodes=2"), std::string::npos) << many;
  const std::string ddp = strata::testing::error_message(
      [] { Fabric f(FabricOptions().with_accelerator("xla").with_devices(2).with_strategy("ddp")); });
  EXPECT_NE(ddp.find("on accelerator 'xla' use 'xla'"), std::string::npos) << ddp;
  const std::string xla_on_cpu = strata::testing::error_message(
      [] { Fabric f(FabricOptions().with_accelerator("cpu").with_devices(2).with_strategy("xla")); });
  EXPECT_NE(xla_on_cpu.find("'xla' trains on xla devices; on accelerator 'cpu' use 'ddp'"), std::string::npos)
      << xla_on_cpu;
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

// The `xla` strategy on 2 and 4 CPU-plugin devices, ranks as threads of
// this process: every rank trains on its slice of each batch, DDP's buckets
// reduce the gradients inside the step, and every rank ends with the
// weights one CPU process gets from the whole batch (which `ddp` on CPU
// workers matches too: tests/strategies).
TEST(XlaFabricTest, XlaStrategyTrainsLikeTheWholeBatchOnTheCpu) {
  if (!have_plugin()) GTEST_SKIP() << "no PJRT plugin found (set STRATA_PJRT_PLUGIN)";
  strata::xla::init();
  if (strata::xla::device_count() < 4) GTEST_SKIP() << "the plugin addresses fewer than 4 devices";
  constexpr int kSteps = 20;
  at::manual_seed(7);
  torch::nn::Sequential reference(torch::nn::Linear(6, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
  std::vector<at::Tensor> initial;
  for (const at::Tensor& p : reference->parameters()) initial.push_back(p.detach().clone());
  const at::Tensor x = at::randn({kSteps, 8, 6});
  const at::Tensor y = at::randn({kSteps, 8, 3});
  std::vector<double> cpu_losses;
  {
    torch::optim::AdamW optimizer(reference->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    for (int64_t step = 0; step < kSteps; ++step) {
      at::Tensor loss = at::mse_loss(reference->forward(x[step]), y[step]);
      loss.backward();
      optimizer.step();
      optimizer.zero_grad();
      cpu_losses.push_back(loss.item<double>());
    }
  }
  for (int n : {2, 4}) {
    SCOPED_TRACE(std::to_string(n) + " devices");
    Fabric fabric(FabricOptions().with_accelerator("xla").with_devices(n).with_strategy("xla"));
    EXPECT_EQ(fabric.placement().world_size, n);
    EXPECT_EQ(fabric.placement().processes_per_node, 1);
    std::vector<std::vector<at::Tensor>> weights(n);
    std::vector<std::vector<double>> losses(n);
    std::vector<std::string> devices(n);
    strata::xla::reset_metrics();
    int64_t compiles_after_step_2 = -1;
    const double first = fabric.launch([&](Fabric& f) {
      const int rank = f.global_rank();
      EXPECT_EQ(f.world_size(), n);
      EXPECT_EQ(f.strategy().name(), "xla");
      devices[rank] = f.device().str();
      torch::nn::Sequential model(torch::nn::Linear(6, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
      {
        // Rank r starts off by r: sync_module_states gives every rank rank 0's.
        torch::NoGradGuard no_grad;
        auto params = model->parameters();
        for (size_t i = 0; i < params.size(); ++i) params[i].copy_(initial[i] + rank);
      }
      f.setup_module(model);
      torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
      f.setup_optimizer(optimizer);
      const int64_t rows = 8 / n;
      for (int64_t step = 0; step < kSteps; ++step) {
        at::Tensor xs = x[step].narrow(0, rank * rows, rows).to(f.device());
        at::Tensor ys = y[step].narrow(0, rank * rows, rows).to(f.device());
        at::Tensor loss = at::mse_loss(model->forward(xs), ys);
        f.backward(loss);
        optimizer.step();
        optimizer.zero_grad();
        at::Tensor mean_loss = f.all_reduce(loss.detach(), "mean");
        strata::xla::mark_step();
        losses[rank].push_back(mean_loss.item<double>());
        if (step == 2 && rank == 0) compiles_after_step_2 = strata::xla::metrics().compiles;
      }
      for (const at::Tensor& p : model->parameters()) weights[rank].push_back(p.detach().cpu());
      return losses[rank].front();
    });
    EXPECT_EQ(first, losses[0].front()) << "launch returns rank 0's result";
    for (int r = 0; r < n; ++r) EXPECT_EQ(devices[r], "xla:" + std::to_string(r));
    for (int64_t step = 0; step < kSteps; ++step) {
      const double tol = step == 0 ? 1e-5 : 1e-3;
      EXPECT_NEAR(losses[0][step], cpu_losses[step], tol * std::abs(cpu_losses[step])) << "step " << step;
    }
    const auto want = reference->parameters();
    for (size_t i = 0; i < want.size(); ++i) {
      const double diff = (weights[0][i] - want[i]).abs().max().item<double>();
      EXPECT_LE(diff, 1e-3 * want[i].abs().max().item<double>()) << "parameter " << i;
      for (int r = 1; r < n; ++r) EXPECT_TRUE(at::equal(weights[r][i], weights[0][i])) << "parameter " << i << " rank " << r;
    }
    std::printf("%d devices: step 0 loss %.9g (cpu %.9g), last %.9g (cpu %.9g)\n", n, losses[0].front(),
                cpu_losses.front(), losses[0].back(), cpu_losses.back());
    const strata::xla::Metrics m = strata::xla::metrics();
    for (const auto& [op, calls] : m.fallbacks) ADD_FAILURE() << op << " fell back " << calls << " times";
    EXPECT_EQ(m.compiles, compiles_after_step_2) << "no compile after step 2";
    EXPECT_GE(m.lowered.count("strata::all_reduce"), 1u) << "the buckets are reduced inside the step";
    std::printf("%s\n", strata::xla::summary(m).c_str());
  }
}

// The `xla_fsdp` strategy on 2 and 4 devices: each Linear a unit (and
// activation-checkpointed in the second run), each rank on its slice of the
// batch; every rank ends with the weights one CPU process gets from the
// whole batch, holding 1/N of the parameters and of AdamW's state.
TEST(XlaFabricTest, XlaFsdpStrategyTrainsLikeTheWholeBatchOnTheCpu) {
  if (!have_plugin()) GTEST_SKIP() << "no PJRT plugin found (set STRATA_PJRT_PLUGIN)";
  strata::xla::init();
  if (strata::xla::device_count() < 4) GTEST_SKIP() << "the plugin addresses fewer than 4 devices";
  constexpr int kSteps = 12;
  at::manual_seed(9);
  torch::nn::Sequential reference(torch::nn::Linear(6, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
  std::vector<at::Tensor> initial;
  int64_t numel = 0;
  for (const at::Tensor& p : reference->parameters()) {
    initial.push_back(p.detach().clone());
    numel += p.numel();
  }
  const at::Tensor x = at::randn({kSteps, 8, 6});
  const at::Tensor y = at::randn({kSteps, 8, 3});
  std::vector<double> cpu_losses;
  {
    torch::optim::AdamW optimizer(reference->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
    for (int64_t step = 0; step < kSteps; ++step) {
      at::Tensor loss = at::mse_loss(reference->forward(x[step]), y[step]);
      loss.backward();
      optimizer.step();
      optimizer.zero_grad();
      cpu_losses.push_back(loss.item<double>());
    }
  }
  for (const auto& [n, checkpointed] : std::vector<std::pair<int, bool>>{{2, false}, {4, false}, {2, true}}) {
    SCOPED_TRACE(std::to_string(n) + " devices" + (checkpointed ? ", activation checkpointing" : ""));
    auto options = strata::strategies::FSDPOptions().with_auto_wrap_policy(strata::strategies::ModuleTypes{"Linear"});
    if (checkpointed) options.with_activation_checkpointing_policy(strata::strategies::ModuleTypes{"Linear"});
    auto strategy = std::make_shared<strata::strategies::XlaFSDPStrategy>(
        strata::strategies::make_accelerator("xla"), std::nullopt, options);
    Fabric fabric(FabricOptions().with_accelerator("xla").with_devices(n).with_strategy(strategy));
    std::vector<std::vector<double>> losses(n);
    std::vector<std::vector<at::Tensor>> full(n);
    std::vector<int64_t> held(n), state(n);
    strata::xla::reset_metrics();
    int64_t compiles_after_step_2 = -1, compiles_after_training = -1;
    fabric.launch([&](Fabric& f) {
      const int rank = f.global_rank();
      EXPECT_EQ(f.strategy().name(), "xla_fsdp");
      torch::nn::Sequential model(torch::nn::Linear(6, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
      {
        torch::NoGradGuard no_grad;
        auto params = model->parameters();
        for (size_t i = 0; i < params.size(); ++i) params[i].copy_(initial[i]);
      }
      f.setup_module(model);
      torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
      f.setup_optimizer(optimizer);
      const int64_t rows = 8 / n;
      for (int64_t step = 0; step < kSteps; ++step) {
        at::Tensor xs = x[step].narrow(0, rank * rows, rows).to(f.device());
        at::Tensor ys = y[step].narrow(0, rank * rows, rows).to(f.device());
        at::Tensor loss = at::mse_loss(model->forward(xs), ys);
        f.backward(loss);
        optimizer.step();
        optimizer.zero_grad();
        at::Tensor mean_loss = f.all_reduce(loss.detach(), "mean");
        strata::xla::mark_step();
        losses[rank].push_back(mean_loss.item<double>());
        if (step == 2 && rank == 0) compiles_after_step_2 = strata::xla::metrics().compiles;
      }
      // Read before any rank's next sync can run (every sync is the ranks'
      // together), so the reads of full parameters below are not counted.
      if (rank == 0) compiles_after_training = strata::xla::metrics().compiles;
      // What this rank holds: its shards, and AdamW's two moments of them.
      for (const at::Tensor& p : model->parameters()) {
        EXPECT_EQ(p.device(), f.device());
        held[rank] += p.numel();
      }
      for (const auto& group : optimizer.param_groups())
        for (const at::Tensor& p : group.params()) {
          auto it = optimizer.state().find(p.unsafeGetTensorImpl());
          if (it == optimizer.state().end()) continue;
          const auto& s = static_cast<const torch::optim::AdamWParamState&>(*it->second);
          state[rank] += s.exp_avg().numel() + s.exp_avg_sq().numel();
        }
      auto& fsdp = static_cast<strata::strategies::FSDPStrategy&>(f.strategy());
      for (const auto& item : reference->named_parameters())
        full[rank].push_back(fsdp.full_parameter(*model.ptr(), item.key()).cpu());
    });
    for (int64_t step = 0; step < kSteps; ++step) {
      const double tol = step == 0 ? 1e-5 : 1e-3;
      EXPECT_NEAR(losses[0][step], cpu_losses[step], tol * std::abs(cpu_losses[step])) << "step " << step;
    }
    const auto want = reference->parameters();
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(full[r].size(), want.size());
      for (size_t i = 0; i < want.size(); ++i) {
        const double diff = (full[r][i] - want[i]).abs().max().item<double>();
        EXPECT_LE(diff, 1e-3 * want[i].abs().max().item<double>()) << "parameter " << i << " rank " << r;
      }
      // Each rank holds 1/n of the parameters (padded up to a multiple of n
      // per unit) and of AdamW's state.
      EXPECT_LE(held[r], numel / n + 2 * n) << "rank " << r;
      EXPECT_GE(held[r], numel / n) << "rank " << r;
      EXPECT_EQ(state[r], 2 * held[r]) << "rank " << r;
    }
    std::printf("%d devices%s: step 0 loss %.9g (cpu %.9g), last %.9g (cpu %.9g); rank 0 holds %lld of %lld\n", n,
                checkpointed ? " (checkpointed)" : "", losses[0].front(), cpu_losses.front(), losses[0].back(),
                cpu_losses.back(), static_cast<long long>(held[0]), static_cast<long long>(numel));
    const strata::xla::Metrics m = strata::xla::metrics();
    for (const auto& [op, calls] : m.fallbacks) ADD_FAILURE() << op << " fell back " << calls << " times";
    EXPECT_EQ(compiles_after_training, compiles_after_step_2) << "no compile after step 2";
    EXPECT_GE(m.lowered.count("strata::reduce_scatter"), 1u) << "the gradients are reduce-scattered in the step";
    std::printf("%s\n", strata::xla::summary(m).c_str());
  }
}

// A rank that fails stops the others at once (not at the collective
// timeout), and launch() throws its error.
TEST(XlaFabricTest, ARankThatFailsStopsTheOthersAndIsReported) {
  if (!have_plugin()) GTEST_SKIP() << "no PJRT plugin found (set STRATA_PJRT_PLUGIN)";
  strata::xla::init();
  Fabric fabric(FabricOptions().with_accelerator("xla").with_devices(2).with_strategy("xla"));
  const auto start = std::chrono::steady_clock::now();
  const std::string error = strata::testing::error_message([&] {
    fabric.launch([&](Fabric& f) {
      if (f.global_rank() == 1) throw strata::Error("rank 1 gives up");
      f.barrier("never met");
    });
  });
  EXPECT_EQ(error, "rank 1 gives up");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

}  // namespace
