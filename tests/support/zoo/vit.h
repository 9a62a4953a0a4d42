// A small Vision Transformer written from its standard definition: patch
// embedding by a strided Conv2d, a class token and a learned position
// embedding (parameters), pre-norm encoder blocks of LayerNorm,
// torch::nn::MultiheadAttention and a GELU MLP in a ModuleList `blocks`,
// a final LayerNorm and a linear head on the class token. Trained with
// cross-entropy. Tiny shapes.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <tuple>
#include <utility>

#include "support/zoo/batch.h"

namespace zoo::vit {

struct ViTConfig {
  int64_t image_size = 8;
  int64_t patch_size = 4;
  int64_t in_channels = 3;
  int64_t num_classes = 10;
  int64_t dim = 16;
  int64_t depth = 2;
  int64_t heads = 2;
  int64_t mlp_dim = 32;
};

struct EncoderBlockImpl : torch::nn::Module {
  EncoderBlockImpl(int64_t dim, int64_t heads, int64_t mlp_dim)
      : norm1(torch::nn::LayerNormOptions({dim})),
        attn(torch::nn::MultiheadAttentionOptions(dim, heads)),
        norm2(torch::nn::LayerNormOptions({dim})),
        fc1(dim, mlp_dim),
        fc2(mlp_dim, dim) {
    register_module("norm1", norm1);
    register_module("attn", attn);
    register_module("norm2", norm2);
    register_module("fc1", fc1);
    register_module("fc2", fc2);
  }

  /// x is (N, L, E); MultiheadAttention takes (L, N, E).
  torch::Tensor forward(torch::Tensor x) {
    auto h = norm1->forward(x).transpose(0, 1);
    auto attn_out = std::get<0>(attn->forward(h, h, h));
    x = x + attn_out.transpose(0, 1);
    x = x + fc2->forward(torch::gelu(fc1->forward(norm2->forward(x))));
    return x;
  }

  torch::nn::LayerNorm norm1;
  torch::nn::MultiheadAttention attn;
  torch::nn::LayerNorm norm2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(EncoderBlock);

struct VisionTransformerImpl : torch::nn::Module {
  explicit VisionTransformerImpl(const ViTConfig& c)
      : patch_embed(torch::nn::Conv2dOptions(c.in_channels, c.dim, c.patch_size).stride(c.patch_size)),
        norm(torch::nn::LayerNormOptions({c.dim})),
        head(c.dim, c.num_classes) {
    const int64_t num_patches = (c.image_size / c.patch_size) * (c.image_size / c.patch_size);
    register_module("patch_embed", patch_embed);
    cls_token = register_parameter("cls_token", torch::zeros({1, 1, c.dim}));
    pos_embed = register_parameter("pos_embed", torch::randn({1, num_patches + 1, c.dim}) * 0.02);
    for (int64_t i = 0; i < c.depth; ++i) blocks->push_back(EncoderBlock(c.dim, c.heads, c.mlp_dim));
    register_module("blocks", blocks);
    register_module("norm", norm);
    register_module("head", head);
  }

  /// Class scores (N, num_classes) of images (N, C, H, W).
  torch::Tensor forward(torch::Tensor x) {
    x = patch_embed->forward(x).flatten(2).transpose(1, 2);  // (N, patches, dim)
    auto cls = cls_token.expand({x.size(0), -1, -1});
    x = torch::cat({cls, x}, 1) + pos_embed;
    for (const auto& block : *blocks) x = block->as<EncoderBlock>()->forward(x);
    x = norm->forward(x);
    return head->forward(x.select(1, 0));
  }

  torch::nn::Conv2d patch_embed;
  torch::Tensor cls_token, pos_embed;
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm norm;
  torch::nn::Linear head;
};
TORCH_MODULE(VisionTransformer);

/// Parameters of VisionTransformer(c).
constexpr int64_t parameter_count(const ViTConfig& c) {
  const int64_t d = c.dim, patches = (c.image_size / c.patch_size) * (c.image_size / c.patch_size);
  const int64_t block = 4 * d                       // two LayerNorms
                        + 3 * d * d + 3 * d        // in_proj
                        + d * d + d                // out_proj
                        + d * c.mlp_dim + c.mlp_dim + c.mlp_dim * d + d;
  return c.in_channels * d * c.patch_size * c.patch_size + d  // patch embedding
         + d + (patches + 1) * d                              // class token, positions
         + c.depth * block + 2 * d + d * c.num_classes + c.num_classes;
}

/// `n` images (n, C, size, size) and their classes (n).
inline std::pair<torch::Tensor, torch::Tensor> batch(const ViTConfig& c, int64_t n = 4, uint64_t seed = 5) {
  auto gen = batch_generator(seed);
  auto images = normal({n, c.in_channels, c.image_size, c.image_size}, gen);
  return {images, labels(c.num_classes, {n}, gen)};
}

/// Cross-entropy of class scores.
inline torch::Tensor loss(const torch::Tensor& logits, const torch::Tensor& targets) {
  return torch::nn::functional::cross_entropy(logits, targets);
}

}  // namespace zoo::vit
