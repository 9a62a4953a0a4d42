// Checkpoints of every strategy: the save is planned (each strategy says
// where each tensor lives; Note [Checkpoint planning]) and written by one
// code path; every rank reads either layout (full, or the sharded layout of
// the fully-sharded strategy at any world size) through
// checkpoint::StateReader.
//
// Layout (docs/checkpoints.md): PATH/state.safetensors holds every tensor,
// named "<state key>/<parameter or buffer name>" for modules,
// "<state key>/<parameter name>.<state name>" for optimizers and
// "<state key>" for tensor entries; PATH/metadata.json describes each state
// entry ("entries": {key: {"kind": ..., ...}}), the strategy and the world
// size.
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <filesystem>

#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/sharded.h"
#include "strata/checkpoint/single_file.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/core/error.h"
#include "strata/strategies/strategy.h"
#include "checkpoint_plan.h"

namespace strata::strategies {
namespace {

// Names of the parameters of every module in `state` (optimizer state is
// keyed by parameter name, so it can be resharded and moved between
// strategies).
checkpoint::ParamNames param_names_of(const State& state) {
  checkpoint::ParamNames names;
  for (const auto& [key, value] : state) {
    if (!value.is_module()) continue;
    for (const auto& [impl, name] : checkpoint::param_names(*value.module())) names.emplace(impl, name);
  }
  return names;
}

// The tensors of the checkpoint whose names start with "<key>/", without
// the prefix, each whole (assembled from its shards when sharded).
checkpoint::NamedTensors read_prefixed(const checkpoint::StateReader& reader, const std::string& key) {
  checkpoint::NamedTensors out;
  for (const std::string& name : reader.names_under(key))
    out.emplace_back(name, reader.full(reader.tensor_of(key, name)));
  return out;
}

// Opens what load_raw reads: a plain safetensors file (a state dict), a
// folder `strata ckpt export` wrote (its model.safetensors), or a strata
// checkpoint (a folder or one file).
checkpoint::StateReader open_raw(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path exported = fs::path(path) / "model.safetensors";
  if (fs::is_directory(path, ec) && !fs::exists(fs::path(path) / "metadata.json", ec) &&
      fs::is_regular_file(exported, ec)) {
    return checkpoint::StateReader::open_plain(exported.string());
  }
  if (fs::is_directory(path, ec)) return checkpoint::StateReader::open(path);
  return checkpoint::StateReader::open_plain(path);
}

// The entry of kind `kind` that load_raw reads: the only one, or `fallback`.
std::string raw_entry(const checkpoint::StateReader& reader, const std::string& path, const std::string& kind,
                      const std::string& fallback) {
  std::vector<std::string> keys;
  for (const auto& [key, entry] : reader.entries().items()) {
    if (entry.value("kind", "") == kind) keys.push_back(key);
  }
  if (keys.size() == 1) return keys.front();
  for (const std::string& key : keys) {
    if (key == fallback) return key;
  }
  std::string list;
  for (const std::string& key : keys) list += (list.empty() ? "'" : ", '") + key + "'";
  throw CheckpointError("[checkpoint] load_raw: " + path + (keys.empty() ? " holds no " + kind + " state" :
                        " holds several " + kind + " entries (" + list + ") and none is named '" + fallback + "'") +
                        ". Load a strata checkpoint's entries by name with Fabric::load({{\"<key>\", " + kind + "}})");
}

}  // namespace

void Strategy::load_raw(const std::string& path, torch::nn::Module& module, bool strict) {
  const checkpoint::StateReader reader = open_raw(path);
  const std::string key = raw_entry(reader, path, "module", checkpoint::kPrimaryModuleKey);
  load_module_entry(reader, key, module, strict, path + (key == checkpoint::kPrimaryModuleKey ? "" : " entry '" + key + "'"));
}

void Strategy::load_raw(const std::string& path, torch::optim::Optimizer& optimizer, bool strict) {
  checkpoint::ParamNames names;
  for (const ModulePtr& module : modules_) {
    for (const auto& [impl, name] : checkpoint::param_names(*module)) names.emplace(impl, name);
  }
  STRATA_CHECK(!names.empty(), ConfigError, "[", name(), "] load_raw of an optimizer before setup_module: the "
               "optimizer's state is stored by parameter name, so set up the module it trains first");
  const checkpoint::StateReader reader = open_raw(path);
  const std::string key = raw_entry(reader, path, "optimizer", "optimizer");
  checkpoint::OptimizerState optim{read_optimizer_tensors(reader, key, optimizer), reader.entries()[key].at("state")};
  checkpoint::load_optimizer_state(optimizer, names, optim, strict, path + " entry '" + key + "'");
}

void Strategy::save_checkpoint(const std::string& requested_path, const State& state,
                               const nlohmann::json& storage_options, const StateFilter& filter) {
  STRATA_CHECK(storage_options.is_null() || storage_options.empty(), ConfigError, "[", name(),
               "] storage_options are not supported (no CheckpointIO plugins); pass none");
  STRATA_CHECK(!state.empty(), ConfigError, "[", name(), "] save_checkpoint got an empty state; nothing to save");
  for (const auto& [key, value] : state) {
    STRATA_CHECK(key.find('/') == std::string::npos, ConfigError, "[checkpoint] state key '", key,
                 "' contains '/'; use another name");
  }
  // Every rank writes where rank 0 was told to.
  const std::string path = group_.broadcast_object(requested_path, 0);
  SavePlan plan = plan_save(state, filter);
  const bool sharded = sharded_state_dict();
  nlohmann::json metadata = {
      {"strategy", name()}, {"world_size", world_size()}, {"state_dict_type", sharded ? "sharded" : "full"}};
  WriteOptions options;
  options.sharded_layout = sharded;
  options.sequential = sequential_checkpoint_writes();
  options.local_rank = local_rank();
  options.local_world_size = env_.local_world_size;
  options.tag = name();
  // Note [Gathered tensors on a lazy device] (checkpoint_plan.h).
  options.end_step = [this] { mark_step(); };
  write_plan(group_, path, plan, std::move(metadata), options);
}

SavePlan Strategy::plan_save(const State& state, const StateFilter& filter) {
  SavePlan plan;
  const checkpoint::ParamNames names = param_names_of(state);
  for (const auto& [key, value] : state) {
    if (value.is_module()) {
      plan.entries[key] = {{"kind", "module"}};
      plan_module_entry(key, *value.module(), filter, plan);
    } else if (value.is_optimizer()) {
      checkpoint::OptimizerState optim = checkpoint::optimizer_state(value.optimizer(), names);
      plan.entries[key] = {{"kind", "optimizer"}, {"state", optim.json}};
      plan_optimizer_entry(key, value.optimizer(), optim.tensors, filter, plan);
    } else if (value.is_tensor()) {
      plan.entries[key] = {{"kind", "tensor"}};
      plan.add_whole(key, value.tensor(), is_global_zero());
    } else {
      plan.entries[key] = {{"kind", "value"}, {"value", value.value()}};
    }
  }
  return plan;
}

void Strategy::plan_module_entry(const std::string& key, torch::nn::Module& module, const StateFilter& filter,
                                 SavePlan& plan) {
  for (const auto& [name, tensor] : checkpoint::module_state(module)) {
    if (filter_keeps(filter, key, name, tensor)) plan.add_whole(key + "/" + name, tensor, is_global_zero());
  }
}

void Strategy::plan_optimizer_entry(const std::string& key, torch::optim::Optimizer&,
                                    const checkpoint::NamedTensors& tensors, const StateFilter& filter,
                                    SavePlan& plan) {
  for (const auto& [name, tensor] : tensors) {
    if (filter_keeps(filter, key, name, tensor)) plan.add_whole(key + "/" + name, tensor, is_global_zero());
  }
}

void Strategy::load_module_entry(const checkpoint::StateReader& reader, const std::string& key,
                                 torch::nn::Module& module, bool strict, const std::string& source) {
  checkpoint::load_module_state(module, read_prefixed(reader, key), strict, source);
}

checkpoint::NamedTensors Strategy::read_optimizer_tensors(const checkpoint::StateReader& reader,
                                                          const std::string& key, torch::optim::Optimizer&) {
  return read_prefixed(reader, key);
}

nlohmann::json Strategy::load_checkpoint(const std::string& path, State& state, bool strict) {
  STRATA_CHECK(!state.empty(), ConfigError, "[", name(),
               "] load_checkpoint got an empty state: pass the modules, optimizers and values to restore");
  // Either layout, at any world size; a full checkpoint without
  // state.safetensors is refused by open() ("... has no state.safetensors").
  const checkpoint::StateReader reader = checkpoint::StateReader::open(path);
  const nlohmann::json& entries = reader.entries();

  std::vector<std::string> missing;
  for (const auto& [key, value] : state) {
    if (!entries.contains(key)) missing.push_back(key);
  }
  if (strict && !missing.empty()) {
    std::string list;
    for (const std::string& key : missing) list += (list.empty() ? "" : ", ") + key;
    throw CheckpointError("[checkpoint] " + path + " has no entry for state key(s) " + list +
                          "; it holds: " + entries.dump() + ". Load with strict=false to skip them");
  }

  checkpoint::ParamNames names = param_names_of(state);
  for (auto& [key, value] : state) {
    if (!entries.contains(key)) continue;
    const nlohmann::json& entry = entries[key];
    std::string kind = entry.value("kind", "");
    STRATA_CHECK(kind == value.kind(), CheckpointError, "[checkpoint] ", path, ": entry '", key, "' is a ", kind,
                 " in the checkpoint but a ", value.kind(), " in the state passed to load");
    std::string source = path + " entry '" + key + "'";
    if (value.is_module()) {
      load_module_entry(reader, key, *value.module(), strict, source);
    } else if (value.is_optimizer()) {
      checkpoint::OptimizerState optim{read_optimizer_tensors(reader, key, value.optimizer()), entry.at("state")};
      checkpoint::load_optimizer_state(value.optimizer(), names, optim, strict, source);
    } else if (value.is_tensor()) {
      at::Tensor stored = reader.full(reader.tensor_of(key));
      at::Tensor target = value.tensor();
      STRATA_CHECK(target.sizes() == stored.sizes(), CheckpointError, "[checkpoint] ", source, ": shape ",
                   stored.sizes(), " in the checkpoint, ", target.sizes(), " in the state");
      torch::NoGradGuard no_grad;
      target.copy_(stored);
    } else {
      value = StateValue(entry.at("value"));
    }
  }
  nlohmann::json remainder = nlohmann::json::object();
  for (const auto& [key, entry] : entries.items()) {
    if (state.count(key)) continue;
    if (entry.value("kind", "") == "value") {
      remainder[key] = entry.at("value");
    } else {
      remainder[key] = {{"kind", entry.value("kind", "")}};
    }
  }
  return remainder;
}

const char* StateValue::kind() const {
  if (is_module()) return "module";
  if (is_optimizer()) return "optimizer";
  if (is_tensor()) return "tensor";
  return "value";
}

}  // namespace strata::strategies
