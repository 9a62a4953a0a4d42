// FNet ("FNet: Mixing Tokens with Fourier Transforms", Lee-Thorp et al.)
// for sequence classification, as Hugging Face's modeling_fnet.py writes
// it (re-typed in LibTorch's C++): word, position and token type
// embeddings summed, LayerNorm and a linear projection; encoder layers
// whose token mixing is the real part of a two-dimensional Fourier
// transform over the sequence and hidden dims (torch.fft.fftn(x, dim=(1,
// 2)).real) added back and normalised, then a GELU feed-forward with its
// own residual LayerNorm; a tanh pooler over the first token and a linear
// classifier, trained with cross-entropy. Tiny shapes; the config's
// dropout probability is 0, so the losses compare across devices.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "support/zoo/batch.h"

namespace zoo::fnet {

struct FNetConfig {
  int64_t vocab_size = 64;
  int64_t hidden_size = 16;
  int64_t num_hidden_layers = 2;
  int64_t intermediate_size = 32;
  double hidden_dropout_prob = 0.0;
  int64_t max_position_embeddings = 16;
  int64_t type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
  int64_t num_labels = 3;
  int64_t seq_length = 8;  // of the batch
};

struct FNetEmbeddingsImpl : torch::nn::Module {
  explicit FNetEmbeddingsImpl(const FNetConfig& config)
      : word_embeddings(config.vocab_size, config.hidden_size),
        position_embeddings(config.max_position_embeddings, config.hidden_size),
        token_type_embeddings(config.type_vocab_size, config.hidden_size),
        LayerNorm(torch::nn::LayerNormOptions({config.hidden_size}).eps(config.layer_norm_eps)),
        projection(config.hidden_size, config.hidden_size),
        dropout(config.hidden_dropout_prob) {
    register_module("word_embeddings", word_embeddings);
    register_module("position_embeddings", position_embeddings);
    register_module("token_type_embeddings", token_type_embeddings);
    register_module("LayerNorm", LayerNorm);
    register_module("projection", projection);
    register_module("dropout", dropout);
    position_ids = register_buffer("position_ids", torch::arange(config.max_position_embeddings).expand({1, -1}));
    token_type_ids = register_buffer("token_type_ids", torch::zeros({1, config.max_position_embeddings}, torch::kLong));
  }

  torch::Tensor forward(const torch::Tensor& input_ids) {
    const int64_t seq_length = input_ids.size(1);
    const torch::Tensor positions = position_ids.slice(1, 0, seq_length);
    const torch::Tensor types = token_type_ids.slice(1, 0, seq_length).expand({input_ids.size(0), seq_length});
    torch::Tensor embeddings = word_embeddings->forward(input_ids) + token_type_embeddings->forward(types);
    embeddings = embeddings + position_embeddings->forward(positions);
    embeddings = LayerNorm->forward(embeddings);
    embeddings = projection->forward(embeddings);
    return dropout->forward(embeddings);
  }

