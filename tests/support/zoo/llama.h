// A LLaMA-style decoder written from its standard definition: token
// embedding, RMSNorm modules with a weight, rotary position embeddings
// applied to q and k after `view(B, T, H, D).transpose(1, 2)`, causal
// attention written out (scores, mask, softmax), a SwiGLU feed-forward, and
// pre-norm TransformerBlocks in a ModuleList called `layers` whose forward
// calls `attention->forward(...)` directly. Trained with cross-entropy on
// the next token. Tiny shapes; no bias anywhere, as in the original.
#pragma once

#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>

#include "support/zoo/batch.h"

namespace zoo::llama {

struct ModelArgs {
  int64_t vocab_size = 64;
  int64_t dim = 32;
  int64_t n_layers = 2;
  int64_t n_heads = 4;
  int64_t hidden_dim = 64;  ///< the SwiGLU width
  int64_t max_seq_len = 16;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
};

struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(int64_t dim, double eps) : eps(eps) {
    weight = register_parameter("weight", torch::ones({dim}));
  }

  torch::Tensor forward(torch::Tensor x) {
    auto norm = x * torch::rsqrt(x.pow(2).mean(-1, /*keepdim=*/true) + eps);
    return norm * weight;
  }

  double eps;
  torch::Tensor weight;
};
TORCH_MODULE(RMSNorm);

/// cos and sin of the rotary angles, (max_seq_len, head_dim) each, the
/// half-dimension frequencies repeated for both halves.
inline std::pair<torch::Tensor, torch::Tensor> rope_tables(int64_t head_dim, int64_t max_seq_len, double theta) {
  auto inv_freq = 1.0 / torch::pow(theta, torch::arange(0, head_dim, 2, torch::kFloat) / head_dim);
  auto t = torch::arange(max_seq_len, torch::kFloat);
  auto freqs = torch::outer(t, inv_freq);
  auto emb = torch::cat({freqs, freqs}, -1);
  return {emb.cos(), emb.sin()};
}

/// (x1, x2) -> (-x2, x1) over the two halves of the last dimension.
inline torch::Tensor rotate_half(const torch::Tensor& x) {
  auto half = x.size(-1) / 2;
  auto x1 = x.slice(-1, 0, half);
  auto x2 = x.slice(-1, half);
  return torch::cat({-x2, x1}, -1);
}

/// q and k (B, H, T, D) rotated by position; cos and sin are (T, D).
inline std::pair<torch::Tensor, torch::Tensor> apply_rotary_emb(const torch::Tensor& q, const torch::Tensor& k,
                                                                 const torch::Tensor& cos, const torch::Tensor& sin) {
  return {q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin};
}

struct AttentionImpl : torch::nn::Module {
  explicit AttentionImpl(const ModelArgs& args)
      : n_heads(args.n_heads),
        head_dim(args.dim / args.n_heads),
        wq(torch::nn::LinearOptions(args.dim, args.dim).bias(false)),
        wk(torch::nn::LinearOptions(args.dim, args.dim).bias(false)),
        wv(torch::nn::LinearOptions(args.dim, args.dim).bias(false)),
        wo(torch::nn::LinearOptions(args.dim, args.dim).bias(false)) {
    register_module("wq", wq);
    register_module("wk", wk);
    register_module("wv", wv);
    register_module("wo", wo);
  }

  torch::Tensor forward(torch::Tensor x, torch::Tensor cos, torch::Tensor sin) {
    const auto B = x.size(0), T = x.size(1), C = x.size(2);
    auto q = wq->forward(x).view({B, T, n_heads, head_dim}).transpose(1, 2);
    auto k = wk->forward(x).view({B, T, n_heads, head_dim}).transpose(1, 2);
    auto v = wv->forward(x).view({B, T, n_heads, head_dim}).transpose(1, 2);
    std::tie(q, k) = apply_rotary_emb(q, k, cos, sin);

    auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(head_dim));
    auto mask = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(x.device())).triu(1);
    scores = scores.masked_fill(mask, -std::numeric_limits<float>::infinity());
    auto probs = torch::softmax(scores, -1);
    auto out = torch::matmul(probs, v).transpose(1, 2).contiguous().view({B, T, C});
    return wo->forward(out);
  }

  int64_t n_heads, head_dim;
  torch::nn::Linear wq, wk, wv, wo;
};
TORCH_MODULE(Attention);

