// Training state as named tensors plus JSON, and back: what PyTorch's
// state_dict() and load_state_dict() do for modules and optimizers, plus the
// random generators.
//
// Everything is keyed by NAME, never by position or pointer, so a checkpoint
// can be loaded into a freshly built model, resharded, or resumed under
// another strategy:
// - module state: parameters and buffers under the names named_parameters()
//   and named_buffers() give ("blocks.0.attn.qkv.weight");
// - optimizer state (LibTorch's SGD, Adam, AdamW): per-parameter tensors
//   "<param name>.<state>" (e.g. "fc.weight.exp_avg"), and JSON holding the
//   optimizer type, each param group's options and parameter names, and the
//   per-parameter scalars (Adam's step);
// - the CPU random generator's state as a uint8 tensor.
#pragma once

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "strata/checkpoint/safetensors.h"

namespace strata::checkpoint {

/// What a non-strict load did not match.
struct LoadReport {
  std::vector<std::string> missing;     ///< expected by the target, absent from the state
  std::vector<std::string> unexpected;  ///< in the state, unknown to the target
  /// True when both lists are empty.
  bool ok() const { return missing.empty() && unexpected.empty(); }
};

/// The parameters and buffers of `module` (recursively), parameters first,
/// each in the order named_parameters() / named_buffers() give them. The
/// tensors alias the module's (no copy); undefined buffers are skipped.
NamedTensors module_state(const torch::nn::Module& module);

/// Copies `tensors` into `module`'s parameters and buffers of the same names,
/// in place and without recording gradients (so optimizers built over the
/// parameters stay valid). Every key matched must agree in shape and dtype,
/// otherwise CheckpointError naming the key and both shapes/dtypes. With
/// `strict`, a missing or unexpected key is a CheckpointError listing them
/// (the first 10 of each, then "and K more"); otherwise they are returned.
/// `source` names where the tensors came from, for messages.
LoadReport load_module_state(torch::nn::Module& module, const NamedTensors& tensors,
                             bool strict = true, const std::string& source = "module state");

/// Maps each parameter (by its TensorImpl) to its name.
using ParamNames = std::unordered_map<const c10::TensorImpl*, std::string>;

/// The names of `module`'s parameters, as named_parameters() gives them.
ParamNames param_names(const torch::nn::Module& module);

/// An optimizer's state: tensors "<param name>.<state>" and a JSON object
/// {"type": "adam"|"adamw"|"sgd", "param_groups": [{"params": [names...],
/// "options": {...}}], "state": {"<param name>": {"step": 3}, ...}}.
struct OptimizerState {
  NamedTensors tensors;
  nlohmann::json json;
};

/// Captures `optimizer`'s state, naming each parameter through `names`.
/// Supported: torch::optim::SGD (momentum_buffer), Adam and AdamW (step,
/// exp_avg, exp_avg_sq, max_exp_avg_sq with amsgrad). Throws CheckpointError
/// for another optimizer type or a parameter missing from `names`. The
/// tensors alias the optimizer's (no copy).
OptimizerState optimizer_state(const torch::optim::Optimizer& optimizer, const ParamNames& names);

/// Checks optimizer-state JSON, as optimizer_state() writes it, against the
/// names of the state tensors stored with it (`tensor_names`, without any
/// prefix), before anything uses it: the type is known; param-group
/// parameter names are strings, each in one group only; options are the
/// type's, finite and in range (lr, eps, weight_decay, momentum >= 0; each
/// beta in [0, 1); nesterov only with momentum > 0 and dampening 0); every
/// "state" entry names a parameter of a group, lists known tensors once
/// (max_exp_avg_sq only with amsgrad) and, for Adam, a "step" from 0 to
/// 2^53-1; every listed tensor is stored, and every stored tensor is listed
/// (an orphaned tensor is an error, never silently dropped). Throws
/// CheckpointError "[checkpoint] <where>: <field>...: ..." naming the field.
void validate_optimizer_state(const nlohmann::json& state, const std::vector<std::string>& tensor_names,
                              const std::string& where, const std::string& field);

/// Restores `state` into `optimizer`, an optimizer of the same type built
/// over parameters with the same names (possibly a different model object
/// or process): param-group options are set, and per-parameter state is
/// created or replaced (tensors copied to the parameter's device). Param
/// groups must match in number; within them, with `strict`, a parameter
/// name missing on either side is a CheckpointError listing them, otherwise
/// it is reported and a warning lists them (warn() in input.h). Throws
/// CheckpointError for a type mismatch, an unsupported optimizer, state
/// that fails validate_optimizer_state, or a state tensor whose shape or
/// dtype differs from its parameter's. `source` names where the state came
/// from, for messages.
LoadReport load_optimizer_state(torch::optim::Optimizer& optimizer, const ParamNames& names,
                                const OptimizerState& state, bool strict = true,
                                const std::string& source = "optimizer state");

/// The default CPU generator's state (a 1-D uint8 tensor, a copy).
at::Tensor cpu_rng_state();

/// Restores the default CPU generator's state from a tensor returned by
/// cpu_rng_state(). Throws CheckpointError when it is not a uint8 tensor of
/// the right size or the generator refuses its contents (e.g. all zeros);
/// `source` names where it came from, for messages.
void set_cpu_rng_state(const at::Tensor& state, const std::string& source = "CPU RNG state");

/// The state of `device`'s default generator (a 1-D uint8 CPU tensor, a
/// copy), through LibTorch's device-generic generator API: for "cpu" the
/// same as cpu_rng_state(), for "cuda:i" GPU i's Philox seed and offset.
at::Tensor device_rng_state(c10::Device device);

/// Restores `device`'s default generator from a tensor returned by
/// device_rng_state(device). Throws CheckpointError, naming `source`, when
/// it is not a 1-D uint8 tensor of that generator's size or the generator
/// refuses it.
void set_device_rng_state(c10::Device device, const at::Tensor& state, const std::string& source);

}  // namespace strata::checkpoint
