// Lowered kernels of the shape and indexing ops the example GPT reaches:
// batched matrix products, cat, triu and tril, arange, linspace, masked_fill_,
// index_select (embedding lookups), its backward index_add, and
// embedding_dense_backward (Note [What is lowered] in lowerings.cpp).
#include <ATen/ExpandUtils.h>  // at::infer_size (not reached through ops/ in every LibTorch)
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/embedding_dense_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/index_add.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/linspace.h>
#include <ATen/ops/masked_fill.h>
#include <ATen/ops/tril.h>
#include <ATen/ops/triu.h>
#include <ATen/ops/arange.h>

#include <cmath>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

at::Tensor& bmm_out(const at::Tensor& self, const at::Tensor& mat2, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::bmm(meta(self), meta(mat2)); }, &out);
    NodePtr a = r.convert(r.tensor(self), res.dtype), b = r.convert(r.tensor(mat2), res.dtype);
    r.write(out, r.op("dot", {a, b}, {res.dtype, res.dims}, [](shlo::Function& f, const std::vector<shlo::Value>& in) {
      return f.dot_general(in[0], in[1], shlo::DotDims{{0}, {0}, {2}, {1}});
    }));
  };
  STRATA_LOWER("aten::bmm.out", bmm_out, self, mat2, out);
}

at::Tensor& cat_out(const at::ITensorListRef& tensors, int64_t dim, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    std::vector<at::Tensor> list(tensors.begin(), tensors.end());
    std::vector<at::Tensor> metas;
    for (const auto& t : list) metas.push_back(meta(t));
    const Result res = result_of([&] { return at::cat(metas, dim); }, &out);
    if (res.dims.empty()) throw NotLowered{};
    const int64_t d = c10::maybe_wrap_dim(dim, static_cast<int64_t>(res.dims.size()));
    std::vector<NodePtr> parts;
    for (const auto& t : list) {
      if (t.dim() == 1 && t.size(0) == 0) continue;  // LibTorch's legacy empty tensors join nothing
      if (t.numel() == 0) continue;
      parts.push_back(r.convert(r.tensor(t), res.dtype));
    }
    if (parts.empty()) throw NotLowered{};
    if (parts.size() == 1) {
      r.write(out, parts[0]);
      return;
    }
    r.write(out, r.op("concatenate", parts, {res.dtype, res.dims}, lazy::Attributes{}.add(d),
                      [d](shlo::Function& f, const std::vector<shlo::Value>& in) {
                        return f.concatenate(in, d);
                      }));
  };
  STRATA_LOWER("aten::cat.out", cat_out, tensors, dim, out);
}

// self where column - row >= diagonal (triu) or <= diagonal (tril), else
// 0 (over the last two dims).
void lower_triangle(Recorder& r, const Result& res, const at::Tensor& self, int64_t diagonal, bool upper,
                    const at::Tensor& out) {
  if (res.dims.size() < 2) throw NotLowered{};
  const int64_t rank = static_cast<int64_t>(res.dims.size());
  NodePtr rows = r.iota(ElementType::kS64, res.dims, rank - 2), cols = r.iota(ElementType::kS64, res.dims, rank - 1);
  NodePtr shifted = r.binary(Binary::kAdd, rows, r.splat(static_cast<double>(diagonal), ElementType::kS64, res.dims));
  NodePtr keep = r.compare(cols, shifted, upper ? shlo::Direction::kGE : shlo::Direction::kLE);
  NodePtr x = r.convert(r.tensor(self), res.dtype);
  r.write(out, r.select(keep, x, r.convert(r.splat(0.0, ElementType::kS64, res.dims), res.dtype)));
}

at::Tensor& triu_out(const at::Tensor& self, int64_t diagonal, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::triu(meta(self), diagonal); }, &out);
    lower_triangle(r, res, self, diagonal, true, out);
  };
  STRATA_LOWER("aten::triu.out", triu_out, self, diagonal, out);
}

at::Tensor& tril_out(const at::Tensor& self, int64_t diagonal, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::tril(meta(self), diagonal); }, &out);
    lower_triangle(r, res, self, diagonal, false, out);
  };
  STRATA_LOWER("aten::tril.out", tril_out, self, diagonal, out);
}

