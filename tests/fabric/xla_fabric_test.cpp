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
#include <torch/optim/sgd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <unistd.h>

#include "strata/core/error.h"
#include "strata/data/dataset.h"
#include "strata/data/distributed_sampler.h"
#include "strata/data/loader.h"
#include "strata/fabric/fabric.h"
#include "strata/strategies/xla.h"
#include "strata/xla_device/device.h"
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

// One CPU process training `model` with AdamW on every whole batch of x
// and y ([steps, 8, ...]); returns each step's loss.
std::vector<double> train_whole_batches(torch::nn::Sequential& model, const at::Tensor& x, const at::Tensor& y) {
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2).weight_decay(0.1));
  std::vector<double> losses;
  for (int64_t step = 0; step < x.size(0); ++step) {
    at::Tensor loss = at::mse_loss(model->forward(x[step]), y[step]);
    loss.backward();
    optimizer.step();
    optimizer.zero_grad();
    losses.push_back(loss.item<double>());
  }
  return losses;
}

// Each rank trains `model` on its slice of every batch of x and y,
// marking each step; returns the mean loss of each step over the ranks.
// Rank 0 notes the compiles after step 2.
std::vector<double> train_slices(Fabric& f, torch::nn::Sequential& model, torch::optim::Optimizer& optimizer,
                                 const at::Tensor& x, const at::Tensor& y, int64_t& compiles_after_step_2) {
  const int rank = f.global_rank();
  const int64_t rows = x.size(1) / f.world_size();
  std::vector<double> losses;
  for (int64_t step = 0; step < x.size(0); ++step) {
    at::Tensor xs = x[step].narrow(0, rank * rows, rows).to(f.device());
    at::Tensor ys = y[step].narrow(0, rank * rows, rows).to(f.device());
    at::Tensor loss = at::mse_loss(model->forward(xs), ys);
    f.backward(loss);
    optimizer.step();
    optimizer.zero_grad();
    at::Tensor mean_loss = f.all_reduce(loss.detach(), "mean");
    strata::xla::mark_step();
    losses.push_back(mean_loss.item<double>());
    if (step == 2 && rank == 0) compiles_after_step_2 = strata::xla::metrics().compiles;
  }
  return losses;
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
  const std::vector<double> cpu_losses = train_whole_batches(reference, x, y);
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
      losses[rank] = train_slices(f, model, optimizer, x, y, compiles_after_step_2);
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
  const std::vector<double> cpu_losses = train_whole_batches(reference, x, y);
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
      losses[rank] = train_slices(f, model, optimizer, x, y, compiles_after_step_2);
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

// Two SGD steps of a small MLP on every rank, each step marked.
void two_sgd_steps(Fabric& f) {
  torch::nn::Sequential model(torch::nn::Linear(6, 16), torch::nn::ReLU(), torch::nn::Linear(16, 3));
  f.setup_module(model);
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.1));
  f.setup_optimizer(optimizer);
  for (int step = 0; step < 2; ++step) {
    f.backward(model->forward(at::ones({4, 6}).to(f.device())).sum());
    optimizer.step();
    optimizer.zero_grad();
    strata::xla::mark_step();
  }
}

