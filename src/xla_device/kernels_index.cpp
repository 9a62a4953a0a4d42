// Lowered kernels of the reductions with indices (max and min, with their
// indices along a dim or over all elements; argmax, argmin), of indexing
// by integer tensors (index.Tensor, index_put_), of flip, of cumsum, and
// of sort and topk; gather and the scatters along a dim are in
// kernels_scatter.cpp: Note [What is lowered] in lowerings.cpp.
//
// Note [Min as a max]
// The emitter's argmax returns the first maximum, NaN counting as the
// largest (torch.max's rule). The minimum is the maximum of an
// order-reversed copy: -x for floats (NaN stays NaN and still wins, as in
// torch.min; -0 and 0 tie, the first index wins on both sides), ~x for
// signed integers (order-reversing without overflow), reversed back after.
#include <ATen/ops/flip.h>
#include <ATen/ops/index.h>
#include <ATen/ops/_index_put_impl.h>
#include <ATen/ExpandUtils.h>
#include <ATen/ops/argmax.h>
#include <ATen/ops/argmin.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/max.h>
#include <ATen/ops/min.h>
#include <ATen/ops/sort.h>
#include <ATen/ops/topk.h>

#include <numeric>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

bool is_signed_integer(ElementType t) {
  return t == ElementType::kS8 || t == ElementType::kS16 || t == ElementType::kS32 || t == ElementType::kS64;
}

// Note [Min as a max]: x order-reversed (and its own inverse).
NodePtr reversed(Recorder& r, const NodePtr& x) {
  const ElementType t = x->type().dtype;
  if (is_floating(t)) return r.unary("negate", x, &shlo::Function::negate);
  if (is_signed_integer(t)) return r.unary("not", x, &shlo::Function::logical_not);
  throw NotLowered{};
}

// {value, index (s64)} of the first max (or min) of `x` along `dim`.
std::pair<NodePtr, NodePtr> arg_extreme(Recorder& r, NodePtr x, int64_t dim, bool max) {
  if (!max) x = reversed(r, x);
  std::vector<int64_t> dims = x->type().dims;
  dims.erase(dims.begin() + dim);
  const ElementType t = x->type().dtype;
  auto both = [&](int which, ElementType dtype) {
    return r.op(which == 0 ? "argmax_value" : "argmax_index", {x}, {dtype, dims},
                lazy::Attributes{}.add(dim).add(which),
                [dim, which](shlo::Function& f, const std::vector<shlo::Value>& in) {
                  return f.argmax(in[0], dim)[static_cast<size_t>(which)];
                });
  };
  NodePtr value = both(0, t), index = both(1, ElementType::kS64);
  return {max ? value : reversed(r, value), index};
}

// `self` as its value in its own dtype, flattened to 1-d when `dim` is
// absent (a reduction over all elements); the dim reduced.
std::pair<NodePtr, int64_t> reduction_input(Recorder& r, const at::Tensor& self, std::optional<int64_t> dim) {
  if (self.numel() == 0) throw NotLowered{};  // LibTorch's own error
  NodePtr x = r.tensor(self);
  if (!dim.has_value()) return {r.reshape(x, {self.numel()}), 0};
  if (self.dim() == 0) return {r.reshape(x, {1}), 0};
  return {x, c10::maybe_wrap_dim(*dim, self.dim())};
}

std::tuple<at::Tensor&, at::Tensor&> extreme_dim_out(const char* name, bool max, const at::Tensor& self, int64_t dim,
                                                     bool keepdim, at::Tensor& values, at::Tensor& indices) {
  Recorder r(name);
  if (values.scalar_type() != self.scalar_type() || indices.scalar_type() != at::kLong) throw NotLowered{};
  const auto [x, d] = reduction_input(r, self, dim);
  const auto [value, index] = arg_extreme(r, x, d, max);
  std::vector<int64_t> dims = vec(self.sizes());
  if (!dims.empty()) {
    if (keepdim) dims[static_cast<size_t>(d)] = 1;
    else dims.erase(dims.begin() + d);
  }
  r.write(values, r.reshape(value, dims));
  r.write(indices, r.reshape(index, dims));
  return {values, indices};
}

