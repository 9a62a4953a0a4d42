// Batches for a training loop: the abstract Loader (what strategies and
// Fabric accept, iterable with range-for) and DataLoader, which stacks a
// dataset's examples in the order a DistributedSampler gives.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json_fwd.hpp>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

#include "strata/data/dataset.h"
#include "strata/data/distributed_sampler.h"

namespace strata::data {

/// A batch of examples: input and target stacked along a new dim 0.
struct Batch {
  at::Tensor input;
  at::Tensor target;
  /// Note [Unequal shares] (distributed_sampler.h): how many rows are real
  /// examples, -1 meaning all of them. 0 marks a filler batch: a rank
  /// whose share of this global batch is empty still gets one example, so
  /// that it runs the same forward and collectives as the others, and the
  /// Trainer gives it no weight.
  int64_t count = -1;
  /// Examples in the global batch (over all ranks) this batch is a share
  /// of; -1 when every rank holds an equal share.
  int64_t global_count = -1;
  /// Both tensors on `device` (the same tensors when already there); the
  /// counts are kept.
  Batch to(at::Device device, bool non_blocking = false) const;
  /// Number of rows (input.size(0)).
  int64_t size() const { return input.size(0); }
  /// Number of real examples: size(), or count when set.
  int64_t examples() const { return count < 0 ? size() : count; }
  /// This rank's weight in a mean over the ranks that gives the mean over
  /// the global batch: examples() * world_size / global_count, 1 with equal
  /// shares, 0 for a filler batch.
  double share(int world_size) const {
    return global_count < 0 ? 1.0 : static_cast<double>(examples()) * world_size / static_cast<double>(global_count);
  }
};

/// Where a loader stands: the epoch, and how many batches of it have been
/// handed out. A loader restored with load_state() continues with batch
/// `position` of `epoch`.
struct LoaderState {
  uint64_t epoch = 0;
  uint64_t position = 0;
  bool operator==(const LoaderState& o) const { return epoch == o.epoch && position == o.position; }
};
/// JSON form: {"epoch": E, "position": P} (for checkpoint metadata).
void to_json(nlohmann::json& j, const LoaderState& s);
/// Throws ConfigError when a field is missing or not a non-negative integer.
void from_json(const nlohmann::json& j, LoaderState& s);

/// A source of batches, one pass (epoch) at a time.
///
/// Protocol: reset() starts a pass; next() returns its batches, then
/// std::nullopt at the end. Range-for does both: `for (Batch& b : loader)`
/// calls reset() and then next() until the end; breaking out early and
/// iterating again starts a fresh pass. A loader is used by one consumer
/// thread at a time.
class Loader {
 public:
  virtual ~Loader() = default;

  /// Batches in one full pass.
  virtual size_t size() const = 0;
  /// The next batch of the current pass, or std::nullopt when it is over.
  virtual std::optional<Batch> next() = 0;
  /// Starts a new pass (see DataLoader::reset for resumed state).
  virtual void reset() = 0;

  /// Selects the epoch of the next pass (forwarded to the sampler). The
  /// default does nothing, for loaders without epochs.
  virtual void set_epoch(uint64_t epoch) { (void)epoch; }
  /// Whether state() / load_state() are supported.
  virtual bool resumable() const { return false; }
  /// The position to save in a checkpoint. Default: throws ConfigError.
  virtual LoaderState state() const;
  /// Makes the next pass continue at `state`. Default: throws ConfigError.
  virtual void load_state(const LoaderState& state);
  /// True for loaders that already move batches to a device in the
  /// background (so process_dataloader does not wrap them again).
  virtual bool is_device_loader() const { return false; }

  /// Input iterator for range-for; see begin().
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;

    Iterator() = default;
    Batch& operator*() { return *current_; }
    Batch* operator->() { return &*current_; }
    Iterator& operator++();
    /// Iterators compare equal when both are past the end.
    bool operator==(const Iterator& o) const { return !current_ && !o.current_; }
    bool operator!=(const Iterator& o) const { return !(*this == o); }

   private:
    friend class Loader;
    explicit Iterator(Loader* loader);
    Loader* loader_ = nullptr;
    std::optional<Batch> current_;
  };

