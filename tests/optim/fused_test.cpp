// strata::optim's fused optimizers against torch::optim's loop: the same
// training to rounding (Note [Fused against the loop] in
// src/optim/fused.cpp), checkpoints that move between the two, and the
// fallback to the loop where no fused kernel serves.
#include <gtest/gtest.h>

#include <torch/nn.h>
#include <torch/serialize.h>

#include <cstdio>
#include <functional>
#include <memory>
#include <sstream>

#include "strata/checkpoint/state_dict.h"
#include "strata/optim/fused.h"

namespace strata::testing {
namespace {

struct Net : torch::nn::Module {
  Net() {
    a = register_module("a", torch::nn::Linear(16, 32));
    b = register_module("b", torch::nn::Linear(32, 4));
  }
  at::Tensor forward(const at::Tensor& x) { return b->forward(at::tanh(a->forward(x))); }
  torch::nn::Linear a{nullptr}, b{nullptr};
};

std::shared_ptr<Net> net(int64_t seed = 3) {
  torch::manual_seed(seed);
  return std::make_shared<Net>();
}

std::shared_ptr<Net> copy_of(const Net& source) {
  auto out = net(99);
  torch::NoGradGuard no_grad;
  auto to = out->parameters();
  auto from = source.parameters();
  for (size_t i = 0; i < to.size(); ++i) to[i].copy_(from[i]);
  return out;
}

/// `steps` steps on fixed batches (the same for every model given the seed).
void train(Net& model, torch::optim::Optimizer& optimizer, int steps, int first_batch = 0) {
  for (int s = first_batch; s < first_batch + steps; ++s) {
    torch::manual_seed(1000 + s);
    const at::Tensor x = torch::randn({8, 16});
    const at::Tensor y = torch::randn({8, 4});
    optimizer.zero_grad();
    torch::mse_loss(model.forward(x), y).backward();
    optimizer.step();
  }
}

/// max |a - b| over every parameter, relative to the largest |a|.
double relative_difference(const Net& a, const Net& b) {
  double diff = 0, scale = 0;
  auto pa = a.parameters(), pb = b.parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    diff = std::max(diff, (pa[i] - pb[i]).abs().max().item<double>());
    scale = std::max(scale, pa[i].abs().max().item<double>());
  }
  return diff / scale;
}

// The bound: a few float32 ulps per step, 30 steps (Note [Fused against the
// loop]). A wrong formula is off by orders of magnitude more; the AdamW case
// shows it by putting Adam's coupled weight decay beside it.
constexpr double kRounding = 1e-5;

struct Case {
  const char* name;
  std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)> loop, fused;
};

class FusedAgainstLoop : public ::testing::TestWithParam<Case> {};

TEST_P(FusedAgainstLoop, TrainsTheSameToRounding) {
  auto reference = net();
  auto fused_model = copy_of(*reference);
  auto loop = GetParam().loop(reference->parameters());
  auto fused = GetParam().fused(fused_model->parameters());
  ASSERT_TRUE(optim::is_fused(*fused));
  ASSERT_FALSE(optim::is_fused(*loop));
  train(*reference, *loop, 30);
  train(*fused_model, *fused, 30);
  const double diff = relative_difference(*reference, *fused_model);
  EXPECT_LT(diff, kRounding) << GetParam().name;
  auto untrained = net();
  EXPECT_GT(relative_difference(*reference, *untrained), 1e-2) << "the steps moved the parameters";
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", diff);
  RecordProperty("relative_difference", text);
}

using torch::optim::AdamOptions;
using torch::optim::AdamWOptions;
using torch::optim::SGDOptions;

