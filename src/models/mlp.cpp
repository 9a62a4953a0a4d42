// The MLP example model.
#include "strata/models/mlp.h"

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>

#include "strata/core/error.h"
#include "strata/core/module_hooks.h"

namespace strata::models {

MLPImpl::MLPImpl(int64_t in, int64_t hidden, int64_t out, int64_t n_hidden_layers)
    : torch::nn::Module(kTypeName) {
  STRATA_CHECK(in > 0 && hidden > 0 && out > 0, ConfigError, "[mlp] sizes must be > 0, got in=", in,
               " hidden=", hidden, " out=", out);
  STRATA_CHECK(n_hidden_layers >= 0, ConfigError, "[mlp] n_hidden_layers must be >= 0, got ", n_hidden_layers);
  layers = register_module("layers", torch::nn::ModuleList());
  int64_t width = in;
  for (int64_t i = 0; i < n_hidden_layers; ++i) {
    layers->push_back(torch::nn::Linear(width, hidden));
    width = hidden;
  }
  layers->push_back(torch::nn::Linear(width, out));
}

at::Tensor MLPImpl::forward(const at::Tensor& x) {
  // Hooked, so that FSDP can treat the model as its root unit.
  return hooked_forward(*this, x, [this](const at::Tensor& in) {
    at::Tensor h = in;
    const size_t n = layers->size();
    for (size_t i = 0; i < n; ++i) {
      h = layers->ptr(i)->as<torch::nn::LinearImpl>()->forward(h);
      if (i + 1 < n) h = at::relu(h);
    }
    return h;
  });
}

}  // namespace strata::models