  torch::nn::Embedding word_embeddings, position_embeddings, token_type_embeddings;
  torch::nn::LayerNorm LayerNorm;
  torch::nn::Linear projection;
  torch::nn::Dropout dropout;
  torch::Tensor position_ids, token_type_ids;
};
TORCH_MODULE(FNetEmbeddings);

struct FNetBasicFourierTransformImpl : torch::nn::Module {
  torch::Tensor forward(const torch::Tensor& hidden_states) {
    return torch::real(torch::fft::fftn(hidden_states, std::nullopt, std::vector<int64_t>{1, 2}));
  }
};
TORCH_MODULE(FNetBasicFourierTransform);

struct FNetBasicOutputImpl : torch::nn::Module {
  explicit FNetBasicOutputImpl(const FNetConfig& config)
      : LayerNorm(torch::nn::LayerNormOptions({config.hidden_size}).eps(config.layer_norm_eps)) {
    register_module("LayerNorm", LayerNorm);
  }
  torch::Tensor forward(const torch::Tensor& hidden_states, const torch::Tensor& input_tensor) {
    return LayerNorm->forward(input_tensor + hidden_states);
  }
  torch::nn::LayerNorm LayerNorm;
};
TORCH_MODULE(FNetBasicOutput);

struct FNetFourierTransformImpl : torch::nn::Module {
  explicit FNetFourierTransformImpl(const FNetConfig& config) : output(config) {
    register_module("self", self);
    register_module("output", output);
  }
  torch::Tensor forward(const torch::Tensor& hidden_states) {
    return output->forward(self->forward(hidden_states), hidden_states);
  }
  FNetBasicFourierTransform self;
  FNetBasicOutput output;
};
TORCH_MODULE(FNetFourierTransform);

struct FNetIntermediateImpl : torch::nn::Module {
  explicit FNetIntermediateImpl(const FNetConfig& config) : dense(config.hidden_size, config.intermediate_size) {
    register_module("dense", dense);
  }
  torch::Tensor forward(const torch::Tensor& hidden_states) {
    return torch::nn::functional::gelu(dense->forward(hidden_states));
  }
  torch::nn::Linear dense;
};
TORCH_MODULE(FNetIntermediate);

struct FNetOutputImpl : torch::nn::Module {
  explicit FNetOutputImpl(const FNetConfig& config)
      : dense(config.intermediate_size, config.hidden_size),
        LayerNorm(torch::nn::LayerNormOptions({config.hidden_size}).eps(config.layer_norm_eps)),
        dropout(config.hidden_dropout_prob) {
    register_module("dense", dense);
    register_module("LayerNorm", LayerNorm);
    register_module("dropout", dropout);
  }
  torch::Tensor forward(const torch::Tensor& hidden_states, const torch::Tensor& input_tensor) {
    return LayerNorm->forward(dropout->forward(dense->forward(hidden_states)) + input_tensor);
  }
  torch::nn::Linear dense;
  torch::nn::LayerNorm LayerNorm;
  torch::nn::Dropout dropout;
};
TORCH_MODULE(FNetOutput);

struct FNetLayerImpl : torch::nn::Module {
  explicit FNetLayerImpl(const FNetConfig& config) : fourier(config), intermediate(config), output(config) {
    register_module("fourier", fourier);
    register_module("intermediate", intermediate);
    register_module("output", output);
  }
  torch::Tensor forward(const torch::Tensor& hidden_states) {
    const torch::Tensor fourier_output = fourier->forward(hidden_states);
    return output->forward(intermediate->forward(fourier_output), fourier_output);
  }
  FNetFourierTransform fourier;
  FNetIntermediate intermediate;
  FNetOutput output;
};
TORCH_MODULE(FNetLayer);

struct FNetPoolerImpl : torch::nn::Module {
  explicit FNetPoolerImpl(const FNetConfig& config) : dense(config.hidden_size, config.hidden_size) {
    register_module("dense", dense);
  }
  torch::Tensor forward(const torch::Tensor& hidden_states) {
    return torch::tanh(dense->forward(hidden_states.select(1, 0)));
  }
  torch::nn::Linear dense;
};
TORCH_MODULE(FNetPooler);

struct FNetForSequenceClassificationImpl : torch::nn::Module {
  explicit FNetForSequenceClassificationImpl(const FNetConfig& config)
      : embeddings(config), pooler(config), dropout(config.hidden_dropout_prob),
        classifier(config.hidden_size, config.num_labels) {
    register_module("embeddings", embeddings);
    for (int64_t i = 0; i < config.num_hidden_layers; ++i) layer->push_back(FNetLayer(config));
    register_module("layer", layer);
    register_module("pooler", pooler);
    register_module("dropout", dropout);
    register_module("classifier", classifier);
  }
  torch::Tensor forward(const torch::Tensor& input_ids) {
    torch::Tensor hidden_states = embeddings->forward(input_ids);
    for (const auto& module : *layer) hidden_states = module->as<FNetLayer>()->forward(hidden_states);
    return classifier->forward(dropout->forward(pooler->forward(hidden_states)));
  }
  FNetEmbeddings embeddings;
  torch::nn::ModuleList layer;
  FNetPooler pooler;
  torch::nn::Dropout dropout;
  torch::nn::Linear classifier;
};
TORCH_MODULE(FNetForSequenceClassification);

/// `batch_size` sequences of token ids and their labels.
inline std::pair<torch::Tensor, torch::Tensor> batch(const FNetConfig& c, int64_t batch_size = 4, uint64_t seed = 9) {
  auto gen = batch_generator(seed);
  torch::Tensor tokens = labels(c.vocab_size, {batch_size, c.seq_length}, gen);
  return {tokens, labels(c.num_labels, {batch_size}, gen)};
}

inline torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& labels) {
  return torch::nn::functional::cross_entropy(logits, labels);
}

}  // namespace zoo::fnet
