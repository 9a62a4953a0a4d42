// The model zoo (tests/support/zoo/) on the CPU: each model, written as its
// authors write it, has the parameters its definition implies, the
// parameter names a wrap policy or a checkpoint sees, and trains: three
// steps on its tiny batch give finite losses that fall (or, for the
// models that draw dropout masks or play a GAN's two sides, move).
#include <gtest/gtest.h>

#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "support/zoo/dcgan.h"
#include "support/zoo/fnet.h"
#include "support/zoo/llama.h"
#include "support/zoo/mnist.h"
#include "support/zoo/resnet.h"
#include "support/zoo/rnn_lm.h"
#include "support/zoo/vit.h"

namespace {

int64_t count(const std::vector<torch::Tensor>& params) {
  int64_t n = 0;
  for (const auto& p : params) n += p.numel();
  return n;
}

bool has_parameter(const torch::nn::Module& module, const std::string& name) {
  return module.named_parameters().contains(name);
}

/// The losses of `steps` optimizer steps of `step` (which returns the loss
/// before its update).
std::vector<double> train(int steps, const std::function<torch::Tensor()>& step) {
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) losses.push_back(step().item<double>());
  return losses;
}

void expect_finite(const std::vector<double>& losses) {
  for (double l : losses) EXPECT_TRUE(std::isfinite(l)) << l;
}

void expect_falls(const std::vector<double>& losses) {
  expect_finite(losses);
  ASSERT_EQ(losses.size(), 3u);
  EXPECT_LT(losses[1], losses[0]);
  EXPECT_LT(losses[2], losses[1]);
}

TEST(ZooTest, MnistNetHasTheExamplesParametersAndTrains) {
  torch::manual_seed(1);
  zoo::mnist::Net model;
  EXPECT_EQ(count(model.parameters()), zoo::mnist::kParameters);
  EXPECT_TRUE(has_parameter(model, "conv2.weight"));
  model.train();
  torch::optim::SGD optimizer(model.parameters(), torch::optim::SGDOptions(0.01).momentum(0.5));
  auto [data, target] = zoo::mnist::batch();
  auto losses = train(3, [&, &data = data, &target = target] {
    optimizer.zero_grad();
    auto output = model.forward(data);
    EXPECT_EQ(output.sizes(), (std::vector<int64_t>{4, 10}));
    auto loss = zoo::mnist::loss(output, target);
    loss.backward();
    optimizer.step();
    return loss;
  });
  expect_finite(losses);
  // Dropout draws new masks every step: the loss moves, not always down.
  EXPECT_NE(losses[0], losses[1]);
  EXPECT_NE(losses[1], losses[2]);
  // Without dropout the same batch is fitted.
  model.eval();
  auto before = zoo::mnist::loss(model.forward(data), target).item<double>();
  for (int i = 0; i < 3; ++i) {
    optimizer.zero_grad();
    zoo::mnist::loss(model.forward(data), target).backward();
    optimizer.step();
  }
  EXPECT_LT(zoo::mnist::loss(model.forward(data), target).item<double>(), before);
}