struct FeedForwardImpl : torch::nn::Module {
  FeedForwardImpl(int64_t dim, int64_t hidden_dim)
      : w1(torch::nn::LinearOptions(dim, hidden_dim).bias(false)),
        w2(torch::nn::LinearOptions(hidden_dim, dim).bias(false)),
        w3(torch::nn::LinearOptions(dim, hidden_dim).bias(false)) {
    register_module("w1", w1);
    register_module("w2", w2);
    register_module("w3", w3);
  }

  torch::Tensor forward(torch::Tensor x) { return w2->forward(torch::silu(w1->forward(x)) * w3->forward(x)); }

  torch::nn::Linear w1, w2, w3;
};
TORCH_MODULE(FeedForward);

struct TransformerBlockImpl : torch::nn::Module {
  explicit TransformerBlockImpl(const ModelArgs& args)
      : attention(args),
        feed_forward(args.dim, args.hidden_dim),
        attention_norm(args.dim, args.norm_eps),
        ffn_norm(args.dim, args.norm_eps) {
    register_module("attention", attention);
    register_module("feed_forward", feed_forward);
    register_module("attention_norm", attention_norm);
    register_module("ffn_norm", ffn_norm);
  }

  torch::Tensor forward(torch::Tensor x, torch::Tensor cos, torch::Tensor sin) {
    auto h = x + attention->forward(attention_norm->forward(x), cos, sin);
    return h + feed_forward->forward(ffn_norm->forward(h));
  }

  Attention attention;
  FeedForward feed_forward;
  RMSNorm attention_norm, ffn_norm;
};
TORCH_MODULE(TransformerBlock);

struct TransformerImpl : torch::nn::Module {
  explicit TransformerImpl(const ModelArgs& args)
      : tok_embeddings(args.vocab_size, args.dim),
        norm(args.dim, args.norm_eps),
        output(torch::nn::LinearOptions(args.dim, args.vocab_size).bias(false)) {
    register_module("tok_embeddings", tok_embeddings);
    for (int64_t i = 0; i < args.n_layers; ++i) layers->push_back(TransformerBlock(args));
    register_module("layers", layers);
    register_module("norm", norm);
    register_module("output", output);
    auto [cos, sin] = rope_tables(args.dim / args.n_heads, args.max_seq_len, args.rope_theta);
    rope_cos = register_buffer("rope_cos", cos);
    rope_sin = register_buffer("rope_sin", sin);
  }

  /// Logits (B, T, vocab) of tokens (B, T).
  torch::Tensor forward(torch::Tensor tokens) {
    const auto T = tokens.size(1);
    auto h = tok_embeddings->forward(tokens);
    auto cos = rope_cos.narrow(0, 0, T), sin = rope_sin.narrow(0, 0, T);
    for (size_t i = 0; i < layers->size(); ++i) h = layers[i]->as<TransformerBlock>()->forward(h, cos, sin);
    return output->forward(norm->forward(h));
  }

  torch::nn::Embedding tok_embeddings;
  torch::nn::ModuleList layers;
  RMSNorm norm;
  torch::nn::Linear output;
  torch::Tensor rope_cos, rope_sin;
};
TORCH_MODULE(Transformer);

/// Parameters of Transformer(args): embedding and output head, and per
/// layer four attention projections, three SwiGLU projections and two
/// norms; the final norm.
constexpr int64_t parameter_count(const ModelArgs& a) {
  return 2 * a.vocab_size * a.dim + a.n_layers * (4 * a.dim * a.dim + 3 * a.dim * a.hidden_dim + 2 * a.dim) + a.dim;
}

/// `n` sequences of `t + 1` tokens as inputs (n, t) and next-token targets (n, t).
inline std::pair<torch::Tensor, torch::Tensor> batch(const ModelArgs& args, int64_t n = 2, int64_t t = 8,
                                                     uint64_t seed = 3) {
  auto gen = batch_generator(seed);
  auto tokens = labels(args.vocab_size, {n, t + 1}, gen);
  return {tokens.narrow(1, 0, t).contiguous(), tokens.narrow(1, 1, t).contiguous()};
}

/// Cross-entropy of logits (B, T, V) against targets (B, T).
inline torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), targets.view({-1}));
}

}  // namespace zoo::llama
