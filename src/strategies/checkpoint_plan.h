// One checkpoint planner for every strategy (Note [Checkpoint planning]).
// Private to the strategies area.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <functional>
#include <string>
#include <vector>

#include "strata/comm/group.h"
#include "strata/strategies/saved_state.h"

namespace strata::strategies {

/// Note [Checkpoint planning]
/// A save is planned before anything is written: every strategy says, for
/// each tensor of the state, where it lives on this rank, whole (every
/// rank holds the same value; rank 0 writes it) or sharded (each rank
/// holds a flat piece; `gather` assembles the full value, a collective that
/// every rank runs in plan order). One code path then writes the plan in
/// either layout, full (one file by rank 0) or sharded (one file per rank),
/// and turns a failure on any rank into the same CheckpointError on every
/// rank, so no rank is left waiting for a peer that gave up.
struct PlannedTensor {
  std::string name;            ///< "<state key>/<tensor name>"
  std::vector<int64_t> shape;  ///< the full shape
  c10::ScalarType dtype = c10::kFloat;
  /// What this rank writes in a sharded layout: its unpadded slice, or for
  /// a whole tensor the tensor itself (rank 0; undefined elsewhere).
  at::Tensor local;
  /// Sharded tensors: the full value (a collective); empty for whole ones.
  std::function<at::Tensor()> gather;
  bool sharded() const { return static_cast<bool>(gather); }
};

/// Everything one rank saves, and the entries rank 0 describes.
struct SavePlan {
  std::vector<PlannedTensor> tensors;
  nlohmann::json entries = nlohmann::json::object();
  /// Adds a whole tensor (written by rank 0).
  void add_whole(const std::string& name, const at::Tensor& tensor, bool is_rank_zero);
};

/// Whether `filter` keeps tensor `name` of state entry `key`.
bool filter_keeps(const StateFilter& filter, const std::string& key, const std::string& name, const at::Tensor& t);

/// How write_plan lays the plan out.
struct WriteOptions {
  bool sharded_layout = false;  ///< one file per rank (else one full file by rank 0)
  bool sequential = false;      ///< local ranks write their files one after another
  int local_rank = 0;
  int local_world_size = 1;
  std::string tag = "checkpoint";  ///< message tag, e.g. the strategy's name
  /// Run by every rank after each gather of the full layout, before rank 0
  /// writes the value (Note [Gathered tensors on a lazy device]); null:
  /// nothing to run.
  std::function<void()> end_step;
};

/// Note [Gathered tensors on a lazy device]
/// On a lazy device a gather is recorded, not run, and rank 0's write of
/// the full value reads it to the host, which runs the step. Where the
/// ranks are replicas of one step (xla_fsdp), running it is a meeting of
/// every replica, which the other ranks, having nothing to write, would not
/// attend: they would go on to the next gather or to the closing exchange
/// of errors and wait there, apart from rank 0. So every rank ends the step
/// after each gather (the strategy's mark_step), together, and rank 0 then
/// writes a value already computed.

/// Writes `plan` to the checkpoint directory `path` (the same on every
/// rank), or to one file when `path` ends in ".safetensors" (full layout
/// only; the model keeps its plain names, single_file.h), atomically, with `metadata` (the strategy, world size, layout;
/// entries and, for the sharded layout, tensor records are added). Every
/// rank calls it; a failure on any rank throws the same CheckpointError on
/// every rank.
void write_plan(comm::Group& group, const std::string& path, const SavePlan& plan, nlohmann::json metadata,
                const WriteOptions& options);

}  // namespace strata::strategies
