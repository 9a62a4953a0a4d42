// Lowered kernels of gather and the scatters along a dim: scatter_add,
// scatter_reduce, scatter with a tensor or a value (Note [What is
// lowered] in lowerings.cpp).
#include <ATen/ops/gather.h>
#include <ATen/ops/scatter.h>
#include <ATen/ops/scatter_add.h>
#include <ATen/ops/scatter_reduce.h>

#include <cmath>
#include <numeric>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

// Note [Gather and scatter along a dim]
// torch.gather and scatter_add address one element per index: the full
// coordinates of each index element are its own position with `dim`
// replaced by the index, a [..., rank] tensor of s64 built from iotas;
// StableHLO's gather (scatter) then takes (adds) single elements at them.
// Out-of-range indices are clamped by gather and dropped by scatter (XLA),
// where LibTorch raises: validate on the host where that matters.
NodePtr coordinates(Recorder& r, const NodePtr& index, int64_t dim) {
  const std::vector<int64_t> dims = index->type().dims;
  const int64_t rank = static_cast<int64_t>(dims.size());
  std::vector<int64_t> one = dims;
  one.push_back(1);
  std::vector<NodePtr> parts;
  for (int64_t d = 0; d < rank; ++d)
    parts.push_back(r.reshape(d == dim ? r.convert(index, ElementType::kS64) : r.iota(ElementType::kS64, dims, d), one));
  return r.concat(parts, rank);
}

at::Tensor& gather_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, bool sparse_grad,
                       at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::gather(meta(self), dim, meta(index), sparse_grad); }, &out);
    if (self.dim() == 0 || index.dim() != self.dim()) throw NotLowered{};
    const int64_t d = c10::maybe_wrap_dim(dim, self.dim()), rank = self.dim();
    NodePtr x = r.tensor(self), at = coordinates(r, r.tensor(index), d);
    shlo::GatherDims g;
    g.collapsed_slice_dims.resize(static_cast<size_t>(rank));
    std::iota(g.collapsed_slice_dims.begin(), g.collapsed_slice_dims.end(), 0);
    g.start_index_map = g.collapsed_slice_dims;
    g.index_vector_dim = rank;
    const std::vector<int64_t> sizes(static_cast<size_t>(rank), 1);
    r.write(out, r.op("gather", {x, at}, {x->type().dtype, res.dims}, attributes_of(g, sizes),
                      [g, sizes](shlo::Function& f, const std::vector<shlo::Value>& in) {
                        return f.gather(in[0], in[1], g, sizes);
                      }));
  };
  STRATA_LOWER("aten::gather.out", gather_out, self, dim, index, sparse_grad, out);
}

// scatter's dimension numbers for one element per index (Note [Gather and
// scatter along a dim]).
shlo::ScatterDims elementwise_scatter(int64_t rank) {
  shlo::ScatterDims s;
  s.inserted_window_dims.resize(static_cast<size_t>(rank));
  std::iota(s.inserted_window_dims.begin(), s.inserted_window_dims.end(), 0);
  s.scatter_dims_to_operand_dims = s.inserted_window_dims;
  s.index_vector_dim = rank;
  return s;
}

// self with src[i...] added at the coordinates of index[i...] (src read
// over index's shape).
// self with src[i...] combined by `kind` into the coordinates of index[i...]
// (scatter_add, scatter_reduce with include_self): one XLA scatter whose
// combiner is the reduction; the result's shape and dtype come from
// `on_meta`.
template <class Meta>
void scatter_combined(Recorder& r, Meta&& on_meta, const at::Tensor& self, int64_t dim, const at::Tensor& index,
                      const at::Tensor& src, shlo::ReduceOp kind, at::Tensor& out) {
  const Result res = result_of(std::forward<Meta>(on_meta), &out);
  if (self.dim() == 0 || index.dim() != self.dim() || src.dim() != self.dim()) throw NotLowered{};
  const int64_t d = c10::maybe_wrap_dim(dim, self.dim()), rank = self.dim();
  NodePtr x = r.convert(r.tensor(self), res.stored);
  NodePtr at = coordinates(r, r.tensor(index), d);
  std::vector<int64_t> zeros(static_cast<size_t>(rank), 0);
  NodePtr updates = r.convert(r.slice(r.tensor(src), zeros, vec(index.sizes())), res.stored);
  const shlo::ScatterDims s = elementwise_scatter(rank);
  auto scatter = [&](const NodePtr& base, const NodePtr& with, shlo::ReduceOp how) {
    return r.op("scatter", {base, at, with}, base->type(), attributes_of(s, how),
                [s, how](shlo::Function& f, const std::vector<shlo::Value>& in) {
                  return f.scatter(in[0], in[1], in[2], s, how);
                });
  };
  NodePtr combined = scatter(x, updates, kind);
  const bool extreme = kind == shlo::ReduceOp::kMax || kind == shlo::ReduceOp::kMin;
  if (extreme && is_floating(res.stored)) {
    // XLA's max and min keep one operand's NaN only, LibTorch's amax and
    // amin any: an element that self or any update makes NaN is NaN.
    const shlo::Type& t = updates->type();
    NodePtr nans = r.select(r.compare(updates, updates, shlo::Direction::kNE), r.splat(1.0, ElementType::kF32, t.dims),
                            r.splat(0.0, ElementType::kF32, t.dims));
    NodePtr count = scatter(r.splat(0.0, ElementType::kF32, x->type().dims), nans, shlo::ReduceOp::kSum);
    NodePtr nan = r.splat(std::nan(""), res.stored, x->type().dims);
    NodePtr touched = r.compare(count, r.splat(0.0, ElementType::kF32, x->type().dims), shlo::Direction::kGT);
    combined = r.select(r.compare(x, x, shlo::Direction::kNE), x, r.select(touched, nan, combined));
  }
  r.write(out, combined);
}

