// The GPT and MLP example models: shapes, causality, initialisation, weight
// tying, determinism, learning, sampling and configuration errors.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <cmath>
#include <functional>
#include <set>
#include <string>

#include "strata/core/error.h"
#include "strata/models/gpt.h"
#include "strata/models/mlp.h"
#include "support/errors.h"

namespace {

using strata::models::GPT;
using strata::models::GPTConfig;

GPTConfig tiny() { return GPTConfig::preset("tiny"); }

TEST(GptTest, ForwardMapsTokenIdsToLogitsOverTheVocabulary) {
  torch::manual_seed(0);
  GPT model(tiny());
  auto idx = at::randint(0, 256, {3, 17}, at::kLong);
  auto logits = model->forward(idx);
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 17, 256}));
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
  EXPECT_EQ(model->loss(idx, idx).dim(), 0);
}

TEST(GptTest, ChangingAFutureTokenLeavesEarlierLogitsUnchanged) {
  torch::manual_seed(1);
  GPT model(tiny());
  auto idx = at::randint(0, 256, {2, 20}, at::kLong);
  auto changed = idx.clone();
  changed.select(1, 12).copy_((idx.select(1, 12) + 1) % 256);
  auto a = model->forward(idx), b = model->forward(changed);
  EXPECT_TRUE(at::equal(a.narrow(1, 0, 12), b.narrow(1, 0, 12)));
  // The changed position and everything after it do see the change.
  EXPECT_GT((a.narrow(1, 12, 8) - b.narrow(1, 12, 8)).abs().max().item<double>(), 1e-4);
}

TEST(GptTest, LossAtInitialisationIsCloseToLogOfTheVocabularySize) {
  torch::manual_seed(2);
  GPT model(GPTConfig::preset("small"));
  auto idx = at::randint(0, 256, {4, 64}, at::kLong);
  auto tgt = at::randint(0, 256, {4, 64}, at::kLong);
  EXPECT_NEAR(model->loss(idx, tgt).item<double>(), std::log(256.0), 0.1);
}

TEST(GptTest, InitialisationIsGpt2Style) {
  torch::manual_seed(3);
  auto cfg = GPTConfig().with_n_layer(2).with_n_head(4).with_n_embd(128);
  GPT model(cfg);
  auto params = model->named_parameters();
  auto std_of = [&](const std::string& name) { return params[name].std().item<double>(); };
  EXPECT_NEAR(std_of("wte.weight"), 0.02, 0.001);
  EXPECT_NEAR(std_of("blocks.0.attn.c_attn.weight"), 0.02, 0.001);
  EXPECT_NEAR(std_of("blocks.1.mlp.c_fc.weight"), 0.02, 0.001);
  const double proj = 0.02 / std::sqrt(4.0);
  EXPECT_NEAR(std_of("blocks.0.attn.c_proj.weight"), proj, proj * 0.05);
  EXPECT_NEAR(std_of("blocks.1.mlp.c_proj.weight"), proj, proj * 0.05);
  EXPECT_TRUE(at::equal(params["blocks.0.attn.c_attn.bias"], at::zeros({384})));
  EXPECT_TRUE(at::equal(params["ln_f.weight"], at::ones({128})));
}

TEST(GptTest, TiedHeadIsTheEmbeddingTensorAndIsListedOnce) {
  torch::manual_seed(4);
  GPT model(tiny());
  EXPECT_TRUE(model->lm_head_weight().is_same(model->wte->weight));
  int listed = 0;
  std::set<std::string> names;
  for (const auto& p : model->named_parameters()) {
    names.insert(p.key());
    if (p.value().unsafeGetTensorImpl() == model->wte->weight.unsafeGetTensorImpl()) ++listed;
  }
  EXPECT_EQ(listed, 1);
  EXPECT_EQ(names.count("wte.weight"), 1u);
  EXPECT_EQ(names.count("lm_head.weight"), 0u);
  // A gradient step through the head moves the embedding (one tensor).
  auto idx = at::randint(0, 256, {2, 8}, at::kLong);
  model->loss(idx, idx).backward();
  EXPECT_TRUE(model->wte->weight.grad().defined());

  // 2*V*C + T*C for embeddings and head, per block 12*C*C + 13*C, ln_f 2*C.
  const int64_t C = 64, V = 256, T = 64, L = 2;
  const int64_t per_block = 12 * C * C + 13 * C;
  EXPECT_EQ(model->num_parameters(), V * C + T * C + L * per_block + 2 * C);

  GPT untied(tiny().with_tie_weights(false));
  auto untied_params = untied->named_parameters();
  ASSERT_TRUE(untied_params.contains("lm_head.weight"));
  EXPECT_FALSE(untied->lm_head_weight().is_same(untied->wte->weight));
  EXPECT_EQ(untied->num_parameters(), model->num_parameters() + V * C);
}

TEST(GptTest, ModulesAreRecognisableByName) {
  GPT model(tiny());
  EXPECT_EQ(model->name(), "GPT");
  int blocks = 0;
  for (const auto& m : model->modules(/*include_self=*/false)) {
    if (m->name() == strata::models::BlockImpl::kTypeName) {
      ++blocks;
      EXPECT_NE(dynamic_cast<strata::models::BlockImpl*>(m.get()), nullptr);
    }
  }
  EXPECT_EQ(blocks, 2);
}

