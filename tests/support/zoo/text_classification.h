// The text classifier of PyTorch's "Text classification with the torchtext
// library" tutorial, as its authors write it (re-typed in LibTorch's C++):
// an EmbeddingBag that averages each text's token embeddings, one linear
// layer, weights drawn uniform in [-0.5, 0.5], trained with SGD (lr 5),
// cross-entropy and the gradient's norm clipped to 0.1. Its input is the
// batch's texts joined into one index tensor, with each text's offset.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "support/zoo/batch.h"

namespace zoo::text_classification {

struct TextClassificationModelImpl : torch::nn::Module {
  TextClassificationModelImpl(int64_t vocab_size, int64_t embed_dim, int64_t num_class)
      : embedding(torch::nn::EmbeddingBagOptions(vocab_size, embed_dim).sparse(false)), fc(embed_dim, num_class) {
    register_module("embedding", embedding);
    register_module("fc", fc);
    init_weights();
  }

  void init_weights() {
    const double initrange = 0.5;
    torch::NoGradGuard no_grad;
    embedding->weight.uniform_(-initrange, initrange);
    fc->weight.uniform_(-initrange, initrange);
    fc->bias.zero_();
  }

  torch::Tensor forward(const torch::Tensor& text, const torch::Tensor& offsets) {
    auto embedded = embedding->forward(text, offsets);
    return fc->forward(embedded);
  }

  torch::nn::EmbeddingBag embedding;
  torch::nn::Linear fc;
};
TORCH_MODULE(TextClassificationModel);

struct Config {
  int64_t vocab_size = 50, embed_dim = 8, num_class = 4;
};

/// Six texts of 1 to 6 tokens joined (tokens), their offsets, and their
/// classes.
inline std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> batch(const Config& c, uint64_t seed = 5) {
  auto gen = batch_generator(seed);
  std::vector<int64_t> offsets;
  int64_t total = 0;
  for (int64_t length : {3, 1, 6, 2, 5, 4}) {
    offsets.push_back(total);
    total += length;
  }
  return {labels(c.vocab_size, {total}, gen), torch::tensor(offsets, torch::kLong),
          labels(c.num_class, {static_cast<int64_t>(offsets.size())}, gen)};
}

/// The tutorial's training step: cross-entropy, backward, the gradient's
/// norm clipped to 0.1, SGD.
inline torch::Tensor train_step(TextClassificationModel& model, torch::optim::SGD& optimizer,
                                const torch::Tensor& text, const torch::Tensor& offsets, const torch::Tensor& label) {
  optimizer.zero_grad();
  auto predicted_label = model->forward(text, offsets);
  auto loss = torch::nn::functional::cross_entropy(predicted_label, label);
  loss.backward();
  torch::nn::utils::clip_grad_norm_(model->parameters(), 0.1);
  optimizer.step();
  return loss;
}

}  // namespace zoo::text_classification