template <class Opt, class Options>
std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)> make(Options options) {
  return [options](std::vector<at::Tensor> params) { return std::make_unique<Opt>(std::move(params), options); };
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, FusedAgainstLoop,
    ::testing::Values(
        Case{"adamw", make<torch::optim::AdamW>(AdamWOptions(1e-2).weight_decay(0.1)),
             make<optim::AdamW>(AdamWOptions(1e-2).weight_decay(0.1))},
        Case{"adamw_amsgrad", make<torch::optim::AdamW>(AdamWOptions(1e-2).amsgrad(true).betas({0.8, 0.95})),
             make<optim::AdamW>(AdamWOptions(1e-2).amsgrad(true).betas({0.8, 0.95}))},
        Case{"adam_l2", make<torch::optim::Adam>(AdamOptions(1e-2).weight_decay(0.05)),
             make<optim::Adam>(AdamOptions(1e-2).weight_decay(0.05))},
        Case{"sgd", make<torch::optim::SGD>(SGDOptions(0.05)), make<optim::SGD>(SGDOptions(0.05))},
        Case{"sgd_momentum_dampening",
             make<torch::optim::SGD>(SGDOptions(0.05).momentum(0.9).dampening(0.1).weight_decay(0.01)),
             make<optim::SGD>(SGDOptions(0.05).momentum(0.9).dampening(0.1).weight_decay(0.01))},
        Case{"sgd_nesterov", make<torch::optim::SGD>(SGDOptions(0.05).momentum(0.9).nesterov(true)),
             make<optim::SGD>(SGDOptions(0.05).momentum(0.9).nesterov(true))}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.name); });

// The bound discriminates: AdamW's decoupled decay against Adam's coupled
// one, same rate, differs far beyond it.
TEST(FusedOptimizerTest, TheBoundSeparatesAnotherFormula) {
  auto reference = net();
  auto other = copy_of(*reference);
  torch::optim::AdamW loop(reference->parameters(), AdamWOptions(1e-2).weight_decay(0.1));
  optim::Adam coupled(other->parameters(), AdamOptions(1e-2).weight_decay(0.1));
  train(*reference, loop, 30);
  train(*other, coupled, 30);
  EXPECT_GT(relative_difference(*reference, *other), 100 * kRounding);
}

// A checkpoint of the fused optimizer is the loop's, both through strata's
// optimizer state and through torch::serialize: stop after 10 steps, move
// the state across, and 10 more steps agree with 20 uninterrupted ones.
// The rate reaches the kernels as a tensor made from the group's options
// each step, so a schedule that rewrites it is followed; plain SGD agrees
// with the loop bit for bit, so the rates must be the same doubles.
TEST(FusedOptimizerTest, AScheduleThatRewritesTheRateIsFollowedExactly) {
  auto reference = net();
  auto fused_model = copy_of(*reference);
  auto constant_model = copy_of(*reference);
  torch::optim::SGD loop(reference->parameters(), SGDOptions(0.05));
  optim::SGD fused(fused_model->parameters(), SGDOptions(0.05));
  optim::SGD constant(constant_model->parameters(), SGDOptions(0.05));
  for (int s = 0; s < 10; ++s) {
    const double rate = 0.05 * (1.0 - s / 10.0) + 1e-3 * s * s;
    static_cast<SGDOptions&>(loop.param_groups()[0].options()).lr(rate);
    static_cast<SGDOptions&>(fused.param_groups()[0].options()).lr(rate);
    train(*reference, loop, 1, s);
    train(*fused_model, fused, 1, s);
    train(*constant_model, constant, 1, s);
  }
  EXPECT_EQ(relative_difference(*reference, *fused_model), 0.0);
  EXPECT_GT(relative_difference(*reference, *constant_model), 1e-3) << "the schedule changed the training";
}

