// FSDPStrategy's checkpoints: the plan says which tensors are sharded (the
// parameters of the module set up and their optimizer state); the shared
// writer (checkpoint_plan.h) lays them out sharded (one file per rank) or
// full (one consolidated file, gathered tensor by tensor). Loading reads
// only this rank's slices, at any saved world size.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <unordered_map>

#include "../checkpoint_plan.h"
#include "fsdp_state.h"
#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/sharded.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/core/error.h"
#include "strata/core/strings.h"

namespace strata::strategies {
namespace {

using checkpoint::shard_slice;

// A tensor sharded like `p` (the parameter, or its optimizer state), from
// this rank's padded piece.
PlannedTensor sharded_tensor(std::string name, detail::FSDPState& impl, const detail::ShardedParam& p,
                             const at::Tensor& padded) {
  checkpoint::FlatSlice slice = shard_slice(p.numel, impl.world(), impl.rank());
  at::Tensor piece = padded.detach();
  detail::FSDPState* gatherer = &impl;
  const detail::ShardedParam* param = &p;
  return {std::move(name), p.shape, padded.scalar_type(), piece.narrow(0, 0, slice.size()),
          [gatherer, param, piece] { return gatherer->gather_full(*param, piece); }};
}

}  // namespace

detail::FSDPState* FSDPStrategy::state_of(const torch::optim::Optimizer& optimizer) const {
  for (const auto& group : optimizer.param_groups()) {
    for (const at::Tensor& param : group.params()) {
      for (const auto& state : states_) {
        for (const auto& p : state->params()) {
          if (p.shard.unsafeGetTensorImpl() == param.unsafeGetTensorImpl()) return state.get();
        }
      }
      return nullptr;  // the first parameter decides: an optimizer holds one module's parameters
    }
  }
  return nullptr;
}

SavePlan FSDPStrategy::plan_save(const State& state, const StateFilter& filter) {
  STRATA_CHECK(!states_.empty(), ConfigError, "[fsdp] save_checkpoint before setup_module");
  bool found_sharded = false;
  for (const auto& [key, value] : state) found_sharded = found_sharded || (value.is_module() && state_of(*value.module()));
  STRATA_CHECK(found_sharded, ConfigError,
               "[fsdp] save_checkpoint: the state holds no module set up by this strategy; put the module "
               "returned by setup_module in the state (e.g. {\"model\", model})");
  return Strategy::plan_save(state, filter);
}

void FSDPStrategy::plan_module_entry(const std::string& key, torch::nn::Module& module, const StateFilter& filter,
                                     SavePlan& plan) {
  detail::FSDPState* sharded = state_of(module);
  if (sharded == nullptr) {
    Strategy::plan_module_entry(key, module, filter, plan);
    return;
  }
  for (const auto& p : sharded->params()) {
    if (filter_keeps(filter, key, p.name, p.shard)) {
      plan.tensors.push_back(sharded_tensor(key + "/" + p.name, *sharded, p, p.shard));
    }
  }
  for (const auto& [name, t] : checkpoint::module_state(module)) {
    if (sharded->param(name)) continue;  // a shard, planned above
    if (filter_keeps(filter, key, name, t)) plan.add_whole(key + "/" + name, t, is_global_zero());
  }
}

void FSDPStrategy::plan_optimizer_entry(const std::string& key, torch::optim::Optimizer& optimizer,
                                        const checkpoint::NamedTensors& tensors, const StateFilter& filter,
                                        SavePlan& plan) {
  detail::FSDPState* sharded = state_of(optimizer);
  for (const auto& [name, t] : tensors) {
    if (!filter_keeps(filter, key, name, t)) continue;
    const detail::ShardedParam* p = sharded ? sharded->param_of_state(name) : nullptr;  // sharded like its parameter
    if (p && t.numel() == p->chunk) {
      plan.tensors.push_back(sharded_tensor(key + "/" + name, *sharded, *p, t));
    } else {
      plan.add_whole(key + "/" + name, t, is_global_zero());
    }
  }
}

namespace {

// This rank's padded piece of `name`, a tensor of the checkpoint sharded
// like parameter `p` (a parameter, or its optimizer state).
at::Tensor my_piece(const checkpoint::StateReader& reader, const std::string& name, const detail::FSDPState& impl,
                    const detail::ShardedParam& p) {
  std::vector<int64_t> shape = reader.shape(name);
  STRATA_CHECK(shape == p.shape, CheckpointError, "[checkpoint] ", reader.path(), ": '", name, "' has shape ",
               c10::IntArrayRef(shape), " in the checkpoint but ", c10::IntArrayRef(p.shape),
               " in the model (a checkpoint of another model?)");
  checkpoint::FlatSlice slice = shard_slice(p.numel, impl.world(), impl.rank());
  at::Tensor piece = at::zeros({p.chunk}, at::TensorOptions().dtype(reader.dtype(name)));
  piece.narrow(0, 0, slice.size()).copy_(reader.flat_slice(name, slice.begin, slice.end));
  return piece;
}

}  // namespace

void FSDPStrategy::load_module_entry(const checkpoint::StateReader& reader, const std::string& key,
                                     torch::nn::Module& module, bool strict, const std::string& source) {
  detail::FSDPState* sharded = state_of(module);
  if (sharded == nullptr) {
    Strategy::load_module_entry(reader, key, module, strict, source);
    return;
  }
  std::vector<std::string> missing, unexpected;
  std::unordered_map<std::string, bool> known;
  torch::NoGradGuard no_grad;
  for (const auto& p : sharded->params()) {
    known[p.name] = true;
    std::string name = reader.tensor_of(key, p.name);
    if (!reader.contains(name)) {
      missing.push_back(p.name);
      continue;
    }
    STRATA_CHECK(reader.dtype(name) == p.shard.scalar_type(), CheckpointError, "[checkpoint] ", reader.path(),
                 ": '", name, "' is ", reader.dtype(name), " in the checkpoint but ", p.shard.scalar_type(),
                 " in the model");
    p.shard.detach().copy_(my_piece(reader, name, *sharded, p));
  }
  for (const auto& item : module.named_buffers()) {
    known[item.key()] = true;
    std::string name = reader.tensor_of(key, item.key());
    if (!reader.contains(name)) {
      missing.push_back(item.key());
      continue;
    }
    at::Tensor stored = reader.full(name);
    STRATA_CHECK(stored.sizes() == item.value().sizes(), CheckpointError, "[checkpoint] ", reader.path(), ": '",
                 name, "' has shape ", stored.sizes(), " in the checkpoint but ", item.value().sizes(),
                 " in the model");
    item.value().copy_(stored);
  }
  for (const std::string& name : reader.names_under(key)) {
    if (!known.count(name)) unexpected.push_back(name);
  }
  if (strict && (!missing.empty() || !unexpected.empty())) {
    throw CheckpointError("[checkpoint] " + source + " does not match the model: missing " +
                          (missing.empty() ? "none" : join(missing, ", ", 10)) + "; unexpected " +
                          (unexpected.empty() ? "none" : join(unexpected, ", ", 10)) +
                          ". Load with strict=false to load what matches");
  }
}

checkpoint::NamedTensors FSDPStrategy::read_optimizer_tensors(const checkpoint::StateReader& reader,
                                                              const std::string& key,
                                                              torch::optim::Optimizer& optimizer) {
  detail::FSDPState* sharded = state_of(optimizer);
  if (sharded == nullptr) return Strategy::read_optimizer_tensors(reader, key, optimizer);
  checkpoint::NamedTensors tensors;
  for (const std::string& name : reader.names_under(key)) {
    std::string full_name = reader.tensor_of(key, name);
    if (const detail::ShardedParam* p = sharded->param_of_state(name)) {  // sharded like its parameter
      tensors.emplace_back(name, my_piece(reader, full_name, *sharded, *p));
    } else {
      tensors.emplace_back(name, reader.full(full_name));
    }
  }
  return tensors;
}

}  // namespace strata::strategies
