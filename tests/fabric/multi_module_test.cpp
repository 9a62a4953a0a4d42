// Several modules on one strategy (a generator and a critic trained in
// alternation, as a Lightning user sets up a GAN): each has its own hooks
// or units, optimizer and checkpoint entries, and training on 2 ranks
// equals training in one process, under DDP and FSDP.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <filesystem>

#include <unistd.h>

#include "strata/core/error.h"
#include "strata/core/module_hooks.h"
#include "strata/fabric/fabric.h"
#include "strata/strategies/ddp.h"
#include "strata/strategies/fsdp.h"
#include "support/checks.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

using strata::Fabric;
using strata::FabricOptions;
using strata::strategies::FSDPStrategy;
using strata::testing::Checks;

// Two layers; its forward runs through hooked_forward, so under FSDP the
// whole module is a unit.
struct TwoLayerImpl : torch::nn::Module {
  TwoLayerImpl(int64_t in, int64_t hidden, int64_t out) {
    a = register_module("a", torch::nn::Linear(in, hidden));
    b = register_module("b", torch::nn::Linear(hidden, out));
  }
  at::Tensor forward(const at::Tensor& x) {
    return strata::hooked_forward(*this, x, [this](const at::Tensor& in) { return b->forward(at::tanh(a->forward(in))); });
  }
  torch::nn::Linear a{nullptr}, b{nullptr};
};
TORCH_MODULE(TwoLayer);

struct Result {
  std::vector<double> losses;
  std::vector<at::Tensor> params;  // generator's, then critic's, full values
  std::string refusal;              // of full_parameter by a name both modules have (fsdp)
};

// Alternating steps: the critic learns to tell real from generated
// samples, then the generator learns to fool it.
Result train(Fabric* fabric) {
  at::manual_seed(8);
  TwoLayer generator(4, 16, 6), critic(6, 16, 1);
  if (fabric) {
    fabric->setup_module(generator);
    fabric->setup_module(critic);
  }
  torch::optim::SGD opt_g(generator->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  torch::optim::SGD opt_c(critic->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  if (fabric) fabric->setup_optimizers({&opt_g, &opt_c});
  at::Generator gen = at::detail::createCPUGenerator(5);
  at::Tensor real = at::randn({8, 6}, gen) * 0.5 + 1.0;
  at::Tensor noise = at::randn({8, 4}, gen);
  const int world = fabric ? fabric->world_size() : 1, rank = fabric ? fabric->global_rank() : 0;
  real = real.chunk(world)[rank];
  noise = noise.chunk(world)[rank];
  auto backward = [&](const at::Tensor& loss) {
    if (fabric) {
      fabric->backward(loss);
    } else {
      loss.backward();
    }
  };
  auto mean = [&](const at::Tensor& loss) {
    return fabric ? fabric->all_reduce(loss.detach()).item<double>() : loss.item<double>();
  };
  Result result;
  for (int step = 0; step < 4; ++step) {
    opt_c.zero_grad();
    at::Tensor fake = generator->forward(noise).detach();
    at::Tensor loss_c = (critic->forward(real) - 1).pow(2).mean() + critic->forward(fake).pow(2).mean();
    backward(loss_c);
    opt_c.step();
    result.losses.push_back(mean(loss_c));

    opt_g.zero_grad();
    opt_c.zero_grad();
    at::Tensor loss_g = (critic->forward(generator->forward(noise)) - 1).pow(2).mean();
    backward(loss_g);
    opt_g.step();
    result.losses.push_back(mean(loss_g));
  }
  auto* fsdp = fabric ? dynamic_cast<FSDPStrategy*>(&fabric->strategy()) : nullptr;
  if (fsdp) {
    // Both modules have an "a.weight": the name alone does not say whose.
    std::string refused;
    try {
      (void)fsdp->full_parameter("a.weight");
    } catch (const strata::ConfigError& e) {
      refused = e.what();
    }
    result.refusal = refused;
  }
  for (TwoLayer* m : {&generator, &critic}) {
    for (const auto& item : (*m)->named_parameters()) {
      result.params.push_back(fsdp ? fsdp->full_parameter(**m, item.key()) : item.value().detach().clone());
    }
  }
  return result;
}

STRATA_WORKER(two_modules_alternating) {
  const std::string kind = args.at(0);
  Result reference = train(nullptr);
  std::shared_ptr<strata::strategies::Strategy> strategy;
  if (kind == "fsdp") {
    strategy = std::make_shared<FSDPStrategy>();
  } else {
    strategy = std::make_shared<strata::strategies::DDPStrategy>();
  }
  strategy->set_collective_timeout(std::chrono::seconds(60));
  Fabric fabric(FabricOptions().with_strategy(strategy));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    Result result = train(&f);
    c.expect(result.losses.size() == reference.losses.size(), "as many steps");
    for (size_t i = 0; i < result.losses.size() && i < reference.losses.size(); ++i) {
      c.expect(std::abs(result.losses[i] - reference.losses[i]) < 1e-5,
               "loss " + std::to_string(i) + ": " + std::to_string(result.losses[i]) + " vs " +
                   std::to_string(reference.losses[i]));
    }
    if (kind == "fsdp") {
      c.expect(result.refusal == "[fsdp] full_parameter('a.weight'): 2 modules set up by this strategy have a "
                                 "parameter of that name; say which with full_parameter(module, name), the module "
                                 "one that setup_module returned",
               "full_parameter by an ambiguous name: " + result.refusal);
    }
    c.expect(result.params.size() == reference.params.size(), "the same parameters");
    for (size_t i = 0; i < result.params.size() && i < reference.params.size(); ++i) {
      c.expect(at::allclose(result.params[i], reference.params[i], 1e-5, 1e-5), "parameter " + std::to_string(i));
    }
  });
  return c.result();
}

TEST(MultiModuleTest, TwoModulesTrainedInAlternationUnderDdpEqualOneProcess) {
  auto run = strata::testing::run_workers(2, "two_modules_alternating", {"ddp"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

TEST(MultiModuleTest, TwoModulesTrainedInAlternationUnderFsdpEqualOneProcess) {
  auto run = strata::testing::run_workers(2, "two_modules_alternating", {"fsdp"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

}  // namespace