TEST(FusedOptimizerTest, CheckpointsMoveBetweenFusedAndLoop) {
  auto uninterrupted = net();
  auto fused_first = copy_of(*uninterrupted);
  optim::AdamW straight(uninterrupted->parameters(), AdamWOptions(1e-2).weight_decay(0.1));
  train(*uninterrupted, straight, 20);

  optim::AdamW fused(fused_first->parameters(), AdamWOptions(1e-2).weight_decay(0.1));
  train(*fused_first, fused, 10);
  // fused -> loop through strata's checkpoint state
  auto loop_model = copy_of(*fused_first);
  torch::optim::AdamW loop(loop_model->parameters(), AdamWOptions(1e-3));
  const checkpoint::OptimizerState state =
      checkpoint::optimizer_state(fused, checkpoint::param_names(*fused_first));
  EXPECT_EQ(state.json.at("type"), "adamw");
  EXPECT_EQ(state.json.at("state").at("a.weight").at("step"), 10);
  checkpoint::load_optimizer_state(loop, checkpoint::param_names(*loop_model), state);
  EXPECT_DOUBLE_EQ(static_cast<const AdamWOptions&>(loop.param_groups()[0].options()).lr(), 1e-2);
  train(*loop_model, loop, 10, /*first_batch=*/10);
  EXPECT_LT(relative_difference(*uninterrupted, *loop_model), kRounding);

  // loop -> fused through torch::serialize
  auto back_model = copy_of(*loop_model);
  std::stringstream bytes;
  torch::save(loop, bytes);
  optim::AdamW back(back_model->parameters(), AdamWOptions(1e-2).weight_decay(0.1));
  torch::load(back, bytes);
  train(*back_model, back, 5, 20);
  train(*loop_model, loop, 5, 20);
  EXPECT_LT(relative_difference(*loop_model, *back_model), kRounding);
  const auto& s = static_cast<const torch::optim::AdamWParamState&>(
      *back.state().at(back_model->a->weight.unsafeGetTensorImpl()));
  EXPECT_EQ(s.step(), 25);
}

// Parameters of several dtypes go to one fused call per dtype; bf16 agrees
// with the loop to bf16's rounding.
TEST(FusedOptimizerTest, ParametersOfTwoDtypesStepInTheirOwnCalls) {
  torch::manual_seed(5);
  at::Tensor w32 = torch::randn({64}).requires_grad_();
  at::Tensor w16 = torch::randn({64}).to(at::kBFloat16).requires_grad_();
  at::Tensor r32 = w32.detach().clone().requires_grad_(), r16 = w16.detach().clone().requires_grad_();
  const at::Tensor initial16 = w16.detach().to(at::kFloat);
  optim::AdamW fused({w32, w16}, AdamWOptions(1e-2));
  torch::optim::AdamW loop({r32, r16}, AdamWOptions(1e-2));
  for (int s = 0; s < 5; ++s) {
    fused.zero_grad();
    loop.zero_grad();
    (w32 * w32).sum().backward();
    (w16.to(at::kFloat) * 3).sum().backward();
    (r32 * r32).sum().backward();
    (r16.to(at::kFloat) * 3).sum().backward();
    fused.step();
    loop.step();
  }
  EXPECT_EQ(fused.loop_steps(), 0);
  EXPECT_LT((w32 - r32).abs().max().item<double>(), 1e-6);
  EXPECT_LE((w16.to(at::kFloat) - r16.to(at::kFloat)).abs().max().item<double>(), 1.6e-2);  // 2 bf16 ulps at |w| ~ 2
  EXPECT_GT((w16.detach().to(at::kFloat) - initial16).abs().max().item<double>(), 0.04) << "5 steps of 1e-2 moved it";
}

// A sparse gradient has no fused kernel: the whole step takes the loop, and
// the result is the loop's exactly.
TEST(FusedOptimizerTest, ASparseGradientTakesTheLoop) {
  torch::manual_seed(7);
  torch::nn::Embedding fused_emb(torch::nn::EmbeddingOptions(10, 4).sparse(true));
  torch::nn::Embedding loop_emb(torch::nn::EmbeddingOptions(10, 4).sparse(true));
  {
    torch::NoGradGuard no_grad;
    loop_emb->weight.copy_(fused_emb->weight);
  }
  optim::SGD fused(fused_emb->parameters(), SGDOptions(0.1));
  torch::optim::SGD loop(loop_emb->parameters(), SGDOptions(0.1));
  const at::Tensor ids = torch::tensor({1, 3, 3, 7});
  for (int s = 0; s < 3; ++s) {
    fused.zero_grad();
    loop.zero_grad();
    fused_emb->forward(ids).pow(2).sum().backward();
    loop_emb->forward(ids).pow(2).sum().backward();
    fused.step();
    loop.step();
  }
  EXPECT_EQ(fused.loop_steps(), 3);
  EXPECT_TRUE(torch::equal(fused_emb->weight, loop_emb->weight));
}

}  // namespace
}  // namespace strata::testing
