// The GPT example model: configuration presets, the attention/MLP/block
// modules, the model, sampling and byte-level (de)tokenisation.
#include "strata/models/gpt.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/init.h>
#include <torch/utils.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_set>

#include "strata/core/error.h"
#include "strata/core/module_hooks.h"

namespace strata::models {

// ---- configuration ------------------------------------------------------

std::vector<std::string> GPTConfig::preset_names() { return {"tiny", "small", "medium", "large"}; }

GPTConfig GPTConfig::preset(const std::string& name) {
  if (name == "tiny") return GPTConfig().with_n_layer(2).with_n_head(2).with_n_embd(64).with_block_size(64);
  if (name == "small") return GPTConfig().with_n_layer(4).with_n_head(4).with_n_embd(128).with_block_size(128);
  if (name == "medium") return GPTConfig().with_n_layer(6).with_n_head(6).with_n_embd(384).with_block_size(256);
  if (name == "large") return GPTConfig().with_n_layer(12).with_n_head(12).with_n_embd(768).with_block_size(256);
  std::string known;
  for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
  throw ConfigError(detail::cat("[gpt] unknown model preset '", name, "'; known presets: ", known));
}

void GPTConfig::validate() const {
  auto positive = [](const char* field, int64_t v) {
    STRATA_CHECK(v > 0, ConfigError, "[gpt] ", field, " must be > 0, got ", v);
  };
  positive("vocab_size", vocab_size);
  positive("block_size", block_size);
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_embd", n_embd);
  STRATA_CHECK(n_embd % n_head == 0, ConfigError, "[gpt] n_embd (", n_embd,
               ") must be divisible by n_head (", n_head, ")");
  STRATA_CHECK(dropout >= 0.0 && dropout < 1.0, ConfigError, "[gpt] dropout must be in [0, 1), got ",
               dropout);
  STRATA_CHECK(attention == "explicit" || attention == "sdpa", ConfigError, "[gpt] attention must be 'explicit' "
               "(matmul, mask, softmax) or 'sdpa' (scaled_dot_product_attention), got '", attention, "'");
}

// ---- modules --------------------------------------------------------------

namespace {
torch::nn::Linear make_linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}
torch::nn::LayerNorm make_layer_norm(int64_t n) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({n}).eps(1e-5));
}
}  // namespace

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const GPTConfig& config)
    : torch::nn::Module(kTypeName), n_head_(config.n_head), n_embd_(config.n_embd), sdpa_(config.attention == "sdpa") {
  c_attn = register_module("c_attn", make_linear(n_embd_, 3 * n_embd_, config.bias));
  c_proj = register_module("c_proj", make_linear(n_embd_, n_embd_, config.bias));
  attn_dropout = register_module("attn_dropout", torch::nn::Dropout(config.dropout));
  resid_dropout = register_module("resid_dropout", torch::nn::Dropout(config.dropout));
}

at::Tensor CausalSelfAttentionImpl::forward(const at::Tensor& x) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  const int64_t hd = C / n_head_;
  auto qkv = c_attn->forward(x).split(n_embd_, /*dim=*/2);
  // [B, T, C] -> [B, h, T, hd]
  auto q = qkv[0].view({B, T, n_head_, hd}).transpose(1, 2);
  auto k = qkv[1].view({B, T, n_head_, hd}).transpose(1, 2);
  auto v = qkv[2].view({B, T, n_head_, hd}).transpose(1, 2);
  if (sdpa_) {
    const double p = is_training() ? attn_dropout->options.p() : 0.0;
    auto y = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/std::nullopt, p, /*is_causal=*/true)
                 .transpose(1, 2)
                 .contiguous()
                 .view({B, T, C});
    return resid_dropout->forward(c_proj->forward(y));
  }
  auto att = at::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(hd)));
  // Note [Causal mask]: built per call on the input's device rather than
  // kept as a buffer, so it never appears in state dicts or checkpoints and
  // needs no care when the model moves between devices or is sharded.
  auto future = at::ones({T, T}, x.options().dtype(at::kBool)).triu(1);
  att = att.masked_fill(future, -std::numeric_limits<double>::infinity());
  att = attn_dropout->forward(at::softmax(att, -1));
  auto y = at::matmul(att, v).transpose(1, 2).contiguous().view({B, T, C});
  return resid_dropout->forward(c_proj->forward(y));
}

