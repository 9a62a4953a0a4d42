// DistributedSampler: the per-epoch order of dataset indices and each
// rank's share of it.
#include "strata/data/distributed_sampler.h"

#include <numeric>

#include "strata/core/error.h"

namespace strata::data {

namespace {

// splitmix64 (Steele, Lea, Flood 2014): a tiny generator with good
// statistical quality, fully specified here.
struct SplitMix64 {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // A value in [0, bound) by multiply-shift (Lemire); the bias is at most
  // bound / 2^64, far below anything a shuffle could show.
  uint64_t below(uint64_t bound) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * bound) >> 64);
  }
};

}  // namespace

DistributedSampler::DistributedSampler(size_t dataset_size, int num_replicas, int rank, bool shuffle,
                                       uint64_t seed, bool drop_last, bool repeat_to_even)
    : dataset_size_(dataset_size),
      num_replicas_(num_replicas),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last),
      repeat_to_even_(repeat_to_even) {
  STRATA_CHECK(num_replicas >= 1, ConfigError, "[data] num_replicas must be >= 1, got ", num_replicas);
  STRATA_CHECK(rank >= 0 && rank < num_replicas, ConfigError, "[data] rank ", rank,
               " is out of range for num_replicas ", num_replicas, " (valid ranks: 0..", num_replicas - 1, ")");
  const auto n = dataset_size, r = static_cast<size_t>(num_replicas);
  // As PyTorch: drop the tail that does not split evenly, or pad up to it
  // (or leave it uneven, Note [Unequal shares]: the largest share).
  num_samples_ = drop_last ? n / r : (n + r - 1) / r;
}

// Note [Sampler permutation]: PyTorch draws the order with torch.randperm
// on a generator seeded with seed + epoch, whose output changes between
// versions and devices. Resuming a run must reproduce the order exactly
// (the checkpoint only stores the epoch and position), so the order here
// is a Fisher-Yates shuffle driven by splitmix64: the same on every build.
std::vector<size_t> DistributedSampler::permutation(size_t n, uint64_t seed) {
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  SplitMix64 rng{seed};
  for (size_t i = n; i > 1; --i) {
    size_t j = static_cast<size_t>(rng.below(i));
    std::swap(order[i - 1], order[j]);
  }
  return order;
}

std::vector<size_t> DistributedSampler::indices() const {
  std::vector<size_t> order;
  if (shuffle_) {
    order = permutation(dataset_size_, seed_ + epoch_);
  } else {
    order.resize(dataset_size_);
    std::iota(order.begin(), order.end(), size_t{0});
  }
  const size_t total = total_size();
  if (order.size() < total) {
    // Pad by repeating the order from its start (as many times as needed).
    const size_t n = order.size();
    for (size_t i = 0; order.size() < total; ++i) order.push_back(order[i % n]);
  } else {
    order.resize(total);
  }
  std::vector<size_t> mine;
  mine.reserve(num_samples_);
  // An uneven tail (total == dataset size) simply ends earlier on some ranks.
  for (size_t pos = static_cast<size_t>(rank_); pos < total; pos += static_cast<size_t>(num_replicas_))
    mine.push_back(order[pos]);
  return mine;
}

}  // namespace strata::data
