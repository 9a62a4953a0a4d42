// sync_batchnorm (Note [Synchronised batch norm] in
// strategies/sync_batchnorm.cpp): at 2 ranks, each on its half of every
// global batch, a model with BatchNorm1d and BatchNorm2d layers trains as
// one process on the whole batch (loss, parameters, running statistics)
// under ddp and fsdp; a batch norm the option did not register computes
// LibTorch's own bits, before and after the kernel is in place.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/batch_norm_native.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <string>
#include <vector>

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
using strata::strategies::DDPOptions;
using strata::strategies::DDPStrategy;
using strata::strategies::FSDPOptions;
using strata::strategies::FSDPStrategy;
using strata::testing::Checks;

constexpr int kSteps = 3;
constexpr int64_t kBatch = 8;  // global

// conv -> BatchNorm2d -> relu -> flatten -> linear -> BatchNorm1d -> relu -> linear.
struct NetImpl : torch::nn::Module {
  NetImpl() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(2, 3, 3).padding(1)));
    bn2 = register_module("bn2", torch::nn::BatchNorm2d(3));
    fc1 = register_module("fc1", torch::nn::Linear(3 * 4 * 4, 5));
    bn1 = register_module("bn1", torch::nn::BatchNorm1d(5));
    fc2 = register_module("fc2", torch::nn::Linear(5, 1));
  }
  at::Tensor forward(const at::Tensor& x) {
    // Through hooked_forward, so that under fsdp the whole model is a unit.
    return strata::hooked_forward(*this, x, [this](const at::Tensor& in) {
      at::Tensor h = at::relu(bn2->forward(conv->forward(in))).flatten(1);
      return fc2->forward(at::relu(bn1->forward(fc1->forward(h))));
    });
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::BatchNorm2d bn2{nullptr};
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn1{nullptr};
};
TORCH_MODULE(Net);

// Inputs with a per-row offset, so that the two halves' statistics differ.
at::Tensor inputs(int step) {
  at::Generator gen = at::detail::createCPUGenerator(30 + step);
  return at::randn({kBatch, 2, 4, 4}, gen) + at::arange(kBatch, at::kFloat).view({kBatch, 1, 1, 1}) * 0.3;
}
at::Tensor targets(int step) { return at::randn({kBatch, 1}, at::detail::createCPUGenerator(60 + step)); }

struct Trained {
  std::vector<double> losses;
  std::map<std::string, at::Tensor> state;  // parameters and buffers, full
};

// kSteps of SGD on this rank's share (all of it without a fabric).
Trained train(Fabric* fabric, Net model) {
  const int world = fabric ? fabric->world_size() : 1, rank = fabric ? fabric->global_rank() : 0;
  if (fabric) model = fabric->setup_module(model);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.5));
  if (fabric) fabric->setup_optimizer(opt);
  Trained out;
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    at::Tensor loss =
        (model->forward(inputs(step).chunk(world)[rank]) - targets(step).chunk(world)[rank]).pow(2).mean();
    if (fabric) {
      fabric->backward(loss);
      out.losses.push_back(fabric->all_reduce(loss.detach()).item<double>());
    } else {
      loss.backward();
      out.losses.push_back(loss.item<double>());
    }
    opt.step();
  }
  auto* fsdp = fabric ? dynamic_cast<FSDPStrategy*>(&fabric->strategy()) : nullptr;
  for (const auto& item : model->named_parameters()) {
    out.state[item.key()] = fsdp ? fsdp->full_parameter(*model, item.key()) : item.value().detach().clone();
  }
  for (const auto& item : model->named_buffers()) out.state[item.key()] = item.value().clone();
  return out;
}

Net make_net() {
  at::manual_seed(11);
  return Net();
}

