// The auto-wrap policy: which modules of a model become FSDP units.
// Private to the strategies area.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <vector>

#include "strata/strategies/fsdp.h"

namespace strata::strategies::detail {

/// The short form of a module type name: the last component without a
/// trailing "Impl" ("torch::nn::LinearImpl" -> "Linear").
std::string short_type_name(const std::string& name);

/// True when `module`'s type (module.name()) or its short form is in
/// `types`.
bool matches(const ModuleTypes& types, const torch::nn::Module& module);

/// Whether `policy` makes `module` a unit, given the elements of its
/// parameters not already in a unit below it.
bool wraps(const AutoWrapPolicy& policy, const torch::nn::Module& module, int64_t nonwrapped_numel);

/// Elements of `module`'s parameters (below it too when `recurse`), each
/// tensor once.
int64_t numel_of(const torch::nn::Module& module, bool recurse);

/// The units `policy` makes below `root` (children before their parents),
/// then the root, which is always a unit.
std::vector<torch::nn::Module*> unit_modules(torch::nn::Module& root, const AutoWrapPolicy& policy);

}  // namespace strata::strategies::detail