// Note [Collectives in order] in src/xla_device/replicas.cpp: in the
// compiled step of xla_fsdp, each unit is gathered twice (before its
// forward and before its backward), and every collective after the first
// takes its input through an optimization barrier with the one before.
TEST(XlaFabricTest, XlaFsdpStepKeepsItsGathersApartAndInOrder) {
  if (!have_plugin()) GTEST_SKIP() << "no PJRT plugin found (set STRATA_PJRT_PLUGIN)";
  strata::xla::init();
  namespace fs = std::filesystem;
  const fs::path dump = fs::temp_directory_path() / ("strata-xla-order-" + std::to_string(::getpid()));
  fs::create_directories(dump);
  ::setenv("STRATA_XLA_DUMP_DIR", dump.c_str(), 1);
  auto options = strata::strategies::FSDPOptions().with_auto_wrap_policy(strata::strategies::ModuleTypes{"Linear"});
  auto strategy = std::make_shared<strata::strategies::XlaFSDPStrategy>(strata::strategies::make_accelerator("xla"),
                                                                        std::nullopt, options);
  Fabric fabric(FabricOptions().with_accelerator("xla").with_devices(2).with_strategy(strategy));
  fabric.launch([&](Fabric& f) { two_sgd_steps(f); });
  ::unsetenv("STRATA_XLA_DUMP_DIR");
  auto count = [](const std::string& text, const std::string& what) {
    int64_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  // The training step: the program with the most gathers.
  std::string step;
  for (const auto& entry : fs::directory_iterator(dump)) {
    if (entry.path().extension() != ".mlir") continue;
    std::ifstream in(entry.path());
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (count(text, "stablehlo.all_gather") > count(step, "stablehlo.all_gather")) step = text;
  }
  fs::remove_all(dump);
  const int64_t gathers = count(step, "stablehlo.all_gather");
  const int64_t collectives = gathers + count(step, "stablehlo.reduce_scatter") + count(step, "stablehlo.all_reduce");
  EXPECT_EQ(gathers, 4) << "two units, each gathered before its forward and again before its backward";
  EXPECT_EQ(count(step, "stablehlo.optimization_barrier"), collectives - 1) << step;
}

// XLAStrategy's debug: the ranks check each collective's description
// against each other's, and report each step's communication.
TEST(XlaFabricTest, XlaDebugReportsEachStepsCommunication) {
  if (!have_plugin()) GTEST_SKIP() << "no PJRT plugin found (set STRATA_PJRT_PLUGIN)";
  strata::xla::init();
  auto strategy = std::make_shared<strata::strategies::XlaStrategy>(
      strata::strategies::make_accelerator("xla"), std::nullopt, strata::strategies::DDPOptions().with_debug(true));
  Fabric fabric(FabricOptions().with_accelerator("xla").with_devices(2).with_strategy(strategy));
  ::testing::internal::CaptureStderr();
  fabric.launch([&](Fabric& f) {
    EXPECT_TRUE(f.strategy().group().debug());
    two_sgd_steps(f);
  });
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("[xla] step 1 communication: "), std::string::npos) << log;
  EXPECT_NE(log.find("[xla] step 2 communication: "), std::string::npos) << log;
  EXPECT_NE(log.find("all_reduce"), std::string::npos) << log;
}