STRATA_WORKER(sync_batchnorm_against_one_process) {
  const std::string kind = args.at(0);
  const Trained expected = train(nullptr, make_net());
  std::shared_ptr<strata::strategies::Strategy> strategy;
  if (kind == "fsdp") {
    strategy = std::make_shared<FSDPStrategy>(strata::strategies::cpu_accelerator(), std::nullopt,
                                              FSDPOptions().with_sync_batchnorm(true));
  } else {
    strategy = std::make_shared<DDPStrategy>(strata::strategies::cpu_accelerator(), std::nullopt,
                                             DDPOptions().with_sync_batchnorm(true));
  }
  strategy->set_collective_timeout(std::chrono::seconds(60));
  Fabric fabric(FabricOptions().with_strategy(strategy));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    const Trained got = train(&f, make_net());
    for (size_t i = 0; i < got.losses.size() && i < expected.losses.size(); ++i) {
      c.expect(std::abs(got.losses[i] - expected.losses[i]) < 1e-5,
               kind + ": loss " + std::to_string(i) + ": " + std::to_string(got.losses[i]) + " vs " +
                   std::to_string(expected.losses[i]));
    }
    for (const auto& [name, want] : expected.state) {
      auto it = got.state.find(name);
      c.expect(it != got.state.end(), kind + ": no " + name);
      if (it == got.state.end()) continue;
      c.expect(at::allclose(it->second.to(at::kDouble), want.to(at::kDouble), 1e-4, 1e-5),
               kind + ": " + name + " differs from one process's by " +
                   std::to_string((it->second.to(at::kDouble) - want.to(at::kDouble)).abs().max().item<double>()));
    }
  });
  return c.result();
}

TEST(SyncBatchNormTest, DdpTrainsAsOneProcessOnTheWholeBatch) {
  auto run = strata::testing::run_workers(2, "sync_batchnorm_against_one_process", {"ddp"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

TEST(SyncBatchNormTest, FsdpTrainsAsOneProcessOnTheWholeBatch) {
  auto run = strata::testing::run_workers(2, "sync_batchnorm_against_one_process", {"fsdp"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

// Forward and backward of a batch norm layer no strategy registered.
std::vector<at::Tensor> plain_batch_norm() {
  at::manual_seed(5);
  torch::nn::BatchNorm2d bn(3);
  at::Tensor x = (at::randn({4, 3, 2, 2}, at::detail::createCPUGenerator(9)) * 3 + 1).requires_grad_();
  at::Tensor y = bn->forward(x);
  (y * at::arange(y.numel(), at::kFloat).view(y.sizes())).sum().backward();
  return {y.detach(), x.grad(), bn->weight.grad(), bn->bias.grad(), bn->running_mean.clone(),
          bn->running_var.clone()};
}

STRATA_WORKER(sync_batchnorm_leaves_other_layers) {
  const std::vector<at::Tensor> before = plain_batch_norm();
  auto strategy = std::make_shared<DDPStrategy>(strata::strategies::cpu_accelerator(), std::nullopt,
                                                DDPOptions().with_sync_batchnorm(true));
  strategy->set_collective_timeout(std::chrono::seconds(60));
  Fabric fabric(FabricOptions().with_strategy(strategy));
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    Net model = f.setup_module(make_net());
    const c10::OperatorHandle op = c10::Dispatcher::singleton().findSchemaOrThrow("aten::batch_norm", "");
    c.expect(op.hasKernelForDispatchKey(c10::DispatchKey::AutogradCPU), "the AutogradCPU kernel is registered");
    const std::vector<at::Tensor> after = plain_batch_norm();
    for (size_t i = 0; i < before.size(); ++i) {
      c.expect(at::equal(before[i], after[i]), "tensor " + std::to_string(i) + " of an unregistered batch norm "
                                               "changed once the kernel is in place");
    }
    // A registered layer in eval mode uses its running statistics: LibTorch's own too.
    model->eval();
    at::Tensor x = at::randn({2, 3, 4, 4});
    at::Tensor mine = model->bn2->forward(x);
    at::Tensor own = at::native::batch_norm(x, model->bn2->weight, model->bn2->bias, model->bn2->running_mean,
                                            model->bn2->running_var, false, 0.1, 1e-5, true);
    c.expect(at::equal(mine, own), "a registered layer in eval mode is LibTorch's batch norm");
  });
  return c.result();
}

TEST(SyncBatchNormTest, ABatchNormNotRegisteredComputesLibTorchsOwnBits) {
  auto run = strata::testing::run_workers(2, "sync_batchnorm_leaves_other_layers");
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

}  // namespace