at::Tensor& scatter_add_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                            at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    scatter_combined(r, [&] { return at::scatter_add(meta(self), dim, meta(index), meta(src)); }, self, dim, index,
                     src, shlo::ReduceOp::kSum, out);
  };
  STRATA_LOWER("aten::scatter_add.out", scatter_add_out, self, dim, index, src, out);
}

// scatter_reduce with include_self: "sum", "prod", "amax" and "amin".
// "mean", and include_self=False, whose untouched elements keep self while
// the touched ones forget it, take the fallback.
at::Tensor& scatter_reduce_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                               c10::string_view reduce, bool include_self, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    if (!include_self || self.scalar_type() == at::kBool) throw NotLowered{};
    shlo::ReduceOp kind = shlo::ReduceOp::kSum;
    if (reduce == "prod") kind = shlo::ReduceOp::kProduct;
    else if (reduce == "amax") kind = shlo::ReduceOp::kMax;
    else if (reduce == "amin") kind = shlo::ReduceOp::kMin;
    else if (reduce != "sum") throw NotLowered{};
    scatter_combined(r, [&] { return at::scatter_reduce(meta(self), dim, meta(index), meta(src), reduce, include_self); },
                     self, dim, index, src, kind, out);
  };
  STRATA_LOWER("aten::scatter_reduce.two_out", scatter_reduce_two_out, self, dim, index, src, reduce, include_self, out);
}

// self with src[i...] (or the scalar `value`) put at the coordinates of
// index[i...]. Repeated coordinates keep one of their updates: LibTorch
// leaves which one undefined too.
at::Tensor& scatter_put(const char* name, const at::Tensor& self, int64_t dim, const at::Tensor& index,
                        const at::Tensor* src, const at::Scalar* value, at::Tensor& out) {
  Recorder r(name);
  const Result res = result_of(
      [&] {
        return src ? at::scatter(meta(self), dim, meta(index), meta(*src)) : at::scatter(meta(self), dim, meta(index), *value);
      },
      &out);
  if (self.dim() == 0 || index.dim() != self.dim() || (src && src->dim() != self.dim())) throw NotLowered{};
  const int64_t d = c10::maybe_wrap_dim(dim, self.dim());
  NodePtr x = r.convert(r.tensor(self), res.stored);
  NodePtr at = coordinates(r, r.tensor(index), d);
  const std::vector<int64_t> zeros(static_cast<size_t>(self.dim()), 0);
  NodePtr updates = src ? r.convert(r.slice(r.tensor(*src), zeros, vec(index.sizes())), res.stored)
                        : r.broadcast(r.scalar(*value, res.stored), vec(index.sizes()));
  const shlo::ScatterDims s = elementwise_scatter(self.dim());
  r.write(out, r.op("scatter_replace", {x, at, updates}, x->type(),
                    attributes_of(s), [s](shlo::Function& f, const std::vector<shlo::Value>& in) {
                      return f.scatter_replace(in[0], in[1], in[2], s);
                    }));
  return out;
}

at::Tensor& scatter_src_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Tensor& src,
                            at::Tensor& out) {
  try {
    return scatter_put("aten::scatter.src_out", self, dim, index, &src, nullptr, out);
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::scatter_src_out>::call(self, dim, index, src, out);
}

at::Tensor& scatter_value_out(const at::Tensor& self, int64_t dim, const at::Tensor& index, const at::Scalar& value,
                              at::Tensor& out) {
  try {
    return scatter_put("aten::scatter.value_out", self, dim, index, nullptr, &value, out);
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::scatter_value_out>::call(self, dim, index, value,
                                                                                       out);
}

}  // namespace

void register_scatter(torch::Library& library) {
  library.impl("gather.out", TORCH_FN(gather_out));
  library.impl("scatter_add.out", TORCH_FN(scatter_add_out));
  library.impl("scatter_reduce.two_out", TORCH_FN(scatter_reduce_out));
  library.impl("scatter.src_out", TORCH_FN(scatter_src_out));
  library.impl("scatter.value_out", TORCH_FN(scatter_value_out));
}

}  // namespace strata::xla::detail::lowering
