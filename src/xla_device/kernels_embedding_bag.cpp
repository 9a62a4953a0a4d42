// nn::EmbeddingBag on the xla device: `_embedding_bag` and the backwards
// its derivative formula reaches (`_embedding_bag_backward`, dense, and
// `_embedding_bag_per_sample_weights_backward`), computed from ATen ops
// that are lowered.
//
// Note [Bags as segment sums]
// A bag's offsets decide which rows it reduces, so the bags are segments
// of the indices: position i belongs to bag offset2bag[i], the number of
// the bags' offsets at or before i, less one (an offset past the last
// index starts an empty bag; with include_last_offset the last offset
// only ends the last bag: LibTorch expects it to be the number of
// indices, and its CPU kernel's modes disagree on indices after it). The
// rows of `weight` at the indices (times the per-sample
// weights) are then added per bag (index_add, a scatter-add on XLA), or
// reduced by their largest (scatter_reduce "amax"); a padding_idx row is
// left out, and counts for nothing in a bag's size (mean) or maximum.
// An empty bag is 0. The max mode's indices are the word of each bag's
// first largest element, as the CPU's loop keeps the first.
//
// The auxiliary outputs are LibTorch's (bag sizes for mean and max, the
// max indices), except that offset2bag is always filled: the CPU leaves
// it empty on its summing fast path, and the backward then rebuilds it.
// The backwards use it: a row's gradient is its bag's gradient (divided
// by the bag's size for mean, times its per-sample weight), added at its
// index; for max, each bag's gradient goes to its max index, element by
// element. Sums are ordered by XLA's scatter, not the CPU's loop: equal
// to a rounding of the sum.
//
// Lowered: f32 weights, int64 or int32 indices (at least one) and
// offsets, 1-d; sparse gradients and scale_grad_by_freq take the CPU
// fallback.
#include <ATen/ops/_embedding_bag.h>
#include <ATen/ops/_embedding_bag_backward.h>
#include <ATen/ops/_embedding_bag_dense_backward.h>
#include <ATen/ops/_embedding_bag_per_sample_weights_backward.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

constexpr int64_t kSum = 0, kMean = 1, kMax = 2;

