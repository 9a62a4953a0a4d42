// The generator and discriminator of pytorch/examples cpp/dcgan, as its
// authors write them: a generator module of four transposed convolutions
// with BatchNorm2d and ReLU, tanh at the end (a TORCH_MODULE holder), and a
// discriminator that is an nn::Sequential of convolutions, LeakyReLU,
// BatchNorm2d and a Sigmoid, trained with binary cross-entropy. The noise
// size is the generator's constructor argument there too; the tests give a
// small one.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <memory>

#include "support/zoo/batch.h"

namespace zoo::dcgan {

using namespace torch;

struct DCGANGeneratorImpl : nn::Module {
  DCGANGeneratorImpl(int kNoiseSize)
      : conv1(nn::ConvTranspose2dOptions(kNoiseSize, 256, 4).bias(false)),
        batch_norm1(256),
        conv2(nn::ConvTranspose2dOptions(256, 128, 3).stride(2).padding(1).bias(false)),
        batch_norm2(128),
        conv3(nn::ConvTranspose2dOptions(128, 64, 4).stride(2).padding(1).bias(false)),
        batch_norm3(64),
        conv4(nn::ConvTranspose2dOptions(64, 1, 4).stride(2).padding(1).bias(false)) {
    // register_module() is needed if we want to use the parameters() method later on
    register_module("conv1", conv1);
    register_module("conv2", conv2);
    register_module("conv3", conv3);
    register_module("conv4", conv4);
    register_module("batch_norm1", batch_norm1);
    register_module("batch_norm2", batch_norm2);
    register_module("batch_norm3", batch_norm3);
  }

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(batch_norm1(conv1(x)));
    x = torch::relu(batch_norm2(conv2(x)));
    x = torch::relu(batch_norm3(conv3(x)));
    x = torch::tanh(conv4(x));
    return x;
  }

  nn::ConvTranspose2d conv1, conv2, conv3, conv4;
  nn::BatchNorm2d batch_norm1, batch_norm2, batch_norm3;
};

TORCH_MODULE(DCGANGenerator);

inline nn::Sequential create_discriminator() {
  return nn::Sequential(
      // Layer 1
      nn::Conv2d(nn::Conv2dOptions(1, 64, 4).stride(2).padding(1).bias(false)),
      nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
      // Layer 2
      nn::Conv2d(nn::Conv2dOptions(64, 128, 4).stride(2).padding(1).bias(false)),
      nn::BatchNorm2d(128),
      nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
      // Layer 3
      nn::Conv2d(nn::Conv2dOptions(128, 256, 4).stride(2).padding(1).bias(false)),
      nn::BatchNorm2d(256),
      nn::LeakyReLU(nn::LeakyReLUOptions().negative_slope(0.2)),
      // Layer 4
      nn::Conv2d(nn::Conv2dOptions(256, 1, 3).stride(1).padding(0).bias(false)),
      nn::Sigmoid());
}

/// Parameters of the generator for `noise` inputs: the four transposed
/// convolutions (no bias) and the three BatchNorm2d's weight and bias.
constexpr int64_t generator_parameters(int64_t noise) {
  return noise * 256 * 16 + 256 * 128 * 9 + 128 * 64 * 16 + 64 * 1 * 16 + 2 * (256 + 128 + 64);
}

/// Parameters of the discriminator.
constexpr int64_t kDiscriminatorParameters =
    1 * 64 * 16 + 64 * 128 * 16 + 128 * 256 * 16 + 256 * 1 * 9 + 2 * (128 + 256);

/// One step's inputs: `n` real 28x28 images in [-1, 1] (n, 1, 28, 28), the
/// example's smoothed real labels in [0.8, 1.0) (n), and the generator's
/// noise (n, noise, 1, 1).
struct Batch {
  torch::Tensor real_images, real_labels, noise;
};

inline Batch batch(int64_t noise, int64_t n = 4, uint64_t seed = 2) {
  auto gen = batch_generator(seed);
  Batch b;
  b.real_images = torch::tanh(normal({n, 1, 28, 28}, gen));
  b.real_labels = torch::empty({n}).uniform_(0.8, 1.0, gen);
  b.noise = normal({n, noise, 1, 1}, gen);
  return b;
}

/// The example's models and their Adam optimizers (lr 2e-4, betas 0.5 and
/// 0.5), built from the current seed and moved to `device`.
struct Example {
  std::shared_ptr<DCGANGenerator> generator;
  std::shared_ptr<nn::Sequential> discriminator;
  std::shared_ptr<torch::optim::Adam> generator_optimizer, discriminator_optimizer;
};
inline Example example(int64_t noise, torch::Device device) {
  Example e;
  e.generator = std::make_shared<DCGANGenerator>(noise);
  e.discriminator = std::make_shared<nn::Sequential>(create_discriminator());
  (*e.generator)->to(device);
  (*e.discriminator)->to(device);
  const auto options = torch::optim::AdamOptions(2e-4).betas(std::make_tuple(0.5, 0.5));
  e.generator_optimizer = std::make_shared<torch::optim::Adam>((*e.generator)->parameters(), options);
  e.discriminator_optimizer = std::make_shared<torch::optim::Adam>((*e.discriminator)->parameters(), options);
  return e;
}

/// `b` on `device`.
inline Batch to(Batch b, torch::Device device) {
  b.real_images = b.real_images.to(device);
  b.real_labels = b.real_labels.to(device);
  b.noise = b.noise.to(device);
  return b;
}

/// The example's loss.
inline torch::Tensor loss(const torch::Tensor& output, const torch::Tensor& labels) {
  return torch::binary_cross_entropy(output, labels);
}

/// The discriminator's and the generator's loss of one step.
struct Losses {
  torch::Tensor d_loss, g_loss;
};

/// One step of the example's training loop on `b` (already on the models'
/// device): the discriminator on real and on fake images, then the
/// generator against the discriminator, each with its own optimizer.
/// `backward` is the loop's `loss.backward()` (Fabric's loop passes its
/// fabric.backward, as Lightning's docs have users do).
inline Losses train_step(DCGANGenerator& generator, nn::Sequential& discriminator,
                         torch::optim::Optimizer& generator_optimizer,
                         torch::optim::Optimizer& discriminator_optimizer, const Batch& b,
                         const std::function<void(const torch::Tensor&)>& backward =
                             [](const torch::Tensor& loss) { loss.backward(); }) {
  // Train discriminator with real images.
  discriminator->zero_grad();
  torch::Tensor real_output = discriminator->forward(b.real_images).reshape(b.real_labels.sizes());
  torch::Tensor d_loss_real = torch::binary_cross_entropy(real_output, b.real_labels);
  backward(d_loss_real);

  // Train discriminator with fake images.
  torch::Tensor fake_images = generator->forward(b.noise);
  torch::Tensor fake_labels = torch::zeros(b.noise.size(0), b.noise.options());
  torch::Tensor fake_output = discriminator->forward(fake_images.detach()).reshape(fake_labels.sizes());
  torch::Tensor d_loss_fake = torch::binary_cross_entropy(fake_output, fake_labels);
  backward(d_loss_fake);

  torch::Tensor d_loss = d_loss_real + d_loss_fake;
  discriminator_optimizer.step();

  // Train generator.
  generator->zero_grad();
  fake_labels.fill_(1);
  fake_output = discriminator->forward(fake_images).reshape(fake_labels.sizes());
  torch::Tensor g_loss = torch::binary_cross_entropy(fake_output, fake_labels);
  backward(g_loss);
  generator_optimizer.step();
  return {d_loss, g_loss};
}

}  // namespace zoo::dcgan
