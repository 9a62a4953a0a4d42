// F::grid_sample on the xla device: `grid_sampler_2d` and its backward,
// computed from ATen ops that are lowered.
//
// Note [Sampling as gathers]
// Each output pixel reads the input at the grid's coordinates, mapped from
// [-1, 1] to pixels as LibTorch's CPU kernel maps them ((g + 1) * size/2
// - 1/2, or (g + 1) * (size - 1)/2 with align_corners) and, for "border",
// clipped to the image. Bilinear interpolation reads the four pixels
// around that point (one gather of the flattened image each; a pixel
// outside the image reads 0) and weighs each by the point's distances to
// the opposite sides, summed in the CPU's order (nw, ne, sw, se); nearest
// reads the pixel at the coordinates rounded half to even. The backward
// is the CPU's formula: the input's gradient scatters each output
// gradient to the pixels it read, times their weights; the grid's is,
// per point, the sum over channels of the gradient times the difference
// of the pixel values across each axis, times the map's derivative (0 on
// a clipped side). Sums are ordered by XLA: equal to their rounding.
//
// Lowered: f32, bilinear and nearest, "zeros" and "border" padding.
// Bicubic interpolation and "reflection" padding take the CPU fallback.
#include <ATen/ops/grid_sampler_2d.h>
#include <ATen/ops/grid_sampler_2d_backward.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/stack.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <array>
#include <tuple>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

constexpr int64_t kBilinear = 0, kNearest = 1, kZeros = 0, kBorder = 1;

bool lowered(const at::Tensor& input, const at::Tensor& grid, int64_t interpolation, int64_t padding) {
  auto f32 = [](const at::Tensor& t) {
    return t.defined() && t.device().type() == kXla && t.scalar_type() == at::kFloat && t.dim() == 4;
  };
  return f32(input) && f32(grid) && grid.size(0) == input.size(0) && grid.size(3) == 2 &&
         (interpolation == kBilinear || interpolation == kNearest) && (padding == kZeros || padding == kBorder) &&
         input.numel() > 0 && grid.numel() > 0;
}

// One axis of the grid mapped to pixels (Note [Sampling as gathers]), and
// d pixel / d grid.
struct Axis {
  at::Tensor at, derivative;
};

Axis axis_of(const at::Tensor& g, int64_t size, int64_t padding, bool align_corners) {
  const double scale = align_corners ? (size - 1) / 2.0 : size / 2.0;
  at::Tensor at = align_corners ? (g + 1) * scale : (g + 1) * scale - 0.5;
  if (padding != kBorder) return {at, at::full_like(at, scale)};
  const double last = static_cast<double>(size - 1);
  const at::Tensor inside = (at > 0) & (at < last);
  return {at.clamp(0.0, last), at::where(inside, scale, 0.0)};
}

// The pixels of `flat` (n, c, h*w) at integer coordinates (n, ho, wo),
// (n, c, ho, wo), 0 outside the image; with the flat index and the mask,
// for the backward's scatter.
struct Read {
  at::Tensor values, index, inside;
};

Read read(const at::Tensor& flat, const at::Tensor& x, const at::Tensor& y, int64_t h, int64_t w) {
  const int64_t n = flat.size(0), c = flat.size(1), points = x.size(1) * x.size(2);
  const at::Tensor inside = (x >= 0) & (x < w) & (y >= 0) & (y < h);
  const at::Tensor index = (y.clamp(0, h - 1) * w + x.clamp(0, w - 1)).view({n, 1, points}).expand({n, c, points});
  const at::Tensor mask = inside.unsqueeze(1);
  const at::Tensor values = at::where(mask, flat.gather(2, index).view({n, c, x.size(1), x.size(2)}), 0.0);
  return {values, index, mask};
}

// The four corners around (x, y) and their weights (Note [Sampling as
// gathers]), in the CPU's order: nw, ne, sw, se.
struct Corners {
  std::array<Read, 4> reads;
  std::array<at::Tensor, 4> weights;  // (n, 1, ho, wo)
  at::Tensor west, north;             // x - floor(x), y - floor(y)
};

