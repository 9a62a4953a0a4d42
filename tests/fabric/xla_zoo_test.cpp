// The model zoo (tests/support/zoo/), unchanged, on the `xla` accelerator at
// 2 devices (ranks as threads of this process), under `xla` and under
// `xla_fsdp` with the block types as units: ten steps through Fabric, each
// rank on its slice of the batch, from the weights one CPU process starts
// from. The losses and the final weights are that CPU process's on the
// whole batch, to rounding (Note [Zoo tolerances] in
// tests/xla_device/zoo_test.cpp); no op falls back to the CPU, a step runs
// at most two programs, and nothing is compiled after step 2. The MNIST net
// trains in eval mode (its dropout draws from each device's generator).
// The BatchNorm models (ResNet, DCGAN) normalise over each rank's slice on
// xla, so they are not in this comparison with one process. Skips without
// the CPU PJRT plugin or with fewer than 2 devices.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/fabric/fabric.h"
#include "strata/strategies/fsdp.h"
#include "strata/strategies/xla.h"
#include "strata/xla/device.h"
#include "support/zoo/llama.h"
#include "support/zoo/mnist.h"
#include "support/zoo/rnn_lm.h"
#include "support/zoo/vit.h"

namespace {

using strata::Fabric;
using strata::FabricOptions;

constexpr int kDevices = 2;
constexpr int kSteps = 10;
constexpr int64_t kBatch = 4;  // 2 rows a rank
// Note [Zoo tolerances] (tests/xla_device/zoo_test.cpp).
constexpr double kFirstStep = 1e-5, kLaterSteps = 1e-3;

/// One zoo model: how to build it, run it, its optimizer, batch and loss.
struct ZooCase {
  std::string name;
  std::function<std::shared_ptr<torch::nn::Module>()> build;
  std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)> forward;
  std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)> optimizer;
  std::pair<at::Tensor, at::Tensor> batch;
  std::function<at::Tensor(const at::Tensor&, const at::Tensor&)> loss;
};

template <class Impl>
std::function<at::Tensor(torch::nn::Module&, const at::Tensor&)> forward_of() {
  return [](torch::nn::Module& m, const at::Tensor& x) { return dynamic_cast<Impl&>(m).forward(x); };
}

std::unique_ptr<torch::optim::Optimizer> sgd(std::vector<at::Tensor> params) {
  return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(0.05).momentum(0.9));
}

std::unique_ptr<torch::optim::Optimizer> adamw(std::vector<at::Tensor> params) {
  return std::make_unique<torch::optim::AdamW>(std::move(params), torch::optim::AdamWOptions(1e-3));
}

ZooCase zoo_case(const std::string& name) {
  const zoo::llama::ModelArgs llama;
  const zoo::vit::ViTConfig vit;
  const zoo::rnn_lm::RNNConfig rnn;
  if (name == "mnist") {
    return {name,
            [] {
              auto net = std::make_shared<zoo::mnist::Net>();
              net->eval();
              return net;
            },
            forward_of<zoo::mnist::Net>(), sgd, zoo::mnist::batch(kBatch), zoo::mnist::loss};
  }
  if (name == "llama") {
    return {name, [llama] { return zoo::llama::Transformer(llama).ptr(); }, forward_of<zoo::llama::TransformerImpl>(),
            adamw, zoo::llama::batch(llama, kBatch), zoo::llama::loss};
  }
  if (name == "vit") {
    // SGD: the key part of MultiheadAttention's in_proj_bias has a gradient
    // of exactly zero in exact arithmetic (softmax ignores a constant added
    // to every score of a query), so what it gets is rounding, which
    // AdamW's division by its own magnitude turns into steps of a good part
    // of the learning rate, one way on one device count and the other way
    // on another (2e-3 apart after ten steps at 1e-3).
    return {name, [vit] { return zoo::vit::VisionTransformer(vit).ptr(); },
            forward_of<zoo::vit::VisionTransformerImpl>(), sgd, zoo::vit::batch(vit, kBatch), zoo::vit::loss};
  }
  if (name == "lstm") {
    return {name, [rnn] { return zoo::rnn_lm::LSTMModel(rnn).ptr(); }, forward_of<zoo::rnn_lm::LSTMModelImpl>(), sgd,
            zoo::rnn_lm::batch(rnn, kBatch), zoo::rnn_lm::loss};
  }
  return {name, [rnn] { return zoo::rnn_lm::GRUModel(rnn).ptr(); }, forward_of<zoo::rnn_lm::GRUModelImpl>(), sgd,
          zoo::rnn_lm::batch(rnn, kBatch), zoo::rnn_lm::loss};
}

const strata::strategies::ModuleTypes kBlocks{"TransformerBlock", "EncoderBlock", "LSTM", "GRU"};

struct Trained {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> params;  // full values, on the CPU
};

// One CPU process on the whole batch.
Trained on_the_cpu(const ZooCase& zc, const std::map<std::string, at::Tensor>& initial) {
  std::shared_ptr<torch::nn::Module> model = zc.build();
  {
    torch::NoGradGuard no_grad;
    for (auto& item : model->named_parameters()) item.value().copy_(initial.at(item.key()));
  }
  auto optimizer = zc.optimizer(model->parameters());
  Trained out;
  for (int step = 0; step < kSteps; ++step) {
    optimizer->zero_grad();
    at::Tensor loss = zc.loss(zc.forward(*model, zc.batch.first), zc.batch.second);
    loss.backward();
    optimizer->step();
    out.losses.push_back(loss.item<double>());
  }
  for (const auto& item : model->named_parameters()) out.params[item.key()] = item.value().detach().clone();
  return out;
}

class XlaZooRanksTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(XlaZooRanksTest, TrainsAsOneCpuProcessOnTheWholeBatchWithNoFallbackAndOneProgramAStep) {
  const auto& [strategy_name, model_name] = GetParam();
  try {
    if (strata::xla::find_plugin().path.empty()) GTEST_SKIP() << "no PJRT plugin found (set STRATA_PJRT_PLUGIN)";
  } catch (const strata::ConfigError& e) {
    GTEST_SKIP() << e.what();
  }
  strata::xla::init();
  if (strata::xla::device_count() < kDevices) GTEST_SKIP() << "the plugin addresses fewer than 2 devices";
  const ZooCase zc = zoo_case(model_name);
  at::manual_seed(11);
  std::map<std::string, at::Tensor> initial;
  for (const auto& item : zc.build()->named_parameters()) initial[item.key()] = item.value().detach().clone();
  const Trained want = on_the_cpu(zc, initial);

  std::shared_ptr<strata::strategies::Strategy> strategy;
  auto accelerator = strata::strategies::make_accelerator("xla");
  if (strategy_name == "xla") {
    strategy = std::make_shared<strata::strategies::XlaStrategy>(accelerator);
  } else {
    strategy = std::make_shared<strata::strategies::XlaFSDPStrategy>(
        accelerator, std::nullopt, strata::strategies::FSDPOptions().with_auto_wrap_policy(kBlocks));
  }
  Fabric fabric(FabricOptions().with_accelerator("xla").with_devices(kDevices).with_strategy(strategy));
  std::vector<Trained> got(kDevices);
  std::vector<int64_t> executions, compiles;
  strata::xla::reset_metrics();
  fabric.launch([&](Fabric& f) {
    const int rank = f.global_rank();
    std::shared_ptr<torch::nn::Module> model = zc.build();
    {
      torch::NoGradGuard no_grad;
      for (auto& item : model->named_parameters()) item.value().copy_(initial.at(item.key()));
    }
    f.setup_module(model);
    auto optimizer = zc.optimizer(model->parameters());
    f.setup_optimizer(*optimizer);
    const at::Tensor input = zc.batch.first.chunk(kDevices)[rank].to(f.device());
    const at::Tensor target = zc.batch.second.chunk(kDevices)[rank].to(f.device());
    for (int step = 0; step < kSteps; ++step) {
      // Every rank's thread runs its step between the barriers, so rank 0
      // counts the programs of the step of all of them.
      f.barrier();
      const strata::xla::Metrics before = strata::xla::metrics();
      optimizer->zero_grad();
      at::Tensor loss = zc.loss(zc.forward(*model, input), target);
      f.backward(loss);
      optimizer->step();
      const at::Tensor mean = f.all_reduce(loss.detach(), "mean");
      strata::xla::mark_step();
      got[rank].losses.push_back(mean.item<double>());
      f.barrier();
      if (rank == 0) {
        const strata::xla::Metrics after = strata::xla::metrics();
        executions.push_back(after.executions - before.executions);
        compiles.push_back(after.compiles - before.compiles);
      }
    }
    auto* fsdp = dynamic_cast<strata::strategies::FSDPStrategy*>(&f.strategy());
    for (const auto& item : model->named_parameters()) {
      got[rank].params[item.key()] =
          (fsdp ? fsdp->full_parameter(*model, item.key()) : item.value().detach()).cpu().clone();
    }
  });

  const strata::xla::Metrics m = strata::xla::metrics();
  std::printf("%s %s: %s\n", strategy_name.c_str(), model_name.c_str(), strata::xla::summary(m).c_str());
  std::string fallbacks;
  for (const auto& [op, n] : m.fallbacks) fallbacks += (fallbacks.empty() ? "" : ", ") + op + " x" + std::to_string(n);
  EXPECT_EQ(fallbacks, "") << "ops that fell back to the CPU";
  ASSERT_EQ(executions.size(), static_cast<size_t>(kSteps));
  for (int i = 0; i < kSteps; ++i) {
    EXPECT_LE(executions[i], 2) << "programs run in step " << i;
    if (i >= 2) EXPECT_EQ(compiles[i], 0) << "programs compiled in step " << i;
  }
  for (int r = 0; r < kDevices; ++r) {
    ASSERT_EQ(got[r].losses.size(), want.losses.size()) << "rank " << r;
    for (int i = 0; i < kSteps; ++i) {
      const double b = want.losses[i];
      const double tol = (i == 0 ? kFirstStep : kLaterSteps) * std::max(1.0, std::abs(b));
      EXPECT_NEAR(got[r].losses[i], b, tol) << "rank " << r << " step " << i;
    }
    ASSERT_EQ(got[r].params.size(), want.params.size()) << "rank " << r;
    for (const auto& [name, value] : want.params) {
      const at::Tensor& mine = got[r].params.at(name);
      ASSERT_EQ(mine.sizes(), value.sizes()) << name;
      const double diff = (mine - value).abs().max().item<double>();
      EXPECT_LE(diff, kLaterSteps * std::max(1.0, value.abs().max().item<double>())) << name << " rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Zoo, XlaZooRanksTest,
                         ::testing::Combine(::testing::Values("xla", "xla_fsdp"),
                                            ::testing::Values("mnist", "llama", "vit", "lstm", "gru")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

}  // namespace
