// The lowered convolutions, pooling and padding (src/xla_device/kernels_conv.cpp,
// kernels_pool.cpp) against LibTorch's CPU kernels: each op forward and,
// through autograd, backward (a random output gradient, the inputs'
// gradients compared), on contiguous and transposed inputs, f32 and bf16,
// recorded with no fallback; a call the lowering leaves to the CPU falls
// back and runs; and a small conv net trains like the CPU, one program a
// step and no compile after step 2. Skips, saying so, without the CPU PJRT
// plugin.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "strata/core/error.h"
#include "strata/xla_device/device.h"
#include "strata/xla/error.h"
#include "xla_device/xla_device_test.h"

namespace strata::testing {
namespace {

using strata::xla::metrics;
using Ints = std::vector<int64_t>;
using Fn = std::function<at::Tensor(const std::vector<at::Tensor>&)>;
namespace F = torch::nn::functional;

class XlaConvPoolTest : public XlaDeviceFixture {};

// Note [Tolerances of the window ops]
// Max pooling, padding and the gradients of max pooling without overlap
// and of a constant pad move values: exact. A convolution's sums are
// ordered by XLA's CPU kernels their own way, as are the pooling sums (and
// the divisions) and the gradients of reflected or replicated elements:
// 1e-5 of the largest value.
// bf16 results differ by one bf16 rounding where the f32 values straddle
// it (Note [bf16 computes in f32] in src/xla_device/lowering.h): 1e-2.
constexpr double kExact = 0, kSum = 1e-5, kBf16 = 1e-2;

// |a - b| <= tol * max(1, max|b|), same dtype and shape.
::testing::AssertionResult close(const at::Tensor& xla, const at::Tensor& cpu, double tol) {
  const at::Tensor a = xla.cpu();
  if (a.scalar_type() != cpu.scalar_type() || a.sizes() != cpu.sizes())
    return ::testing::AssertionFailure() << "dtype/shape " << a.scalar_type() << a.sizes() << " vs "
                                         << cpu.scalar_type() << cpu.sizes();
  const at::Tensor x = a.to(torch::kDouble), y = cpu.to(torch::kDouble);
  const double scale = std::max(1.0, y.abs().max().item<double>());
  const double diff = (x - y).abs().max().item<double>();
  if (diff <= tol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max difference " << diff << " over " << tol * scale;
}

// `f` of `inputs` on the CPU and on xla, and the inputs' gradients for a
// random gradient of the result; the xla side recorded into one step.
struct Compared {
  std::string what;
  at::Tensor xla, cpu;
  std::vector<at::Tensor> xla_grads, cpu_grads;
  double tol;
};

Compared run_both(const std::string& what, const Fn& f, const std::vector<at::Tensor>& inputs, const c10::Device& dev,
                  double tol) {
  std::vector<at::Tensor> cpu_in, xla_in;
  for (const at::Tensor& t : inputs) {
    const bool grad = at::isFloatingType(t.scalar_type());
    cpu_in.push_back(t.clone().requires_grad_(grad));
    xla_in.push_back(t.to(dev).requires_grad_(grad));
  }
  Compared c{what, f(xla_in), f(cpu_in), {}, {}, tol};
  const at::Tensor gy = torch::randn(c.cpu.sizes()).to(c.cpu.scalar_type());
  c.cpu.backward(gy);
  c.xla.backward(gy.to(dev));
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!cpu_in[i].requires_grad()) continue;
    c.cpu_grads.push_back(cpu_in[i].grad());
    c.xla_grads.push_back(xla_in[i].grad());
  }
  c.cpu = c.cpu.detach();
  c.xla = c.xla.detach();
  return c;
}

void expect_all_close(const std::vector<Compared>& cases) {
  for (const Compared& c : cases) {
    EXPECT_TRUE(close(c.xla, c.cpu, c.tol)) << c.what << ": result";
    ASSERT_EQ(c.xla_grads.size(), c.cpu_grads.size()) << c.what;
    for (size_t i = 0; i < c.cpu_grads.size(); ++i) {
      ASSERT_TRUE(c.xla_grads[i].defined()) << c.what << ": gradient " << i;
      EXPECT_TRUE(close(c.xla_grads[i], c.cpu_grads[i], c.tol)) << c.what << ": gradient of input " << i;
    }
  }
}

void expect_no_fallback() {
  for (const auto& [op, count] : metrics().fallbacks) ADD_FAILURE() << op << " fell back " << count << " times";
}

TEST_F(XlaConvPoolTest, ConvolutionsAndTheirGradientsMatchTheCpu) {
  torch::manual_seed(3);
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  const auto r = [](std::vector<int64_t> dims) { return torch::randn(dims); };
  std::vector<Compared> cases = {
      run_both("conv2d, bias", [](const auto& in) { return at::conv2d(in[0], in[1], in[2]); },
               {r({2, 3, 6, 5}), r({4, 3, 3, 3}), r({4})}, device_, kSum),
      run_both("conv2d, stride, padding, dilation",
               [](const auto& in) { return at::conv2d(in[0], in[1], in[2], Ints{2, 1}, Ints{1, 2}, Ints{2, 1}); },
               {r({2, 3, 7, 6}), r({4, 3, 3, 2}), r({4})}, device_, kSum),
      run_both("conv2d, groups, no bias",
               [](const auto& in) { return at::conv2d(in[0], in[1], std::nullopt, Ints{1, 2}, Ints{1, 0}, Ints{1, 1}, 2); },
               {r({2, 4, 5, 6}), r({6, 2, 3, 3})}, device_, kSum),
      run_both("conv2d, depthwise", [](const auto& in) { return at::conv2d(in[0], in[1], in[2], 1, 1, 1, 4); },
               {r({1, 4, 5, 5}), r({4, 1, 3, 3}), r({4})}, device_, kSum),
      run_both("conv2d of a transposed input",
               [](const auto& in) { return at::conv2d(in[0].transpose(2, 3), in[1], in[2], 1, 1); },
               {r({2, 3, 5, 6}), r({4, 3, 3, 3}), r({4})}, device_, kSum),
      run_both("conv2d, padding 'same'", [](const auto& in) { return at::conv2d(in[0], in[1], in[2], 1, "same"); },
               {r({1, 2, 6, 6}), r({3, 2, 4, 3}), r({3})}, device_, kSum),
      run_both("conv2d, padding wider than the kernel reaches",
               [](const auto& in) { return at::conv2d(in[0], in[1], in[2], 1, 2); },
               {r({1, 2, 3, 3}), r({3, 2, 1, 1}), r({3})}, device_, kSum),
      run_both("conv1d, stride, padding, dilation",
               [](const auto& in) { return at::conv1d(in[0], in[1], in[2], 2, 2, 2); },
               {r({2, 3, 9}), r({4, 3, 3}), r({4})}, device_, kSum),
      run_both("conv1d of a transposed input",
               [](const auto& in) { return at::conv1d(in[0].transpose(1, 2), in[1], std::nullopt, 1, 1); },
               {r({2, 7, 3}), r({5, 3, 3})}, device_, kSum),
      run_both("conv3d, stride, groups",
               [](const auto& in) { return at::conv3d(in[0], in[1], in[2], Ints{1, 2, 1}, 1, 1, 2); },
               {r({1, 4, 4, 5, 4}), r({2, 2, 3, 3, 2}), r({2})}, device_, kSum),
      run_both("conv_transpose2d, stride, padding, output_padding",
               [](const auto& in) { return at::conv_transpose2d(in[0], in[1], in[2], 2, 1, 1); },
               {r({2, 3, 4, 3}), r({3, 4, 3, 3}), r({4})}, device_, kSum),
      run_both("conv_transpose2d, groups, dilation",
               [](const auto& in) { return at::conv_transpose2d(in[0], in[1], std::nullopt, Ints{1, 2}, Ints{0, 1}, Ints{0, 1}, 2, Ints{2, 1}); },
               {r({1, 4, 3, 4}), r({4, 3, 2, 3})}, device_, kSum),
      run_both("conv_transpose1d, output_padding beyond padding",
               [](const auto& in) { return at::conv_transpose1d(in[0], in[1], in[2], 3, 0, 2); },
               {r({2, 2, 4}), r({2, 3, 3}), r({3})}, device_, kSum),
      run_both("conv_transpose3d", [](const auto& in) { return at::conv_transpose3d(in[0], in[1], in[2], 2, 1); },
               {r({1, 2, 3, 2, 3}), r({2, 2, 3, 2, 3}), r({2})}, device_, kSum),
  };
  const auto m = metrics();
  expect_no_fallback();
  EXPECT_EQ(m.lowered.at("aten::convolution_overrideable"), static_cast<int64_t>(cases.size()));
  EXPECT_EQ(m.lowered.at("aten::convolution_backward_overrideable"), static_cast<int64_t>(cases.size()))
      << "one call per backward, however many gradients (input, weight, bias) it writes";
  strata::xla::mark_step();
  expect_all_close(cases);
}

TEST_F(XlaConvPoolTest, Bf16ConvolutionsMatchTheCpu) {
  torch::manual_seed(5);
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  const auto r = [](std::vector<int64_t> dims) { return torch::randn(dims).to(torch::kBFloat16); };
  std::vector<Compared> cases = {
      run_both("bf16 conv2d", [](const auto& in) { return at::conv2d(in[0], in[1], in[2], 1, 1); },
               {r({2, 3, 5, 5}), r({4, 3, 3, 3}), r({4})}, device_, kBf16),
      run_both("bf16 conv_transpose2d", [](const auto& in) { return at::conv_transpose2d(in[0], in[1], in[2], 2); },
               {r({1, 2, 3, 3}), r({2, 3, 2, 2}), r({3})}, device_, kBf16),
      run_both("bf16 max_pool2d", [](const auto& in) { return at::max_pool2d(in[0], 2, 2); }, {r({2, 3, 4, 6})},
               device_, kExact),
      run_both("bf16 avg_pool2d", [](const auto& in) { return at::avg_pool2d(in[0], 2, 2); }, {r({2, 3, 4, 6})},
               device_, kBf16),
  };
  expect_no_fallback();
  strata::xla::mark_step();
  expect_all_close(cases);
}

TEST_F(XlaConvPoolTest, PoolingAndItsGradientsMatchTheCpu) {
  torch::manual_seed(7);
  const at::Tensor x4 = torch::randn({2, 3, 7, 6}), x3 = torch::randn({2, 3, 9}), x5 = torch::randn({1, 2, 5, 4, 6});
  // Ties: LibTorch's index is the first maximum of each window.
  const at::Tensor ties = torch::randint(0, 3, {1, 2, 6, 6}).to(torch::kFloat);
  const at::Tensor xla_x4 = x4.to(device_);
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  const auto [values, indices] = at::max_pool2d_with_indices(x4, {3, 2}, {2, 2}, {1, 1}, {1, 2}, true);
  const auto [xla_values, xla_indices] = at::max_pool2d_with_indices(xla_x4, {3, 2}, {2, 2}, {1, 1}, {1, 2}, true);
  const auto [tie_values, tie_indices] = at::max_pool2d_with_indices(ties, 3, 1, 1);
  const auto [xla_tie_values, xla_tie_indices] = at::max_pool2d_with_indices(ties.to(device_), 3, 1, 1);
  std::vector<Compared> cases = {
      run_both("max_pool2d", [](const auto& in) { return at::max_pool2d(in[0], 2); }, {x4}, device_, kExact),
      run_both("max_pool2d, overlapping, padding, dilation, ceil_mode",
               [](const auto& in) { return at::max_pool2d(in[0], {3, 2}, {2, 1}, {1, 1}, {1, 2}, true); }, {x4},
               device_, kSum),
      run_both("max_pool2d of a transposed input",
               [](const auto& in) { return at::max_pool2d(in[0].transpose(2, 3), 2, 1); }, {x4}, device_, kSum),
      run_both("max_pool1d", [](const auto& in) { return at::max_pool1d(in[0], 3, 2, 1); }, {x3}, device_, kExact),
      run_both("max_pool3d", [](const auto& in) { return at::max_pool3d(in[0], {2, 3, 2}, {2, 1, 2}, {1, 1, 0}); },
               {x5}, device_, kSum),
      run_both("avg_pool2d", [](const auto& in) { return at::avg_pool2d(in[0], 2); }, {x4}, device_, kSum),
      run_both("avg_pool2d, padding, count_include_pad false, ceil_mode",
               [](const auto& in) { return at::avg_pool2d(in[0], {3, 2}, {2, 2}, {1, 1}, true, false); }, {x4},
               device_, kSum),
      run_both("avg_pool2d, padding counted, ceil_mode",
               [](const auto& in) { return at::avg_pool2d(in[0], 3, 2, 1, true, true); }, {x4}, device_, kSum),
      run_both("avg_pool2d, divisor_override",
               [](const auto& in) { return at::avg_pool2d(in[0], 2, 1, 1, false, true, 3); }, {x4}, device_, kSum),
      run_both("avg_pool1d", [](const auto& in) { return at::avg_pool1d(in[0], 3, 2, 1); }, {x3}, device_, kSum),
      run_both("avg_pool3d, count_include_pad false",
               [](const auto& in) { return at::avg_pool3d(in[0], 2, {1, 2, 2}, 1, false, false); }, {x5}, device_,
               kSum),
      run_both("adaptive_avg_pool2d, uneven windows",
               [](const auto& in) { return at::adaptive_avg_pool2d(in[0], {3, 4}); }, {x4}, device_, kSum),
      run_both("adaptive_avg_pool2d of a transposed input",
               [](const auto& in) { return at::adaptive_avg_pool2d(in[0].transpose(2, 3), {4, 5}); }, {x4}, device_,
               kSum),
      run_both("adaptive_avg_pool1d", [](const auto& in) { return at::adaptive_avg_pool1d(in[0], 4); }, {x3}, device_,
               kSum),
      run_both("adaptive_avg_pool3d", [](const auto& in) { return at::adaptive_avg_pool3d(in[0], {2, 3, 4}); }, {x5},
               device_, kSum),
      run_both("adaptive_max_pool2d, even windows",
               [](const auto& in) { return std::get<0>(at::adaptive_max_pool2d(in[0].narrow(3, 0, 6), {7, 3})); },
               {x4}, device_, kExact),
      run_both("adaptive_max_pool2d of a transposed input",
               [](const auto& in) { return std::get<0>(at::adaptive_max_pool2d(in[0].transpose(2, 3), {2, 7})); },
               {x4}, device_, kExact),
  };
  // The .out forms, into tensors of another size (resized, as out= is).
  at::Tensor out_values = at::empty({1}, device_), out_indices = at::empty({1}, at::TensorOptions(device_).dtype(at::kLong));
  at::max_pool2d_with_indices_out(out_values, out_indices, xla_x4, {3, 2}, {2, 2}, {1, 1}, {1, 2}, true);
  at::Tensor out_grad = at::empty({1}, device_);
  at::max_pool2d_with_indices_backward_out(out_grad, xla_values, xla_x4, {3, 2}, {2, 2}, {1, 1}, {1, 2}, true,
                                           xla_indices);
  const at::Tensor grad = at::max_pool2d_with_indices_backward(values, x4, {3, 2}, {2, 2}, {1, 1}, {1, 2}, true, indices);
  const auto [adaptive, adaptive_indices] = at::adaptive_max_pool2d(ties, {2, 3});
  const auto [xla_adaptive, xla_adaptive_indices] = at::adaptive_max_pool2d(ties.to(device_), {2, 3});
  expect_no_fallback();
  EXPECT_EQ(metrics().lowered.at("aten::max_pool2d_with_indices_backward"), 5);
  strata::xla::mark_step();
  expect_all_close(cases);
  EXPECT_TRUE(close(xla_values, values, kExact));
  EXPECT_TRUE(at::equal(xla_indices.cpu(), indices)) << "the flat index of each max within its plane";
  EXPECT_TRUE(at::equal(xla_tie_values.cpu(), tie_values));
  EXPECT_TRUE(at::equal(xla_tie_indices.cpu(), tie_indices)) << "ties go to the first maximum";
  EXPECT_TRUE(at::equal(out_values.cpu(), values)) << "max_pool2d_with_indices.out";
  EXPECT_TRUE(at::equal(out_indices.cpu(), indices)) << "max_pool2d_with_indices.out's indices";
  EXPECT_TRUE(close(out_grad, grad, kExact)) << "max_pool2d_with_indices_backward.grad_input";
  EXPECT_TRUE(at::equal(xla_adaptive.cpu(), adaptive));
  EXPECT_TRUE(at::equal(xla_adaptive_indices.cpu(), adaptive_indices)) << "adaptive max pooling's ties";
}

TEST_F(XlaConvPoolTest, PadsAndTheirGradientsMatchTheCpu) {
  torch::manual_seed(9);
  const at::Tensor x3 = torch::randn({2, 3, 5}), x4 = torch::randn({2, 2, 4, 5}), x5 = torch::randn({1, 2, 3, 4, 3});
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  auto pad = [](std::vector<int64_t> p, F::PadFuncOptions::mode_t mode) {
    return [p, mode](const std::vector<at::Tensor>& in) { return F::pad(in[0], F::PadFuncOptions(p).mode(mode)); };
  };
  std::vector<Compared> cases = {
      run_both("constant pad", [](const auto& in) { return F::pad(in[0], F::PadFuncOptions({1, 2, 0, 1}).value(0.5)); },
               {x4}, device_, kExact),
      run_both("constant pad, negative (a cut)",
               [](const auto& in) { return F::pad(in[0], F::PadFuncOptions({-1, 2, 1, -2})); }, {x4}, device_, kExact),
      run_both("reflect 1-d", pad({2, 3}, torch::kReflect), {x3}, device_, kSum),
      run_both("reflect 2-d", pad({1, 3, 2, 1}, torch::kReflect), {x4}, device_, kSum),
      run_both("reflect 2-d of a transposed input",
               [](const auto& in) {
                 return F::pad(in[0].transpose(2, 3), F::PadFuncOptions({1, 2, 2, 1}).mode(torch::kReflect));
               },
               {x4}, device_, kSum),
      run_both("reflect 3-d", pad({1, 1, 2, 0, 1, 2}, torch::kReflect), {x5}, device_, kSum),
      run_both("replicate 1-d", pad({3, 1}, torch::kReplicate), {x3}, device_, kSum),
      run_both("replicate 2-d", pad({2, 2, 1, 3}, torch::kReplicate), {x4}, device_, kSum),
      run_both("replicate 3-d", pad({1, 0, 1, 2, 2, 1}, torch::kReplicate), {x5}, device_, kSum),
      run_both("circular 1-d", pad({2, 1}, torch::kCircular), {x3}, device_, kSum),
      run_both("circular 2-d", pad({1, 2, 2, 1}, torch::kCircular), {x4}, device_, kSum),
      run_both("a convolution with circular padding",
               [](const auto& in) {
                 torch::manual_seed(3);
                 torch::nn::Conv2d conv(torch::nn::Conv2dOptions(2, 3, 3).padding(1).padding_mode(torch::kCircular));
                 conv->to(in[0].device());
                 return conv->forward(in[0]);
               },
               {x4}, device_, kSum),
  };
  expect_no_fallback();
  strata::xla::mark_step();
  expect_all_close(cases);
}

// nn::Unfold and nn::Fold (im2col, col2im: each the other's gradient) and
// the distances (cdist, pdist: kernels_distance.cpp) as modules and
// functions reach them, with their gradients, in one step: a fold adds
// the same terms in the same order as the CPU (exact), a distance sums
// its terms in XLA's order.
TEST_F(XlaConvPoolTest, FoldUnfoldAndDistancesAndTheirGradientsMatchTheCpu) {
  torch::manual_seed(4);
  const at::Tensor image = torch::randn({2, 3, 6, 5}), cols = torch::randn({2, 3 * 4, 15});
  const at::Tensor a = torch::randn({2, 6, 4}), b = torch::randn({7, 4}), many = torch::randn({30, 4});
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  std::vector<Compared> cases = {
      run_both("nn::Unfold",
               [](const auto& in) {
                 torch::nn::Unfold unfold(torch::nn::UnfoldOptions({2, 3}).dilation({2, 1}).padding(1).stride({1, 2}));
                 return unfold->forward(in[0]);
               },
               {image}, device_, kExact),
      run_both("nn::Fold",
               [](const auto& in) {
                 torch::nn::Fold fold(torch::nn::FoldOptions({5, 6}, {2, 2}).padding({1, 0}).stride({2, 1}));
                 return fold->forward(in[0]);
               },
               {cols}, device_, kExact),
      run_both("cdist p=2 (exact differences)", [](const auto& in) { return torch::cdist(in[0], in[1]); }, {a, b},
               device_, kSum),
      run_both("cdist p=2 over 25 rows (a matrix product)", [](const auto& in) { return torch::cdist(in[0], in[1]); },
               {many, b}, device_, kSum),
      run_both("cdist p=1", [](const auto& in) { return torch::cdist(in[0], in[1], 1); }, {a, b}, device_, kSum),
      run_both("cdist p=inf", [](const auto& in) { return torch::cdist(in[0], in[1], INFINITY); }, {a, b}, device_,
               kSum),
      run_both("pdist p=2", [](const auto& in) { return torch::pdist(in[0]); }, {b}, device_, kSum),
      run_both("pdist p=3", [](const auto& in) { return torch::pdist(in[0], 3); }, {b}, device_, kSum),
      run_both("PairwiseDistance", [](const auto& in) { return torch::nn::PairwiseDistance()->forward(in[0], in[1]); },
               {b, b.flip(0)}, device_, kSum),
  };
  expect_no_fallback();
  strata::xla::mark_step();
  expect_all_close(cases);
}

// Note [Convolutions on the host] in kernels_conv.cpp: a call the lowering
// leaves (an input whose rows overlap in memory, which no slice of its
// storage reads) runs LibTorch's CPU convolution through the fallback,
// counted; STRATA_XLA_FALLBACK=error refuses it by name.
// An overlapping view is read by a gather (Note [Any strided view]) and
// lowered. A call the lowering leaves runs on the CPU through the kernels
// registered for the overrideable convolutions there (LibTorch's default
// throws): they compute what at::convolution does.
TEST_F(XlaConvPoolTest, AnOverlappingViewIsLoweredAndTheFallbacksCpuKernelsComputeAConvolution) {
  torch::manual_seed(13);
  const at::Tensor base = torch::randn({24}), w = torch::randn({3, 2, 2, 2}), b = torch::randn({3});
  const at::Tensor xla_base = base.to(device_), xla_w = w.to(device_), xla_b = b.to(device_);
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  auto overlapping = [](const at::Tensor& t) { return t.as_strided({1, 2, 3, 3}, {12, 6, 2, 1}); };
  const at::Tensor want = at::conv2d(overlapping(base), w, b, 1, 1);
  const at::Tensor got = at::conv2d(overlapping(xla_base), xla_w, xla_b, 1, 1);
  EXPECT_EQ(metrics().fallback_calls(), 0);
  EXPECT_TRUE(close(got, want, kSum));

  const at::Tensor x = overlapping(base).contiguous();
  const at::Tensor host = at::convolution_overrideable(x, w, b, {1, 1}, {1, 1}, {1, 1}, false, {0, 0}, 1);
  EXPECT_TRUE(at::allclose(host, at::convolution(x, w, b, {1, 1}, {1, 1}, {1, 1}, false, {0, 0}, 1)));
  const at::Tensor gy = torch::randn(host.sizes());
  auto [gx, gw, gb] = at::convolution_backward_overrideable(gy, x, w, {1, 1}, {1, 1}, {1, 1}, false, {0, 0}, 1,
                                                            {true, true, true});
  auto [ex, ew, eb] = at::convolution_backward(gy, x, w, at::IntArrayRef{3}, {1, 1}, {1, 1}, {1, 1}, false, {0, 0}, 1,
                                               {true, true, true});
  EXPECT_TRUE(at::allclose(gx, ex) && at::allclose(gw, ew) && at::allclose(gb, eb));
  strata::xla::mark_step();
}

// conv2d -> relu -> max_pool2d -> linear, SGD: as the CPU, one program a step.
struct ConvNet : torch::nn::Module {
  ConvNet() {
    conv = register_module("conv", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 4, 3).padding(1)));
    fc = register_module("fc", torch::nn::Linear(4 * 4 * 4, 3));
  }
  at::Tensor forward(const at::Tensor& x) {
    const at::Tensor h = torch::max_pool2d(torch::relu(conv->forward(x)), 2);
    return fc->forward(h.flatten(1));
  }
  torch::nn::Conv2d conv{nullptr};
  torch::nn::Linear fc{nullptr};
};