Corners corners(const at::Tensor& flat, const Axis& x, const Axis& y, int64_t h, int64_t w) {
  const at::Tensor x0f = x.at.floor(), y0f = y.at.floor();
  const at::Tensor x0 = x0f.to(at::kLong), y0 = y0f.to(at::kLong);
  Corners k;
  k.west = x.at - x0f;
  k.north = y.at - y0f;
  const at::Tensor e = k.west.neg().add(1), s = k.north.neg().add(1);
  k.reads = {read(flat, x0, y0, h, w), read(flat, x0 + 1, y0, h, w), read(flat, x0, y0 + 1, h, w),
             read(flat, x0 + 1, y0 + 1, h, w)};
  k.weights = {(s * e).unsqueeze(1), (s * k.west).unsqueeze(1), (k.north * e).unsqueeze(1),
               (k.north * k.west).unsqueeze(1)};
  return k;
}

at::Tensor grid_sampler_2d(const at::Tensor& input, const at::Tensor& grid, int64_t interpolation, int64_t padding,
                           bool align_corners) {
  if (!lowered(input, grid, interpolation, padding)) {
    return at::native::call_fallback_fn<&cpu_fallback, at::_ops::grid_sampler_2d>::call(input, grid, interpolation,
                                                                                       padding, align_corners);
  }
  const int64_t h = input.size(2), w = input.size(3);
  const at::Tensor flat = input.reshape({input.size(0), input.size(1), h * w});
  const Axis x = axis_of(grid.select(3, 0), w, padding, align_corners);
  const Axis y = axis_of(grid.select(3, 1), h, padding, align_corners);
  if (interpolation == kNearest) return read(flat, x.at.round().to(at::kLong), y.at.round().to(at::kLong), h, w).values;
  const Corners k = corners(flat, x, y, h, w);
  return k.reads[0].values * k.weights[0] + k.reads[1].values * k.weights[1] + k.reads[2].values * k.weights[2] +
         k.reads[3].values * k.weights[3];
}

std::tuple<at::Tensor, at::Tensor> grid_sampler_2d_backward(const at::Tensor& grad_output, const at::Tensor& input,
                                                            const at::Tensor& grid, int64_t interpolation,
                                                            int64_t padding, bool align_corners,
                                                            std::array<bool, 2> output_mask) {
  if (!lowered(input, grid, interpolation, padding) || grad_output.scalar_type() != at::kFloat) {
    return at::native::call_fallback_fn<&cpu_fallback, at::_ops::grid_sampler_2d_backward>::call(
        grad_output, input, grid, interpolation, padding, align_corners, output_mask);
  }
  const int64_t n = input.size(0), c = input.size(1), h = input.size(2), w = input.size(3);
  const int64_t points = grid.size(1) * grid.size(2);
  const at::Tensor flat = input.reshape({n, c, h * w});
  const Axis x = axis_of(grid.select(3, 0), w, padding, align_corners);
  const Axis y = axis_of(grid.select(3, 1), h, padding, align_corners);
  at::Tensor grad_input, grad_grid = at::zeros_like(grid);
  auto scatter = [&](const Read& r, const at::Tensor& g) {
    grad_input = grad_input.scatter_add(2, r.index, at::where(r.inside, g, 0.0).reshape({n, c, points}));
  };
  if (output_mask[0]) grad_input = at::zeros({n, c, h * w}, input.options());
  if (interpolation == kNearest) {
    if (output_mask[0]) scatter(read(flat, x.at.round().to(at::kLong), y.at.round().to(at::kLong), h, w), grad_output);
  } else {
    const Corners k = corners(flat, x, y, h, w);
    if (output_mask[0]) {
      for (size_t i = 0; i < 4; ++i) scatter(k.reads[i], grad_output * k.weights[i]);
    }
    if (output_mask[1]) {
      const at::Tensor e = k.west.neg().add(1).unsqueeze(1), s = k.north.neg().add(1).unsqueeze(1);
      const at::Tensor west = k.west.unsqueeze(1), north = k.north.unsqueeze(1);
      const std::array<at::Tensor, 4> v{k.reads[0].values, k.reads[1].values, k.reads[2].values, k.reads[3].values};
      const at::Tensor gx = (((v[1] - v[0]) * s + (v[3] - v[2]) * north) * grad_output).sum(1);
      const at::Tensor gy = (((v[2] - v[0]) * e + (v[3] - v[1]) * west) * grad_output).sum(1);
      grad_grid = at::stack({gx * x.derivative, gy * y.derivative}, 3);
    }
  }
  if (output_mask[0]) grad_input = grad_input.view({n, c, h, w});
  return {grad_input, grad_grid};
}

}  // namespace

void register_grid_sampler(torch::Library& library) {
  library.impl("grid_sampler_2d", TORCH_FN(grid_sampler_2d));
  library.impl("grid_sampler_2d_backward", TORCH_FN(grid_sampler_2d_backward));
}

}  // namespace strata::xla::detail::lowering