TEST(GptTest, SameSeedGivesTheSameModelAndADifferentSeedAnother) {
  torch::manual_seed(42);
  GPT a(tiny());
  torch::manual_seed(42);
  GPT b(tiny());
  torch::manual_seed(43);
  GPT c(tiny());
  auto pb = b->named_parameters(), pc = c->named_parameters();
  bool any_diff = false;
  for (const auto& p : a->named_parameters()) {
    EXPECT_TRUE(at::equal(p.value(), pb[p.key()])) << p.key();
    if (p.key().find("weight") != std::string::npos && p.key().find("ln") == std::string::npos)
      any_diff = any_diff || !at::equal(p.value(), pc[p.key()]);
  }
  EXPECT_TRUE(any_diff);
}

TEST(GptTest, TrainingOnRepeatingTextDrivesTheLossFarBelowChanceAndGenerationFollowsIt) {
  torch::manual_seed(5);
  GPT model(tiny());
  const std::string unit = "hello world! ";
  std::string text;
  while (text.size() < 2000) text += unit;
  auto tokens = strata::models::encode_bytes(text);
  const int64_t seq = 32, batch = 8;
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3).weight_decay(0.0));
  auto gen = at::make_generator<at::CPUGeneratorImpl>(123);
  double first = 0, last = 0;
  for (int step = 0; step < 300; ++step) {
    auto starts = at::randint(0, tokens.numel() - seq - 1, {batch}, gen, at::kLong);
    std::vector<at::Tensor> xs, ys;
    for (int64_t i = 0; i < batch; ++i) {
      int64_t s = starts[i].item<int64_t>();
      xs.push_back(tokens.narrow(0, s, seq));
      ys.push_back(tokens.narrow(0, s + 1, seq));
    }
    opt.zero_grad();
    auto loss = model->loss(at::stack(xs), at::stack(ys));
    loss.backward();
    opt.step();
    if (step == 0) first = loss.item<double>();
    last = loss.item<double>();
  }
  EXPECT_GT(first, 5.0);
  EXPECT_LT(last, 0.5) << "loss went from " << first << " to " << last;

  auto prompt = strata::models::encode_bytes("hello world! hello wo");
  auto out = model->generate(prompt, 10, /*temperature=*/0.0);
  ASSERT_EQ(out.numel(), prompt.numel() + 10);
  EXPECT_EQ(strata::models::decode_bytes(out), "hello world! hello world! hello");
  EXPECT_TRUE(model->is_training());  // generate restores the mode
}

TEST(GptTest, GenerateReturnsPromptPlusNewTokensAndIsReproducibleWithAGenerator) {
  torch::manual_seed(6);
  GPT model(tiny());
  auto prompt = at::randint(0, 256, {2, 5}, at::kLong);
  // Longer than block_size: the context is cropped, not an error.
  auto g1 = at::make_generator<at::CPUGeneratorImpl>(9);
  auto g2 = at::make_generator<at::CPUGeneratorImpl>(9);
  auto a = model->generate(prompt, 70, 1.0, 10, g1);
  auto b = model->generate(prompt, 70, 1.0, 10, g2);
  EXPECT_EQ(a.sizes(), (std::vector<int64_t>{2, 75}));
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_TRUE(at::equal(a.narrow(1, 0, 5), prompt));
  // top_k = 1 is greedy decoding.
  auto greedy = model->generate(prompt, 8, 0.0);
  auto top1 = model->generate(prompt, 8, 1.0, 1);
  EXPECT_TRUE(at::equal(greedy, top1));
  EXPECT_EQ(model->generate(prompt.select(0, 0), 3).sizes(), (std::vector<int64_t>{8}));
}

// attention = "sdpa" is the same function and the same parameters as the
// explicit form: a model of either loads the other's state, and the logits
// and every gradient agree to float32 rounding (the flash kernel sums in
// blocks, with an online softmax); causality holds; the config JSON is the
// same.
TEST(GptTest, SdpaAttentionIsTheExplicitFunctionToRounding) {
  torch::manual_seed(4);
  GPT explicit_model(GPTConfig::preset("small"));
  GPT sdpa_model(GPTConfig::preset("small").with_attention("sdpa"));
  {
    torch::NoGradGuard no_grad;
    auto to = sdpa_model->named_parameters();
    for (const auto& p : explicit_model->named_parameters()) to[p.key()].copy_(p.value());
  }
  auto idx = at::randint(0, 256, {4, 100}, at::kLong);
  auto a = explicit_model->forward(idx), b = sdpa_model->forward(idx);
  EXPECT_LT((a - b).abs().max().item<double>(), 1e-4 * a.abs().max().item<double>());
  explicit_model->loss(idx, idx).backward();
  sdpa_model->loss(idx, idx).backward();
  auto sdpa_params = sdpa_model->named_parameters();
  for (const auto& p : explicit_model->named_parameters()) {
    const at::Tensor& g = p.value().grad();
    const at::Tensor& h = sdpa_params[p.key()].grad();
    EXPECT_LT((g - h).abs().max().item<double>(), 1e-4 * g.abs().max().item<double>() + 1e-7) << p.key();
  }
  auto changed = idx.clone();
  changed.select(1, 60).copy_((idx.select(1, 60) + 1) % 256);
  EXPECT_TRUE(at::equal(sdpa_model->forward(changed).narrow(1, 0, 60), b.narrow(1, 0, 60)));
  EXPECT_EQ(GPTConfig::preset("small").with_attention("sdpa").to_json(), GPTConfig::preset("small").to_json());
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([] { GPT m(GPTConfig().with_attention("flash")); }),
            "[gpt] attention must be 'explicit' (matmul, mask, softmax) or 'sdpa' (scaled_dot_product_attention), "
            "got 'flash'");
}