// start + i * step for i in [0, ceil((end - start) / step)), in out's
// dtype; the bounds set the shape, so they are baked in. Integer bounds
// are an iota in s64 converted once to out's dtype (LibTorch computes
// them exactly in double and rounds once: the same values); other ranges
// are LibTorch's CPU kernel's values, baked as linspace's are (below).
at::Tensor& arange_out(const at::Scalar& start, const at::Scalar& end, const at::Scalar& step, at::Tensor& out) {
  constexpr int64_t kMaxBaked = 1 << 16;
  auto lower = [&](Recorder& r) {
    if (start.isComplex() || end.isComplex() || step.isComplex()) throw NotLowered{};
    const double a = start.toDouble(), b = end.toDouble(), s = step.toDouble();
    if (s == 0 || !std::isfinite(a) || !std::isfinite(b) || !std::isfinite(s)) throw NotLowered{};
    const ElementType t = element_type(out.scalar_type());
    const int64_t n = static_cast<int64_t>(std::ceil((b - a) / s));
    if (n <= 0) throw NotLowered{};
    const std::vector<int64_t> dims = {n};
    if (start.isIntegral(false) && end.isIntegral(false) && step.isIntegral(false)) {
      NodePtr i = r.iota(ElementType::kS64, dims, 0);
      if (s != 1) i = r.binary(Binary::kMultiply, i, r.splat(s, ElementType::kS64, dims));
      if (a != 0) i = r.binary(Binary::kAdd, i, r.splat(a, ElementType::kS64, dims));
      r.write(out, i);
      return;
    }
    if (!is_floating(t) || n > kMaxBaked) throw NotLowered{};
    const at::Tensor values =
        at::arange(start, end, step, at::TensorOptions().dtype(out.scalar_type())).to(at::kDouble).contiguous();
    if (values.numel() != n) throw NotLowered{};
    const std::vector<double> v(values.data_ptr<double>(), values.data_ptr<double>() + n);
    const shlo::Type type{t, dims};
    r.write(out, r.op("constant", {}, type, lazy::Attributes{}.add(v),
                      [type, v](shlo::Function& f, const std::vector<shlo::Value>&) {
                        return f.constant(type, v);
                      }));
  };
  STRATA_LOWER("aten::arange.start_out", arange_start_out, start, end, step, out);
}

// linspace's values depend on its arguments only: LibTorch's CPU kernel
// computes them (its halves from each end, in its rounding) and they are
// baked into the program, as a grid of affine_grid wants them. Longer
// ranges than kMaxBaked take the fallback rather than a large constant.
at::Tensor& linspace_out(const at::Scalar& start, const at::Scalar& end, int64_t steps, at::Tensor& out) {
  constexpr int64_t kMaxBaked = 1 << 16;
  auto lower = [&](Recorder& r) {
    const ElementType t = element_type(out.scalar_type());
    if (steps < 1 || steps > kMaxBaked || start.isComplex() || end.isComplex()) throw NotLowered{};
    const at::Tensor host = at::linspace(start, end, steps, at::TensorOptions().dtype(out.scalar_type()));
    const at::Tensor values = host.to(at::kDouble).contiguous();
    const std::vector<double> v(values.data_ptr<double>(), values.data_ptr<double>() + steps);
    const shlo::Type type{t, {steps}};
    r.write(out, r.op("constant", {}, type, lazy::Attributes{}.add(v),
                      [type, v](shlo::Function& f, const std::vector<shlo::Value>&) {
                        return f.constant(type, v);
                      }));
  };
  STRATA_LOWER("aten::linspace.out", linspace_out, start, end, steps, out);
}

at::Tensor& masked_fill_(at::Tensor& self, const at::Tensor& mask, const at::Scalar& value) {
  try {
    Recorder r("aten::masked_fill_.Scalar");
    if (mask.scalar_type() != at::kBool) throw NotLowered{};
    const ElementType t = element_type(self.scalar_type());
    const std::vector<int64_t> dims = vec(self.sizes());
    if (at::infer_size(self.sizes(), mask.sizes()) != self.sizes()) throw NotLowered{};
    NodePtr m = r.broadcast(r.tensor(mask), dims);
    // An infinite fill (the causal mask's -inf) is structural: baked in.
    const bool infinite = is_floating(t) && value.isFloatingPoint() && std::isinf(value.toDouble());
    NodePtr v = r.broadcast(infinite ? r.constant(value.toDouble(), t) : r.scalar(value, t), dims);
    r.write(self, r.select(m, v, r.tensor(self)));
    return self;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::masked_fill__Scalar>::call(self, mask, value);
}

NodePtr take(Recorder& r, const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  if (index.dim() > 1 || self.dim() == 0) throw NotLowered{};
  if (index.scalar_type() != at::kLong && index.scalar_type() != at::kInt) throw NotLowered{};
  const int64_t d = c10::maybe_wrap_dim(dim, self.dim());
  NodePtr table = r.tensor(self), idx = r.reshape(r.tensor(index), {index.numel()});
  std::vector<int64_t> dims = vec(self.sizes());
  dims[static_cast<size_t>(d)] = index.numel();
  return r.op("take_rows", {table, idx}, {table->type().dtype, dims}, lazy::Attributes{}.add(d),
              [d](shlo::Function& f, const std::vector<shlo::Value>& in) {
                return f.take_rows(in[0], in[1], d);
              });
}

// Out-of-range indices are clamped by XLA, where LibTorch raises: callers
// that need the check must validate on the host.
at::Tensor index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  try {
    Recorder r("aten::index_select");
    NodePtr value = take(r, self, dim, index);
    at::Tensor out = at::empty(value->type().dims, self.options());
    r.write(out, value);
    return out;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::index_select>::call(self, dim, index);
}

at::Tensor& index_select_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    if (out.scalar_type() != self.scalar_type()) throw NotLowered{};
    r.write(out, take(r, self, dim, index));
  };
  STRATA_LOWER("aten::index_select.out", index_select_out, self, dim, index, out);
}