MLPBlockImpl::MLPBlockImpl(const GPTConfig& config) : torch::nn::Module(kTypeName) {
  c_fc = register_module("c_fc", make_linear(config.n_embd, 4 * config.n_embd, config.bias));
  c_proj = register_module("c_proj", make_linear(4 * config.n_embd, config.n_embd, config.bias));
  dropout = register_module("dropout", torch::nn::Dropout(config.dropout));
}

at::Tensor MLPBlockImpl::forward(const at::Tensor& x) {
  return dropout->forward(c_proj->forward(at::gelu(c_fc->forward(x))));
}

BlockImpl::BlockImpl(const GPTConfig& config) : torch::nn::Module(kTypeName) {
  ln1 = register_module("ln1", make_layer_norm(config.n_embd));
  attn = register_module("attn", CausalSelfAttention(config));
  ln2 = register_module("ln2", make_layer_norm(config.n_embd));
  mlp = register_module("mlp", MLPBlock(config));
}

at::Tensor BlockImpl::forward(const at::Tensor& x) {
  // Through hooked_forward, so FSDP can make a block a unit and activation
  // checkpointing can recompute it (core/module_hooks.h).
  return hooked_forward(*this, x, [this](const at::Tensor& in) {
    auto h = in + attn->forward(ln1->forward(in));
    return h + mlp->forward(ln2->forward(h));
  });
}

// ---- the model ------------------------------------------------------------

GPTImpl::GPTImpl(GPTConfig config) : torch::nn::Module(kTypeName), config_(std::move(config)) {
  config_.validate();
  wte = register_module("wte", torch::nn::Embedding(config_.vocab_size, config_.n_embd));
  wpe = register_module("wpe", torch::nn::Embedding(config_.block_size, config_.n_embd));
  drop = register_module("drop", torch::nn::Dropout(config_.dropout));
  blocks = register_module("blocks", torch::nn::ModuleList());
  // Note [Sharded construction]: inside a strategy's module_sharded_context
  // each block is initialised and handed over (module_built) as soon as it
  // exists, so the strategy can shard it before the next one is built. The
  // random draws then come in another order than in a plain construction:
  // same distribution, different values for a given seed.
  const bool sharded_build = module_built_handler_active();
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    blocks->push_back(Block(config_));
    if (sharded_build) {
      if (!SkipParameterInit::active()) init_block(*blocks[i]->as<BlockImpl>());
      module_built(*blocks[i]);
    }
  }
  ln_f = register_module("ln_f", make_layer_norm(config_.n_embd));
  // Note [Tied head]: LibTorch's named_parameters() does not deduplicate,
  // so a tied head that registered the embedding's tensor a second time
  // would be listed (and all-reduced, sharded, saved) twice. The tied head
  // therefore owns no parameter: forward() reads wte->weight at call time
  // (so whatever a strategy puts there is used), and lm_head_weight()
  // exposes the tie as the very same tensor.
  if (!config_.tie_weights) {
    lm_head = register_module("lm_head", make_linear(config_.n_embd, config_.vocab_size, false));
  }
  if (SkipParameterInit::active()) return;  // to be loaded (module_init_context(empty_init=true))
  if (sharded_build) {
    init_outer();
  } else {
    reset_parameters();
  }
}

namespace {
const double kInitStd = 0.02;

void init_linear(const torch::nn::Linear& l, double s) {
  torch::nn::init::normal_(l->weight, 0.0, s);
  if (l->bias.defined()) torch::nn::init::zeros_(l->bias);
}

void init_norm(const torch::nn::LayerNorm& n) {
  torch::nn::init::ones_(n->weight);
  torch::nn::init::zeros_(n->bias);
}
}  // namespace

