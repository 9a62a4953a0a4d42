// A small GPT-style decoder-only language model: the example model that
// `strata train` trains on byte-level text.
//
// Architecture (GPT-2 / nanoGPT): token and position embeddings, n_layer
// pre-norm transformer blocks (causal self-attention and a GELU MLP), a
// final LayerNorm and a language-model head, optionally tied to the token
// embedding. Attention is written with matmul + masked_fill + softmax by
// default, so that PyTorch peers and the xla device reproduce it operation
// for operation; `attention = "sdpa"` computes the same function with
// at::scaled_dot_product_attention (is_causal; the flash kernel on the CPU
// and on CUDA), faster and in less memory, to rounding.
//
// Parameter names (what state dicts and checkpoints use):
//   wte.weight, wpe.weight,
//   blocks.<i>.ln1.{weight,bias}, blocks.<i>.attn.c_attn.{weight,bias},
//   blocks.<i>.attn.c_proj.{weight,bias}, blocks.<i>.ln2.{weight,bias},
//   blocks.<i>.mlp.c_fc.{weight,bias}, blocks.<i>.mlp.c_proj.{weight,bias},
//   ln_f.{weight,bias}, and lm_head.weight only when the head is untied.
//
// Recognising the modules (for wrap and checkpointing policies): every
// module here is constructed with a fixed name, so `module.name()` returns
// its kTypeName ("GPT", "Block", "CausalSelfAttention", "MLPBlock");
// `dynamic_cast<const BlockImpl*>(&module)` works as well.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace strata::models {

/// Hyper-parameters of the GPT model: public fields with fluent `with_x`
/// setters, as every strata options struct:
/// `GPTConfig().with_n_layer(4).with_n_head(4).with_n_embd(128)`, a named
/// preset, or designated initialisers (`GPTConfig{.n_layer = 4}`).
/// GPTImpl's constructor validates them.
struct GPTConfig {
  /// Vocabulary size; 256 for byte-level text.
  int64_t vocab_size = 256;
  /// Context length: the longest sequence forward() accepts.
  int64_t block_size = 64;
  /// Number of transformer blocks.
  int64_t n_layer = 2;
  /// Attention heads per block; must divide n_embd.
  int64_t n_head = 2;
  /// Embedding (model) width.
  int64_t n_embd = 64;
  /// Dropout probability after embeddings, attention weights and residual
  /// projections, in [0, 1).
  double dropout = 0.0;
  /// Whether the language-model head reuses the token embedding's weight.
  bool tie_weights = true;
  /// Whether the Linear layers have biases (LayerNorms always have one:
  /// LibTorch's C++ LayerNormOptions has no bias switch).
  bool bias = true;
  /// How attention is computed, not what: "explicit" (matmul, causal
  /// mask, softmax, matmul) or "sdpa" (at::scaled_dot_product_attention
  /// with is_causal). The same parameters and function (at dropout 0; with
  /// dropout the two draw their masks differently), so it is not part
  /// of to_json(): a checkpoint of either loads into the other.
  std::string attention = "explicit";

  GPTConfig& with_vocab_size(int64_t v) { vocab_size = v; return *this; }
  GPTConfig& with_block_size(int64_t b) { block_size = b; return *this; }
  GPTConfig& with_n_layer(int64_t n) { n_layer = n; return *this; }
  GPTConfig& with_n_head(int64_t n) { n_head = n; return *this; }
  GPTConfig& with_n_embd(int64_t n) { n_embd = n; return *this; }
  GPTConfig& with_dropout(double p) { dropout = p; return *this; }
  GPTConfig& with_tie_weights(bool t) { tie_weights = t; return *this; }
  GPTConfig& with_bias(bool b) { bias = b; return *this; }
  GPTConfig& with_attention(std::string a) { attention = std::move(a); return *this; }

  /// The named configurations: "tiny" (2 layers, 2 heads, width 64, context
  /// 64), "small" (4/4/128, context 128), "medium" (6/6/384, context 256),
  /// "large" (12/12/768, context 256); all byte-level (vocab 256).
  /// Throws ConfigError listing the known names for any other name.
  static GPTConfig preset(const std::string& name);

  /// The names preset() accepts, smallest first.
  static std::vector<std::string> preset_names();

  /// Throws ConfigError ("[gpt] ...") naming the first invalid field: a
  /// non-positive size, n_embd not divisible by n_head, dropout outside
  /// [0, 1), an attention other than "explicit" or "sdpa".
  void validate() const;

  /// Every field as JSON, with "model_type": "strata-gpt", so a reader can
  /// rebuild the model from a checkpoint alone:
  /// {"model_type": "strata-gpt", "vocab_size": 256, "block_size": 64,
  ///  "n_layer": 2, "n_head": 2, "n_embd": 64, "dropout": 0.0,
  ///  "tie_weights": true, "bias": true}.
  nlohmann::json to_json() const;

  /// The configuration `json` describes (as written by to_json). Hostile
  /// input: every field must be present with its type, sizes within
  /// [1, 2^20] (vocab_size up to 2^24), no unknown field; then validate().
  /// Throws ConfigError naming `source`, the field and the value.
  static GPTConfig from_json(const nlohmann::json& json, const std::string& source);
};

/// Multi-head causal self-attention: one qkv projection, attention over
/// earlier positions only, an output projection.
class CausalSelfAttentionImpl : public torch::nn::Module {
 public:
  static constexpr const char* kTypeName = "CausalSelfAttention";