  /// Calls reset(), then fetches the first batch.
  Iterator begin();
  /// The past-the-end iterator.
  Iterator end() { return Iterator(); }
};

/// Batches `batch_size` examples of a dataset in the order the sampler
/// gives for the current epoch, stacked into [batch_size, ...] tensors.
///
/// size() is ceil(sampler.size() / batch_size), or the floor with
/// drop_last (the last, smaller batch is then dropped). The loader counts
/// the batches it has handed out in this epoch (its position); state() and
/// load_state() save and restore {epoch, position} so a resumed run
/// continues with the next batch.
class DataLoader : public Loader {
 public:
  /// Throws ConfigError when dataset is null, batch_size is 0 or the
  /// sampler was built for a different dataset size.
  DataLoader(std::shared_ptr<const Dataset> dataset, DistributedSampler sampler, size_t batch_size,
             bool drop_last = false);
  /// A single-process loader: a 1-replica sampler with `shuffle` and `seed`.
  DataLoader(std::shared_ptr<const Dataset> dataset, size_t batch_size, bool shuffle = false,
             uint64_t seed = 0, bool drop_last = false);

  /// Batches per epoch: the same on every rank, also when the sampler
  /// leaves an uneven tail (then counted over the whole dataset: as many
  /// as a single process with batch_size * num_replicas takes).
  size_t size() const override;
  /// The next batch of the current pass; starts a pass first if none is.
  /// Over an uneven sampler, a batch that is a smaller share of its global
  /// batch carries count and global_count (Note [Unequal shares]).
  std::optional<Batch> next() override;
  /// Starts a pass over the current epoch from its first batch — or, right
  /// after load_state(), from the restored position.
  void reset() override;
  /// Changes the epoch (and the sampler's). A different epoch starts from
  /// its first batch at the next reset(); the same epoch keeps the
  /// position (so `load_state(s); set_epoch(s.epoch)` still resumes).
  void set_epoch(uint64_t epoch) override;
  bool resumable() const override { return true; }
  LoaderState state() const override;
  /// Restores {epoch, position}; the next reset() continues there. Throws
  /// ConfigError when position > size().
  void load_state(const LoaderState& state) override;

  const std::shared_ptr<const Dataset>& dataset() const { return dataset_; }
  const DistributedSampler& sampler() const { return sampler_; }
  size_t batch_size() const { return batch_size_; }
  bool drop_last() const { return drop_last_; }

 private:
  std::shared_ptr<const Dataset> dataset_;
  DistributedSampler sampler_;
  size_t batch_size_;
  bool drop_last_;
  std::vector<size_t> order_;  // the sampler's indices for the running pass
  size_t position_ = 0;        // batches handed out in this epoch
  bool started_ = false;       // a pass is running
  bool resume_pending_ = false;
};

/// How a loader over a dataset is made for a job (make_distributed_loader,
/// Fabric::setup_dataloader, the Trainer's DataSource). Fluent setters.
struct DataOptions {
  /// Examples per step over all ranks: each of N ranks takes batch_size / N
  /// (which must divide), so a loader position means the same examples at
  /// any world size.
  int64_t batch_size = 1;
  bool shuffle = false;  ///< reshuffle every epoch (the same order on every rank)
  uint64_t seed = 0;     ///< seed of the shuffle
  bool drop_last = false;

  DataOptions& with_batch_size(int64_t b) { batch_size = b; return *this; }
  DataOptions& with_shuffle(bool s) { shuffle = s; return *this; }
  DataOptions& with_seed(uint64_t s) { seed = s; return *this; }
  DataOptions& with_drop_last(bool d) { drop_last = d; return *this; }
};

/// Rank `rank`'s loader of `dataset` in a job of `world_size` ranks: a
/// DistributedSampler that repeats no example (Note [Unequal shares]) and
/// batch_size / world_size examples per batch, so batch k of the ranks
/// together is batch k of one process with batch_size. Throws ConfigError
/// ("[data] ...") for a null dataset, or a batch_size that is not a
/// positive multiple of world_size.
std::shared_ptr<DataLoader> make_distributed_loader(std::shared_ptr<const Dataset> dataset,
                                                    const DataOptions& options, int world_size, int rank);

}  // namespace strata::data
