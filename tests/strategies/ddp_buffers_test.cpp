// DDP's buffers at 2 ranks (Note [Buffers from rank 0] in ddp.cpp): with
// broadcast_buffers (the default) BatchNorm's running statistics are equal
// on every rank after each step and are what rank 0 computes when every
// forward starts from its buffers, checked against one process that plays
// both ranks (two replicas, gradients averaged, rank 0's buffers copied
// to rank 1 after each step). Without it they drift apart.
#include <gtest/gtest.h>

#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>
#include <torch/optim/sgd.h>

#include <string>
#include <vector>

#include "strata/strategies/ddp.h"
#include "support/checks.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

using strata::strategies::DDPOptions;
using strata::strategies::DDPStrategy;
using strata::testing::Checks;

constexpr int kSteps = 3;
constexpr int64_t kPerRank = 6;

struct NetImpl : torch::nn::Module {
  NetImpl() {
    fc1 = register_module("fc1", torch::nn::Linear(4, 8));
    bn = register_module("bn", torch::nn::BatchNorm1d(8));
    fc2 = register_module("fc2", torch::nn::Linear(8, 1));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2->forward(at::relu(bn->forward(fc1->forward(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};
TORCH_MODULE(Net);

// Step s of rank r: inputs with a per-rank offset and scale, so that the
// ranks' batch statistics differ.
at::Tensor inputs(int step, int rank) {
  at::Generator gen = at::detail::createCPUGenerator(10 * step + rank);
  return at::randn({kPerRank, 4}, gen) * (1.0 + rank) + 0.5 * rank;
}
at::Tensor targets(int step, int rank) {
  at::Generator gen = at::detail::createCPUGenerator(1000 + 10 * step + rank);
  return at::randn({kPerRank, 1}, gen);
}

Net make_net() {
  at::manual_seed(7);
  return Net();
}

// Both ranks in one process: each replica's gradient halved, then summed
// (DDP's average at 2 ranks), one SGD step on replica 0 copied to replica
// 1, and replica 0's buffers copied to replica 1 (the broadcast).
Net reference() {
  Net replicas[2] = {make_net(), make_net()};
  torch::optim::SGD opt(replicas[0]->parameters(), torch::optim::SGDOptions(0.1));
  for (int step = 0; step < kSteps; ++step) {
    for (int r = 0; r < 2; ++r) {
      replicas[r]->zero_grad();
      at::Tensor loss = (replicas[r]->forward(inputs(step, r)) - targets(step, r)).pow(2).mean();
      loss.backward();
    }
    torch::NoGradGuard no_grad;
    std::vector<at::Tensor> p0 = replicas[0]->parameters(), p1 = replicas[1]->parameters();
    for (size_t i = 0; i < p0.size(); ++i) p0[i].mutable_grad() = p0[i].grad().mul(0.5).add(p1[i].grad().mul(0.5));
    opt.step();
    for (size_t i = 0; i < p0.size(); ++i) p1[i].copy_(p0[i]);
    std::vector<at::Tensor> b0 = replicas[0]->buffers(), b1 = replicas[1]->buffers();
    for (size_t i = 0; i < b0.size(); ++i) b1[i].copy_(b0[i]);
  }
  return replicas[0];
}

STRATA_WORKER(ddp_batchnorm_buffers) {
  const bool broadcast = args.at(0) == "broadcast";
  DDPStrategy strategy(strata::strategies::cpu_accelerator(), std::nullopt,
                       DDPOptions().with_broadcast_buffers(broadcast));
  strategy.setup_environment();
  Checks c;
  c.rank = strategy.global_rank();
  Net model = make_net();
  strategy.setup_module(model.ptr());
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  strategy.setup_optimizer(opt);
  for (int step = 0; step < kSteps; ++step) {
    opt.zero_grad();
    at::Tensor loss = (model->forward(inputs(step, c.rank)) - targets(step, c.rank)).pow(2).mean();
    strategy.backward(loss);
    strategy.optimizer_step(opt);
  }
  // The largest difference of each buffer between the ranks.
  double drift = 0.0;
  for (const auto& item : model->named_buffers()) {
    at::Tensor both = strategy.all_gather(item.value().to(at::kDouble));
    drift = std::max(drift, (both[0] - both[1]).abs().max().item<double>());
  }
  if (!broadcast) {
    c.expect(drift > 1e-4, "without broadcast_buffers the running statistics drift apart, got " +
                               std::to_string(drift));
    return c.result();
  }
  c.expect(drift == 0.0, "the buffers differ between the ranks by " + std::to_string(drift));
  Net expected = reference();
  for (const auto& item : expected->named_buffers()) {
    const at::Tensor mine = model->named_buffers()[item.key()];
    c.expect(at::allclose(mine, item.value(), 1e-6, 1e-7), "buffer " + item.key() + " is not rank 0's own");
  }
  for (const auto& item : expected->named_parameters()) {
    const at::Tensor mine = model->named_parameters()[item.key()];
    c.expect(at::allclose(mine, item.value(), 1e-6, 1e-7), "parameter " + item.key() + " differs from the reference");
  }
  c.expect(model->bn->num_batches_tracked.item<int64_t>() == kSteps, "num_batches_tracked counts the steps");
  strategy.teardown();
  return c.result();
}

TEST(DDPBuffersTest, BatchNormStatisticsAreRankZerosOnEveryRankAfterEachStep) {
  auto run = strata::testing::run_workers(2, "ddp_batchnorm_buffers", {"broadcast"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

TEST(DDPBuffersTest, WithoutBroadcastBuffersTheStatisticsDriftApart) {
  auto run = strata::testing::run_workers(2, "ddp_batchnorm_buffers", {"local"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

}  // namespace
