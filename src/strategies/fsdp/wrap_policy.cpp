// The auto-wrap policy (a set of module types, or a predicate).
#include "wrap_policy.h"

#include <string>
#include <string_view>
#include <unordered_set>

#include "strata/core/module_hooks.h"

namespace strata::strategies::detail {
namespace {

// Applies `policy` below `module`; returns the number of elements not
// wrapped into a unit. Units are appended bottom-up.
int64_t apply_policy(torch::nn::Module& module, const AutoWrapPolicy& policy, bool is_root,
                     std::vector<torch::nn::Module*>& units) {
  int64_t total = numel_of(module, true);
  bool descend = true;
  if (std::holds_alternative<std::monostate>(policy)) descend = false;
  if (auto* predicate = std::get_if<WrapPredicate>(&policy); predicate && !is_root) {
    descend = (*predicate)(module, true, total);
  }
  if (!descend) return total;
  int64_t nonwrapped = numel_of(module, false);
  for (const auto& child : module.children()) {
    if (is_forward_hooks_holder(*child)) continue;  // another strategy's hooks, not the model's
    nonwrapped += apply_policy(*child, policy, false, units);
  }
  if (is_root || !wraps(policy, module, nonwrapped)) return nonwrapped;
  units.push_back(&module);
  return 0;
}

}  // namespace

std::string short_type_name(const std::string& name) {
  // "torch::nn::LinearImpl" -> "Linear"
  size_t colon = name.rfind("::");
  std::string last = colon == std::string::npos ? name : name.substr(colon + 2);
  constexpr std::string_view kImpl = "Impl";
  if (last.size() > kImpl.size() && last.ends_with(kImpl)) last.resize(last.size() - kImpl.size());
  return last;
}

bool matches(const ModuleTypes& types, const torch::nn::Module& module) {
  if (types.empty()) return false;
  const std::string& name = module.name();
  return types.count(name) > 0 || types.count(short_type_name(name)) > 0;
}

bool wraps(const AutoWrapPolicy& policy, const torch::nn::Module& module, int64_t nonwrapped_numel) {
  if (auto* types = std::get_if<ModuleTypes>(&policy)) return matches(*types, module);
  if (auto* predicate = std::get_if<WrapPredicate>(&policy)) return (*predicate)(module, false, nonwrapped_numel);
  return false;
}

}  // namespace strata::strategies::detail

namespace strata::strategies {

WrapPredicate wrap_every_leaf() {
  return [](const torch::nn::Module& module, bool recurse, int64_t nonwrapped_numel) {
    if (recurse) return true;
    for (const auto& child : module.children()) {
      if (!is_forward_hooks_holder(*child)) return false;
    }
    return nonwrapped_numel > 0;
  };
}

}  // namespace strata::strategies

namespace strata::strategies::detail {

int64_t numel_of(const torch::nn::Module& module, bool recurse) {
  std::unordered_set<const c10::TensorImpl*> seen;
  int64_t n = 0;
  for (const at::Tensor& p : module.parameters(recurse)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  }
  return n;
}

std::vector<torch::nn::Module*> unit_modules(torch::nn::Module& root, const AutoWrapPolicy& policy) {
  std::vector<torch::nn::Module*> units;
  apply_policy(root, policy, true, units);
  units.push_back(&root);
  return units;
}

}  // namespace strata::strategies::detail