void GPTImpl::init_block(BlockImpl& b) {
  torch::NoGradGuard no_grad;
  const double proj_std = kInitStd / std::sqrt(2.0 * static_cast<double>(config_.n_layer));
  init_norm(b.ln1);
  init_linear(b.attn->c_attn, kInitStd);
  init_linear(b.attn->c_proj, proj_std);
  init_norm(b.ln2);
  init_linear(b.mlp->c_fc, kInitStd);
  init_linear(b.mlp->c_proj, proj_std);
}

void GPTImpl::init_outer() {
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(wte->weight, 0.0, kInitStd);
  torch::nn::init::normal_(wpe->weight, 0.0, kInitStd);
  init_norm(ln_f);
  if (lm_head) init_linear(lm_head, kInitStd);
}

void GPTImpl::reset_parameters() {
  // A fixed order, so a seed always gives the same model.
  torch::NoGradGuard no_grad;
  torch::nn::init::normal_(wte->weight, 0.0, kInitStd);
  torch::nn::init::normal_(wpe->weight, 0.0, kInitStd);
  for (const auto& m : *blocks) init_block(*m->as<BlockImpl>());
  init_norm(ln_f);
  if (lm_head) init_linear(lm_head, kInitStd);
}

at::Tensor GPTImpl::lm_head_weight() const { return lm_head ? lm_head->weight : wte->weight; }

int64_t GPTImpl::num_parameters() const {
  std::unordered_set<const void*> seen;
  int64_t n = 0;
  for (const auto& p : parameters()) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) n += p.numel();
  }
  return n;
}

at::Tensor GPTImpl::forward(const at::Tensor& idx) {
  STRATA_CHECK(idx.dim() == 2, ConfigError, "[gpt] forward expects token ids of shape [B, T], got ",
               idx.sizes());
  STRATA_CHECK(idx.scalar_type() == at::kLong, ConfigError, "[gpt] token ids must be int64, got ",
               idx.scalar_type());
  const int64_t T = idx.size(1);
  STRATA_CHECK(T <= config_.block_size, ConfigError, "[gpt] sequence length ", T,
               " exceeds block_size ", config_.block_size);
  // The whole model is the root unit of FSDP: its forward runs hooked too.
  return hooked_forward(*this, idx, [this](const at::Tensor& ids) {
    auto pos = at::arange(ids.size(1), ids.options());
    auto x = drop->forward(wte->forward(ids) + wpe->forward(pos));
    for (const auto& m : *blocks) x = m->as<BlockImpl>()->forward(x);
    x = ln_f->forward(x);
    return lm_head ? lm_head->forward(x) : at::linear(x, wte->weight);
  });
}

at::Tensor GPTImpl::loss(const at::Tensor& idx, const at::Tensor& targets) {
  auto logits = forward(idx);
  if (logits.scalar_type() == at::kHalf || logits.scalar_type() == at::kBFloat16) logits = logits.to(at::kFloat);
  return torch::nn::functional::cross_entropy(logits.view({-1, logits.size(-1)}), targets.reshape({-1}));
}

