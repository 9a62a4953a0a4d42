// Every global batch holds the same examples at every world size: the
// ranks' k-th batches of a split (DistributedSampler + DataLoader, as the
// Trainer builds them) together hold exactly the k-th batch a single
// process takes with the whole global batch, over whole epochs, for
// hundreds of seeds, dataset sizes and batch sizes, with uneven tails
// (Note [Unequal shares] in data/distributed_sampler.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "strata/data/dataset.h"
#include "strata/data/device_loader.h"
#include "strata/data/distributed_sampler.h"
#include "strata/data/loader.h"

namespace {

using strata::data::Batch;
using strata::data::DataLoader;
using strata::data::DistributedSampler;

// Example i has input [i] and target [i].
std::shared_ptr<strata::data::TensorDataset> ids(int64_t n) {
  at::Tensor x = at::arange(n, at::kLong).unsqueeze(1);
  return std::make_shared<strata::data::TensorDataset>(x, x.clone());
}

// The ids of a batch's real examples (a filler batch has none).
std::vector<int64_t> real_ids(const Batch& batch) {
  std::vector<int64_t> out;
  for (int64_t i = 0; i < batch.examples(); ++i) out.push_back(batch.input[i][0].item<int64_t>());
  return out;
}

struct Case {
  uint64_t seed;
  int64_t n;
  size_t global_batch;  // a multiple of 12, so 1, 2, 3 and 4 ranks all divide it
  bool drop_last;
};

// One epoch's global batches, as sorted id lists, at `world` ranks; also
// checks the per-batch bookkeeping the Trainer relies on.
std::vector<std::vector<int64_t>> global_batches(const Case& c, int world, uint64_t epoch) {
  auto data = ids(c.n);
  std::vector<DataLoader> loaders;
  const size_t per_rank = c.global_batch / static_cast<size_t>(world);
  for (int r = 0; r < world; ++r) {
    DistributedSampler sampler(static_cast<size_t>(c.n), world, r, true, c.seed, c.drop_last,
                               /*repeat_to_even=*/false);
    loaders.emplace_back(data, sampler, per_rank, c.drop_last);
    loaders.back().set_epoch(epoch);
    loaders.back().reset();
  }
  const size_t steps = loaders[0].size();
  std::vector<std::vector<int64_t>> out;
  for (size_t k = 0; k < steps; ++k) {
    std::vector<int64_t> batch;
    double shares = 0;
    int64_t global_count = -1;
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(loaders[r].size(), steps) << "every rank counts the same batches";
      std::optional<Batch> b = loaders[r].next();
      if (!b) {
        ADD_FAILURE() << "rank " << r << " ran out at batch " << k << " of " << steps;
        return out;
      }
      std::vector<int64_t> mine = real_ids(*b);
      batch.insert(batch.end(), mine.begin(), mine.end());
      shares += b->share(world);
      if (b->global_count >= 0) {
        EXPECT_TRUE(global_count < 0 || global_count == b->global_count) << "ranks disagree on the global batch";
        global_count = b->global_count;
      }
      EXPECT_GE(b->size(), 1) << "a rank always has a row to run";
    }
    EXPECT_NEAR(shares, world, 1e-9) << "the shares of batch " << k << " sum to the world size";
    if (global_count >= 0) EXPECT_EQ(global_count, static_cast<int64_t>(batch.size()));
    std::sort(batch.begin(), batch.end());
    out.push_back(batch);
  }
  for (int r = 0; r < world; ++r) EXPECT_FALSE(loaders[r].next()) << "rank " << r << " has a batch too many";
  return out;
}