std::tuple<at::Tensor&, at::Tensor&> max_dim_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& max,
                                                 at::Tensor& max_values) {
  try {
    return extreme_dim_out("aten::max.dim_max", true, self, dim, keepdim, max, max_values);
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::max_dim_max>::call(self, dim, keepdim, max,
                                                                                  max_values);
}

std::tuple<at::Tensor&, at::Tensor&> min_dim_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& min,
                                                 at::Tensor& min_indices) {
  try {
    return extreme_dim_out("aten::min.dim_min", false, self, dim, keepdim, min, min_indices);
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::min_dim_min>::call(self, dim, keepdim, min,
                                                                                  min_indices);
}

// The index of the first max (min) along `dim`, or over all elements.
void lower_arg(Recorder& r, bool max, const at::Tensor& self, std::optional<int64_t> dim, bool keepdim,
               const at::Tensor& out) {
  if (out.scalar_type() != at::kLong) throw NotLowered{};
  const auto [x, d] = reduction_input(r, self, dim);
  std::vector<int64_t> dims;
  if (dim.has_value()) {
    dims = vec(self.sizes());
    if (!dims.empty()) {
      if (keepdim) dims[static_cast<size_t>(d)] = 1;
      else dims.erase(dims.begin() + d);
    }
  } else if (keepdim) {
    dims.assign(static_cast<size_t>(self.dim()), 1);
  }
  r.write(out, r.reshape(arg_extreme(r, x, d, max).second, dims));
}

at::Tensor& argmax_out(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim, at::Tensor& out) {
  auto lower = [&](Recorder& r) { lower_arg(r, true, self, dim, keepdim, out); };
  STRATA_LOWER("aten::argmax.out", argmax_out, self, dim, keepdim, out);
}

at::Tensor& argmin_out(const at::Tensor& self, std::optional<int64_t> dim, bool keepdim, at::Tensor& out) {
  auto lower = [&](Recorder& r) { lower_arg(r, false, self, dim, keepdim, out); };
  STRATA_LOWER("aten::argmin.out", argmin_out, self, dim, keepdim, out);
}

// The max (min) of all elements, NaN if any is.
at::Tensor& extreme_out(const char* name, bool max, const at::Tensor& self, at::Tensor& out) {
  Recorder r(name);
  if (out.scalar_type() != self.scalar_type()) throw NotLowered{};
  const auto [x, d] = reduction_input(r, self, std::nullopt);
  r.write(out, r.reshape(arg_extreme(r, x, d, max).first, {}));
  return out;
}

at::Tensor& max_unary_out(const at::Tensor& self, at::Tensor& out) {
  try {
    return extreme_out("aten::max.unary_out", true, self, out);
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::max_unary_out>::call(self, out);
}

at::Tensor& min_unary_out(const at::Tensor& self, at::Tensor& out) {
  try {
    return extreme_out("aten::min.unary_out", false, self, out);
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::min_unary_out>::call(self, out);
}

at::Tensor max(const at::Tensor& self) {
  at::Tensor out = at::empty({}, self.options());
  return max_unary_out(self, out);
}

at::Tensor min(const at::Tensor& self) {
  at::Tensor out = at::empty({}, self.options());
  return min_unary_out(self, out);
}

// Note [Indexing by integer tensors]
// x[i0, i1] (index.Tensor) and x[i0, i1] = v (index_put_) with integer
// index tensors on k dims: the indices broadcast to one shape B, negative
// ones count from the end, and each element of B picks the operand's slice
// at (i0, i1, ...). The result is, as LibTorch's:
//   - indices on consecutive dims p..p+k-1: the operand's dims before p,
//     then B, then its dims after p+k;
//   - indices on dims apart from each other: B, then the operand's other
//     dims in order.
// One gather reads it and one scatter (replacing, or adding with
// accumulate=True) writes it. Index tensors on the CPU are uploaded first
// (LibTorch takes them for a device tensor too). A boolean mask stands for
// the coordinates of its true elements, one index per dim it covers
// (LibTorch's nonzero): its count decides the result's shape, so the mask
// is read to the host (on the xla device that runs the step so far, as
// torch_xla does) and the coordinates come back as index tensors; each
// count of true elements is a program of its own. An out-of-range index is
// clamped (gather) or dropped (scatter) where LibTorch raises.
struct AdvancedIndex {
  std::vector<int64_t> dims;     // the indexed dims, ascending
  bool adjacent = true;          // dims are consecutive: B sits in their place
  std::vector<int64_t> batch;    // B
  NodePtr coordinates;           // [B..., k], s64
};

// `indices` with each boolean mask replaced by the integer indices of its
// true elements and each index on the CPU uploaded to self's device; masks
// whose shape is not the operand's at their dims are left to the fallback
// (LibTorch's error).
c10::List<std::optional<at::Tensor>> integer_indices(const at::Tensor& self,
                                                     const c10::List<std::optional<at::Tensor>>& indices) {
  c10::List<std::optional<at::Tensor>> out;
  int64_t dim = 0;
  for (size_t d = 0; d < indices.size(); ++d) {
    const std::optional<at::Tensor> t = indices.get(d);
    if (!t.has_value() || !t->defined()) {
      out.push_back(std::nullopt);
      ++dim;
      continue;
    }
    if (t->device() != self.device() && !t->device().is_cpu()) throw NotLowered{};
    if (t->scalar_type() != at::kBool && t->scalar_type() != at::kByte) {
      if (!at::isIntegralType(t->scalar_type(), /*includeBool=*/false)) throw NotLowered{};
      out.push_back(t->device() == self.device() ? *t : t->to(self.device()));
      ++dim;
      continue;
    }
    if (dim + t->dim() > self.dim()) throw NotLowered{};
    for (int64_t j = 0; j < t->dim(); ++j)
      if (t->size(j) != self.size(dim + j)) throw NotLowered{};
    const at::Tensor where = at::nonzero(*t).to(self.device());  // [true elements, mask dims]: Note [Shapes that depend on values]
    for (int64_t j = 0; j < t->dim(); ++j) out.push_back(where.select(1, j).to(self.device()));
    dim += t->dim();
  }
  return out;
}

AdvancedIndex advanced_index(Recorder& r, const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices) {
  AdvancedIndex a;
  std::vector<at::Tensor> given;
  for (size_t d = 0; d < indices.size(); ++d) {
    const std::optional<at::Tensor> t = indices.get(d);
    if (!t.has_value() || !t->defined()) continue;
    if (!a.dims.empty() && static_cast<int64_t>(d) != a.dims.back() + 1) a.adjacent = false;
    a.dims.push_back(static_cast<int64_t>(d));
    given.push_back(*t);
  }
  if (given.empty()) throw NotLowered{};
  a.batch = vec(given[0].sizes());
  for (const at::Tensor& t : given) a.batch = at::infer_size(a.batch, t.sizes());
  std::vector<int64_t> one = a.batch;
  one.push_back(1);
  std::vector<NodePtr> parts;
  for (size_t j = 0; j < given.size(); ++j) {
    NodePtr i = r.broadcast(r.convert(r.tensor(given[j]), ElementType::kS64), a.batch);
    const double size = static_cast<double>(self.size(a.dims[j]));
    NodePtr negative = r.compare(i, r.splat(0.0, ElementType::kS64, a.batch), shlo::Direction::kLT);
    i = r.select(negative, r.binary(Recorder::Binary::kAdd, i, r.splat(size, ElementType::kS64, a.batch)), i);
    parts.push_back(r.reshape(i, one));
  }
  a.coordinates = r.concat(parts, static_cast<int64_t>(a.batch.size()));
  return a;
}

// The result dims that hold the operand's un-indexed dims (in order).
std::vector<int64_t> window_dims(const AdvancedIndex& a, int64_t rank) {
  const int64_t nb = static_cast<int64_t>(a.batch.size()), k = static_cast<int64_t>(a.dims.size());
  std::vector<int64_t> out;
  if (!a.adjacent) {
    for (int64_t d = 0; d < rank - k; ++d) out.push_back(nb + d);
    return out;
  }
  const int64_t first = a.dims.front();
  for (int64_t d = 0; d < first; ++d) out.push_back(d);
  for (int64_t d = first + k; d < rank; ++d) out.push_back(d - k + nb);
  return out;
}

c10::List<std::optional<at::Tensor>> metas_of(const c10::List<std::optional<at::Tensor>>& indices) {
  c10::List<std::optional<at::Tensor>> metas;
  for (size_t d = 0; d < indices.size(); ++d) {
    const std::optional<at::Tensor> t = indices.get(d);
    metas.push_back(t.has_value() && t->defined() ? std::optional<at::Tensor>(meta(*t)) : std::nullopt);
  }
  return metas;
}

at::Tensor& index_out(const at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const c10::List<std::optional<at::Tensor>> integers = integer_indices(self, indices);
    const Result res = result_of([&] { return at::index(meta(self), metas_of(integers)); }, &out);
    const AdvancedIndex a = advanced_index(r, self, integers);
    NodePtr x = r.tensor(self);
    shlo::GatherDims g;
    g.offset_dims = window_dims(a, self.dim());
    g.collapsed_slice_dims = a.dims;
    g.start_index_map = a.dims;
    g.index_vector_dim = static_cast<int64_t>(a.batch.size());
    std::vector<int64_t> sizes = vec(self.sizes());
    for (int64_t d : a.dims) sizes[static_cast<size_t>(d)] = 1;
    r.write(out, r.op("gather", {x, a.coordinates}, {x->type().dtype, res.dims},
                      attributes_of(g, sizes),
                      [g, sizes](shlo::Function& f, const std::vector<shlo::Value>& in) {
                        return f.gather(in[0], in[1], g, sizes);
                      }));
  };
  STRATA_LOWER("aten::index.Tensor_out", index_Tensor_out, self, indices, out);
}

at::Tensor& index_put_impl(at::Tensor& self, const c10::List<std::optional<at::Tensor>>& indices,
                           const at::Tensor& values, bool accumulate, bool unsafe) {
  at::Tensor& out = self;
  auto lower = [&](Recorder& r) {
    const c10::List<std::optional<at::Tensor>> integers = integer_indices(self, indices);
    const std::vector<int64_t> window = vec(at::index(meta(self), metas_of(integers)).sizes());
    if (!c10::canCast(values.scalar_type(), self.scalar_type())) throw NotLowered{};
    const AdvancedIndex a = advanced_index(r, self, integers);
    for (int64_t n : a.batch)
      if (n == 0) throw NotLowered{};  // nothing to write: the fallback's no-op
    const ElementType stored = element_type(self.scalar_type());
    NodePtr x = r.tensor(self);
    NodePtr updates = values.device().is_cpu() && values.dim() == 0 ? r.broadcast(r.scalar(values.item(), stored), window)
                                                                    : r.broadcast(r.convert(r.tensor(values), stored), window);
    shlo::ScatterDims s;
    s.update_window_dims = window_dims(a, self.dim());
    s.inserted_window_dims = a.dims;
    s.scatter_dims_to_operand_dims = a.dims;
    s.index_vector_dim = static_cast<int64_t>(a.batch.size());
    r.write(self, r.op(accumulate ? "scatter" : "scatter_replace", {x, a.coordinates, updates}, x->type(),
                       attributes_of(s, accumulate),
                       [s, accumulate](shlo::Function& f, const std::vector<shlo::Value>& in) {
                         return accumulate ? f.scatter(in[0], in[1], in[2], s, shlo::ReduceOp::kSum)
                                           : f.scatter_replace(in[0], in[1], in[2], s);
                       }));
  };
  STRATA_LOWER("aten::_index_put_impl_", _index_put_impl_, self, indices, values, accumulate, unsafe);
}

// flip: XLA's reverse along the dims.
at::Tensor flip(const at::Tensor& self, at::IntArrayRef dims) {
  at::Tensor out = at::empty(self.sizes(), self.options());
  auto lower = [&](Recorder& r) {
    std::vector<int64_t> along;
    for (int64_t d : dims) along.push_back(c10::maybe_wrap_dim(d, self.dim()));
    std::sort(along.begin(), along.end());
    if (std::adjacent_find(along.begin(), along.end()) != along.end()) throw NotLowered{};  // LibTorch refuses
    NodePtr x = r.tensor(self);
    r.write(out, along.empty() ? x : r.op("reverse", {x}, x->type(), lazy::Attributes{}.add(along),
                                          [along](shlo::Function& f, const std::vector<shlo::Value>& in) {
                                            return f.reverse(in[0], along);
                                          }));
  };
  STRATA_LOWER("aten::flip", flip, self, dims);
}

// The running sum along `dim`, as a masked sum: each output element sums
// the inputs at or before it (n^2 terms for a dim of n, so only dims of up
// to 64 elements are lowered; a longer one takes the fallback). The sums
// run in XLA's order, not LibTorch's left-to-right one.
at::Tensor& cumsum_out(const at::Tensor& self, int64_t dim, std::optional<at::ScalarType> dtype, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::cumsum(meta(self), dim, dtype); }, &out);
    if (self.dim() == 0) throw NotLowered{};
    const int64_t d = c10::maybe_wrap_dim(dim, self.dim()), n = self.size(d);
    if (n > 64) throw NotLowered{};
    NodePtr x = r.convert(r.tensor(self), res.dtype);
    // out[..., j, ...] = sum over i <= j of x[..., i, ...]: x broadcast
    // along a new dim j after d, masked where i > j, summed over i.
    std::vector<int64_t> wide = res.dims;
    wide.insert(wide.begin() + d + 1, n);
    std::vector<int64_t> mapping;
    for (int64_t k = 0; k < static_cast<int64_t>(res.dims.size()); ++k) mapping.push_back(k <= d ? k : k + 1);
    NodePtr spread = r.op("broadcast", {x}, {res.dtype, wide}, lazy::Attributes{}.add(wide).add(mapping),
                          [wide, mapping](shlo::Function& f, const std::vector<shlo::Value>& in) {
                            return f.broadcast_in_dim(in[0], wide, mapping);
                          });
    NodePtr keep = r.compare(r.iota(ElementType::kS64, wide, d), r.iota(ElementType::kS64, wide, d + 1),
                             shlo::Direction::kLE);
    NodePtr masked = r.select(keep, spread, r.splat(0.0, res.dtype, wide));
    r.write(out, r.sum(masked, {d}));
  };
  STRATA_LOWER("aten::cumsum.out", cumsum_out, self, dim, dtype, out);
}

