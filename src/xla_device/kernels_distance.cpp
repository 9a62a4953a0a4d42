// The pairwise distances on the xla device: `_cdist_forward` (cdist),
// `_pdist_forward` (pdist) and their backwards.
//
// Note [Distances as ATen ops]
// Each kernel computes, from ATen ops on the xla device (all lowered),
// what LibTorch's CPU kernel computes (DistanceOpsKernel.cpp), p by p:
// the terms of |a - b| it sums (ceil clamped to 1 for p = 0, |a - b| for
// p = 1, its square for p = 2, its p-th power otherwise; for p = inf the
// largest) and the finish (the square root, the 1/p-th power). cdist's
// p = 2 takes the matrix-product form where LibTorch's does (compute_mode
// 1, or 0 with more than 25 rows): `_euclidean_dist`. The backwards use
// the CPU kernel's formula per pair, zero where the distance is zero,
// summed over the other set's rows. What is left is the order of the
// sums, within the tolerance of any sum; LibTorch's own two kernels
// disagree on a NaN input under p = inf (cdist's scalar max drops it,
// pdist's vector max keeps it), which this one keeps.
//
// The kernels sit below autograd (PrivateUse1), so LibTorch's derivative
// formulas call the backward kernels here as on the CPU. A dtype other
// than f32, a negative p or a shape LibTorch refuses takes the CPU
// fallback, which raises LibTorch's error where it has one.
#include <ATen/ops/_cdist_backward.h>
#include <ATen/ops/_cdist_forward.h>
#include <ATen/ops/_euclidean_dist.h>
#include <ATen/ops/_pdist_backward.h>
#include <ATen/ops/_pdist_forward.h>
#include <ATen/ops/scatter_add.h>
#include <ATen/ops/triu_indices.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <ATen/ExpandUtils.h>
#include <torch/library.h>

#include <cmath>
#include <optional>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

bool on_device_f32(const at::Tensor& t) {
  return t.defined() && t.device().type() == kXla && t.scalar_type() == at::kFloat;
}

bool valid_p(double p) { return p >= 0 && !std::isnan(p); }

// Note [Distances as ATen ops]: the distance of `d` = |a - b| along its
// last dim.
at::Tensor distance(const at::Tensor& d, double p) {
  if (p == 0) return d.ceil().clamp_max(1).sum(-1);
  if (p == 1) return d.sum(-1);
  if (p == 2) return (d * d).sum(-1).sqrt();
  if (std::isinf(p)) return d.amax(-1);
  return d.pow(p).sum(-1).pow(1.0 / p);
}

// Note [Distances as ATen ops]: the gradient of the distance `dist` of a
// pair by its first member, given `diff` = a - b and the distance's
// gradient `grad` (both broadcast along the last dim).
at::Tensor pair_gradient(const at::Tensor& diff, const at::Tensor& grad, const at::Tensor& dist, double p) {
  if (p == 1) return grad * diff.sign();
  if (p < 2) {
    at::Tensor g = at::where(dist == 0, 0.0, diff.sign() * diff.abs().pow(p - 1) * grad / dist.pow(p - 1));
    return p < 1 ? at::where(diff == 0, 0.0, g) : g;
  }
  if (p == 2) return at::where(dist == 0, 0.0, grad * diff / dist);
  if (std::isinf(p)) return grad * diff.sign() * (1 - (diff.abs() - dist).abs().ceil().clamp_max(1));
  return at::where(dist == 0, 0.0, diff * diff.abs().pow(p - 2) * grad / dist.pow(p - 1));
}

