// FSDP units with several tensors in and out (the variadic hooked_forward),
// with and without activation checkpointing: training on 2 ranks equals
// training in one process.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <tuple>

#include "strata/core/module_hooks.h"
#include "strata/fabric/fabric.h"
#include "strata/strategies/fsdp.h"
#include "support/checks.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

using strata::Fabric;
using strata::FabricOptions;
using strata::strategies::FSDPOptions;
using strata::strategies::FSDPStrategy;
using strata::strategies::ModuleTypes;
using strata::testing::Checks;

// A unit that takes two streams and returns two.
struct TwoStreamImpl : torch::nn::Module {
  TwoStreamImpl() : torch::nn::Module("TwoStream") {
    f = register_module("f", torch::nn::Linear(8, 8));
    g = register_module("g", torch::nn::Linear(8, 8));
  }
  std::tuple<at::Tensor, at::Tensor> forward(const at::Tensor& x, const at::Tensor& h) {
    return strata::hooked_forward(
        *this,
        [this](const at::Tensor& x, const at::Tensor& h) {
          at::Tensor mixed = at::tanh(f->forward(x) + h);
          return std::make_tuple(mixed, g->forward(h) * at::sigmoid(x));
        },
        x, h);
  }
  torch::nn::Linear f{nullptr}, g{nullptr};
};
TORCH_MODULE(TwoStream);

struct NetImpl : torch::nn::Module {
  NetImpl() : torch::nn::Module("Net") {
    first = register_module("first", TwoStream());
    second = register_module("second", TwoStream());
    head = register_module("head", torch::nn::Linear(16, 1));
  }
  at::Tensor forward(const at::Tensor& x) {
    return strata::hooked_forward(*this, x, [this](const at::Tensor& in) {
      auto [a, b] = first->forward(in, at::zeros_like(in));
      auto [c, d] = second->forward(a, b);
      return head->forward(at::cat({c, d}, 1));
    });
  }
  TwoStream first{nullptr}, second{nullptr};
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Net);

std::pair<at::Tensor, at::Tensor> data() {
  at::Generator gen = at::detail::createCPUGenerator(3);
  at::Tensor x = at::randn({8, 8}, gen);
  return {x, x.sum(1, true).sin()};
}

// Trains 5 steps; the losses (mean over ranks) and the final parameters.
std::pair<std::vector<double>, std::vector<at::Tensor>> train(Fabric* fabric) {
  at::manual_seed(21);
  Net model;
  FSDPStrategy* fsdp = nullptr;
  if (fabric) {
    fabric->setup_module(model);
    fsdp = dynamic_cast<FSDPStrategy*>(&fabric->strategy());
  }
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.3).momentum(0.9));
  if (fabric) fabric->setup_optimizer(optimizer);
  auto [x, y] = data();
  int world = fabric ? fabric->world_size() : 1, rank = fabric ? fabric->global_rank() : 0;
  x = x.chunk(world)[rank];
  y = y.chunk(world)[rank];
  std::vector<double> losses;
  for (int step = 0; step < 5; ++step) {
    at::Tensor loss = (model->forward(x) - y).pow(2).mean();
    if (fabric) {
      fabric->backward(loss);
      loss = fabric->all_reduce(loss.detach());
    } else {
      loss.backward();
    }
    optimizer.step();
    optimizer.zero_grad();
    losses.push_back(loss.item<double>());
  }
  std::vector<at::Tensor> params;
  for (const auto& item : model->named_parameters()) {
    params.push_back(fsdp ? fsdp->full_parameter(item.key()) : item.value().detach().clone());
  }
  return {losses, params};
}

STRATA_WORKER(fsdp_multi_input_unit) {
  const bool checkpoint = args.at(0) == "checkpoint";
  auto reference = train(nullptr);
  FSDPOptions options = FSDPOptions().with_auto_wrap_policy(ModuleTypes{"TwoStream"});
  if (checkpoint) options.with_activation_checkpointing_policy({"TwoStream"});
  auto strategy = std::make_shared<FSDPStrategy>(strata::strategies::cpu_accelerator(), std::nullopt, options);
  strategy->set_collective_timeout(std::chrono::seconds(60));
  Fabric fabric(FabricOptions().with_strategy(strategy));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    auto [losses, params] = train(&f);
    c.expect(strategy->units().size() == 3, "two TwoStream units and the root");
    for (size_t i = 0; i < losses.size(); ++i) {
      c.expect(std::abs(losses[i] - reference.first[i]) < 1e-5,
               "step " + std::to_string(i) + ": loss " + std::to_string(losses[i]) + " vs " +
                   std::to_string(reference.first[i]));
    }
    c.expect(params.size() == reference.second.size(), "the same parameters");
    for (size_t i = 0; i < params.size() && i < reference.second.size(); ++i) {
      c.expect(at::allclose(params[i], reference.second[i], 1e-5, 1e-5), "parameter " + std::to_string(i));
    }
  });
  return c.result();
}

TEST(FSDPUnitsTest, AUnitWithTwoTensorsInAndOutTrainsAsOneProcessDoes) {
  auto run = strata::testing::run_workers(2, "fsdp_multi_input_unit", {"plain"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

TEST(FSDPUnitsTest, AMultiInputUnitRecomputedInBackwardTrainsAsOneProcessDoes) {
  auto run = strata::testing::run_workers(2, "fsdp_multi_input_unit", {"checkpoint"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

}  // namespace
