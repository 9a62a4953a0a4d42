// DistributedSampler: PyTorch's padding/splitting, the shared per-epoch
// shuffle, and the property that N ranks see what one process would.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <numeric>
#include <set>
#include <vector>

#include "strata/core/error.h"
#include "strata/data/distributed_sampler.h"
#include "support/errors.h"

namespace {
using strata::data::DistributedSampler;
using Indices = std::vector<size_t>;

TEST(DistributedSamplerTest, WithoutShufflePadsFromTheStartAndDealsPositionsRoundRobin) {
  // torch.utils.data.DistributedSampler(range(10), 3, r, shuffle=False):
  // total 12, order 0..9,0,1.
  EXPECT_EQ(DistributedSampler(10, 3, 0, false).indices(), (Indices{0, 3, 6, 9}));
  EXPECT_EQ(DistributedSampler(10, 3, 1, false).indices(), (Indices{1, 4, 7, 0}));
  EXPECT_EQ(DistributedSampler(10, 3, 2, false).indices(), (Indices{2, 5, 8, 1}));
  EXPECT_EQ(DistributedSampler(10, 3, 2, false).size(), 4u);
  EXPECT_EQ(DistributedSampler(10, 3, 2, false).total_size(), 12u);
  // Padding longer than the dataset repeats it as often as needed.
  EXPECT_EQ(DistributedSampler(2, 5, 4, false).indices(), (Indices{0}));
  EXPECT_EQ(DistributedSampler(2, 5, 3, false).indices(), (Indices{1}));
}

TEST(DistributedSamplerTest, DropLastTruncatesToAMultipleOfTheReplicas) {
  EXPECT_EQ(DistributedSampler(10, 3, 0, false, 0, true).indices(), (Indices{0, 3, 6}));
  EXPECT_EQ(DistributedSampler(10, 3, 2, false, 0, true).indices(), (Indices{2, 5, 8}));
  EXPECT_EQ(DistributedSampler(10, 3, 1, false, 0, true).size(), 3u);
  EXPECT_EQ(DistributedSampler(2, 3, 1, false, 0, true).size(), 0u);
  EXPECT_TRUE(DistributedSampler(0, 2, 1).indices().empty());
}

TEST(DistributedSamplerTest, ShuffledRanksPartitionOnePermutationAndEveryRankGetsTheSameCount) {
  for (size_t n : {12u, 13u, 100u}) {
    for (int world : {1, 2, 4}) {
      std::multiset<size_t> all;
      for (int r = 0; r < world; ++r) {
        DistributedSampler s(n, world, r, true, 7);
        s.set_epoch(3);
        auto mine = s.indices();
        EXPECT_EQ(mine.size(), (n + world - 1) / world);
        all.insert(mine.begin(), mine.end());
      }
      // Every index appears; only the padding repeats some.
      for (size_t i = 0; i < n; ++i) EXPECT_GE(all.count(i), 1u) << "n=" << n << " world=" << world;
      EXPECT_EQ(all.size(), ((n + world - 1) / world) * world);
    }
  }
}

TEST(DistributedSamplerTest, TheOrderDependsOnSeedPlusEpochOnly) {
  DistributedSampler a(50, 1, 0, true, 10);
  DistributedSampler b(50, 1, 0, true, 10);
  EXPECT_EQ(a.indices(), b.indices());
  auto epoch0 = a.indices();
  a.set_epoch(1);
  EXPECT_NE(a.indices(), epoch0);
  DistributedSampler c(50, 1, 0, true, 11);  // seed 11, epoch 0 == seed 10, epoch 1
  EXPECT_EQ(c.indices(), a.indices());
  Indices sorted = a.indices();
  std::sort(sorted.begin(), sorted.end());
  Indices iota(50);
  std::iota(iota.begin(), iota.end(), size_t{0});
  EXPECT_EQ(sorted, iota);
}

TEST(DistributedSamplerTest, ThePermutationIsPinnedAcrossBuilds) {
  // Resumed runs rely on this exact order (Note [Sampler permutation]).
  EXPECT_EQ(DistributedSampler::permutation(10, 0), (Indices{4, 9, 2, 5, 1, 7, 6, 0, 3, 8}));
}

// With N ranks of per-rank batch b, the union of the ranks' k-th batches
// is the k-th batch (size N*b) of one process with the same seed/epoch.
TEST(DistributedSamplerTest, RanksKthBatchesTogetherEqualTheSingleProcessKthBatch) {
  for (int world : {2, 3, 4}) {
    for (size_t b : {1u, 2u, 5u}) {
      for (uint64_t epoch : {0u, 1u, 5u}) {
        const size_t n = static_cast<size_t>(world) * 37;  // no padding
        DistributedSampler single(n, 1, 0, true, 1234);
        single.set_epoch(epoch);
        const auto one = single.indices();
        std::vector<Indices> per_rank;
        for (int r = 0; r < world; ++r) {
          DistributedSampler s(n, world, r, true, 1234);
          s.set_epoch(epoch);
          per_rank.push_back(s.indices());
        }
        const size_t batches = per_rank[0].size() / b;
        ASSERT_EQ(batches, one.size() / (b * world));
        for (size_t k = 0; k < batches; ++k) {
          std::set<size_t> united, reference(one.begin() + k * b * world, one.begin() + (k + 1) * b * world);
          for (const auto& mine : per_rank) united.insert(mine.begin() + k * b, mine.begin() + (k + 1) * b);
          EXPECT_EQ(united, reference) << "world=" << world << " b=" << b << " epoch=" << epoch << " k=" << k;
        }
      }
    }
  }
}

TEST(DistributedSamplerTest, InvalidRanksAndReplicasAreRejected) {
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([] { DistributedSampler(10, 2, 2); }),
            "[data] rank 2 is out of range for num_replicas 2 (valid ranks: 0..1)");
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([] { DistributedSampler(10, 2, -1); }),
            "[data] rank -1 is out of range for num_replicas 2 (valid ranks: 0..1)");
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([] { DistributedSampler(10, 0, 0); }), "[data] num_replicas must be >= 1, got 0");
}

}  // namespace