at::Tensor GPTImpl::generate(const at::Tensor& prompt, int64_t max_new_tokens, double temperature,
                             int64_t top_k, c10::optional<at::Generator> generator) {
  STRATA_CHECK(prompt.dim() == 1 || prompt.dim() == 2, ConfigError,
               "[gpt] generate expects a prompt of shape [T] or [B, T], got ", prompt.sizes());
  STRATA_CHECK(prompt.size(-1) >= 1, ConfigError, "[gpt] generate needs a non-empty prompt");
  STRATA_CHECK(max_new_tokens >= 0, ConfigError, "[gpt] max_new_tokens must be >= 0, got ", max_new_tokens);
  STRATA_CHECK(temperature >= 0.0, ConfigError, "[gpt] temperature must be >= 0, got ", temperature);
  STRATA_CHECK(top_k >= 0, ConfigError, "[gpt] top_k must be >= 0, got ", top_k);
  torch::NoGradGuard no_grad;
  // Sample in eval mode (no dropout); restore the caller's mode on any exit.
  struct ModeRestorer {
    GPTImpl* self;
    bool was_training;
    ~ModeRestorer() { self->train(was_training); }
  } restore{this, is_training()};
  eval();
  auto idx = prompt.dim() == 1 ? prompt.unsqueeze(0) : prompt;
  // Note [Generating on a lazy device]
  // A lazy device (strata's xla device, torch_xla's, LibTorch's lazy
  // tensors) compiles a program for each new shape, and a context that
  // grows by a token a step is a new shape every step: a 200-token sample
  // compiled 200 programs. There the context is a window of block_size
  // tokens instead, the last ones so far left-aligned and the rest
  // padding, kept on the host and uploaded each step, and the logits are
  // read at the last real position through an index uploaded too, so
  // every step runs the same program. Causal attention keeps the padding
  // out of every earlier position: the logits are the growing context's.
  const c10::Device device = idx.device();
  const bool lazy = device.is_privateuseone() || device.is_xla() || device.type() == c10::DeviceType::Lazy;
  if (lazy) idx = idx.cpu();
  for (int64_t i = 0; i < max_new_tokens; ++i) {
    const int64_t T = idx.size(1);
    at::Tensor logits;  // [B, V]
    if (lazy) {
      const int64_t n = std::min(T, config_.block_size);
      at::Tensor window = at::zeros({idx.size(0), config_.block_size}, idx.options());
      window.narrow(1, 0, n).copy_(idx.narrow(1, T - n, n));
      const at::Tensor last = at::full({1}, n - 1, idx.options()).to(device);
      logits = forward(window.to(device)).index_select(1, last).squeeze(1).to(at::kFloat);
    } else {
      auto ctx = T > config_.block_size ? idx.narrow(1, T - config_.block_size, config_.block_size) : idx;
      logits = forward(ctx).select(1, -1).to(at::kFloat);
    }
    at::Tensor next;
    if (temperature == 0.0) {
      next = logits.argmax(-1, /*keepdim=*/true);
    } else {
      logits = logits / temperature;
      if (top_k > 0 && top_k < logits.size(-1)) {
        auto kth = std::get<0>(logits.topk(top_k, -1)).narrow(-1, top_k - 1, 1);
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<double>::infinity());
      }
      next = at::multinomial(at::softmax(logits, -1), 1, /*replacement=*/false, generator);
    }
    idx = at::cat({idx, lazy ? next.cpu() : next}, 1);
  }
  if (lazy) idx = idx.to(device);
  return prompt.dim() == 1 ? idx.squeeze(0) : idx;
}

// ---- byte-level tokens ----------------------------------------------------

at::Tensor encode_bytes(const std::string& text) {
  auto out = at::empty({static_cast<int64_t>(text.size())}, at::kLong);
  auto* p = out.data_ptr<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) p[i] = static_cast<unsigned char>(text[i]);
  return out;
}

std::string decode_bytes(const at::Tensor& tokens) {
  auto t = tokens.reshape({-1}).to(at::kCPU, at::kLong).contiguous();
  std::string out(static_cast<size_t>(t.numel()), '\0');
  const auto* p = t.data_ptr<int64_t>();
  for (int64_t i = 0; i < t.numel(); ++i) {
    STRATA_CHECK(p[i] >= 0 && p[i] < 256, ConfigError, "[gpt] token ", p[i], " at position ", i,
                 " is not a byte (expected 0..255)");
    out[static_cast<size_t>(i)] = static_cast<char>(p[i]);
  }
  return out;
}

}  // namespace strata::models