// self with alpha * source's slices added at `index` along `dim`
// (index_select's backward). Repeated indices add up in XLA's order, not
// the CPU loop's, to a rounding of the sum; out-of-range indices are
// dropped by XLA's scatter where LibTorch raises.
at::Tensor& index_add_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& source,
                          const at::Scalar& alpha, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    if (self.dim() == 0 || index.dim() > 1 || out.scalar_type() != self.scalar_type()) throw NotLowered{};
    if (index.scalar_type() != at::kLong && index.scalar_type() != at::kInt) throw NotLowered{};
    if (source.scalar_type() != self.scalar_type() || source.dim() != self.dim()) throw NotLowered{};
    const int64_t d = c10::maybe_wrap_dim(dim, self.dim());
    std::vector<int64_t> rows = vec(self.sizes());
    rows[static_cast<size_t>(d)] = index.numel();
    if (vec(source.sizes()) != rows) throw NotLowered{};
    const ElementType stored = element_type(self.scalar_type());
    const ElementType t = opmath(stored);
    NodePtr idx = r.convert(r.reshape(r.tensor(index), {index.numel()}), ElementType::kS64);
    NodePtr src = r.scaled(alpha, r.convert(r.tensor(source), t));
    NodePtr base = r.convert(r.tensor(self), t);
    r.write(out, r.op("scatter_add_rows", {base, idx, src}, base->type(),
                      lazy::Attributes{}.add(d), [d](shlo::Function& f, const std::vector<shlo::Value>& in) {
                        return f.scatter_add_rows(in[0], in[1], in[2], d);
                      }));
  };
  STRATA_LOWER("aten::index_add.out", index_add_out, self, dim, index, source, alpha, out);
}

// Zeros [num_weights, D] with each row of grad_output added at its index;
// rows at padding_idx add nothing.
at::Tensor embedding_dense_backward(const at::Tensor& grad_output, const at::Tensor& indices, int64_t num_weights,
                                    int64_t padding_idx, bool scale_grad_by_freq) {
  try {
    Recorder r("aten::embedding_dense_backward");
    if (scale_grad_by_freq || grad_output.dim() < 1) throw NotLowered{};
    const ElementType t = element_type(grad_output.scalar_type());
    const int64_t width = grad_output.size(-1), n = indices.numel();
    if (n * width != grad_output.numel()) throw NotLowered{};
    NodePtr idx = r.convert(r.reshape(r.tensor(indices), {n}), ElementType::kS64);
    NodePtr g = r.reshape(r.tensor(grad_output), {n, width});
    if (padding_idx >= 0) {
      NodePtr keep = r.compare(idx, r.splat(static_cast<double>(padding_idx), ElementType::kS64, {n}), shlo::Direction::kNE);
      NodePtr keep2 = r.op("broadcast", {keep}, {ElementType::kPred, {n, width}}, lazy::Attributes{}.add(n).add(width),
                           [n, width](shlo::Function& f, const std::vector<shlo::Value>& in) {
                             return f.broadcast_in_dim(in[0], {n, width}, {0});
                           });
      g = r.select(keep2, g, r.splat(0.0, t, {n, width}));
    }
    NodePtr zeros = r.splat(0.0, t, {num_weights, width});
    NodePtr value = r.op("scatter_add_rows", {zeros, idx, g}, zeros->type(), [](shlo::Function& f, const std::vector<shlo::Value>& in) {
      return f.scatter_add_rows(in[0], in[1], in[2], 0);
    });
    at::Tensor out = at::empty({num_weights, width}, grad_output.options());
    r.write(out, value);
    return out;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::embedding_dense_backward>::call(
      grad_output, indices, num_weights, padding_idx, scale_grad_by_freq);
}

}  // namespace

void register_shape(torch::Library& library) {
  library.impl("bmm.out", TORCH_FN(bmm_out));
  library.impl("index_add.out", TORCH_FN(index_add_out));
  library.impl("linspace.out", TORCH_FN(linspace_out));
  library.impl("cat.out", TORCH_FN(cat_out));
  library.impl("triu.out", TORCH_FN(triu_out));
  library.impl("tril.out", TORCH_FN(tril_out));
  library.impl("arange.start_out", TORCH_FN(arange_out));
  library.impl("masked_fill_.Scalar", TORCH_FN(masked_fill_));
  library.impl("index_select", TORCH_FN(index_select));
  library.impl("index_select.out", TORCH_FN(index_select_out));
  library.impl("embedding_dense_backward", TORCH_FN(embedding_dense_backward));
}

}  // namespace strata::xla::detail::lowering
