// The handle LibTorch gives to a leaf tensor's gradient accumulator (the
// autograd Node that adds into .grad), whatever smart pointer this LibTorch
// version uses for Nodes.
#pragma once

#include <torch/csrc/autograd/variable.h>

#include <utility>

namespace strata::strategies {

using GradAccumulator = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

}  // namespace strata::strategies
