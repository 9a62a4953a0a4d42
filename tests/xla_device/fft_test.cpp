// The Fourier transforms on the xla device (src/xla_device/kernels_fft.cpp):
// torch::fft's functions and torch::stft, each against LibTorch's CPU
// kernels with its gradient, in f32 and f64, contiguous and transposed,
// and with nothing left to the CPU fallback: complex tensors live on the
// device as their parts (Note [Complex tensors on the xla device] in
// src/xla_device/lazy_buffer.h), so the copies, fills and views that the
// transforms' backwards make are lowered too.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

#include "strata/xla_device/device.h"
#include "xla_device/xla_device_test.h"

namespace strata::testing {
namespace {

using XlaFftTest = XlaDeviceFixture;

struct FftCase {
  std::string what;
  std::vector<int64_t> shape;
  /// A real result of the transform of `x` (complex results as their
  /// parts), on x's device.
  std::function<at::Tensor(const at::Tensor&)> call;
};

// A complex tensor of `x`'s last dim (of size 2) as its parts.
at::Tensor complex_of(const at::Tensor& x) { return at::view_as_complex(x.contiguous()); }

std::vector<FftCase> cases() {
  namespace fft = torch::fft;
  return {
      {"rfft over the last dim", {3, 8}, [](const at::Tensor& x) { return at::view_as_real(fft::rfft(x)); }},
      {"rfft of odd length over dim 0, ortho", {7, 4},
       [](const at::Tensor& x) { return at::view_as_real(fft::rfft(x, std::nullopt, 0, "ortho")); }},
      {"rfft2, forward", {2, 4, 6},
       [](const at::Tensor& x) { return at::view_as_real(fft::rfft2(x, std::nullopt, {-2, -1}, "forward")); }},
      {"fft of a real tensor (both sides)", {3, 5}, [](const at::Tensor& x) { return at::view_as_real(fft::fft(x)); }},
      {"fftn over dims 1 and 2, real part", {2, 4, 6},
       [](const at::Tensor& x) { return at::real(fft::fftn(x, std::nullopt, std::vector<int64_t>{1, 2})); }},
      {"rfftn over four dims, two passes", {2, 3, 2, 3, 4},
       [](const at::Tensor& x) {
         return at::view_as_real(fft::rfftn(x, std::nullopt, std::vector<int64_t>{0, 1, 2, 4}));
       }},
      {"ifft of a complex tensor", {3, 6, 2},
       [](const at::Tensor& x) { return at::view_as_real(fft::ifft(complex_of(x))); }},
      {"fft2 of a complex tensor, ortho", {4, 3, 2},
       [](const at::Tensor& x) { return at::view_as_real(fft::fft2(complex_of(x), std::nullopt, {0, 1}, "ortho")); }},
      {"irfft to 9 points", {2, 5, 2}, [](const at::Tensor& x) { return fft::irfft(complex_of(x), 9); }},
      {"irfft2, backward", {3, 4, 2},
       [](const at::Tensor& x) { return fft::irfft2(complex_of(x), std::vector<int64_t>{3, 6}); }},
      {"stft's power spectrum", {2, 32},
       [](const at::Tensor& x) {
         const at::Tensor window = torch::hann_window(8, x.options().requires_grad(false));
         const at::Tensor s = torch::stft(x, 8, 2, 8, window, /*center=*/true, "reflect", /*normalized=*/false,
                                          /*onesided=*/true, /*return_complex=*/true);
         return at::view_as_real(s).pow(2).sum(-1);
       }},
  };
}

// Each case's result and gradient on xla and on the CPU, in `dtype`, its
// input contiguous or transposed (the last two dims swapped and back).
void expect_case(const FftCase& c, c10::Device device, at::ScalarType dtype, bool transposed) {
  SCOPED_TRACE(c.what + (transposed ? ", transposed" : "") + ", " + c10::toString(dtype));
  at::Tensor x = at::randn(c.shape, at::kDouble).to(dtype);
  auto lay = [&](const at::Tensor& t) { return transposed ? t.transpose(0, 1).contiguous().transpose(0, 1) : t; };
  at::Tensor cpu = lay(x).requires_grad_(), xla = lay(x.to(device)).detach().requires_grad_();
  const at::Tensor want = c.call(cpu), got = c.call(xla);
  const at::Tensor weight = at::randn(want.sizes(), at::kDouble).to(dtype);
  (want * weight).sum().backward();
  (got * weight.to(device)).sum().backward();
  strata::xla::mark_step();
  const double tol = dtype == at::kDouble ? 1e-12 : 2e-5;
  auto close = [&](const at::Tensor& a, const at::Tensor& b) {
    const double scale = std::max(1.0, b.abs().max().item<double>());
    return (a.cpu() - b).abs().max().item<double>() <= tol * scale;
  };
  ASSERT_EQ(got.sizes(), want.sizes());
  EXPECT_TRUE(close(got, want)) << "result\n" << got.cpu() << "\n" << want;
  EXPECT_TRUE(close(xla.grad(), cpu.grad())) << "gradient\n" << xla.grad().cpu() << "\n" << cpu.grad();
}

TEST_F(XlaFftTest, TransformsAndTheirGradientsAreTheCpusWithNoFallback) {
  strata::xla::mark_step();
  strata::xla::reset_metrics();
  for (const FftCase& c : cases()) {
    for (at::ScalarType dtype : {at::kFloat, at::kDouble}) {
      expect_case(c, device_, dtype, /*transposed=*/false);
      if (c.shape.size() >= 2) expect_case(c, device_, dtype, /*transposed=*/true);
    }
  }
  const strata::xla::Metrics m = strata::xla::metrics();
  std::string fallbacks;
  for (const auto& [op, n] : m.fallbacks) fallbacks += op + " x" + std::to_string(n) + " ";
  EXPECT_EQ(fallbacks, "");
  for (const char* op : {"aten::_fft_r2c.out", "aten::_fft_c2r.out", "aten::_fft_c2c.out"})
    EXPECT_GT(m.lowered.count(op) ? m.lowered.at(op) : 0, 0) << op;
}

TEST_F(XlaFftTest, ComplexTensorsRoundTripAndTheirViewsReadAsTheCpus) {
  const at::Tensor z = at::complex(at::randn({3, 4}), at::randn({3, 4}));
  const at::Tensor on_device = z.to(device_);
  EXPECT_EQ(on_device.scalar_type(), at::kComplexFloat);
  EXPECT_TRUE(at::equal(on_device.cpu(), z));
  EXPECT_TRUE(at::equal(at::real(on_device).cpu(), at::real(z)));
  EXPECT_TRUE(at::equal(at::imag(on_device.t()).cpu(), at::imag(z.t())));
  at::Tensor filled = at::empty({2, 3}, on_device.options());
  filled.fill_(c10::complex<double>(1.5, -2.0));
  EXPECT_TRUE(at::equal(filled.cpu(), at::full({2, 3}, c10::complex<double>(1.5, -2.0), at::kComplexFloat)));
  at::Tensor promoted = at::randn({5}).to(device_).to(at::kComplexDouble);
  EXPECT_EQ(promoted.scalar_type(), at::kComplexDouble);
  EXPECT_TRUE(at::equal(at::imag(promoted).cpu(), at::zeros({5}, at::kDouble)));
}

}  // namespace
}  // namespace strata::testing
