// Which dataset indices each rank visits in an epoch: PyTorch's
// DistributedSampler, with a shuffle that does not depend on the LibTorch
// version (see Note [Sampler permutation] in the source).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata::data {

/// Splits [0, dataset_size) among num_replicas ranks, as
/// torch.utils.data.DistributedSampler does:
///  - per epoch, the order is a permutation of the indices drawn from a
///    generator seeded with seed + epoch (shuffle), or 0, 1, 2, ... (no
///    shuffle); every rank computes the same order;
///  - the order is padded by repeating it from its start (drop_last false)
///    or truncated (drop_last true) to a multiple of num_replicas, so every
///    rank gets exactly size() indices;
///  - rank r takes the positions r, r + N, r + 2N, ... of that order.
/// Consequence: with N ranks and per-rank batch b, the union of the ranks'
/// k-th batches is the k-th batch of batch size N*b of a 1-rank sampler
/// with the same seed and epoch (when no padding is involved), which is
/// what makes N-rank training equal to single-process training.
///
/// Note [Unequal shares]
/// Padding repeats examples, so a padded epoch at N ranks is not the epoch
/// one rank sees: its last global batch holds duplicates, and a loss or
/// metric over it depends on N. With repeat_to_even false (and drop_last
/// false) nothing is repeated: rank r takes the positions r, r + N, ... < n,
/// so ranks past the tail hold one example fewer (indices() is shorter),
/// while size() stays the largest share, ceil(n / N), on every rank (every
/// rank's loader counts the same batches). A DataLoader over such a sampler
/// marks its batches with their share of the global batch (Batch::count,
/// Batch::global_count), and the Trainer weights losses and logged means
/// by it, so every global batch holds exactly the examples a single process
/// batches together, and its mean is theirs at any world size.
class DistributedSampler {
 public:
  /// Throws ConfigError ("[data] ...") when num_replicas < 1 or rank is
  /// not in [0, num_replicas). repeat_to_even: pad the order by repeating
  /// its start (PyTorch's behaviour, the default) or leave the tail
  /// uneven (Note [Unequal shares]); ignored with drop_last.
  DistributedSampler(size_t dataset_size, int num_replicas, int rank, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false, bool repeat_to_even = true);

  /// Selects the epoch whose order indices() returns (the shuffle is seeded
  /// with seed + epoch). Call it with the same value on every rank.
  void set_epoch(uint64_t epoch) { epoch_ = epoch; }
  uint64_t epoch() const { return epoch_; }

  /// This rank's indices for the current epoch: size() of them, or one
  /// fewer on the ranks past an uneven tail (repeat_to_even false).
  std::vector<size_t> indices() const;

  /// Indices per rank per epoch (the largest share when the tail is uneven).
  size_t size() const { return num_samples_; }
  /// The length of the order the ranks split: size() * num_replicas when
  /// padded or truncated, the dataset size when the tail is uneven.
  size_t total_size() const {
    return uneven() ? dataset_size_ : num_samples_ * static_cast<size_t>(num_replicas_);
  }
  /// True when ranks may hold unequal shares (Note [Unequal shares]).
  bool uneven() const { return !repeat_to_even_ && !drop_last_; }

  size_t dataset_size() const { return dataset_size_; }
  int num_replicas() const { return num_replicas_; }
  int rank() const { return rank_; }
  bool shuffle() const { return shuffle_; }
  uint64_t seed() const { return seed_; }
  bool drop_last() const { return drop_last_; }
  bool repeat_to_even() const { return repeat_to_even_; }

  /// The shared epoch order before padding and splitting: a permutation of
  /// [0, n) that depends only on (n, seed) — the same on every platform
  /// and LibTorch version.
  static std::vector<size_t> permutation(size_t n, uint64_t seed);

 private:
  size_t dataset_size_;
  int num_replicas_;
  int rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  bool repeat_to_even_;
  uint64_t epoch_ = 0;
  size_t num_samples_;
};

}  // namespace strata::data
