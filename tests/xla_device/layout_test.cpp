// Lowered ops on every layout (Note [Writes into a view] in
// src/xla_device/lowering.h): functional, in-place and out= forms on
// transposed, narrowed, strided and expanded inputs and outputs, recorded
// with no fallback and equal to LibTorch's CPU kernels on the same layouts,
// the written views' bases included. Skips, saying so, without the CPU
// PJRT plugin.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "strata/xla_device/device.h"
#include "xla_device/xla_device_test.h"

namespace {

using strata::xla::metrics;

class XlaLayoutTest : public strata::testing::XlaDeviceFixture {};

// Same dtype, shape and strides, values within `tol` of max(1, max|cpu|).
::testing::AssertionResult close(const at::Tensor& xla, const at::Tensor& cpu, double tol) {
  at::Tensor a = xla.cpu();
  if (a.scalar_type() != cpu.scalar_type() || a.sizes() != cpu.sizes())
    return ::testing::AssertionFailure() << "dtype/shape " << a.scalar_type() << a.sizes() << " vs "
                                         << cpu.scalar_type() << cpu.sizes();
  if (xla.strides() != cpu.strides())
    return ::testing::AssertionFailure() << "strides " << xla.strides() << " vs " << cpu.strides();
  const double scale = std::max(1.0, cpu.abs().max().item<double>());
  const double diff = (a.to(torch::kDouble) - cpu.to(torch::kDouble)).abs().max().item<double>();
  if (diff <= tol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max difference " << diff << " over " << tol * scale;
}

struct Case {
  std::string what;
  at::Tensor xla, cpu;
  double tol;
};

// exp-based ops (sigmoid, silu) and rsqrt are XLA's approximations: a few
// f32 ulps (Note [Tolerances of the lowered nn ops] in nn_ops_test.cpp);
// XLA's CPU compiler fuses a product and a sum into one rounding (rotary's
// q * cos + rotated * sin): an ulp.
constexpr double kExact = 0, kFused = 1e-6, kTranscendental = 2e-6;

TEST_F(XlaLayoutTest, FunctionalOpsOnTransposedHeadsLowerWithTheCpuStrides) {
  torch::manual_seed(21);
  // A LLaMA-style attention's heads: [B, T, H * D] viewed [B, T, H, D] and
  // transposed to [B, H, T, D].
  const at::Tensor x = torch::randn({2, 3, 8}), y = torch::randn({2, 3, 8}), cos = torch::randn({3, 2}),
                   sin = torch::randn({3, 2});
  const at::Tensor xx = on(x), xy = on(y), xcos = on(cos), xsin = on(sin);
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  auto heads = [](const at::Tensor& t) { return t.view({2, 3, 2, 4}).transpose(1, 2); };
  // Rotary embedding as its authors write it: halves, neg, cat, products.
  auto rotary = [&](const at::Tensor& q, const at::Tensor& c, const at::Tensor& s) {
    const at::Tensor c4 = torch::cat({c, c}, -1), s4 = torch::cat({s, s}, -1);
    const at::Tensor rotated = torch::cat({-q.narrow(-1, 2, 2), q.narrow(-1, 0, 2)}, -1);
    return q * c4 + rotated * s4;
  };
  const at::Tensor q = heads(x), k = heads(y), xq = heads(xx), xk = heads(xy);
  std::vector<Case> cases = {
      {"add", xq + xk, q + k, kExact},
      {"mul", xq * xk, q * k, kExact},
      {"neg", -xq, -q, kExact},
      {"sub with alpha", torch::sub(xq, xk, 0.5), torch::sub(q, k, 0.5), kExact},
      {"div", xq / (xk.abs() + 1), q / (k.abs() + 1), kExact},
      {"rsqrt", (xq * xq + 1).rsqrt(), (q * q + 1).rsqrt(), kTranscendental},
      {"silu", torch::silu(xq), torch::silu(q), kTranscendental},
      {"sigmoid", torch::sigmoid(xq), torch::sigmoid(q), kTranscendental},
      {"silu * up (SwiGLU)", torch::silu(xq) * xk, torch::silu(q) * k, kTranscendental},
      {"rotary", rotary(xq, xcos, xsin), rotary(q, cos, sin), kFused},
      {"RMSNorm", xq * (xq.pow(2).mean(-1, true) + 1e-6).rsqrt(), q * (q.pow(2).mean(-1, true) + 1e-6).rsqrt(),
       kTranscendental},
      {"matmul of heads", at::matmul(xq, xk.transpose(-2, -1)), at::matmul(q, k.transpose(-2, -1)), 1e-6},
  };
  const auto m = metrics();
  for (const auto& [op, n] : m.fallbacks) ADD_FAILURE() << op << " fell back " << n << " times";
  strata::xla::mark_step();
  for (const auto& c : cases) EXPECT_TRUE(close(c.xla, c.cpu, c.tol)) << c.what;
}

TEST_F(XlaLayoutTest, InPlaceAndOutFormsWriteIntoViewsOfEveryLayout) {
  torch::manual_seed(22);
  const at::Tensor a = torch::randn({4, 6}), b = torch::randn({4, 6}), row = torch::randn({6});
  const at::Tensor xa = on(a), xb = on(b), xrow = on(row);
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  std::vector<Case> cases;
  // Each `write` changes a view of a fresh copy of `a`; the whole copy is
  // compared, so the elements outside the view must stay.
  auto both = [&](const std::string& what, const std::function<void(at::Tensor&, bool)>& write, double tol) {
    at::Tensor cpu = a.clone(), xla = xa.clone();
    write(cpu, false);
    write(xla, true);
    cases.push_back({what, xla, cpu, tol});
  };
  both("mul_ on a transposed tensor", [](at::Tensor& t, bool) { t.t().mul_(2.5); }, kExact);
  both("add_ on a narrowed row block", [&](at::Tensor& t, bool x) { t.narrow(0, 1, 2).add_(x ? xb.narrow(0, 0, 2) : b.narrow(0, 0, 2)); }, kExact);
  both("add_ on a column block", [&](at::Tensor& t, bool x) { t.narrow(1, 2, 3).add_(x ? xrow.narrow(0, 0, 3) : row.narrow(0, 0, 3)); }, kExact);
  both("mul_ on every other column", [](at::Tensor& t, bool) { t.slice(1, 0, 6, 2).mul_(-3); }, kExact);
  both("neg_ on a transposed sub-block", [](at::Tensor& t, bool) { t.narrow(0, 1, 3).narrow(1, 1, 4).t().neg_(); }, kExact);
  both("fill_ of one column", [](at::Tensor& t, bool) { t.select(1, 4).fill_(7); }, kExact);
  both("zero_ of one element", [](at::Tensor& t, bool) { t[2][3].zero_(); }, kExact);
  both("sigmoid_ on a column block", [](at::Tensor& t, bool) { t.narrow(1, 1, 2).sigmoid_(); }, kTranscendental);
  both("copy_ into a column block", [&](at::Tensor& t, bool x) { t.narrow(1, 3, 2).copy_(x ? xb.narrow(1, 0, 2) : b.narrow(1, 0, 2)); }, kExact);
  both("copy_ of a transposed source", [&](at::Tensor& t, bool x) { t.narrow(0, 0, 2).copy_((x ? xb : b).t().narrow(1, 0, 2).t()); }, kExact);
  both("add out= into a narrowed view", [&](at::Tensor& t, bool x) {
    at::Tensor out = t.narrow(1, 1, 4);
    at::add_out(out, (x ? xa : a).narrow(1, 0, 4), (x ? xb : b).narrow(1, 2, 4));
  }, kExact);
  both("mul out= into a transposed view", [&](at::Tensor& t, bool x) {
    at::Tensor out = t.view({6, 4}).t();
    at::mul_out(out, x ? xa : a, x ? xb : b);
  }, kExact);
  both("tanh out= into a strided slice", [&](at::Tensor& t, bool x) {
    at::Tensor out = t.slice(0, 1, 4, 2);
    at::tanh_out(out, (x ? xb : b).narrow(0, 0, 2));
  }, kTranscendental);
  // Expanded inputs broadcast; a transposed out= tensor keeps its strides.
  at::Tensor out = torch::empty({6, 4}).t(), xout = torch::empty({6, 4}, device_).t();
  at::mul_out(out, a, row.expand({4, 6}));
  at::mul_out(xout, xa, xrow.expand({4, 6}));
  cases.push_back({"mul out= of an expanded input into a transposed tensor", xout, out, kExact});
  const auto m = metrics();
  for (const auto& [op, n] : m.fallbacks) ADD_FAILURE() << op << " fell back " << n << " times";
  strata::xla::mark_step();
  for (const auto& c : cases) EXPECT_TRUE(close(c.xla, c.cpu, c.tol)) << c.what;
}

TEST_F(XlaLayoutTest, AWriteIntoAnExpandedTensorIsRefusedAsOnTheCpu) {
  const at::Tensor xa = on(torch::randn({1, 3}));
  EXPECT_THROW(xa.expand({2, 3}).add_(1), c10::Error);
  EXPECT_THROW(torch::randn({1, 3}).expand({2, 3}).add_(1), c10::Error);
}

}  // namespace
