// The values a TrainModule logs during one loop (Lightning's
// ResultCollection): each step's value, and the running reduction over the
// epoch, reduced across ranks when sync_dist.
//
// Note [Epoch reduction]
// "mean" keeps sum(value * batch_size) and sum(batch_size), so the epoch
// value is the mean over examples, however unevenly batches are sized;
// with sync_dist both sums are all-reduced (sum) before dividing, which
// makes it the mean over every rank's examples. "sum" sums, "max"/"min"
// keep the extreme; synced with the same op. Without sync_dist every rank
// keeps its own value (the loggers, on rank 0, see rank 0's).
#pragma once

#include <ATen/core/Tensor.h>

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "strata/comm/backend.h"
#include "strata/loggers/logger.h"
#include "strata/trainer/train_module.h"

namespace strata::strategies {
class Strategy;
}

namespace strata::trainer::detail {

/// One logged name, with its options resolved for the hook that logged it.
struct ResultEntry {
  bool on_step = false;
  bool on_epoch = false;
  bool sync_dist = false;
  bool prog_bar = false;
  bool logger = true;
  comm::ReduceOp op = comm::ReduceOp::kMean;
  double step_value = 0.0;  // the latest step's value (synced when sync_dist)
  bool stepped = false;     // logged since the last take_step()
  double total = 0.0;       // sum (x batch size for mean), max or min
  double weight = 0.0;      // sum of batch sizes (mean) / count
};

class Results {
 public:
  /// Records `value` for `name`. `in_training`: the defaults of
  /// training_step (on_step) or of the evaluation steps (on_epoch).
  /// `share`: the running batch's Batch::share (Note [Unequal shares]):
  /// a synced step mean weights each rank by it, and a filler batch
  /// (share 0) adds nothing to a step or epoch value.
  void log(strategies::Strategy& strategy, const std::string& name, const at::Tensor& value,
           const LogOptions& options, bool in_training, int64_t batch_size, double share = 1.0);
  /// The step values logged since the last call ("<name>_step" when also
  /// on_epoch), split into those for loggers, for the progress bar, and all.
  void take_step(strategies::Strategy& strategy, Metrics& for_logger, Metrics& for_prog_bar, Metrics& all);
  /// Reads the values logged on a lazy device (Note [No reads inside a
  /// lazy step]), which log() keeps unread, into their entries. The reads
  /// above call it first; the Trainer calls it once a step is marked.
  void settle(strategies::Strategy& strategy);
  /// Reduces the epoch values (a collective when any is sync_dist: every
  /// rank must call it with the same names logged) into
  /// "<name>_epoch" or "<name>". The collection keeps this rank's running
  /// values until reset(), so a checkpoint taken after the epoch's end
  /// still holds them.
  void reduce_epoch(strategies::Strategy& strategy, Metrics& for_logger, Metrics& for_prog_bar, Metrics& all);
  /// Forgets every value (a new epoch).
  void reset() {
    entries_.clear();
    deferred_.clear();
  }
  bool empty() const { return entries_.empty(); }

  /// Note [Epoch values in checkpoints]
  /// The epoch's running values, for a checkpoint taken inside the epoch,
  /// so that a run resumed there reports the same epoch values as one that
  /// went on. sync_dist entries are reduced over the ranks first (a
  /// collective: every rank calls it), so the state means the same at any
  /// world size; the others are this rank's (the checkpoint keeps rank
  /// 0's, the rank whose values the loggers show).
  nlohmann::json epoch_state(strategies::Strategy& strategy);
  /// Restores epoch_state() on rank `rank`: reduced sums go to rank 0 only
  /// (the other ranks start from zero, so the next reduction counts them
  /// once); maxima, minima and unsynced values go to every rank.
  /// CheckpointError names `where` for a malformed state
  /// (validate_epoch_results); the collection is unchanged then.
  void load_epoch_state(const nlohmann::json& state, int rank, const std::string& where);
  /// Names logged so far (for messages).
  std::string names() const;

 private:
  using Entries = std::map<std::string, ResultEntry>;
  /// Reduces the sync_dist epoch entries of `entries` over the ranks, in
  /// place (a collective when any exists and the world has several ranks).
  void reduce_synced(strategies::Strategy& strategy, Entries& entries) const;

  /// Adds `x` (`v`, a 0-dim double tensor, for a sync_dist collective) to
  /// `e` as log() does.
  void record(strategies::Strategy& strategy, ResultEntry& e, const at::Tensor& v, double x, int64_t batch_size,
              double share);

  struct Deferred {
    std::string name;
    at::Tensor value;  // on the lazy device, unread
    int64_t batch_size;
    double share;
  };
  Entries entries_;
  std::vector<Deferred> deferred_;  // in the order logged
};

}  // namespace strata::trainer::detail
