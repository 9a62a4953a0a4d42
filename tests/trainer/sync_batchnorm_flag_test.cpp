// The Trainer's sync_batchnorm flag (Lightning's) reaches a strategy
// object: with a DDP that broadcasts no buffers, the ranks' BatchNorm
// running statistics still agree after training at 2 ranks, since each is
// the global batch's (Note [Synchronised batch norm] in
// strategies/sync_batchnorm.cpp).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <string>

#include "strata/data/dataset.h"
#include "strata/strategies/ddp.h"
#include "strata/trainer/trainer.h"
#include "support/checks.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

using strata::strategies::DDPOptions;
using strata::strategies::DDPStrategy;
using strata::testing::Checks;

constexpr int kSteps = 3;
constexpr int64_t kBatch = 8;  // global

class LitNet : public strata::TrainModule {
 public:
  LitNet() {
    fc1 = register_module("fc1", torch::nn::Linear(4, 6));
    bn = register_module("bn", torch::nn::BatchNorm1d(6));
    fc2 = register_module("fc2", torch::nn::Linear(6, 1));
  }
  at::Tensor training_step(const strata::data::Batch& batch, int64_t) override {
    at::Tensor out = fc2->forward(at::relu(bn->forward(fc1->forward(batch.input))));
    return (out - batch.target).pow(2).mean();
  }
  strata::OptimizerConfig configure_optimizers() override {
    return strata::OptimizerConfig(std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.1)));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::BatchNorm1d bn{nullptr};
};

STRATA_WORKER(trainer_sync_batchnorm_flag) {
  const bool sync = args.at(0) == "sync";
  auto strategy = std::make_shared<DDPStrategy>(strata::strategies::cpu_accelerator(), std::nullopt,
                                                DDPOptions().with_broadcast_buffers(false));
  strata::Trainer trainer(strata::TrainerOptions()
                              .with_strategy(strategy)
                              .with_sync_batchnorm(sync)
                              .with_max_steps(kSteps)
                              .with_enable_checkpointing(false)
                              .with_enable_progress_bar(false)
                              .with_enable_model_summary(false)
                              .with_collective_timeout(std::chrono::seconds(60)));
  at::manual_seed(4);
  auto module = std::make_shared<LitNet>();
  // Rows with an offset growing along the dataset: the ranks' halves differ.
  at::Tensor x = at::randn({kSteps * kBatch, 4}, at::detail::createCPUGenerator(2)) +
                 at::arange(kSteps * kBatch, at::kFloat).unsqueeze(1) * 0.2;
  at::Tensor y = at::randn({kSteps * kBatch, 1}, at::detail::createCPUGenerator(3));
  trainer.fit(module, strata::DataSource(std::make_shared<strata::data::TensorDataset>(x, y),
                                         strata::DataOptions().with_batch_size(kBatch)));
  Checks c;
  c.rank = trainer.global_rank();
  c.expect(strategy->sync_batchnorm() == sync, "the Trainer's flag reached the strategy object");
  double drift = 0;
  for (const auto& item : module->named_buffers()) {
    at::Tensor both = strategy->all_gather(item.value().to(at::kDouble));
    drift = std::max(drift, (both[0] - both[1]).abs().max().item<double>());
  }
  if (sync) {
    c.expect(drift == 0.0, "the running statistics differ between the ranks by " + std::to_string(drift));
  } else {
    c.expect(drift > 1e-4, "without sync_batchnorm the running statistics should differ, got " +
                               std::to_string(drift));
  }
  return c.result();
}

TEST(TrainerSyncBatchNormTest, TheFlagMakesTheRanksRunningStatisticsTheGlobalBatchs) {
  auto run = strata::testing::run_workers(2, "trainer_sync_batchnorm_flag", {"sync"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

TEST(TrainerSyncBatchNormTest, WithoutTheFlagTheRanksStatisticsDiffer) {
  auto run = strata::testing::run_workers(2, "trainer_sync_batchnorm_flag", {"local"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

}  // namespace