TEST(WorldSizeBatchesTest, EveryGlobalBatchHoldsTheSingleProcessExamplesForManySeeds) {
  // A cheap generator of cases (the same on every run).
  uint64_t state = 12345;
  auto draw = [&](uint64_t bound) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (state >> 33) % bound;
  };
  int uneven_tails = 0, fillers = 0;
  for (int i = 0; i < 300; ++i) {
    Case c{draw(1000000), static_cast<int64_t>(1 + draw(120)), 12 * (1 + draw(3)), draw(2) == 1};
    for (uint64_t epoch : {0, 1}) {
      const auto reference = global_batches(c, 1, epoch);
      for (int world : {2, 3, 4}) {
        const auto split = global_batches(c, world, epoch);
        ASSERT_EQ(split.size(), reference.size())
            << "seed " << c.seed << ", n " << c.n << ", world " << world << ", drop_last " << c.drop_last;
        for (size_t k = 0; k < split.size(); ++k) {
          ASSERT_EQ(split[k], reference[k]) << "batch " << k << " of epoch " << epoch << ": seed " << c.seed
                                            << ", n " << c.n << ", world " << world;
        }
      }
    }
    const int64_t global = static_cast<int64_t>(c.global_batch);
    if (!c.drop_last && c.n % global != 0) ++uneven_tails;
    if (!c.drop_last && c.n % global != 0 && c.n % global < 4) ++fillers;
  }
  // The cases reach the tails this is about.
  EXPECT_GT(uneven_tails, 50);
  EXPECT_GT(fillers, 5);
}

TEST(WorldSizeBatchesTest, AnUnevenTailIsMarkedWithItsShares) {
  // 51 examples, global batch 12 at 4 ranks: 4 full batches, then 3 examples
  // for 4 ranks: ranks 0-2 hold one each, rank 3 a filler of weight 0.
  auto data = ids(51);
  for (int r = 0; r < 4; ++r) {
    DataLoader loader(data, DistributedSampler(51, 4, r, false, 0, false, false), 3);
    ASSERT_EQ(loader.size(), 5u);
    for (int k = 0; k < 4; ++k) {
      Batch b = *loader.next();
      EXPECT_EQ(b.count, -1);
      EXPECT_EQ(b.global_count, -1);
      EXPECT_EQ(b.share(4), 1.0);
    }
    Batch tail = *loader.next();
    EXPECT_EQ(tail.global_count, 3);
    EXPECT_EQ(tail.size(), 1);
    EXPECT_EQ(tail.examples(), r < 3 ? 1 : 0);
    EXPECT_DOUBLE_EQ(tail.share(4), r < 3 ? 4.0 / 3.0 : 0.0);
    if (r < 3) EXPECT_EQ(tail.input[0][0].item<int64_t>(), 48 + r);
  }
}

TEST(WorldSizeBatchesTest, TheDeviceLoaderKeepsTheShares) {
  auto data = ids(7);
  auto loader = std::make_shared<DataLoader>(data, DistributedSampler(7, 2, 1, false, 0, false, false), 2);
  strata::data::DeviceLoader device(loader, at::Device(at::kCPU));
  std::vector<Batch> got;
  for (std::optional<Batch> b = device.next(); b; b = device.next()) got.push_back(*b);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[1].count, 1);  // rank 1 holds 5 of positions 4..6
  EXPECT_EQ(got[1].global_count, 3);
  EXPECT_DOUBLE_EQ(got[1].share(2), 2.0 / 3.0);
}

TEST(WorldSizeBatchesTest, PyTorchPaddingRepeatsExamplesWhereTheUnevenSplitDoesNot) {
  // The default keeps PyTorch's behaviour (padding to an even split), which
  // is what makes a padded last batch differ from a single process's.
  DistributedSampler padded(5, 2, 1, false);
  EXPECT_EQ(padded.indices(), (std::vector<size_t>{1, 3, 0}));
  DistributedSampler uneven(5, 2, 1, false, 0, false, false);
  EXPECT_EQ(uneven.indices(), (std::vector<size_t>{1, 3}));
  EXPECT_EQ(uneven.size(), 3u);
  EXPECT_TRUE(uneven.uneven());
  EXPECT_EQ(uneven.total_size(), 5u);
  EXPECT_FALSE(DistributedSampler(5, 2, 1, false, 0, true, false).uneven());
}

}  // namespace
