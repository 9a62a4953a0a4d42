// Dropout on the xla device (Note [Random bits on the device] in
// src/xla_device/kernels_random.cpp): the mask follows dropout's law, the
// output and the backward use the very mask returned, manual_seed repeats
// the masks, a new key each step compiles nothing, and the example GPT with
// dropout trains with no fallback. Skips, saying so, without the CPU PJRT
// plugin of the project's environment.
#include <gtest/gtest.h>
#include <torch/nn/functional/dropout.h>
#include <torch/optim.h>

#include <cmath>
#include <cstdio>

#include "strata/core/error.h"
#include "strata/models/gpt.h"
#include "strata/xla_device/device.h"
#include "xla_device/xla_device_test.h"

namespace {

using strata::xla::metrics;

class XlaRandomTest : public strata::testing::XlaDeviceFixture {};

TEST_F(XlaRandomTest, DropoutKeepsOneMinusPAndScalesWhatItKeeps) {
  constexpr double kP = 0.3;
  constexpr int64_t kN = 1 << 20;
  const at::Tensor x = torch::rand({kN}) + 1.0;  // no zeros: a zero in the output means dropped
  torch::manual_seed(7);
  strata::xla::reset_metrics();
  auto [out, mask] = at::native_dropout(x.to(device_), kP, true);
  strata::xla::mark_step();
  const at::Tensor o = out.cpu(), m = mask.cpu();
  EXPECT_EQ(metrics().fallback_calls(), 0) << "native_dropout is lowered";
  ASSERT_EQ(m.scalar_type(), at::kBool);
  // Kept with probability 1 - p: the fraction kept is within 5 standard
  // deviations (sqrt(p (1 - p) / N) = 4.5e-4) of 0.7.
  const double kept = m.to(at::kDouble).mean().item<double>();
  std::printf("kept %.6f of %lld (want %.1f)\n", kept, static_cast<long long>(kN), 1 - kP);
  EXPECT_NEAR(kept, 1 - kP, 5 * std::sqrt(kP * (1 - kP) / kN));
  // The output is x / (1 - p) where kept and 0 elsewhere, exactly.
  const at::Tensor want = torch::where(m, x * static_cast<float>(1.0 / (1.0 - kP)), torch::zeros_like(x));
  EXPECT_TRUE(torch::equal(o, want));
  EXPECT_TRUE(torch::equal(o != 0, m));
  // Neighbouring elements are not correlated (a stuck or repeating stream
  // would be): P(both kept) is (1 - p)^2 within 5 standard deviations.
  const double both = (m.slice(0, 0, kN - 1) & m.slice(0, 1, kN)).to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(both, (1 - kP) * (1 - kP), 5 * std::sqrt(0.49 * 0.51 / kN));
}

TEST_F(XlaRandomTest, DropoutBackwardUsesTheForwardsMask) {
  const at::Tensor x = torch::randn({64, 48});
  torch::manual_seed(3);
  at::Tensor xx = x.to(device_).requires_grad_(true);
  strata::xla::reset_metrics();
  at::Tensor y = torch::nn::functional::dropout(xx, torch::nn::functional::DropoutFuncOptions().p(0.25));
  (y * 2).sum().backward();
  strata::xla::mark_step();
  const at::Tensor yc = y.cpu(), g = xx.grad().cpu();
  const at::Tensor kept = yc != 0;
  EXPECT_GT(kept.sum().item<int64_t>(), 0);
  EXPECT_LT(kept.sum().item<int64_t>(), x.numel());
  // d(2 * sum(dropout(x)))/dx = 2 / (1 - p) where kept, 0 where dropped.
  const at::Tensor want = torch::where(kept, torch::full_like(x, 2.0f / 0.75f), torch::zeros_like(x));
  EXPECT_TRUE(torch::allclose(g, want, 0, 0)) << (g - want).abs().max().item<float>();
  const auto m = metrics();
  EXPECT_EQ(m.fallback_calls(), 0);
  EXPECT_EQ(m.lowered.count("aten::native_dropout"), 1u);
  EXPECT_EQ(m.lowered.count("aten::native_dropout_backward"), 1u);
}

TEST_F(XlaRandomTest, ManualSeedRepeatsTheMasksAndANewKeyCompilesNothing) {
  const at::Tensor x = torch::ones({256}).to(device_);
  auto draw = [&] {
    auto [out, mask] = at::native_dropout(x, 0.5, true);
    strata::xla::mark_step();
    return mask.cpu();
  };
  torch::manual_seed(42);
  strata::xla::reset_metrics();
  const at::Tensor first = draw(), second = draw();
  torch::manual_seed(42);
  const at::Tensor again = draw();
  EXPECT_TRUE(torch::equal(first, again)) << "the same seed draws the same mask";
  EXPECT_FALSE(torch::equal(first, second)) << "each call draws a new mask";
  const auto m = metrics();
  EXPECT_EQ(m.executions, 3);
  EXPECT_EQ(m.compiles, 1) << "the key is a parameter: the three programs are one";
}

// The example GPT with dropout in attention, the residual stream and the
// MLP: every op lowered, one compile for each distinct step, and the same
// seed trains the same way twice.
TEST_F(XlaRandomTest, TheGptWithDropoutTrainsWithNoFallbackAndRepeatsUnderTheSameSeed) {
  auto train = [&](uint64_t seed) {
    torch::manual_seed(1);
    auto config = strata::models::GPTConfig::preset("tiny").with_dropout(0.1);
    strata::models::GPT model(config);
    model->to(device_);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-3));
    torch::manual_seed(seed);
    const at::Tensor x = torch::randint(config.vocab_size, {4, 32}, torch::kLong);
    const at::Tensor y = torch::randint(config.vocab_size, {4, 32}, torch::kLong);
    std::vector<float> losses;
    for (int step = 0; step < 5; ++step) {
      opt.zero_grad();
      at::Tensor loss = model->loss(x.to(device_), y.to(device_));
      loss.backward();
      opt.step();
      strata::xla::mark_step();
      losses.push_back(loss.item<float>());
    }
    return losses;
  };
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  const std::vector<float> a = train(9);
  const auto m = metrics();
  for (const auto& [op, n] : m.fallbacks) ADD_FAILURE() << op << " fell back " << n << " times";
  EXPECT_EQ(m.lowered.count("aten::native_dropout"), 1u);
  EXPECT_LE(m.compiles, 3) << "steps 0 and 1 (AdamW's state), and the set-up's upload";
  const std::vector<float> b = train(9);
  EXPECT_EQ(a, b) << "the same seeds, the same masks, the same losses";
  for (float loss : a) EXPECT_TRUE(std::isfinite(loss));
  EXPECT_LT(a.back(), a.front()) << "5 steps on one batch lower its loss";
}

}  // namespace