// The batch dims x1 and x2 broadcast to, or nullopt where they do not.
std::optional<std::vector<int64_t>> cdist_batch(const at::Tensor& x1, const at::Tensor& x2) {
  if (x1.dim() < 2 || x2.dim() < 2 || x1.size(-1) != x2.size(-1)) return std::nullopt;
  try {
    return at::infer_size(x1.sizes().slice(0, x1.dim() - 2), x2.sizes().slice(0, x2.dim() - 2));
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

std::vector<int64_t> with_rows(std::vector<int64_t> batch, int64_t rows, int64_t cols) {
  batch.push_back(rows);
  batch.push_back(cols);
  return batch;
}

at::Tensor cdist_forward(const at::Tensor& x1, const at::Tensor& x2, double p, std::optional<int64_t> compute_mode) {
  const int64_t mode = compute_mode.value_or(0);
  const auto batch = cdist_batch(x1, x2);
  if (on_device_f32(x1) && on_device_f32(x2) && valid_p(p) && batch && mode >= 0 && mode <= 2) {
    const int64_t r1 = x1.size(-2), r2 = x2.size(-2), m = x1.size(-1);
    const at::Tensor a = x1.expand(with_rows(*batch, r1, m)), b = x2.expand(with_rows(*batch, r2, m));
    const std::vector<int64_t> shape = with_rows(*batch, r1, r2);
    if (a.numel() == 0 || b.numel() == 0) return at::zeros(shape, x1.options());
    if (p == 2 && (mode == 1 || (mode == 0 && (r1 > 25 || r2 > 25)))) return at::_euclidean_dist(a, b);
    return distance((a.unsqueeze(-2) - b.unsqueeze(-3)).abs(), p);
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::_cdist_forward>::call(x1, x2, p, compute_mode);
}

// The gradient by x1 (expanded to the batch dims), as LibTorch's
// _cdist_backward returns it; autograd sums it back over a broadcast.
at::Tensor cdist_backward(const at::Tensor& grad, const at::Tensor& x1, const at::Tensor& x2, double p,
                          const at::Tensor& cdist) {
  const auto batch = cdist_batch(x1, x2);
  if (on_device_f32(grad) && on_device_f32(x1) && on_device_f32(x2) && on_device_f32(cdist) && valid_p(p) && batch) {
    const int64_t r1 = x1.size(-2), r2 = x2.size(-2), m = x1.size(-1);
    const at::Tensor a = x1.expand(with_rows(*batch, r1, m)), b = x2.expand(with_rows(*batch, r2, m));
    if (a.numel() == 0 || b.numel() == 0 || p == 0) return at::zeros(a.sizes(), x1.options());
    const at::Tensor diff = a.unsqueeze(-2) - b.unsqueeze(-3);  // (batch, r1, r2, m)
    return pair_gradient(diff, grad.unsqueeze(-1), cdist.unsqueeze(-1), p).sum(-2);
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::_cdist_backward>::call(grad, x1, x2, p, cdist);
}

// The rows i < j of each pair, in pdist's order (row-major over the
// upper triangle), on the xla device.
std::pair<at::Tensor, at::Tensor> pairs(const at::Tensor& self) {
  const int64_t n = self.size(0);
  const at::Tensor ij = at::triu_indices(n, n, 1, at::kLong).to(self.device());
  return {ij[0], ij[1]};
}

bool pdist_lowered(const at::Tensor& self, double p) {
  return on_device_f32(self) && valid_p(p) && self.dim() == 2 && self.is_contiguous();
}

at::Tensor pdist_forward(const at::Tensor& self, double p) {
  if (pdist_lowered(self, p)) {
    const int64_t n = self.size(0), m = self.size(1);
    if (n <= 1) return at::zeros({0}, self.options());
    if (m == 0) return at::zeros({n * (n - 1) / 2}, self.options());
    const auto [i, j] = pairs(self);
    return distance((self.index_select(0, i) - self.index_select(0, j)).abs(), p);
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::_pdist_forward>::call(self, p);
}

// Each pair's gradient added to its first row and taken from its second,
// as the CPU kernel does.
at::Tensor pdist_backward(const at::Tensor& grad, const at::Tensor& self, double p, const at::Tensor& pdist) {
  if (pdist_lowered(self, p) && on_device_f32(grad) && on_device_f32(pdist)) {
    const int64_t n = self.size(0), m = self.size(1);
    at::Tensor result = at::zeros({n, m}, self.options());
    if (n <= 1 || m == 0 || p == 0) return result;
    const auto [i, j] = pairs(self);
    const at::Tensor diff = self.index_select(0, i) - self.index_select(0, j);  // (pairs, m)
    const at::Tensor g = pair_gradient(diff, grad.unsqueeze(-1), pdist.unsqueeze(-1), p);
    const at::Tensor rows_i = i.unsqueeze(1).expand({i.size(0), m}), rows_j = j.unsqueeze(1).expand({j.size(0), m});
    return result.scatter_add(0, rows_i, g).scatter_add(0, rows_j, -g);
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::_pdist_backward>::call(grad, self, p, pdist);
}

}  // namespace

void register_distance(torch::Library& library) {
  library.impl("_cdist_forward", TORCH_FN(cdist_forward));
  library.impl("_cdist_backward", TORCH_FN(cdist_backward));
  library.impl("_pdist_forward", TORCH_FN(pdist_forward));
  library.impl("_pdist_backward", TORCH_FN(pdist_backward));
}

}  // namespace strata::xla::detail::lowering