// The seeds' methods on both xla strategies at 2 devices: collectives on
// xla tensors (recorded into the step) and on objects, barrier, the data
// loader, clipping, and a checkpoint saved, loaded and removed.
TEST(XlaFabricTest, EverySeedMethodWorksOnBothXlaStrategies) {
  if (!have_plugin()) GTEST_SKIP() << "no PJRT plugin found (set STRATA_PJRT_PLUGIN)";
  strata::xla::init();
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("strata-xla-seed-" + std::to_string(::getpid()))).string();
  for (const std::string spec : {"xla", "xla_fsdp"}) {
    SCOPED_TRACE(spec);
    Fabric fabric(FabricOptions().with_accelerator("xla").with_devices(2).with_strategy(spec));
    fabric.launch([&](Fabric& f) {
      strata::strategies::Strategy& s = f.strategy();
      const int r = f.global_rank();
      EXPECT_EQ(s.name(), spec);
      EXPECT_EQ(s.root_device(), strata::xla::device(r));
      EXPECT_EQ(s.world_size(), 2);

      // Collectives on xla tensors.
      const at::Tensor v = at::full({3}, r + 1.0).to(f.device());
      at::Tensor gathered = f.all_gather(v);
      at::Tensor sum = f.all_reduce(v, "sum");
      // XLAStrategy's seed names it reduce; xla_fsdp's (Fabric's) all_reduce.
      at::Tensor mean = spec == "xla" ? dynamic_cast<strata::strategies::XlaStrategy&>(s).reduce(v) : s.all_reduce(v);
      at::Tensor max = f.all_reduce(v, strata::comm::ReduceOp::kMax);
      at::Tensor from_one = f.broadcast(at::full({2, 2}, 10.0 * r).to(f.device()), 1);
      // sync_grads: d(sum over ranks of sum_k w_k x_k)/dx_r = world * w_r.
      at::Tensor x = at::full({3}, static_cast<double>(r)).to(f.device()).set_requires_grad(true);
      at::Tensor w = (at::arange(2, at::kFloat) + 1).unsqueeze(1).to(f.device());
      (f.all_gather(x, /*sync_grads=*/true) * w).sum().backward();
      strata::xla::mark_step();
      EXPECT_TRUE(gathered.cpu().equal(at::stack({at::full({3}, 1.0f), at::full({3}, 2.0f)})));
      EXPECT_TRUE(sum.cpu().equal(at::full({3}, 3.0f)));
      EXPECT_TRUE(mean.cpu().equal(at::full({3}, 1.5f)));
      EXPECT_TRUE(max.cpu().equal(at::full({3}, 2.0f)));
      EXPECT_TRUE(from_one.cpu().equal(at::full({2, 2}, 10.0f)));
      EXPECT_TRUE(x.grad().cpu().equal(at::full({3}, 2.0f * (r + 1))));
      // Objects and barriers meet between the ranks' threads.
      EXPECT_EQ(f.broadcast(std::string(r == 0 ? "from zero" : "x"), 0), "from zero");
      EXPECT_TRUE(s.reduce_boolean_decision(r == 0, /*all=*/false));
      EXPECT_FALSE(s.reduce_boolean_decision(r == 0, /*all=*/true));
      f.barrier("seed methods");

      // The data loader: each rank its half of the examples, on its device.
      auto dataset = std::make_shared<strata::data::TensorDataset>(at::arange(8, at::kFloat).view({8, 1}),
                                                                   at::arange(8, at::kFloat).view({8, 1}));
      strata::data::DistributedSampler sampler(dataset->size(), f.world_size(), r, /*shuffle=*/true, 3);
      auto loader = f.setup_dataloader(std::make_shared<strata::data::DataLoader>(dataset, sampler, 2, true));
      std::vector<float> seen;
      loader->reset();
      while (auto batch = loader->next()) {
        EXPECT_EQ(batch->input.device(), f.device());
        for (int64_t i = 0; i < batch->input.size(0); ++i) seen.push_back(batch->input[i].item<float>());
      }
      std::vector<std::vector<float>> all = s.group().all_gather_object(seen);
      std::set<float> every(all[0].begin(), all[0].end());
      every.insert(all[1].begin(), all[1].end());
      EXPECT_EQ(all[0].size(), 4u);
      EXPECT_EQ(every.size(), 8u) << "the ranks' halves are disjoint and cover the data";

      // A model, its optimizer, clipping, a step.
      torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
      {
        torch::NoGradGuard no_grad;
        for (auto& p : model->parameters()) p.fill_(0.25);
      }
      f.setup_module(model);
      for (const at::Tensor& p : model->parameters()) EXPECT_EQ(p.device(), f.device());
      torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
      f.setup_optimizer(optimizer);
      at::Tensor loss = model->forward(at::ones({2, 4}).to(f.device())).pow(2).sum();
      f.backward(loss);
      at::Tensor norm = f.clip_gradients(*model.ptr(), optimizer, 1.0);
      f.clip_gradients(*model.ptr(), optimizer, strata::ClipByValue{0.01});
      optimizer.step();
      optimizer.zero_grad();
      strata::xla::mark_step();
      EXPECT_GT(norm.item<double>(), 1.0) << "the norm before clipping";

      if (spec == "xla") {
        // no_backward_sync: each rank keeps its own gradient (of its own
        // input); the next synchronised backward averages what each rank
        // accumulated, as PyTorch's DDP does.
        auto last_grad = [&] { return model->parameters().front().grad().detach().cpu().clone(); };
        const at::Tensor input = at::full({2, 4}, r + 1.0).to(f.device());
        {
          strata::strategies::Scope no_sync = f.no_backward_sync(*model.ptr());
          f.backward(model->forward(input).sum());
        }
        strata::xla::mark_step();
        const at::Tensor own = last_grad();
        const std::vector<at::Tensor> owns = f.all_gather(std::vector<at::Tensor>{own.to(f.device())});
        strata::xla::mark_step();
        EXPECT_FALSE(owns[0].cpu()[0].equal(owns[0].cpu()[1])) << "each rank kept its own gradient";
        f.backward(model->forward(input).sum());
        strata::xla::mark_step();
        const at::Tensor synced = last_grad();
        const at::Tensor expected = owns[0].cpu()[0] + owns[0].cpu()[1];  // the mean of 2 x each rank's own
        EXPECT_TRUE(at::allclose(synced, expected, 1e-5, 1e-6)) << synced << " vs " << expected;
        optimizer.zero_grad();
      }

      // Save, load into a fresh model, remove.
      const std::string path = dir + "/" + spec;
      f.save(path, {{"model", model}, {"optimizer", optimizer}, {"step", 1}});
      torch::nn::Sequential fresh(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 2));
      f.setup_module(fresh);
      torch::optim::AdamW fresh_optimizer(fresh->parameters(), torch::optim::AdamWOptions(1e-2));
      f.setup_optimizer(fresh_optimizer);
      strata::strategies::State state{{"model", fresh}, {"optimizer", fresh_optimizer}, {"step", 0}};
      f.load(path, state);
      EXPECT_EQ(state.at("step").get<int>(), 1);
      auto a = model->parameters(), b = fresh->parameters();
      for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].cpu().equal(b[i].cpu())) << "parameter " << i;
      f.barrier();
      s.remove_checkpoint(path);
      EXPECT_FALSE(std::filesystem::exists(path));
    });
    EXPECT_FALSE(fabric.strategy().launched()) << "teardown after the launched function";
  }
  std::filesystem::remove_all(dir);
}

