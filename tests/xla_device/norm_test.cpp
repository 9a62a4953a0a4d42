// The lowered normalisations (src/xla_device/kernels_norm.cpp) against
// LibTorch's CPU kernels: batch norm in training (the running statistics
// updated in place) and evaluation, 1-d, 2-d and 3-d, with and without
// affine parameters, in f32, bf16 (f32 parameters, as a bf16-mixed model
// keeps them) and f16; instance and group norm; forward and gradients
// through autograd, with no fallback. Skips, saying so, without the CPU
// PJRT plugin.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "strata/xla_device/device.h"
#include "xla_device/xla_device_test.h"

namespace {

using strata::xla::metrics;

class XlaNormTest : public strata::testing::XlaDeviceFixture {};

::testing::AssertionResult close(const at::Tensor& xla, const at::Tensor& cpu, double tol) {
  if (!xla.defined() || !cpu.defined())
    return xla.defined() == cpu.defined() ? ::testing::AssertionSuccess()
                                          : ::testing::AssertionFailure() << "one of the two is undefined";
  at::Tensor a = xla.cpu();
  if (a.scalar_type() != cpu.scalar_type() || a.sizes() != cpu.sizes())
    return ::testing::AssertionFailure() << "dtype/shape " << a.scalar_type() << a.sizes() << " vs "
                                         << cpu.scalar_type() << cpu.sizes();
  if (cpu.numel() == 0) return ::testing::AssertionSuccess();
  const double scale = std::max(1.0, cpu.abs().max().item<double>());
  const double diff = (a.to(torch::kDouble) - cpu.to(torch::kDouble)).abs().max().item<double>();
  if (diff <= tol * scale) return ::testing::AssertionSuccess() << diff;
  return ::testing::AssertionFailure() << "max difference " << diff << " over " << tol * scale;
}

// Note [Tolerances of the normalisations]
// LibTorch's CPU kernels accumulate f32 statistics in double, the lowering
// in f32, and rsqrt is XLA's: 1e-5 of the largest value in f32 (the
// gradients sum products of the normalised input). bf16 and f16 results
// are rounded once from f32 on both sides: one ulp of the result's dtype
// where the f32 values straddle a rounding boundary.
double tolerance(at::ScalarType t) {
  if (t == at::kBFloat16) return 1.0 / 64;
  if (t == at::kHalf) return 1.0 / 512;
  return 1e-5;
}

// The module's output and the gradients of its input and parameters on
// the CPU and on xla (a copy of the same module), with its buffers after.
void expect_like_the_cpu(const std::string& what, torch::nn::AnyModule cpu, at::ScalarType dtype,
                         const at::Tensor& input, const c10::Device& device) {
  cpu.ptr()->zero_grad();  // the gradients of an earlier call go; clone() does not copy them
  torch::nn::AnyModule xla = cpu.clone();
  xla.ptr()->to(device);
  const at::Tensor x = input.to(dtype).clone().requires_grad_();
  const at::Tensor xx = x.detach().to(device).requires_grad_();
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  at::Tensor y = cpu.forward(x), xy = xla.forward(xx);
  const at::Tensor g = torch::randn(y.sizes()).to(y.scalar_type());
  y.backward(g);
  xy.backward(g.to(device));
  const auto m = metrics();
  for (const auto& [op, n] : m.fallbacks) ADD_FAILURE() << what << ": " << op << " fell back " << n << " times";
  strata::xla::mark_step();
  const double tol = tolerance(dtype);
  EXPECT_TRUE(close(xy, y, tol)) << what << " output";
  EXPECT_TRUE(close(xx.grad(), x.grad(), tol)) << what << " input gradient";
  auto cpu_params = cpu.ptr()->named_parameters();
  for (const auto& p : xla.ptr()->named_parameters())
    EXPECT_TRUE(close(p.value().grad(), cpu_params[p.key()].grad(), tol)) << what << " gradient of " << p.key();
  auto cpu_buffers = cpu.ptr()->named_buffers();
  for (const auto& b : xla.ptr()->named_buffers())
    EXPECT_TRUE(close(b.value(), cpu_buffers[b.key()], tol)) << what << " buffer " << b.key();
}

TEST_F(XlaNormTest, BatchNormTrainsAndEvaluatesLikeTheCpu) {
  torch::manual_seed(41);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const std::string d = c10::toString(dtype);
    auto bn2 = torch::nn::BatchNorm2d(torch::nn::BatchNorm2dOptions(3).momentum(0.2));
    if (dtype == at::kHalf) bn2->to(at::kHalf);  // f16 parameters: the statistics in f16
    expect_like_the_cpu("BatchNorm2d training " + d, torch::nn::AnyModule(bn2), dtype, torch::randn({4, 3, 2, 3}) * 3 + 1,
                        device_);
    bn2->eval();
    expect_like_the_cpu("BatchNorm2d eval " + d, torch::nn::AnyModule(bn2), dtype, torch::randn({4, 3, 2, 3}), device_);
    auto bn1 = torch::nn::BatchNorm1d(torch::nn::BatchNorm1dOptions(5).affine(false));
    expect_like_the_cpu("BatchNorm1d without affine " + d, torch::nn::AnyModule(bn1), dtype, torch::randn({6, 5}),
                        device_);
  }
  auto bn3 = torch::nn::BatchNorm3d(torch::nn::BatchNorm3dOptions(2).track_running_stats(false));
  expect_like_the_cpu("BatchNorm3d without running statistics", torch::nn::AnyModule(bn3), at::kFloat,
                      torch::randn({2, 2, 2, 3, 2}), device_);
}

TEST_F(XlaNormTest, InstanceAndGroupNormMatchTheCpu) {
  torch::manual_seed(42);
  auto in2 = torch::nn::InstanceNorm2d(torch::nn::InstanceNorm2dOptions(3).affine(true).track_running_stats(true));
  expect_like_the_cpu("InstanceNorm2d", torch::nn::AnyModule(in2), at::kFloat, torch::randn({2, 3, 3, 2}), device_);
  auto gn = torch::nn::GroupNorm(torch::nn::GroupNormOptions(2, 4));
  expect_like_the_cpu("GroupNorm", torch::nn::AnyModule(gn), at::kFloat, torch::randn({3, 4, 2, 2}), device_);
  auto gn_plain = torch::nn::GroupNorm(torch::nn::GroupNormOptions(4, 4).affine(false));
  expect_like_the_cpu("GroupNorm without affine", torch::nn::AnyModule(gn_plain), at::kFloat, torch::randn({2, 4, 3}),
                      device_);
}

}  // namespace
