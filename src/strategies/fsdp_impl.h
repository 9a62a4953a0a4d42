// The state FSDPStrategy keeps per parameter and per unit (Note [FSDP
// parameters] in fsdp.cpp). Private to the strategies area.
#pragma once

#include <torch/csrc/autograd/function.h>

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata/comm/group.h"
#include "strata/strategies/fsdp.h"
#include "grad_accumulator.h"

namespace strata::strategies {

/// Parameters sharded while the model was built (module_sharded_context),
/// by the TensorImpl of the shard put in the module's dictionary.
struct FSDPStrategy::Presharded {
  struct Entry {
    at::Tensor compute;          ///< the module's own tensor, now empty
    std::vector<int64_t> shape;  ///< its full shape
    bool trainable = false;
    GradAccumulator accumulator;  ///< made while it was full-sized
  };
  std::unordered_map<const c10::TensorImpl*, Entry> by_shard;
};

struct FSDPStrategy::Impl : std::enable_shared_from_this<FSDPStrategy::Impl> {
  struct Param {
    std::string name;            ///< first full name ("blocks.0.attn.c_attn.weight")
    at::Tensor compute;          ///< the module's own tensor: empty, or the full value
    at::Tensor shard;            ///< this rank's padded piece (fp32 leaf), in the module's dictionary
    std::vector<int64_t> shape;  ///< full shape
    int64_t numel = 0;
    int64_t chunk = 0;           ///< shard length (padded) on every rank
    int64_t offset = 0;          ///< where the shard sits in its unit's flat shard
    int64_t storage_bytes = 0;   ///< bytes of the full value's (padded) storage
    size_t unit = 0;
    bool trainable = false;
    bool grad_ready = false;
    std::vector<std::pair<torch::nn::Module*, std::string>> owners;  ///< where it is registered
    at::Tensor preshard;         ///< this rank's piece when sharded at construction (until build ends)
    GradAccumulator accumulator;             ///< kept alive: the hook lives on it
    uintptr_t hook_key = 0;
  };

  enum class UnitState { kIdle, kGathered, kFreed };

  struct Unit {
    torch::nn::Module* module = nullptr;
    std::string name;  ///< path from the root ("" for the root)
    std::string type;  ///< module.name()
    bool root = false;
    std::optional<size_t> parent;  ///< the nearest unit around this one
    std::vector<size_t> params;
    int64_t shard_numel = 0;
    at::Tensor flat_shard;  ///< the shards of params, back to back
    UnitState state = UnitState::kIdle;
    at::Tensor gather_input, gather_output;
    comm::WorkPtr gather_work;
    size_t trainable = 0, ready = 0;
    bool complete = false;  ///< every gradient of this backward arrived
    bool entered = false;   ///< forward ran in this step
    at::Tensor reduce_input, reduce_output;
    comm::WorkPtr reduce_work;
  };

  Impl(comm::Group group, const FSDPOptions& options, c10::ScalarType compute, c10::ScalarType reduce);

  /// Makes the units and shards the parameters (those in `presharded` are
  /// sharded already).
  void build(torch::nn::Module& root_module, const FSDPOptions& options, const Presharded* presharded);
  void unhook();
  /// Puts params[i]'s piece into its unit's flat shard and the shard into
  /// the module's dictionaries; hooks its gradient.
  void shard_param(size_t i, const FSDPOptions& options);

  at::Tensor empty_compute(const Param& p) const;
  void issue_gather(size_t u);
  void ensure_gathered(size_t u);
  void free_storage(size_t u);
  void release(size_t u);
  std::optional<size_t> neighbour(size_t u, int direction) const;
  /// Throws a ConfigError explaining `error` when units that never started
  /// their forward may be why it failed; returns otherwise.
  void explain_failed_forward(const c10::Error& error) const;

  void pre_forward(size_t u);
  at::Tensor post_forward(size_t u, const at::Tensor& output);
  void pre_backward(size_t u);
  void on_grad_ready(size_t param);
  /// `order`, then every unit not in it, by index.
  std::vector<size_t> with_the_rest(std::vector<size_t> order) const;
  void launch_ready_reductions();
  void launch_reduction(size_t u);
  /// Waits for unit u's reduce-scatter and adds it to the shards' gradients.
  void complete_reduction(size_t u);
  void finish();

  /// The parameter an optimizer state tensor "<param name>.<state name>"
  /// belongs to, or null.
  const Param* param_of_state(const std::string& state_name) const;
  /// The full value of a tensor sharded like `p`, from this rank's padded
  /// piece (p.shard, or its optimizer state); a collective.
  at::Tensor gather_full(const Param& p, const at::Tensor& piece);

  comm::Group group;
  int world = 1;
  int rank = 0;
  c10::ScalarType compute_dtype;
  c10::ScalarType reduce_dtype;
  bool reshard_after_forward = true;
  bool prefetch = true;
  ModulePtr root_module;
  std::vector<Param> params;
  std::unordered_map<std::string, size_t> param_index;  ///< params by name
  std::vector<Unit> units;
  size_t root = 0;
  std::vector<torch::nn::Module*> checkpointed;  ///< checkpointed modules that are not units
  std::vector<size_t> forward_order, last_forward_order;
  std::vector<size_t> order_cache;
  size_t next_reduction = 0;
  std::deque<size_t> in_flight;  ///< units whose reduce-scatter runs, oldest first
  bool sync = true;
  int64_t step = 0;
};

}  // namespace strata::strategies