TEST(GptTest, BadConfigurationsAreRejectedWithTheOffendingValue) {
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([] { GPT m(GPTConfig().with_n_embd(100).with_n_head(3)); }),
            "[gpt] n_embd (100) must be divisible by n_head (3)");
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([] { GPTConfig::preset("huge"); }),
            "[gpt] unknown model preset 'huge'; known presets: tiny, small, medium, large");
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([] { GPT m(GPTConfig().with_n_layer(0)); }), "[gpt] n_layer must be > 0, got 0");
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([] { GPT m(GPTConfig().with_dropout(1.0)); }), "[gpt] dropout must be in [0, 1), got 1");
  GPT model(tiny());
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([&] { model->forward(at::zeros({1, 65}, at::kLong)); }),
            "[gpt] sequence length 65 exceeds block_size 64");
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([&] { model->forward(at::zeros({1, 4}, at::kInt)); }),
            "[gpt] token ids must be int64, got Int");
}

TEST(GptTest, PresetsHaveTheDocumentedShapes) {
  auto m = GPTConfig::preset("medium");
  EXPECT_EQ(m.n_layer, 6);
  EXPECT_EQ(m.n_head, 6);
  EXPECT_EQ(m.n_embd, 384);
  EXPECT_EQ(m.block_size, 256);
  auto l = GPTConfig::preset("large");
  EXPECT_EQ(l.n_layer, 12);
  EXPECT_EQ(l.n_embd, 768);
  EXPECT_EQ(GPTConfig::preset("small").block_size, 128);
  for (const auto& name : GPTConfig::preset_names()) EXPECT_NO_THROW(GPTConfig::preset(name).validate());
}

TEST(GptTest, ConfigIsPlainFieldsSetByDesignatedInitialisersOrWithSetters) {
  const GPTConfig designated{.n_layer = 3, .n_head = 4, .n_embd = 32, .tie_weights = false};
  const GPTConfig chained = GPTConfig().with_n_layer(3).with_n_head(4).with_n_embd(32).with_tie_weights(false);
  EXPECT_EQ(designated.to_json(), chained.to_json());
  EXPECT_EQ(designated.vocab_size, 256);
  EXPECT_EQ(designated.block_size, 64);
  EXPECT_FALSE(chained.tie_weights);
}

TEST(GptTest, BytesRoundTripThroughTokens) {
  std::string s = "caf\xc3\xa9\n\x01";
  auto t = strata::models::encode_bytes(s);
  EXPECT_EQ(t.numel(), 7);
  EXPECT_EQ(t[4].item<int64_t>(), 0xa9);
  EXPECT_EQ(strata::models::decode_bytes(t), s);
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([] { strata::models::decode_bytes(at::full({2}, 300, at::kLong)); }),
            "[gpt] token 300 at position 0 is not a byte (expected 0..255)");
}

TEST(MlpTest, HasTheRequestedLayersAndOutputShape) {
  torch::manual_seed(7);
  strata::models::MLP mlp(512, 2048, 512, 1);
  EXPECT_EQ(mlp->name(), "MLP");
  int64_t n = 0;
  for (const auto& p : mlp->parameters()) n += p.numel();
  EXPECT_EQ(n, 512 * 2048 + 2048 + 2048 * 512 + 512);
  EXPECT_EQ(mlp->forward(at::randn({4, 512})).sizes(), (std::vector<int64_t>{4, 512}));

  strata::models::MLP deep(3, 5, 2, 3);
  EXPECT_EQ(deep->layers->size(), 4u);
  // Independent reference: the same layers applied by hand.
  auto x = at::randn({6, 3});
  auto h = x;
  for (size_t i = 0; i < 4; ++i) {
    auto* lin = deep->layers->ptr(i)->as<torch::nn::LinearImpl>();
    h = at::linear(h, lin->weight, lin->bias);
    if (i < 3) h = h.clamp_min(0);
  }
  EXPECT_TRUE(at::allclose(deep->forward(x), h));
  EXPECT_EQ(strata::testing::error_message<strata::ConfigError>([] { strata::models::MLP m(0, 4, 4, 1); }), "[mlp] sizes must be > 0, got in=0 hidden=4 out=4");
}

}  // namespace
