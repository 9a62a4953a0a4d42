// The lowered activations (src/xla_device/kernels_activation.cpp) against
// LibTorch's CPU kernels, forward and gradient through autograd, in f32,
// bf16 and f16, with no fallback; and where with PyTorch's promotion.
// Skips, saying so, without the CPU PJRT plugin.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "strata/xla_device/device.h"
#include "xla_device/xla_device_test.h"

namespace {

using strata::xla::metrics;

class XlaActivationTest : public strata::testing::XlaDeviceFixture {};

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

// Note [Tolerances of the activations]
// f32: XLA's exp, log1p, tanh and rsqrt are its own approximations, a few
// ulps from LibTorch's (Sleef): 4e-6 of the largest value. bf16 and f16
// compute in f32 and round once, as LibTorch does: where the two f32
// results straddle a rounding boundary they differ by one ulp of the
// result's dtype (2^-8 and 2^-11 relative; up to 2^-7 and 2^-10 of the
// largest value). mish's gradient is LibTorch's composite on xla (each of
// its f16 ops rounds) and one fused f32 kernel on the CPU: a few f16 ulps
// (1/256 of the largest value).
double tolerance(at::ScalarType t) {
  if (t == at::kBFloat16) return 1.0 / 128;
  if (t == at::kHalf) return 1.0 / 256;
  return 4e-6;
}

struct Activation {
  std::string name;
  std::function<at::Tensor(const at::Tensor&)> f;
};

TEST_F(XlaActivationTest, ActivationsAndTheirGradientsMatchTheCpuInEveryFloatType) {
  namespace F = torch::nn::functional;
  const std::vector<Activation> activations = {
      {"sigmoid", [](const at::Tensor& x) { return torch::sigmoid(x); }},
      {"tanh", [](const at::Tensor& x) { return torch::tanh(x); }},
      {"rsqrt", [](const at::Tensor& x) { return torch::rsqrt(x.abs() + 0.5); }},
      {"silu", [](const at::Tensor& x) { return F::silu(x); }},
      {"leaky_relu", [](const at::Tensor& x) { return F::leaky_relu(x, F::LeakyReLUFuncOptions().negative_slope(0.2)); }},
      {"hardtanh", [](const at::Tensor& x) { return F::hardtanh(x, F::HardtanhFuncOptions().min_val(-0.5).max_val(1.5)); }},
      {"relu6", [](const at::Tensor& x) { return F::relu6(x); }},
      {"elu", [](const at::Tensor& x) { return F::elu(x, F::ELUFuncOptions().alpha(0.7)); }},
      {"selu", [](const at::Tensor& x) { return F::selu(x); }},
      {"softplus", [](const at::Tensor& x) { return F::softplus(x, F::SoftplusFuncOptions().beta(2).threshold(3)); }},
      {"mish", [](const at::Tensor& x) { return F::mish(x); }},
      {"gelu", [](const at::Tensor& x) { return F::gelu(x); }},
  };
  torch::manual_seed(31);
  // Values on both sides of every threshold (0, the hardtanh bounds,
  // softplus's 3 / beta), and a transposed view.
  const at::Tensor base = torch::randn({5, 7}) * 2, grad = torch::randn({7, 5});
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (const Activation& a : activations) {
      // A leaf of its own each time (to() of the same dtype returns base).
      const at::Tensor x = base.to(dtype).clone().requires_grad_(), g = grad.to(dtype);
      const at::Tensor xx = x.detach().to(device_).requires_grad_(), xg = g.to(device_);
      strata::xla::mark_step();
      strata::xla::reset_metrics();
      at::Tensor y = a.f(x.t()), xy = a.f(xx.t());
      y.backward(g);
      xy.backward(xg);
      const auto m = metrics();
      for (const auto& [op, n] : m.fallbacks)
        ADD_FAILURE() << a.name << " " << dtype << ": " << op << " fell back " << n << " times";
      strata::xla::mark_step();
      EXPECT_TRUE(close(xy, y, tolerance(dtype))) << a.name << " " << dtype;
      EXPECT_TRUE(close(xx.grad(), x.grad(), tolerance(dtype))) << a.name << " gradient " << dtype;
    }
  }
}

TEST_F(XlaActivationTest, WherePromotesAndBroadcastsAsTheCpu) {
  torch::manual_seed(32);
  const at::Tensor c = torch::rand({3, 4}) > 0.5, row = torch::rand({4}) > 0.5;
  const at::Tensor a = torch::randn({3, 4}), i = torch::arange(4, torch::kInt), h = torch::randn({3, 1}).to(at::kBFloat16);
  const at::Tensor xc = on(c), xrow = on(row), xa = on(a), xi = on(i), xh = on(h);
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  const std::vector<std::pair<at::Tensor, at::Tensor>> results = {
      {torch::where(xc, xa, -xa), torch::where(c, a, -a)},
      {torch::where(xrow, xa, xi), torch::where(row, a, i)},
      {torch::where(xc, xh, xa.t().t()), torch::where(c, h, a)},
      {torch::where(xc, xa, 0.5), torch::where(c, a, 0.5)},
      {torch::where(xrow, xi, 3), torch::where(row, i, 3)},
  };
  at::Tensor out = torch::empty({3, 4}).t(), xout = torch::empty({3, 4}, device_).t();
  at::where_out(out, c.t(), a.t(), h.t());
  at::where_out(xout, xc.t(), xa.t(), xh.t());
  const auto m = metrics();
  for (const auto& [op, n] : m.fallbacks) ADD_FAILURE() << op << " fell back " << n << " times";
  strata::xla::mark_step();
  for (size_t k = 0; k < results.size(); ++k) EXPECT_TRUE(close(results[k].first, results[k].second, 0)) << k;
  EXPECT_TRUE(close(xout, out, 0));
}

}  // namespace