// A rank that fails stops the others at once (not at the collective
// timeout), and launch() throws its error.
TEST(XlaFabricTest, ARankThatFailsStopsTheOthersAndIsReported) {
  if (!have_plugin()) GTEST_SKIP() << "no PJRT plugin found (set STRATA_PJRT_PLUGIN)";
  strata::xla::init();
  Fabric fabric(FabricOptions().with_accelerator("xla").with_devices(2).with_strategy("xla"));
  const auto start = std::chrono::steady_clock::now();
  ::testing::internal::CaptureStderr();
  const std::string error = strata::testing::error_message([&] {
    fabric.launch([&](Fabric& f) {
      strata::xla::mark_step();  // step 0, ended together
      if (f.global_rank() == 1) throw strata::Error("rank 1 gives up");
      f.barrier("never met");
    });
  });
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(error, "rank 1 gives up");
  EXPECT_NE(log.find("[fabric] the 'xla' accelerator drives its devices from one process: 2 ranks as threads of "
                     "this one, on xla:0, xla:1"), std::string::npos) << log;
  EXPECT_NE(log.find("[fabric] rank 1 of 2 failed in step 1 (counting from 0): rank 1 gives up"), std::string::npos)
      << log;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

// Lightning's XLA complaint: a save inside `if (rank == 0)` hangs. Here
// the ranks wait at different points, which fails every rank at once
// (Note [Replicas that wait apart] in src/xla_device/meeting.cpp), on
// both strategies.
TEST(XlaFabricTest, ASaveThatOnlyRankZeroReachesFailsAtOnceInsteadOfHanging) {
  if (!have_plugin()) GTEST_SKIP() << "no PJRT plugin found (set STRATA_PJRT_PLUGIN)";
  strata::xla::init();
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("strata-xla-save-" + std::to_string(::getpid()))).string();
  for (const std::string spec : {"xla", "xla_fsdp"}) {
    SCOPED_TRACE(spec);
    Fabric fabric(FabricOptions()
                      .with_accelerator("xla")
                      .with_devices(2)
                      .with_strategy(spec)
                      .with_collective_timeout(std::chrono::minutes(10)));
    ::testing::internal::CaptureStderr();
    const std::string error = strata::testing::error_message([&] {
      fabric.launch([&](Fabric& f) {
        torch::nn::Sequential model(torch::nn::Linear(4, 2));
        f.setup_module(model);
        strata::xla::mark_step();
        strata::strategies::State state{{"model", model}, {"step", 1}};
        if (f.global_rank() == 0) f.save(dir + "/" + spec, state);
        f.barrier("after the save");
      });
    });
    const std::string log = ::testing::internal::GetCapturedStderr();
    EXPECT_NE(error.find("every rank must reach each collective (a checkpoint save, a barrier, a read of a device "
                         "value) at the same point of its code; a collective inside `if (rank == 0)` is the usual "
                         "cause"),
              std::string::npos)
        << error << "\n" << log;
    EXPECT_NE(log.find(" of 2 failed in step "), std::string::npos) << log;
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
