// The network of pytorch/examples cpp/mnist, as its authors write it: two
// convolutions with max pooling, feature dropout on the second, two linear
// layers, dropout between them and log_softmax, trained with nll_loss. The
// top module is a plain value (`Net model;`), and forward calls each
// submodule as `conv1->forward(x)`.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>

#include "support/zoo/batch.h"

namespace zoo::mnist {

struct Net : torch::nn::Module {
  Net()
      : conv1(torch::nn::Conv2dOptions(1, 10, /*kernel_size=*/5)),
        conv2(torch::nn::Conv2dOptions(10, 20, /*kernel_size=*/5)),
        fc1(320, 50),
        fc2(50, 10) {
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("conv2_drop", conv2_drop);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(torch::max_pool2d(conv1->forward(x), 2));
    x = torch::relu(torch::max_pool2d(conv2_drop->forward(conv2->forward(x)), 2));
    x = x.view({-1, 320});
    x = torch::relu(fc1->forward(x));
    x = torch::dropout(x, /*p=*/0.5, /*training=*/is_training());
    x = fc2->forward(x);
    return torch::log_softmax(x, /*dim=*/1);
  }

  torch::nn::Conv2d conv1;
  torch::nn::Conv2d conv2;
  torch::nn::Dropout2d conv2_drop;
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
};

/// Parameters of Net: conv1 1*10*5*5+10, conv2 10*20*5*5+20, fc1 320*50+50,
/// fc2 50*10+10.
constexpr int64_t kParameters = 260 + 5020 + 16050 + 510;

/// `n` normalised 28x28 images (n, 1, 28, 28) and their digits (n).
inline std::pair<torch::Tensor, torch::Tensor> batch(int64_t n = 4, uint64_t seed = 1) {
  auto gen = batch_generator(seed);
  auto data = normal({n, 1, 28, 28}, gen);
  auto target = labels(10, {n}, gen);
  return {data, target};
}

/// The example's loss.
inline torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& target) {
  return torch::nll_loss(output, target);
}

}  // namespace zoo::mnist