TEST_F(XlaConvPoolTest, ASmallConvNetTrainsLikeTheCpuInOneProgramAStep) {
  constexpr int kSteps = 6;
  torch::manual_seed(21);
  auto cpu_model = std::make_shared<ConvNet>();
  auto xla_model = std::make_shared<ConvNet>();
  {
    torch::NoGradGuard no_grad;
    auto from = cpu_model->parameters();
    auto to = xla_model->parameters();
    for (size_t i = 0; i < from.size(); ++i) to[i].copy_(from[i]);
  }
  xla_model->to(device_);
  std::vector<at::Tensor> xs, ys;
  for (int step = 0; step < kSteps; ++step) {
    xs.push_back(torch::randn({8, 1, 8, 8}));
    ys.push_back(torch::randint(0, 3, {8}, torch::kLong));
  }
  torch::optim::SGD cpu_opt(cpu_model->parameters(), torch::optim::SGDOptions(0.1));
  torch::optim::SGD xla_opt(xla_model->parameters(), torch::optim::SGDOptions(0.1));
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  int64_t compiles_after_step_2 = -1;
  for (int step = 0; step < kSteps; ++step) {
    cpu_opt.zero_grad();
    at::Tensor cpu_loss = F::cross_entropy(cpu_model->forward(xs[step]), ys[step]);
    cpu_loss.backward();
    cpu_opt.step();

    xla_opt.zero_grad();
    at::Tensor xla_loss = F::cross_entropy(xla_model->forward(xs[step].to(device_)), ys[step].to(device_));
    xla_loss.backward();
    xla_opt.step();
    strata::xla::mark_step();
    const double got = xla_loss.item<double>(), want = cpu_loss.item<double>();
    std::printf("step %d loss: xla %.9g cpu %.9g\n", step, got, want);
    EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::abs(want))) << "step " << step;
    if (step == 2) compiles_after_step_2 = metrics().compiles;
  }
  expect_parameters_close(*xla_model, *cpu_model, 1e-5);
  const auto m = metrics();
  EXPECT_EQ(m.fallback_calls(), 0) << "forward, backward and SGD are all lowered";
  expect_no_fallback();
  EXPECT_EQ(m.executions, kSteps) << "one program a step; the loss's .item() after it runs nothing";
  EXPECT_EQ(m.compiles, compiles_after_step_2) << "no compile after step 2";
  EXPECT_EQ(m.lowered.at("aten::convolution_overrideable"), kSteps);
  EXPECT_EQ(m.lowered.at("aten::max_pool2d_with_indices_backward"), kSteps);
}

}  // namespace
}  // namespace strata::testing

