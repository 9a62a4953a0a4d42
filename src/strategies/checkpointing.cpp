// Full (consolidated) checkpoints for strategies whose ranks hold whole
// modules (single device, DDP): global rank 0 writes one checkpoint
// directory; every rank reads it.
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
#include "strata/checkpoint/state.h"
#include "strata/core/error.h"
#include "strata/strategies/strategy.h"

namespace strata::strategies {
namespace {

constexpr const char* kStateFile = "state.safetensors";

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

checkpoint::NamedTensors with_prefix(const std::string& key, const checkpoint::NamedTensors& tensors,
                                     const StateFilter& filter) {
  auto keep = filter.find(key);
  checkpoint::NamedTensors out;
  for (const auto& [name, tensor] : tensors) {
    if (keep != filter.end() && !keep->second(name, tensor)) continue;
    out.emplace_back(key + "/" + name, tensor.detach().to(c10::Device(c10::kCPU)).contiguous());
  }
  return out;
}

// The tensors of `file` whose names start with "<key>/", without the prefix.
checkpoint::NamedTensors read_prefixed(checkpoint::SafetensorsFile& file, const std::string& key) {
  checkpoint::NamedTensors out;
  std::string prefix = key + "/";
  for (const std::string& name : file.keys()) {
    if (name.rfind(prefix, 0) == 0) out.emplace_back(name.substr(prefix.size()), file.load(name));
  }
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
    for (const auto& [key, value] : state) {
      STRATA_CHECK(key.find('/') == std::string::npos, ConfigError, "[checkpoint] state key '", key,
                   "' contains '/'; use another name");
      if (value.is_module()) {
        checkpoint::NamedTensors part = with_prefix(key, checkpoint::module_state(*value.module()), filter);
        tensors.insert(tensors.end(), part.begin(), part.end());
        entries[key] = {{"kind", "module"}};
      } else if (value.is_optimizer()) {
        checkpoint::OptimizerState optim = checkpoint::optimizer_state(value.optimizer(), names);
        checkpoint::NamedTensors part = with_prefix(key, optim.tensors, filter);
        tensors.insert(tensors.end(), part.begin(), part.end());
        entries[key] = {{"kind", "optimizer"}, {"state", optim.json}};
      } else if (value.is_tensor()) {
        tensors.emplace_back(key, value.tensor().detach().to(c10::Device(c10::kCPU)).contiguous());
        entries[key] = {{"kind", "tensor"}};
      } else {
        entries[key] = {{"kind", "value"}, {"value", value.value()}};
      }
    }
    nlohmann::json metadata = {{"strategy", name()},
                               {"world_size", world_size()},
                               {"state_dict_type", "full"},
                               {"entries", entries}};
    checkpoint::write_checkpoint_dir(path, {{kStateFile, tensors}}, metadata);
  }
  barrier("save_checkpoint");
}

nlohmann::json Strategy::load_checkpoint(const std::string& path, State& state, bool strict) {
  STRATA_CHECK(!state.empty(), ConfigError, "[", name(),
               "] load_checkpoint got an empty state: pass the modules, optimizers and values to restore");
  checkpoint::CheckpointReader reader = checkpoint::CheckpointReader::open(path);
  const nlohmann::json& entries = reader.metadata().value("entries", nlohmann::json::object());
  STRATA_CHECK(reader.has_file(kStateFile), CheckpointError, "[checkpoint] ", path, " has no ", kStateFile,
               " (written by another strategy's sharded layout?)");
  checkpoint::SafetensorsFile file = reader.open_file(kStateFile);

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
      checkpoint::load_module_state(*value.module(), read_prefixed(file, key), strict, source);
    } else if (value.is_optimizer()) {
      checkpoint::OptimizerState optim{read_prefixed(file, key), entry.at("state")};
      checkpoint::load_optimizer_state(value.optimizer(), names, optim, strict, source);
    } else if (value.is_tensor()) {
      at::Tensor stored = file.load(key);
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
