// Messages and lookups shared by the module and optimizer state loaders
// (state_dict.cpp, optimizer_state.cpp). Private to the checkpoint area.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "strata/checkpoint/state_dict.h"
#include "strata/core/strings.h"

namespace strata::checkpoint::state_messages {

/// Keys a message lists before "and K more".
inline constexpr size_t kListedKeys = 10;

using ::strata::shape_string;  // "[2, 3]" (core/strings.h)

/// "'a', 'b', ... and K more" (the first kListedKeys names).
std::string key_list(const std::vector<std::string>& keys);

/// "1 missing key", "3 missing keys".
std::string plural(size_t n, const char* word);

/// Throws the strict-load error for `report` (CheckpointError naming
/// `source` and `what`), when it is not ok.
void check_strict(const LoadReport& report, const std::string& source, const char* what);

/// The tensors by name; CheckpointError when a name appears twice.
std::unordered_map<std::string, at::Tensor> index_tensors(const NamedTensors& tensors, const std::string& source);

}  // namespace strata::checkpoint::state_messages