bool on_device(const at::Tensor& t) { return t.defined() && t.device().type() == kXla; }
bool index_type(const at::Tensor& t) {
  return on_device(t) && t.dim() == 1 && (t.scalar_type() == at::kLong || t.scalar_type() == at::kInt);
}
bool given(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

// Note [Bags as segment sums]: the bag of each index position.
at::Tensor bag_of_each_index(const at::Tensor& offsets, int64_t num_indices, int64_t num_bags) {
  const at::Tensor starts = offsets.narrow(0, 0, num_bags).to(at::kLong);
  at::Tensor marks = at::zeros({num_indices + 1}, starts.options());
  marks.index_add_(0, starts, at::ones_like(starts));
  return marks.cumsum(0).narrow(0, 0, num_indices) - 1;
}

// 1 where an index is not padding_idx (every index where there is none).
at::Tensor kept(const at::Tensor& indices, int64_t padding_idx) {
  return padding_idx < 0 ? at::ones_like(indices, at::kBool) : indices != padding_idx;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> embedding_bag(
    const at::Tensor& weight, const at::Tensor& indices, const at::Tensor& offsets, bool scale_grad_by_freq,
    int64_t mode, bool sparse, const std::optional<at::Tensor>& per_sample_weights, bool include_last_offset,
    int64_t padding_idx) {
  const bool weighted = given(per_sample_weights);
  const bool lowered = on_device(weight) && weight.scalar_type() == at::kFloat && weight.dim() == 2 &&
                       index_type(indices) && indices.size(0) > 0 && index_type(offsets) && offsets.scalar_type() == indices.scalar_type() &&
                       mode >= kSum && mode <= kMax && !sparse && offsets.size(0) >= (include_last_offset ? 1 : 0) &&
                       (!weighted || (mode == kSum && on_device(*per_sample_weights) &&
                                      per_sample_weights->sizes() == indices.sizes() &&
                                      per_sample_weights->scalar_type() == at::kFloat));
  if (!lowered) {
    return at::native::call_fallback_fn<&cpu_fallback, at::_ops::_embedding_bag>::call(
        weight, indices, offsets, scale_grad_by_freq, mode, sparse, per_sample_weights, include_last_offset,
        padding_idx);
  }
  const int64_t n = indices.size(0), dim = weight.size(1);
  const int64_t bags = offsets.size(0) - (include_last_offset ? 1 : 0);
  const at::ScalarType index_dtype = indices.scalar_type();
  const at::Tensor bag = bag_of_each_index(offsets, n, bags);
  const at::Tensor keep = kept(indices, padding_idx);
  at::Tensor rows = weight.index_select(0, indices);
  if (weighted) rows = rows * per_sample_weights->unsqueeze(1);
  const at::Tensor size = at::zeros({bags}, bag.options()).index_add_(0, bag, keep.to(at::kLong));
  at::Tensor output, max_indices;
  if (mode == kMax) {
    const at::Tensor at_bag = bag.unsqueeze(1).expand({n, dim});
    const at::Tensor keep_rows = keep.unsqueeze(1).expand({n, dim});
    const at::Tensor candidates = at::where(keep_rows, rows, -INFINITY);
    const at::Tensor largest = at::full({bags, dim}, -INFINITY, rows.options())
                                   .scatter_reduce(0, at_bag, candidates, "amax", /*include_self=*/true);
    const at::Tensor nonempty = (size > 0).unsqueeze(1);
    output = at::where(nonempty, largest, 0.0);
    // The first position holding its bag's largest value, per element.
    const at::Tensor position = at::arange(n, bag.options()).unsqueeze(1).expand({n, dim});
    const at::Tensor is_max = keep_rows & (candidates == largest.index_select(0, bag));
    const at::Tensor first = at::full({bags, dim}, n, bag.options())
                                 .scatter_reduce(0, at_bag, at::where(is_max, position, n), "amin", true);
    const at::Tensor word = indices.to(at::kLong).index_select(0, first.clamp_max(n - 1).flatten()).view({bags, dim});
    max_indices = at::where(nonempty, word, 0).to(index_dtype);
  } else {
    const at::Tensor summed =
        at::zeros({bags, dim}, rows.options()).index_add_(0, bag, at::where(keep.unsqueeze(1), rows, 0.0));
    output = mode == kSum ? summed : at::where((size > 0).unsqueeze(1), summed / size.unsqueeze(1), 0.0);
    max_indices = mode == kSum ? at::zeros({bags}, bag.options().dtype(index_dtype)) : size.to(index_dtype);
  }
  const at::Tensor bag_size = mode == kSum ? at::zeros({bags}, size.options().dtype(index_dtype)) : size.to(index_dtype);
  return {output, bag.to(index_dtype), bag_size, max_indices};
}

// Note [Bags as segment sums]: each row's gradient, added at its index.
at::Tensor embedding_bag_dense_backward(const at::Tensor& grad, const at::Tensor& indices,
                                        const at::Tensor& offset2bag, const at::Tensor& bag_size,
                                        const at::Tensor& maximum_indices, int64_t num_weights,
                                        bool scale_grad_by_freq, int64_t mode,
                                        const std::optional<at::Tensor>& per_sample_weights, int64_t padding_idx) {
  const bool lowered = on_device(grad) && grad.scalar_type() == at::kFloat && grad.dim() == 2 && index_type(indices) &&
                       index_type(offset2bag) && offset2bag.size(0) == indices.size(0) && on_device(bag_size) &&
                       on_device(maximum_indices) && !scale_grad_by_freq && mode >= kSum && mode <= kMax &&
                       (!given(per_sample_weights) || on_device(*per_sample_weights));
  if (!lowered) {
    return at::native::call_fallback_fn<&cpu_fallback, at::_ops::_embedding_bag_dense_backward>::call(
        grad, indices, offset2bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq, mode,
        per_sample_weights, padding_idx);
  }
  const int64_t dim = grad.size(1);
  at::Tensor result = at::zeros({num_weights, dim}, grad.options());
  if (mode == kMax) {
    const at::Tensor nonempty = (bag_size > 0).unsqueeze(1);
    return result.scatter_add(0, maximum_indices.to(at::kLong), at::where(nonempty, grad, 0.0));
  }
  const at::Tensor bag = offset2bag.to(at::kLong);
  at::Tensor rows = grad.index_select(0, bag);
  if (mode == kMean) rows = rows / bag_size.to(at::kLong).index_select(0, bag).clamp_min(1).unsqueeze(1);
  if (given(per_sample_weights)) rows = rows * per_sample_weights->unsqueeze(1);
  rows = at::where(kept(indices, padding_idx).unsqueeze(1), rows, 0.0);
  return result.index_add_(0, indices.to(at::kLong), rows);
}

// The weight's gradient as LibTorch's _embedding_bag_backward gives it:
// dense through the kernel above, sparse through the CPU fallback.
at::Tensor embedding_bag_backward(const at::Tensor& grad, const at::Tensor& indices, const at::Tensor& offsets,
                                  const at::Tensor& offset2bag, const at::Tensor& bag_size,
                                  const at::Tensor& maximum_indices, int64_t num_weights, bool scale_grad_by_freq,
                                  int64_t mode, bool sparse, const std::optional<at::Tensor>& per_sample_weights,
                                  int64_t padding_idx) {
  if (!sparse && offset2bag.numel() == indices.numel()) {
    return at::_embedding_bag_dense_backward(grad, indices, offset2bag, bag_size, maximum_indices, num_weights,
                                             scale_grad_by_freq, mode, per_sample_weights, padding_idx);
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::_embedding_bag_backward>::call(
      grad, indices, offsets, offset2bag, bag_size, maximum_indices, num_weights, scale_grad_by_freq, mode, sparse,
      per_sample_weights, padding_idx);
}

// The gradient of each per-sample weight: its row of `weight` dotted
// with its bag's gradient (0 at padding_idx).
at::Tensor embedding_bag_per_sample_weights_backward(const at::Tensor& grad, const at::Tensor& weight,
                                                     const at::Tensor& indices, const at::Tensor& offsets,
                                                     const at::Tensor& offset2bag, int64_t mode,
                                                     int64_t padding_idx) {
  const bool lowered = on_device(grad) && grad.scalar_type() == at::kFloat && grad.dim() == 2 && on_device(weight) &&
                       weight.scalar_type() == at::kFloat && index_type(indices) && index_type(offset2bag) &&
                       offset2bag.size(0) == indices.size(0) && mode == kSum;
  if (!lowered) {
    return at::native::call_fallback_fn<&cpu_fallback, at::_ops::_embedding_bag_per_sample_weights_backward>::call(
        grad, weight, indices, offsets, offset2bag, mode, padding_idx);
  }
  const at::Tensor dots =
      (grad.index_select(0, offset2bag.to(at::kLong)) * weight.index_select(0, indices.to(at::kLong))).sum(1);
  return at::where(kept(indices, padding_idx), dots, 0.0);
}

}  // namespace

void register_embedding_bag(torch::Library& library) {
  library.impl("_embedding_bag", TORCH_FN(embedding_bag));
  library.impl("_embedding_bag_backward", TORCH_FN(embedding_bag_backward));
  library.impl("_embedding_bag_dense_backward", TORCH_FN(embedding_bag_dense_backward));
  library.impl("_embedding_bag_per_sample_weights_backward", TORCH_FN(embedding_bag_per_sample_weights_backward));
}

}  // namespace strata::xla::detail::lowering
