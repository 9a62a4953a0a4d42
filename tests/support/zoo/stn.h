// The network of PyTorch's "Spatial Transformer Networks" tutorial, as its
// authors write it (re-typed in LibTorch's C++): a localization network
// regresses a 2x3 affine matrix, initialised to the identity, whose grid
// (affine_grid) resamples the image (grid_sample, bilinear, zeros) before
// the MNIST classifier's convolutions, feature dropout, two linear layers
// and log_softmax, trained with SGD (lr 0.01) and nll_loss.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>

#include "support/zoo/batch.h"

namespace zoo::stn {

namespace F = torch::nn::functional;

struct Net : torch::nn::Module {
  Net()
      : conv1(torch::nn::Conv2dOptions(1, 10, 5)),
        conv2(torch::nn::Conv2dOptions(10, 20, 5)),
        fc1(320, 50),
        fc2(50, 10),
        localization(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 8, 7)),
                     torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2).stride(2)),
                     torch::nn::ReLU(torch::nn::ReLUOptions(true)),
                     torch::nn::Conv2d(torch::nn::Conv2dOptions(8, 10, 5)),
                     torch::nn::MaxPool2d(torch::nn::MaxPool2dOptions(2).stride(2)),
                     torch::nn::ReLU(torch::nn::ReLUOptions(true))),
        fc_loc(torch::nn::Linear(10 * 3 * 3, 32), torch::nn::ReLU(torch::nn::ReLUOptions(true)),
               torch::nn::Linear(32, 3 * 2)) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("conv2_drop", conv2_drop);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
    register_module("localization", localization);
    register_module("fc_loc", fc_loc);
    // Initialize the weights/bias with identity transformation
    torch::NoGradGuard no_grad;
    auto regressor = fc_loc[2]->as<torch::nn::Linear>();
    regressor->weight.zero_();
    regressor->bias.copy_(torch::tensor({1, 0, 0, 0, 1, 0}, torch::kFloat));
  }

  // Spatial transformer network forward function
  torch::Tensor stn(torch::Tensor x) {
    auto xs = localization->forward(x);
    xs = xs.view({-1, 10 * 3 * 3});
    auto theta = fc_loc->forward(xs);
    theta = theta.view({-1, 2, 3});
    auto grid = F::affine_grid(theta, x.sizes());
    return F::grid_sample(x, grid);
  }

  torch::Tensor forward(torch::Tensor x) {
    // transform the input
    x = stn(x);
    // Perform the usual forward pass
    x = torch::relu(torch::max_pool2d(conv1->forward(x), 2));
    x = torch::relu(torch::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2));
    x = x.view({-1, 320});
    x = F::relu(fc1->forward(x));
    x = F::dropout(x, F::DropoutFuncOptions().training(is_training()));
    x = fc2->forward(x);
    return F::log_softmax(x, 1);
  }

  torch::nn::Conv2d conv1;
  torch::nn::Conv2d conv2;
  torch::nn::Dropout2d conv2_drop;
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
  torch::nn::Sequential localization;
  torch::nn::Sequential fc_loc;
};

/// `n` normalised 28x28 images (n, 1, 28, 28) and their digits (n).
inline std::pair<torch::Tensor, torch::Tensor> batch(int64_t n = 4, uint64_t seed = 3) {
  auto gen = batch_generator(seed);
  auto data = normal({n, 1, 28, 28}, gen);
  auto target = labels(10, {n}, gen);
  return {data, target};
}

}  // namespace zoo::stn