  /// Builds the layers for `config` (validated by the caller).
  explicit CausalSelfAttentionImpl(const GPTConfig& config);

  /// x [B, T, C] -> [B, T, C]; position t attends to positions <= t.
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Linear c_attn{nullptr};
  torch::nn::Linear c_proj{nullptr};
  torch::nn::Dropout attn_dropout{nullptr};
  torch::nn::Dropout resid_dropout{nullptr};

 private:
  int64_t n_head_;
  int64_t n_embd_;
  bool sdpa_;
};
TORCH_MODULE(CausalSelfAttention);

/// The feed-forward part of a block: Linear(C, 4C) -> GELU (exact, as
/// torch.nn.GELU's default) -> Linear(4C, C) -> dropout.
class MLPBlockImpl : public torch::nn::Module {
 public:
  static constexpr const char* kTypeName = "MLPBlock";

  explicit MLPBlockImpl(const GPTConfig& config);

  /// x [B, T, C] -> [B, T, C].
  at::Tensor forward(const at::Tensor& x);

  torch::nn::Linear c_fc{nullptr};
  torch::nn::Linear c_proj{nullptr};
  torch::nn::Dropout dropout{nullptr};
};
TORCH_MODULE(MLPBlock);

/// One pre-norm transformer block: x + attn(ln1(x)), then x + mlp(ln2(x)).
/// This is the natural unit for FSDP auto-wrap and activation checkpointing
/// policies; match it with `module.name() == BlockImpl::kTypeName` or
/// `dynamic_cast<const BlockImpl*>(&module)`.
class BlockImpl : public torch::nn::Module {
 public:
  static constexpr const char* kTypeName = "Block";

  explicit BlockImpl(const GPTConfig& config);

  /// x [B, T, C] -> [B, T, C].
  at::Tensor forward(const at::Tensor& x);

  torch::nn::LayerNorm ln1{nullptr};
  CausalSelfAttention attn{nullptr};
  torch::nn::LayerNorm ln2{nullptr};
  MLPBlock mlp{nullptr};
};
TORCH_MODULE(Block);

/// The GPT language model.
class GPTImpl : public torch::nn::Module {
 public:
  static constexpr const char* kTypeName = "GPT";

  /// Validates `config` (ConfigError) and builds the model with GPT-2 style
  /// initialisation (see reset_parameters), drawing from LibTorch's default
  /// generator, so it is deterministic under torch::manual_seed.
  explicit GPTImpl(GPTConfig config);

  /// idx [B, T] int64 token ids with T <= block_size -> logits [B, T, V].
  /// Throws ConfigError for a wrong rank, dtype or a too long sequence.
  at::Tensor forward(const at::Tensor& idx);

  /// Mean cross-entropy of forward(idx) against targets [B, T] (int64):
  /// a scalar. Low-precision logits are upcast to float32 for the loss.
  at::Tensor loss(const at::Tensor& idx, const at::Tensor& targets);

  /// Autoregressive sampling without gradients, in eval mode (the previous
  /// train/eval mode is restored). prompt: [T] or [B, T] int64, T >= 1.
  /// Each step feeds the last block_size tokens, divides the last logits
  /// by `temperature` (0 means greedy argmax), keeps the `top_k` largest
  /// (0 = all) and samples with `generator` (LibTorch's default if none).
  /// Returns the prompt followed by max_new_tokens tokens: [T + n] or
  /// [B, T + n], matching the prompt's rank.
  at::Tensor generate(const at::Tensor& prompt, int64_t max_new_tokens, double temperature = 1.0,
                      int64_t top_k = 0, c10::optional<at::Generator> generator = c10::nullopt);

  /// Re-initialises every parameter GPT-2 style: Linear and Embedding
  /// weights ~ N(0, 0.02), the residual projections (attn.c_proj and
  /// mlp.c_proj) ~ N(0, 0.02 / sqrt(2 * n_layer)), biases 0, LayerNorm
  /// weight 1 and bias 0. Draws from LibTorch's default generator.
  void reset_parameters();

 private:
  void init_block(BlockImpl& block);  // one block's part of reset_parameters
  void init_outer();                  // the rest: embeddings, final norm, untied head

 public:

  /// The language-model head's weight [V, C]: with tie_weights the very
  /// same tensor as wte->weight (so it is listed once, as wte.weight, in
  /// named_parameters()), otherwise lm_head->weight.
  at::Tensor lm_head_weight() const;

  /// The configuration the model was built with.
  const GPTConfig& config() const { return config_; }

  /// Number of distinct parameter elements (a tied weight counts once).
  int64_t num_parameters() const;

  torch::nn::Embedding wte{nullptr};
  torch::nn::Embedding wpe{nullptr};
  torch::nn::Dropout drop{nullptr};
  /// The blocks, registered as "blocks" (children "blocks.0", ...).
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  /// Only built (and registered) when tie_weights is false.
  torch::nn::Linear lm_head{nullptr};

 private:
  GPTConfig config_;
};
TORCH_MODULE(GPT);

/// Byte-level tokenisation: each byte of `text` becomes one int64 token,
/// as a 1-D tensor.
at::Tensor encode_bytes(const std::string& text);

/// The inverse of encode_bytes: a 1-D tensor of ids in [0, 256) to text.
/// Throws ConfigError for ids outside [0, 256).
std::string decode_bytes(const at::Tensor& tokens);

}  // namespace strata::models
