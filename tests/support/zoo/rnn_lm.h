// Recurrent language models written from the standard definition (the
// word-language-model of pytorch/examples, without its dropout): an
// Embedding, a two-layer torch::nn::LSTM (or GRU), and a Linear decoder
// over the vocabulary, trained with cross-entropy on the next token.
// Tiny shapes; batch-first sequences.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <tuple>
#include <utility>

#include "support/zoo/batch.h"

namespace zoo::rnn_lm {

struct RNNConfig {
  int64_t ntoken = 32;
  int64_t ninp = 16;   ///< embedding width
  int64_t nhid = 16;   ///< hidden width
  int64_t nlayers = 2;
};

struct LSTMModelImpl : torch::nn::Module {
  explicit LSTMModelImpl(const RNNConfig& c)
      : encoder(c.ntoken, c.ninp),
        rnn(torch::nn::LSTMOptions(c.ninp, c.nhid).num_layers(c.nlayers).batch_first(true)),
        decoder(c.nhid, c.ntoken) {
    register_module("encoder", encoder);
    register_module("rnn", rnn);
    register_module("decoder", decoder);
  }

  /// Logits (B, T, ntoken) of tokens (B, T).
  torch::Tensor forward(torch::Tensor input) {
    auto emb = encoder->forward(input);
    auto [output, hidden] = rnn->forward(emb);
    return decoder->forward(output);
  }

  torch::nn::Embedding encoder;
  torch::nn::LSTM rnn;
  torch::nn::Linear decoder;
};
TORCH_MODULE(LSTMModel);

struct GRUModelImpl : torch::nn::Module {
  explicit GRUModelImpl(const RNNConfig& c)
      : encoder(c.ntoken, c.ninp),
        rnn(torch::nn::GRUOptions(c.ninp, c.nhid).num_layers(c.nlayers).batch_first(true)),
        decoder(c.nhid, c.ntoken) {
    register_module("encoder", encoder);
    register_module("rnn", rnn);
    register_module("decoder", decoder);
  }

  /// Logits (B, T, ntoken) of tokens (B, T).
  torch::Tensor forward(torch::Tensor input) {
    auto emb = encoder->forward(input);
    auto [output, hidden] = rnn->forward(emb);
    return decoder->forward(output);
  }

  torch::nn::Embedding encoder;
  torch::nn::GRU rnn;
  torch::nn::Linear decoder;
};
TORCH_MODULE(GRUModel);

/// Parameters of the model with `gates` gates per cell (4 for an LSTM, 3
/// for a GRU): the embedding, each layer's input and hidden weights and
/// their two biases, the decoder.
constexpr int64_t parameter_count(const RNNConfig& c, int64_t gates) {
  int64_t n = c.ntoken * c.ninp + c.nhid * c.ntoken + c.ntoken;
  for (int64_t l = 0; l < c.nlayers; ++l) {
    const int64_t in = l == 0 ? c.ninp : c.nhid;
    n += gates * c.nhid * (in + c.nhid) + 2 * gates * c.nhid;
  }
  return n;
}

/// `n` sequences of `t + 1` tokens as inputs (n, t) and next-token targets (n, t).
inline std::pair<torch::Tensor, torch::Tensor> batch(const RNNConfig& c, int64_t n = 2, int64_t t = 6,
                                                     uint64_t seed = 6) {
  auto gen = batch_generator(seed);
  auto tokens = labels(c.ntoken, {n, t + 1}, gen);
  return {tokens.narrow(1, 0, t).contiguous(), tokens.narrow(1, 1, t).contiguous()};
}

/// Cross-entropy of logits (B, T, V) against targets (B, T).
inline torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), targets.reshape({-1}));
}

}  // namespace zoo::rnn_lm
