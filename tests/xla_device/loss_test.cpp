// The lowered losses (src/xla_device/kernels_loss.cpp) and LibTorch's
// composites over them against LibTorch's CPU kernels: binary
// cross-entropy with and without logits (weights, pos_weight), cross
// entropy with label smoothing, smooth L1 (beta, every reduction), KL
// divergence; loss and input gradient through autograd, f32 and bf16, with
// no fallback. Skips, saying so, without the CPU PJRT plugin.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "strata/xla_device/device.h"
#include "xla_device/xla_device_test.h"

namespace {

using strata::xla::metrics;

class XlaLossTest : public strata::testing::XlaDeviceFixture {};

::testing::AssertionResult close(const at::Tensor& xla, const at::Tensor& cpu, double tol) {
  at::Tensor a = xla.cpu();
  if (a.scalar_type() != cpu.scalar_type() || a.sizes() != cpu.sizes())
    return ::testing::AssertionFailure() << "dtype/shape " << a.scalar_type() << a.sizes() << " vs "
                                         << cpu.scalar_type() << cpu.sizes();
  const double scale = std::max(1.0, cpu.abs().max().item<double>());
  const double diff = (a.to(torch::kDouble) - cpu.to(torch::kDouble)).abs().max().item<double>();
  if (diff <= tol * scale) return ::testing::AssertionSuccess() << diff;
  return ::testing::AssertionFailure() << "max difference " << diff << " over " << tol * scale;
}

// A loss of (input, target) on both devices: the input is what is
// differentiated.
using Loss = std::function<at::Tensor(const at::Tensor& input, const at::Tensor& target, bool on_xla)>;
struct Case {
  std::string name;
  Loss loss;
  at::Tensor input, target;
};

TEST_F(XlaLossTest, LossesAndTheirGradientsMatchTheCpu) {
  namespace F = torch::nn::functional;
  torch::manual_seed(51);
  const at::Tensor probs = torch::rand({4, 5}) * 0.98 + 0.01, labels = (torch::rand({4, 5}) > 0.5).to(at::kFloat);
  const at::Tensor soft = torch::rand({4, 5}), logits = torch::randn({4, 5}) * 3, weight = torch::rand({5}) + 0.5;
  const at::Tensor classes = torch::tensor({1, 4, 0, 2}, at::kLong), scores = torch::randn({4, 5});
  const at::Tensor far = torch::randn({4, 5}) * 2, log_q = torch::log_softmax(torch::randn({4, 5}), 1);
  const at::Tensor xweight = on(weight);
  auto w = [&](bool x) { return x ? xweight : weight; };
  const std::vector<Case> cases = {
      {"binary_cross_entropy", [](auto& i, auto& t, bool) { return F::binary_cross_entropy(i, t); }, probs, labels},
      {"binary_cross_entropy soft targets, weight, sum",
       [&](auto& i, auto& t, bool x) {
         return F::binary_cross_entropy(i, t, F::BinaryCrossEntropyFuncOptions().weight(w(x)).reduction(torch::kSum));
       },
       probs, soft},
      {"binary_cross_entropy none",
       [](auto& i, auto& t, bool) {
         return F::binary_cross_entropy(i, t, F::BinaryCrossEntropyFuncOptions().reduction(torch::kNone));
       },
       probs, labels},
      {"binary_cross_entropy_with_logits",
       [](auto& i, auto& t, bool) { return F::binary_cross_entropy_with_logits(i, t); }, logits, labels},
      {"binary_cross_entropy_with_logits weight, pos_weight",
       [&](auto& i, auto& t, bool x) {
         return F::binary_cross_entropy_with_logits(
             i, t, F::BinaryCrossEntropyWithLogitsFuncOptions().weight(w(x)).pos_weight(w(x) * 2));
       },
       logits, soft},
      {"cross_entropy label smoothing",
       [](auto& i, auto& t, bool) {
         return F::cross_entropy(i, t, F::CrossEntropyFuncOptions().label_smoothing(0.1));
       },
       scores, classes},
      {"cross_entropy label smoothing, weight, sum",
       [&](auto& i, auto& t, bool x) {
         return F::cross_entropy(
             i, t, F::CrossEntropyFuncOptions().label_smoothing(0.2).weight(w(x)).reduction(torch::kSum));
       },
       scores, classes},
      {"smooth_l1_loss", [](auto& i, auto& t, bool) { return F::smooth_l1_loss(i, t); }, far, scores},
      {"smooth_l1_loss beta 0.5, sum",
       [](auto& i, auto& t, bool) {
         return F::smooth_l1_loss(i, t, F::SmoothL1LossFuncOptions().reduction(torch::kSum), 0.5);
       },
       far, scores},
      {"smooth_l1_loss none",
       [](auto& i, auto& t, bool) {
         return F::smooth_l1_loss(i, t, F::SmoothL1LossFuncOptions().reduction(torch::kNone));
       },
       far, scores},
      {"kl_div batchmean",
       [](auto& i, auto& t, bool) {
         return F::kl_div(i, t, F::KLDivFuncOptions().reduction(torch::kBatchMean));
       },
       log_q, torch::softmax(scores, 1)},
      {"kl_div log_target sum",
       [](auto& i, auto& t, bool) {
         return F::kl_div(i, t, F::KLDivFuncOptions().reduction(torch::kSum).log_target(true));
       },
       log_q, torch::log_softmax(scores, 1)},
  };
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (const Case& c : cases) {
      const bool integer_target = !c.target.is_floating_point();
      const at::Tensor input = c.input.to(dtype).clone().requires_grad_();  // a leaf of its own
      const at::Tensor target = integer_target ? c.target : c.target.to(dtype);
      const at::Tensor xinput = input.detach().to(device_).requires_grad_(), xtarget = on(target);
      // bf16 losses take f32 weights on neither side: the weights follow.
      if (dtype != at::kFloat && (c.name.find("weight") != std::string::npos)) continue;
      strata::xla::mark_step();
      strata::xla::reset_metrics();
      at::Tensor loss = c.loss(input, target, false), xloss = c.loss(xinput, xtarget, true);
      const at::Tensor g = torch::rand(loss.sizes()).to(loss.scalar_type()) + 0.5;
      loss.backward(g);
      xloss.backward(on(g));
      const auto m = metrics();
      for (const auto& [op, n] : m.fallbacks)
        ADD_FAILURE() << c.name << " " << dtype << ": " << op << " fell back " << n << " times";
      strata::xla::mark_step();
      // f32: sums in another order and XLA's log/exp (a few ulps); bf16:
      // one bf16 ulp of the largest value where a rounding is straddled.
      const double tol = dtype == at::kFloat ? 1e-5 : 1.0 / 64;
      EXPECT_TRUE(close(xloss, loss, tol)) << c.name << " " << dtype;
      EXPECT_TRUE(close(xinput.grad(), input.grad(), tol)) << c.name << " gradient " << dtype;
    }
  }
}

}  // namespace
