// The Trainer takes what a LibTorch user has: a TrainModule held by value
// (Note [Modules held by value] in strategies/strategy.h), declared after
// the Trainer so it is gone first, and a `torch::data` dataset `.map()`ped
// with Stack<> as a DataSource (data/torch_dataset.h). At 1 and 2 ranks
// (ddp and fsdp) the steps see the global batches of strata's sampler.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/data/datasets/base.h>
#include <torch/data/datasets/map.h>
#include <torch/data/transforms/stack.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <memory>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/data/distributed_sampler.h"
#include "strata/strategies/ddp.h"
#include "strata/strategies/fsdp.h"
#include "strata/strategies/single_device.h"
#include "strata/trainer/trainer.h"
#include "support/checks.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

using strata::testing::Checks;

constexpr size_t kExamples = 16;
constexpr int64_t kBatch = 4;  // global
constexpr uint64_t kSeed = 5;
constexpr int64_t kEpochs = 2;

// Example i: input [i, i, i], target [i / 10].
class Ramp : public torch::data::datasets::Dataset<Ramp> {
 public:
  torch::data::Example<> get(size_t index) override {
    const auto i = static_cast<float>(index);
    return {at::full({3}, i), at::full({1}, i / 10.0f)};
  }
  std::optional<size_t> size() const override { return kExamples; }
};

// Records the global batch of every step: the example ids of all ranks,
// row j of rank r at j * world + r.
class Regression : public strata::TrainModule {
 public:
  Regression() { linear = register_module("linear", torch::nn::Linear(3, 1)); }
  at::Tensor training_step(const strata::data::Batch& batch, int64_t) override {
    at::Tensor all = trainer()->strategy().all_gather(batch.input.select(1, 0).contiguous());
    steps.push_back(all.transpose(0, 1).reshape({-1}).to(at::kLong));
    return (linear->forward(batch.input) - batch.target).pow(2).mean();
  }
  strata::OptimizerConfig configure_optimizers() override {
    return strata::OptimizerConfig(std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01)));
  }
  torch::nn::Linear linear{nullptr};
  std::vector<at::Tensor> steps;
};

strata::TrainerOptions options(std::shared_ptr<strata::strategies::Strategy> strategy) {
  strata::TrainerOptions o;
  o.with_strategy(std::move(strategy))
      .with_max_epochs(kEpochs)
      .with_enable_checkpointing(false)
      .with_enable_progress_bar(false)
      .with_enable_model_summary(false)
      .with_collective_timeout(std::chrono::seconds(60));
  return o;
}

strata::DataSource ramp() {
  return strata::DataSource(Ramp().map(torch::data::transforms::Stack<>()),
                            strata::DataOptions().with_batch_size(kBatch).with_shuffle(true).with_seed(kSeed));
}

int fit_and_check(std::shared_ptr<strata::strategies::Strategy> strategy) {
  Checks c;
  strata::Trainer trainer(options(std::move(strategy)));
  Regression module;  // by value, gone before the Trainer
  trainer.fit(module, ramp());
  c.rank = trainer.global_rank();
  std::vector<int64_t> expected;
  for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
    for (size_t i : strata::data::DistributedSampler::permutation(kExamples, kSeed + epoch)) {
      expected.push_back(static_cast<int64_t>(i));
    }
  }
  c.expect(module.steps.size() == kEpochs * kExamples / kBatch,
           std::to_string(module.steps.size()) + " steps, expected " + std::to_string(kEpochs * kExamples / kBatch));
  std::vector<int64_t> seen;
  for (const at::Tensor& ids : module.steps) {
    for (int64_t k = 0; k < ids.numel(); ++k) seen.push_back(ids[k].item<int64_t>());
  }
  c.expect(seen == expected, "the steps' global batches are not the sampler's");
  c.expect(trainer.global_step() == kEpochs * static_cast<int64_t>(kExamples) / kBatch, "global_step");
  return c.result();
}

STRATA_WORKER(trainer_libtorch_idioms) {
  if (args.at(0) == "fsdp") return fit_and_check(std::make_shared<strata::strategies::FSDPStrategy>());
  return fit_and_check(std::make_shared<strata::strategies::DDPStrategy>());
}

TEST(TrainerLibTorchIdiomsTest, AModuleHeldByValueTrainsOnATorchDatasetInOneProcess) {
  EXPECT_EQ(fit_and_check(std::make_shared<strata::strategies::SingleDeviceStrategy>()), 0);
}

TEST(TrainerLibTorchIdiomsTest, TwoRanksSeeTheSameGlobalBatchesOfATorchDataset) {
  auto run = strata::testing::run_workers(2, "trainer_libtorch_idioms", {"ddp"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

TEST(TrainerLibTorchIdiomsTest, UnderFsdpAModuleHeldByValueGoneBeforeTheTrainerTrainsOnTheSameBatches) {
  auto run = strata::testing::run_workers(2, "trainer_libtorch_idioms", {"fsdp"});
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

}  // namespace
