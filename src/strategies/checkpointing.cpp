// Full (consolidated) checkpoints for strategies whose ranks hold whole
// modules (single device, DDP): global rank 0 writes one checkpoint
// directory; every rank reads it, in either layout (full, or the sharded
// layout of the fully-sharded strategy at any world size) through
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

#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/sharded.h"
#include "strata/checkpoint/single_file.h"
#include "strata/checkpoint/state.h"
#include "strata/core/error.h"
#include "strata/strategies/strategy.h"

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

// The keys of the module entries of `state`.
std::vector<std::string> module_keys_of(const State& state) {
  std::vector<std::string> keys;
  for (const auto& [key, value] : state)
    if (value.is_module()) keys.push_back(key);
  return keys;
}

// The tensors of `tensors` that `filter` keeps, under their stored names
// ("<key>/<name>", or plain for the model of a one-file checkpoint). They
// alias the state's tensors: the writer copies them one at a time.
checkpoint::NamedTensors with_prefix(const std::string& key, const checkpoint::NamedTensors& tensors,
                                     const StateFilter& filter, const std::string& plain_key) {
  auto keep = filter.find(key);
  checkpoint::NamedTensors out;
  for (const auto& [name, tensor] : tensors) {
    if (keep != filter.end() && !keep->second(name, tensor)) continue;
    out.emplace_back(checkpoint::entry_tensor_name(key, name, plain_key), tensor.detach());
  }
  return out;
}

// The tensors of entry `key` of the checkpoint, without their prefix, each
// whole (assembled from its shards when sharded).
checkpoint::NamedTensors read_prefixed(const checkpoint::StateReader& reader, const std::string& key) {
  checkpoint::NamedTensors out;
  for (const std::string& name : reader.names_under(key))
    out.emplace_back(name, reader.full(reader.tensor_of(key, name)));
  return out;
}

}  // namespace

void Strategy::save_checkpoint(const std::string& path, const State& state, const nlohmann::json& storage_options,
                               const StateFilter& filter) {
  STRATA_CHECK(storage_options.is_null() || storage_options.empty(), ConfigError, "[", name(),
               "] storage_options are not supported (no CheckpointIO plugins); pass none");
  STRATA_CHECK(!state.empty(), ConfigError, "[", name(), "] save_checkpoint got an empty state; nothing to save");
  if (is_global_zero()) {
    checkpoint::ParamNames names = param_names_of(state);
    checkpoint::NamedTensors tensors;
    nlohmann::json entries = nlohmann::json::object();
    // One file (PATH.safetensors): the model keeps its plain names.
    const bool one_file = checkpoint::is_single_file_path(path);
    const std::string plain_key = one_file ? checkpoint::primary_module(module_keys_of(state)) : "";
    for (const auto& [key, value] : state) {
      STRATA_CHECK(key.find('/') == std::string::npos, ConfigError, "[checkpoint] state key '", key,
                   "' contains '/'; use another name");
      if (value.is_module()) {
        checkpoint::NamedTensors part =
            with_prefix(key, checkpoint::module_state(*value.module()), filter, plain_key);
        tensors.insert(tensors.end(), part.begin(), part.end());
        entries[key] = {{"kind", "module"}};
        if (key == plain_key) entries[key]["prefix"] = "";
      } else if (value.is_optimizer()) {
        checkpoint::OptimizerState optim = checkpoint::optimizer_state(value.optimizer(), names);
        checkpoint::NamedTensors part = with_prefix(key, optim.tensors, filter, plain_key);
        tensors.insert(tensors.end(), part.begin(), part.end());
        entries[key] = {{"kind", "optimizer"}, {"state", optim.json}};
      } else if (value.is_tensor()) {
        tensors.emplace_back(key, value.tensor().detach());
        entries[key] = {{"kind", "tensor"}};
      } else {
        entries[key] = {{"kind", "value"}, {"value", value.value()}};
      }
    }
    nlohmann::json metadata = {{"strategy", name()},
                               {"world_size", world_size()},
                               {"state_dict_type", "full"},
                               {"entries", entries}};
    // Streamed: the writer takes the specs first, then copies one tensor at a
    // time to CPU, so a device-resident state never needs a second copy.
    std::vector<checkpoint::TensorSpec> specs;
    for (const auto& [name, tensor] : tensors) specs.push_back(checkpoint::TensorSpec::of(name, tensor));
    if (one_file) {
      checkpoint::SafetensorsWriter file = checkpoint::begin_checkpoint_file(path, std::move(specs), metadata);
      for (const auto& [name, tensor] : tensors) file.write(name, tensor);
      file.close();
    } else {
      checkpoint::CheckpointWriter writer = checkpoint::CheckpointWriter::begin(path);
      checkpoint::SafetensorsWriter file = writer.open_file(checkpoint::kFullStateFile, std::move(specs));
      for (const auto& [name, tensor] : tensors) file.write(name, tensor);
      file.close();
      writer.commit(metadata);
    }
  }
  barrier("save_checkpoint");
}

void Strategy::load_module_entry(const checkpoint::StateReader& reader, const std::string& key,
                                 torch::nn::Module& module, bool strict, const std::string& source) {
  checkpoint::load_module_state(module, read_prefixed(reader, key), strict, source);
}

checkpoint::NamedTensors Strategy::read_optimizer_tensors(const checkpoint::StateReader& reader,
                                                          const std::string& key) {
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
      checkpoint::OptimizerState optim{read_optimizer_tensors(reader, key), entry.at("state")};
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

}  // namespace strata::strategies
