// A LibTorch user's `torch::data` dataset reaches Fabric::setup_dataloader
// as it is (data/torch_dataset.h): their own Dataset<Self>, and the same
// `.map()`ped with a TensorLambda and Stack<>. At 1 and 2 workers the ranks'
// batches together are the global batches of strata's sampler (the
// permutation of seed + epoch, cut into batch_size pieces), with the
// transforms applied, over two shuffled epochs.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/data/datasets/base.h>
#include <torch/data/datasets/map.h>
#include <torch/data/transforms/stack.h>
#include <torch/data/transforms/tensor.h>

#include <memory>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/data/distributed_sampler.h"
#include "strata/data/torch_dataset.h"
#include "strata/fabric/fabric.h"
#include "strata/strategies/ddp.h"
#include "support/checks.h"
#include "support/multiprocess.h"
#include "support/worker.h"

namespace {

using strata::Fabric;
using strata::FabricOptions;
using strata::testing::Checks;

constexpr size_t kExamples = 20;
constexpr int64_t kBatch = 4;  // global
constexpr uint64_t kSeed = 3;
constexpr int kEpochs = 2;

// Example i: input [i, i, i], target [i * i].
class Squares : public torch::data::datasets::Dataset<Squares> {
 public:
  torch::data::Example<> get(size_t index) override {
    const auto i = static_cast<float>(index);
    return {at::full({3}, i), at::full({1}, i * i)};
  }
  std::optional<size_t> size() const override { return kExamples; }
};

strata::data::DataOptions options() {
  return strata::data::DataOptions().with_batch_size(kBatch).with_shuffle(true).with_seed(kSeed);
}

// The global batches of both epochs, the input normalized ((x - 0.5) / 2,
// the TensorLambda) or not, from the sampler's permutation.
std::vector<strata::data::Batch> expected_batches(bool normalized) {
  std::vector<strata::data::Batch> out;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    const std::vector<size_t> order = strata::data::DistributedSampler::permutation(kExamples, kSeed + epoch);
    for (size_t start = 0; start < kExamples; start += kBatch) {
      std::vector<at::Tensor> in, target;
      for (size_t k = start; k < start + kBatch; ++k) {
        const auto i = static_cast<float>(order[k]);
        in.push_back(at::full({3}, normalized ? (i - 0.5f) / 2.0f : i));
        target.push_back(at::full({1}, i * i));
      }
      out.push_back({at::stack(in), at::stack(target)});
    }
  }
  return out;
}

// Every batch of both epochs on this rank, gathered from all ranks into
// the global batch (rank r's row j is the global row j * world + r).
std::vector<strata::data::Batch> global_batches(Fabric& f, const std::shared_ptr<strata::data::Loader>& loader) {
  std::vector<strata::data::Batch> out;
  for (int epoch = 0; epoch < kEpochs; ++epoch) {
    loader->set_epoch(epoch);
    for (strata::data::Batch& batch : *loader) {
      auto interleave = [&](const at::Tensor& t) {
        at::Tensor all = f.all_gather(t);  // [world, rows, ...]
        return all.transpose(0, 1).reshape({-1, t.size(1)});
      };
      out.push_back({interleave(batch.input), interleave(batch.target)});
    }
  }
  return out;
}

void compare(Checks& c, const std::vector<strata::data::Batch>& got, const std::vector<strata::data::Batch>& want,
             const std::string& what) {
  c.expect(got.size() == want.size(), what + ": " + std::to_string(got.size()) + " batches, expected " +
                                           std::to_string(want.size()));
  for (size_t k = 0; k < got.size() && k < want.size(); ++k) {
    c.expect(at::equal(got[k].input, want[k].input) && at::equal(got[k].target, want[k].target),
             what + ": global batch " + std::to_string(k) + " differs");
  }
}

int check_loaders(Fabric& fabric) {
  Checks c;
  fabric.launch([&](Fabric& f) {
    c.rank = f.global_rank();
    compare(c, global_batches(f, f.setup_dataloader(Squares(), options())), expected_batches(false),
            "Dataset<Self>");
    auto mapped = Squares()
                      .map(torch::data::transforms::TensorLambda<>([](at::Tensor x) { return (x - 0.5) / 2; }))
                      .map(torch::data::transforms::Stack<>());
    compare(c, global_batches(f, f.setup_dataloader(std::move(mapped), options())), expected_batches(true),
            "MapDataset with a TensorLambda and Stack<>");
  });
  return c.result();
}

STRATA_WORKER(torch_data_batches) {
  auto strategy = std::make_shared<strata::strategies::DDPStrategy>();
  strategy->set_collective_timeout(std::chrono::seconds(60));
  Fabric fabric(FabricOptions().with_strategy(strategy));
  return check_loaders(fabric);
}

TEST(TorchDataTest, OneWorkerReadsTheSamplersGlobalBatchesWithTheTransformsApplied) {
  Fabric fabric(FabricOptions().with_strategy("single_device"));
  EXPECT_EQ(check_loaders(fabric), 0);
}

TEST(TorchDataTest, TwoWorkersTogetherReadTheSameGlobalBatches) {
  auto run = strata::testing::run_workers(2, "torch_data_batches");
  EXPECT_TRUE(run.ok()) << run.launch.summary << "\n" << run.output;
}

TEST(TorchDataTest, ATorchDatasetIsAdaptedAsItIs) {
  auto dataset = strata::data::from_torch(Squares().map(torch::data::transforms::Stack<>()));
  ASSERT_EQ(dataset->size(), kExamples);
  strata::data::Example e = dataset->get(7);
  EXPECT_TRUE(at::equal(e.input, at::full({3}, 7.0f)));
  EXPECT_TRUE(at::equal(e.target, at::full({1}, 49.0f)));
  try {
    dataset->get(kExamples);
    ADD_FAILURE() << "an index past the end was read";
  } catch (const strata::ConfigError& err) {
    EXPECT_EQ(std::string(err.what()), "[data] example index 20 is out of range for a dataset of 20 examples");
  }
}

TEST(TorchDataTest, ABatchSizeTheWorldSizeDoesNotDivideIsRefused) {
  try {
    strata::data::make_distributed_loader(strata::data::from_torch(Squares()), options().with_batch_size(3), 2, 0);
    ADD_FAILURE() << "batch_size 3 was split between 2 ranks";
  } catch (const strata::ConfigError& err) {
    EXPECT_EQ(std::string(err.what()), "[data] batch_size 3 must be a positive multiple of the world size (2): each "
                                       "rank takes batch_size / world_size examples per step");
  }
}

}  // namespace
