// Recomputation: run a forward without keeping its activations and run it
// again during backward. This is what Lightning and PyTorch call activation
// checkpointing (the name kept in the options users type,
// activation_checkpointing_policy and --activation-checkpointing); inside
// strata "checkpoint" means saved state only. LibTorch's C++ API has no
// such helper; this is an autograd Function of strata's own.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "strata/core/module_hooks.h"

namespace strata::strategies {

/// Returns body(input), computed without recording the graph inside body;
/// during backward body runs again (same random-number and autocast state
/// as the first time) and its gradients flow to `input` and to every
/// parameter body used. Gradients equal those of body(input) run plainly.
/// Outside grad mode it is body(input). `body` is kept until backward, so
/// it must not capture locals by reference.
at::Tensor recomputed_forward(const ForwardBody& body, const at::Tensor& input);

/// The form with any number of tensors in and out: gradients flow to every
/// input that requires grad, from every output that does. `unchanged` are
/// tensors the forward updates in place that the recomputation must leave
/// as the forward left them (a module's buffers: Note [One update of the
/// running statistics] in recompute.cpp).
TensorList recomputed_forward(const ForwardFn& body, const TensorList& inputs,
                              std::vector<at::Tensor> unchanged = {});

}  // namespace strata::strategies