TEST(ZooTest, DcganGeneratesImagesAndBothSidesTrain) {
  torch::manual_seed(2);
  const int64_t noise = 8;
  zoo::dcgan::DCGANGenerator generator(noise);
  torch::nn::Sequential discriminator = zoo::dcgan::create_discriminator();
  EXPECT_EQ(count(generator->parameters()), zoo::dcgan::generator_parameters(noise));
  EXPECT_EQ(count(discriminator->parameters()), zoo::dcgan::kDiscriminatorParameters);
  EXPECT_TRUE(has_parameter(*discriminator, "3.weight"));  // the first BatchNorm2d
  EXPECT_EQ(discriminator->named_buffers().size(), 6u);  // two BatchNorm2d: mean, var, batches

  auto b = zoo::dcgan::batch(noise);
  EXPECT_EQ(generator->forward(b.noise).sizes(), (std::vector<int64_t>{4, 1, 28, 28}));
  torch::optim::Adam generator_optimizer(generator->parameters(),
                                         torch::optim::AdamOptions(2e-4).betas(std::make_tuple(0.5, 0.5)));
  torch::optim::Adam discriminator_optimizer(discriminator->parameters(),
                                             torch::optim::AdamOptions(2e-4).betas(std::make_tuple(0.5, 0.5)));
  std::vector<double> d_losses, g_losses;
  for (int i = 0; i < 3; ++i) {
    auto losses = zoo::dcgan::train_step(generator, discriminator, generator_optimizer, discriminator_optimizer, b);
    d_losses.push_back(losses.d_loss.item<double>());
    g_losses.push_back(losses.g_loss.item<double>());
  }
  expect_finite(d_losses);
  expect_finite(g_losses);
  // The discriminator learns to tell the fixed real batch from the fakes.
  EXPECT_LT(d_losses[2], d_losses[0]);
  EXPECT_NE(g_losses[0], g_losses[2]);
}

TEST(ZooTest, LlamaDecoderHasItsBlocksInLayersAndTrains) {
  torch::manual_seed(3);
  zoo::llama::ModelArgs args;
  zoo::llama::Transformer model(args);
  EXPECT_EQ(count(model->parameters()), zoo::llama::parameter_count(args));
  EXPECT_TRUE(has_parameter(*model, "layers.1.attention.wq.weight"));
  EXPECT_TRUE(has_parameter(*model, "layers.0.attention_norm.weight"));
  EXPECT_TRUE(has_parameter(*model, "layers.0.feed_forward.w3.weight"));
  auto [tokens, targets] = zoo::llama::batch(args);
  // Causal: a later token does not change earlier logits.
  auto changed = tokens.clone();
  changed.select(1, 5).fill_(0);
  auto a = model->forward(tokens), b = model->forward(changed);
  EXPECT_TRUE(torch::allclose(a.narrow(1, 0, 5), b.narrow(1, 0, 5)));
  EXPECT_FALSE(torch::allclose(a.narrow(1, 5, 1), b.narrow(1, 5, 1)));

  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  expect_falls(train(3, [&, &tokens = tokens, &targets = targets] {
    optimizer.zero_grad();
    auto loss = zoo::llama::loss(model->forward(tokens), targets);
    loss.backward();
    optimizer.step();
    return loss;
  }));
}

TEST(ZooTest, ResnetHasDownsampleWhereTheShapeChangesAndTrains) {
  torch::manual_seed(4);
  zoo::resnet::ResNet model(std::vector<int64_t>{1, 1});
  EXPECT_EQ(count(model->parameters()), zoo::resnet::parameter_count({1, 1}));
  EXPECT_TRUE(has_parameter(*model, "layer2.0.downsample.0.weight"));
  EXPECT_FALSE(has_parameter(*model, "layer1.0.downsample.0.weight"));
  EXPECT_TRUE(has_parameter(*model, "layer2.0.bn2.bias"));
  model->train();
  auto [images, classes] = zoo::resnet::batch();
  torch::optim::SGD optimizer(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  expect_falls(train(3, [&, &images = images, &classes = classes] {
    optimizer.zero_grad();
    auto logits = model->forward(images);
    EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{4, 10}));
    auto loss = zoo::resnet::loss(logits, classes);
    loss.backward();
    optimizer.step();
    return loss;
  }));
  // Training mode updated BatchNorm's running statistics.
  EXPECT_EQ(model->bn1->num_batches_tracked.item<int64_t>(), 3);
}

TEST(ZooTest, VitHasClassTokenAndPositionsAndTrains) {
  torch::manual_seed(5);
  zoo::vit::ViTConfig c;
  zoo::vit::VisionTransformer model(c);
  EXPECT_EQ(count(model->parameters()), zoo::vit::parameter_count(c));
  EXPECT_TRUE(has_parameter(*model, "cls_token"));
  EXPECT_TRUE(has_parameter(*model, "blocks.1.attn.in_proj_weight"));
  auto [images, classes] = zoo::vit::batch(c);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  expect_falls(train(3, [&, &images = images, &classes = classes] {
    optimizer.zero_grad();
    auto logits = model->forward(images);
    EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{4, 10}));
    auto loss = zoo::vit::loss(logits, classes);
    loss.backward();
    optimizer.step();
    return loss;
  }));
}

