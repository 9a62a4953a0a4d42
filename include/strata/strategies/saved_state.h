// The `state` a user saves and loads: a map from names to modules,
// optimizers, tensors and plain values (numbers, strings, JSON), as a
// Lightning Fabric user writes `state = {"model": model, "step": 0}`: what
// Fabric::save() writes and Fabric::load() restores.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>
#include <variant>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace strata::strategies {

using ModulePtr = std::shared_ptr<torch::nn::Module>;

/// One entry of a State. Modules and optimizers are held by reference
/// (loading restores them in place); tensors are handles (loading copies
/// into them in place); values are JSON (loading replaces them).
class StateValue {
 public:
  StateValue(ModulePtr module) : value_(std::move(module)) {}
  template <class M, class = decltype(std::declval<M&>().ptr())>
  StateValue(const M& module_holder) : value_(ModulePtr(module_holder.ptr())) {}
  StateValue(torch::optim::Optimizer& optimizer) : value_(&optimizer) {}
  StateValue(at::Tensor tensor) : value_(std::move(tensor)) {}
  StateValue(nlohmann::json value) : value_(std::move(value)) {}
  StateValue(int v) : value_(nlohmann::json(v)) {}
  StateValue(int64_t v) : value_(nlohmann::json(v)) {}
  StateValue(double v) : value_(nlohmann::json(v)) {}
  StateValue(bool v) : value_(nlohmann::json(v)) {}
  StateValue(const char* v) : value_(nlohmann::json(v)) {}
  StateValue(std::string v) : value_(nlohmann::json(std::move(v))) {}

  bool is_module() const { return std::holds_alternative<ModulePtr>(value_); }
  bool is_optimizer() const { return std::holds_alternative<torch::optim::Optimizer*>(value_); }
  bool is_tensor() const { return std::holds_alternative<at::Tensor>(value_); }
  bool is_value() const { return std::holds_alternative<nlohmann::json>(value_); }

  const ModulePtr& module() const { return std::get<ModulePtr>(value_); }
  torch::optim::Optimizer& optimizer() const { return *std::get<torch::optim::Optimizer*>(value_); }
  const at::Tensor& tensor() const { return std::get<at::Tensor>(value_); }
  const nlohmann::json& value() const { return std::get<nlohmann::json>(value_); }
  nlohmann::json& value() { return std::get<nlohmann::json>(value_); }

  /// The value converted to T (numbers, strings, vectors, maps...).
  template <class T>
  T get() const {
    return value().get<T>();
  }

  /// "module", "optimizer", "tensor" or "value".
  const char* kind() const;

 private:
  std::variant<ModulePtr, torch::optim::Optimizer*, at::Tensor, nlohmann::json> value_;
};

/// What save() writes and load() restores, by name.
using State = std::map<std::string, StateValue>;

/// A filter for save_checkpoint: `filter[key](name, tensor)` keeps an
/// entry of state[key] (a module or optimizer tensor) when it returns true.
using StateFilter = std::map<std::string, std::function<bool(const std::string&, const at::Tensor&)>>;

}  // namespace strata::strategies
