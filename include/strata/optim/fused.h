// Fused optimizers for LibTorch's C++ frontend: AdamW, Adam and SGD whose
// step is one ATen fused kernel per (device, dtype) group of parameters
// (_fused_adamw_, _fused_adam_, _fused_sgd_: the kernels behind PyTorch's
// `fused=True`) instead of a loop of several passes per parameter.
//
// Each one is a torch::optim optimizer of the same name underneath: the
// same options, param groups, state objects and serialization, so that
//  - a checkpoint saved with one loads into the other (torch::serialize,
//    strata's checkpoint files, Lightning's optimizer_states);
//  - strata's strategies, Fabric and the Trainer take them wherever they
//    take the torch::optim ones;
//  - parameters the fused kernels do not serve (sparse gradients, integer
//    parameters) take the torch::optim step instead, counted in
//    loop_steps(); on the xla device each group's step is one graph node.
//
//   auto opt = std::make_shared<strata::optim::AdamW>(
//       model->parameters(), torch::optim::AdamWOptions(1e-3).weight_decay(0.1));
//
// Results equal torch::optim's to rounding, not bit for bit: the fused
// kernel evaluates the same update in another order (Note [Fused against
// the loop] in src/optim/fused.cpp says how close, and why).
#pragma once

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cstdint>

namespace strata::optim {

/// torch::optim's `Base` whose step runs ATen's fused kernel where one
/// serves the parameters, and `Base`'s own loop otherwise.
template <class Base>
class Fused : public Base {
 public:
  using Base::Base;
  using typename Base::LossClosure;
  /// One step: the fused kernel once per (device, dtype) group when every
  /// parameter with a gradient is a dense float CPU or CUDA tensor (or an
  /// f32 tensor on the xla device), else
  /// `Base::step` (counted in loop_steps()). Returns the closure's loss.
  torch::Tensor step(LossClosure closure = nullptr) override;
  /// Steps (of any group) that fell back to torch::optim's loop.
  int64_t loop_steps() const { return loop_steps_; }

 private:
  /// The fused update of every group (gradients defined, no grad mode).
  void fused_step();
  int64_t loop_steps_ = 0;
};

/// torch::optim::AdamW (decoupled weight decay) on _fused_adamw_.
using AdamW = Fused<torch::optim::AdamW>;
/// torch::optim::Adam (L2 weight decay added to the gradient) on _fused_adam_.
using Adam = Fused<torch::optim::Adam>;
/// torch::optim::SGD (momentum, dampening, Nesterov, weight decay) on
/// _fused_sgd_.
using SGD = Fused<torch::optim::SGD>;

template <>
void Fused<torch::optim::AdamW>::fused_step();
template <>
void Fused<torch::optim::Adam>::fused_step();
template <>
void Fused<torch::optim::SGD>::fused_step();
extern template class Fused<torch::optim::AdamW>;
extern template class Fused<torch::optim::Adam>;
extern template class Fused<torch::optim::SGD>;

/// Whether `optimizer` is one of the fused ones above.
bool is_fused(const torch::optim::Optimizer& optimizer);

}  // namespace strata::optim