// FNet's token mixing, Re(F_S X F_H) for the DFT matrices F = C - iS of the
// sequence and hidden lengths, is C_S X C_H - S_S X S_H: computed here from
// cosines and sines, independently of torch::fft.
TEST(ZooTest, FNetMixesTokensByTheRealPartOfTheTwoDimensionalDftAndTrains) {
  torch::manual_seed(7);
  const zoo::fnet::FNetConfig c;
  auto dft = [](int64_t n) {
    const torch::Tensor k = torch::arange(n, torch::kDouble);
    const torch::Tensor angle = torch::outer(k, k) * (2 * M_PI / static_cast<double>(n));
    return std::make_pair(torch::cos(angle), torch::sin(angle));
  };
  const torch::Tensor x = torch::randn({2, c.seq_length, c.hidden_size}, torch::kDouble);
  const auto [cs, ss] = dft(c.seq_length);
  const auto [ch, sh] = dft(c.hidden_size);
  const torch::Tensor want = torch::matmul(torch::matmul(cs, x), ch) - torch::matmul(torch::matmul(ss, x), sh);
  zoo::fnet::FNetBasicFourierTransform mixing;
  EXPECT_TRUE(torch::allclose(mixing->forward(x), want, 1e-9, 1e-9));

  zoo::fnet::FNetForSequenceClassification model(c);
  EXPECT_TRUE(has_parameter(*model, "layer.1.fourier.output.LayerNorm.weight"));
  EXPECT_TRUE(has_parameter(*model, "embeddings.projection.weight"));
  auto [tokens, labels] = zoo::fnet::batch(c);
  torch::optim::AdamW optimizer(model->parameters(), torch::optim::AdamWOptions(1e-2));
  expect_falls(train(3, [&, &tokens = tokens, &labels = labels] {
    optimizer.zero_grad();
    auto logits = model->forward(tokens);
    EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{4, c.num_labels}));
    auto loss = zoo::fnet::loss(logits, labels);
    loss.backward();
    optimizer.step();
    return loss;
  }));
}

template <typename Model>
void expect_rnn_lm_trains(int64_t gates) {
  torch::manual_seed(6);
  zoo::rnn_lm::RNNConfig c;
  Model model(c);
  EXPECT_EQ(count(model->parameters()), zoo::rnn_lm::parameter_count(c, gates));
  EXPECT_TRUE(has_parameter(*model, "rnn.weight_hh_l1"));
  auto [tokens, targets] = zoo::rnn_lm::batch(c);
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(1e-2));
  expect_falls(train(3, [&, &tokens = tokens, &targets = targets] {
    optimizer.zero_grad();
    auto logits = model->forward(tokens);
    EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{2, 6, c.ntoken}));
    auto loss = zoo::rnn_lm::loss(logits, targets);
    loss.backward();
    optimizer.step();
    return loss;
  }));
}

TEST(ZooTest, LstmLanguageModelTrains) { expect_rnn_lm_trains<zoo::rnn_lm::LSTMModel>(4); }

TEST(ZooTest, GruLanguageModelTrains) { expect_rnn_lm_trains<zoo::rnn_lm::GRUModel>(3); }

TEST(ZooTest, BatchesAreTheSameWhateverTheGlobalSeed) {
  torch::manual_seed(7);
  auto a = zoo::mnist::batch();
  torch::manual_seed(8);
  auto b = zoo::mnist::batch();
  EXPECT_TRUE(torch::equal(a.first, b.first));
  EXPECT_TRUE(torch::equal(a.second, b.second));
  EXPECT_FALSE(torch::equal(a.first, zoo::mnist::batch(4, /*seed=*/9).first));
}

}  // namespace
