// A plain multi-layer perceptron (Linear + ReLU), used by tests and by the
// data-parallel benchmark (its 512-2048-512 model is MLP(512, 2048, 512, 1)).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/pimpl.h>

#include <cstdint>

namespace strata::models {

/// in -> [hidden -> ReLU] x n_hidden_layers -> out. Parameters are named
/// layers.<i>.weight / layers.<i>.bias, i = 0..n_hidden_layers.
/// `module.name()` returns kTypeName ("MLP").
class MLPImpl : public torch::nn::Module {
 public:
  static constexpr const char* kTypeName = "MLP";

  /// Builds n_hidden_layers + 1 Linear layers with LibTorch's default
  /// initialisation (deterministic under torch::manual_seed). With
  /// n_hidden_layers = 0 the model is one Linear(in, out). Throws
  /// ConfigError ("[mlp] ...") for non-positive sizes or a negative count.
  MLPImpl(int64_t in, int64_t hidden, int64_t out, int64_t n_hidden_layers = 1);

  /// x [..., in] -> [..., out].
  at::Tensor forward(const at::Tensor& x);

  torch::nn::ModuleList layers{nullptr};
};
TORCH_MODULE(MLP);

}  // namespace strata::models