namespace strata::testing {
namespace {

// A ViT's patch embedding: the gradient reaching the convolution is a
// slice (the cat with the class token) of a transposed gradient viewed
// again, whose strides do not nest (Note [Any strided view]); and
// MultiheadAttention's torch::equal(query, key) on one tensor, which needs
// no program (Note [equal on the device]).
TEST_F(XlaConvPoolTest, APatchEmbeddingBehindACatTrainsWithoutFallbackAndEqualOfATensorWithItselfRunsNothing) {
  torch::manual_seed(3);
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  const at::Tensor image = torch::randn({2, 3, 8, 8}), weight = torch::randn({16, 3, 4, 4});
  const at::Tensor cls = torch::randn({2, 1, 16}), probe = torch::randn({2, 5, 16});
  auto run = [&](c10::Device device) {
    at::Tensor w = weight.detach().to(device).requires_grad_();
    at::Tensor patches = at::conv2d(image.to(device), w, {}, 4).flatten(2).transpose(1, 2);
    at::Tensor tokens = at::cat({cls.to(device), patches}, 1);
    (tokens * probe.to(device)).sum().backward();
    return w.grad().cpu();
  };
  const at::Tensor want = run(c10::kCPU), got = run(device_);
  expect_no_fallback();
  EXPECT_TRUE(at::allclose(got, want, 1e-5, 1e-5)) << (got - want).abs().max();

  const at::Tensor h = torch::randn({3, 4}).to(device_) * 2;
  const int64_t executions = metrics().executions;
  EXPECT_TRUE(at::equal(h, h));
  EXPECT_EQ(metrics().executions, executions) << "equal of a tensor with itself ran the step";
  EXPECT_FALSE(at::equal(h, h + 1));
  EXPECT_TRUE(at::equal(h, h.clone()));
  EXPECT_FALSE(at::equal(h, h.t().contiguous().t().narrow(0, 0, 2)));
  expect_no_fallback();
}

}  // namespace
}  // namespace strata::testing
