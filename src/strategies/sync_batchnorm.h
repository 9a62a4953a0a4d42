// Synchronised batch norm's registry, for the strategies' teardown and
// tests (sync_batchnorm.cpp, Note [Synchronised batch norm]).
#pragma once

#include <ATen/core/Tensor.h>

namespace strata::strategies::detail {

/// Unregisters every layer `owner` (a strategy) registered: their batch
/// norms compute as LibTorch's own again.
void release_sync_batchnorm(const void* owner);

/// True when the layer found by `key` (its running_mean, or its weight) is
/// registered.
bool batchnorm_kernel_registered(const at::Tensor& key);

}  // namespace strata::strategies::detail