// {values, indices} of self sorted along `dim` (stable; NaN largest, as
// torch.sort: Note [Sort's comparator] in src/xla/stablehlo_sort.cpp).
std::pair<NodePtr, NodePtr> sorted(Recorder& r, const at::Tensor& self, int64_t dim, bool descending) {
  if (self.numel() == 0) throw NotLowered{};
  NodePtr x = r.tensor(self);
  if (self.dim() == 0) x = r.reshape(x, {1});
  const std::vector<int64_t> dims = x->type().dims;
  const int64_t d = self.dim() == 0 ? 0 : c10::maybe_wrap_dim(dim, self.dim());
  NodePtr index = r.iota(ElementType::kS64, dims, d);
  auto take = [&](int which, ElementType dtype) {
    return r.op(which == 0 ? "sort_values" : "sort_indices", {x, index}, {dtype, dims},
                lazy::Attributes{}.add(d).add(descending).add(which),
                [d, descending, which](shlo::Function& f, const std::vector<shlo::Value>& in) {
                  return f.sort(in, d, descending)[static_cast<size_t>(which)];
                });
  };
  return {take(0, x->type().dtype), take(1, ElementType::kS64)};
}

std::tuple<at::Tensor&, at::Tensor&> sort_out(const at::Tensor& self, std::optional<bool> stable, int64_t dim,
                                              bool descending, at::Tensor& values, at::Tensor& indices) {
  try {
    Recorder r("aten::sort.values_stable");
    if (values.scalar_type() != self.scalar_type() || indices.scalar_type() != at::kLong) throw NotLowered{};
    const auto [v, i] = sorted(r, self, dim, descending);
    r.write(values, r.reshape(v, vec(self.sizes())));
    r.write(indices, r.reshape(i, vec(self.sizes())));
    return {values, indices};
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::sort_values_stable>::call(self, stable, dim,
                                                                                         descending, values, indices);
}

// The k largest (smallest) along `dim`, sorted: the first k of a stable
// sort. Equal values come in index order (LibTorch's CPU kernel leaves
// their order unspecified).
std::tuple<at::Tensor&, at::Tensor&> topk_out(const at::Tensor& self, int64_t k, int64_t dim, bool largest,
                                              bool sorted_, at::Tensor& values, at::Tensor& indices) {
  try {
    Recorder r("aten::topk.values");
    if (values.scalar_type() != self.scalar_type() || indices.scalar_type() != at::kLong || self.dim() == 0)
      throw NotLowered{};
    const int64_t d = c10::maybe_wrap_dim(dim, self.dim());
    if (k < 0 || k > self.size(d) || k == 0) throw NotLowered{};
    const auto [v, i] = sorted(r, self, d, largest);
    std::vector<int64_t> start(static_cast<size_t>(self.dim()), 0), limit = vec(self.sizes());
    limit[static_cast<size_t>(d)] = k;
    r.write(values, r.slice(v, start, limit));
    r.write(indices, r.slice(i, start, limit));
    return {values, indices};
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::topk_values>::call(self, k, dim, largest, sorted_,
                                                                                  values, indices);
}

}  // namespace

void register_scatter(torch::Library& library);

void register_index(torch::Library& library) {
  register_scatter(library);
  library.impl("sort.values_stable", TORCH_FN(sort_out));
  library.impl("topk.values", TORCH_FN(topk_out));
  library.impl("max.dim_max", TORCH_FN(max_dim_out));
  library.impl("min.dim_min", TORCH_FN(min_dim_out));
  library.impl("argmax.out", TORCH_FN(argmax_out));
  library.impl("argmin.out", TORCH_FN(argmin_out));
  library.impl("max", TORCH_FN(max));
  library.impl("min", TORCH_FN(min));
  library.impl("max.unary_out", TORCH_FN(max_unary_out));
  library.impl("min.unary_out", TORCH_FN(min_unary_out));
  library.impl("index.Tensor_out", TORCH_FN(index_out));
  library.impl("_index_put_impl_", TORCH_FN(index_put_impl));
  library.impl("flip", TORCH_FN(flip));
  library.impl("cumsum.out", TORCH_FN(cumsum_out));
}

}  // namespace strata::xla::detail::lowering
