// Lowered kernels of the pads of F::pad and of nn::Conv's padding modes
// (Note [What is lowered] in lowerings.cpp): constant_pad_nd,
// reflection_pad and replication_pad, 1-d to 3-d, with their backwards.
// Each computes in the dtype LibTorch's CPU kernel computes in (f32 for
// bf16: Note [bf16 computes in f32] in lowering.h).
#include <ATen/ops/constant_pad_nd.h>
#include <ATen/ops/reflection_pad1d.h>
#include <ATen/ops/reflection_pad1d_backward.h>
#include <ATen/ops/reflection_pad2d.h>
#include <ATen/ops/reflection_pad2d_backward.h>
#include <ATen/ops/reflection_pad3d.h>
#include <ATen/ops/reflection_pad3d_backward.h>
#include <ATen/ops/replication_pad1d.h>
#include <ATen/ops/replication_pad1d_backward.h>
#include <ATen/ops/replication_pad2d.h>
#include <ATen/ops/replication_pad2d_backward.h>
#include <ATen/ops/replication_pad3d.h>
#include <ATen/ops/replication_pad3d_backward.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <limits>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

// ---- Padding ------------------------------------------------------------------------

// The padded value of `self` (pad: low and high per dim, from the last
// dim back, as F::pad takes them): stablehlo.pad, whose negative
// paddings cut as LibTorch's do.
at::Tensor constant_pad_nd(const at::Tensor& self, c10::IntArrayRef pad, const at::Scalar& value) {
  try {
    Recorder r("aten::constant_pad_nd");
    const ElementType t = element_type(self.scalar_type());
    if (pad.size() % 2 != 0 || static_cast<int64_t>(pad.size()) > 2 * self.dim()) throw NotLowered{};
    const size_t n = static_cast<size_t>(self.dim());
    std::vector<int64_t> low(n, 0), high(n, 0), interior(n, 0), dims = vec(self.sizes());
    for (size_t i = 0; i < pad.size() / 2; ++i) {
      const size_t d = n - 1 - i;
      low[d] = pad[2 * i];
      high[d] = pad[2 * i + 1];
      dims[d] += low[d] + high[d];
      if (dims[d] < 1) throw NotLowered{};
    }
    NodePtr x = r.tensor(self);
    NodePtr fill = r.scalar(value, t);
    NodePtr padded = r.op("pad", {x, fill}, {t, dims}, lazy::Attributes{}.add(low).add(high).add(interior),
                          [low, high, interior](shlo::Function& f, const std::vector<shlo::Value>& in) {
                            return f.pad(in[0], in[1], low, high, interior);
                          });
    at::Tensor out = at::empty(dims, self.options());
    r.write(out, padded);
    return out;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::constant_pad_nd>::call(
      self, pad, value);
}

enum class PadMode { kReflect, kReplicate };

// Where each element of a padded dim comes from: reflected about the
// edge elements (not repeating them), or the edge element repeated.
std::vector<double> pad_sources(int64_t size, int64_t low, int64_t high, PadMode mode) {
  if (low < 0 || high < 0 || (mode == PadMode::kReflect && (low >= size || high >= size))) throw NotLowered{};
  std::vector<double> sources;
  for (int64_t j = 0; j < size + low + high; ++j) {
    int64_t i = j - low;
    if (mode == PadMode::kReflect) {
      i = i < 0 ? -i : i >= size ? 2 * (size - 1) - i : i;
    } else {
      i = std::clamp<int64_t>(i, 0, size - 1);
    }
    sources.push_back(static_cast<double>(i));
  }
  return sources;
}

NodePtr index_constant(Recorder& r, const std::vector<double>& values) {
  const shlo::Type type{ElementType::kS64, {static_cast<int64_t>(values.size())}};
  return r.op("constant", {}, type, lazy::Attributes{}.add(type).add(values),
              [type, values](shlo::Function& f, const std::vector<shlo::Value>&) {
                return f.constant(type, values);
              });
}

// The padded dims of a `rank`-d tensor and their (low, high) paddings.
std::vector<std::tuple<int64_t, int64_t, int64_t>> padded_dims(int64_t rank, c10::IntArrayRef padding,
                                                               size_t spatial) {
  if (padding.size() != 2 * spatial || (rank != static_cast<int64_t>(spatial) + 1 &&
                                        rank != static_cast<int64_t>(spatial) + 2))
    throw NotLowered{};
  std::vector<std::tuple<int64_t, int64_t, int64_t>> out;
  for (size_t i = 0; i < spatial; ++i) out.emplace_back(rank - 1 - static_cast<int64_t>(i), padding[2 * i], padding[2 * i + 1]);
  return out;
}

// Note [Padding as gathers]: each padded dim is a gather of whole slices
// at the constant source indices (take_rows), so the backward is the
// scatter-add of the gradient's slices to those indices, dim by dim in
// the reverse order: an input element reflected into the padding gets its
// own gradient plus its reflection's.
template <class Op, PadMode kMode, size_t kSpatial>
at::Tensor pad_forward(const at::Tensor& self, c10::IntArrayRef padding) {
  try {
    Recorder r(Op::name);
    element_type(self.scalar_type());
    NodePtr x = r.tensor(self);
    for (const auto& [dim, low, high] : padded_dims(self.dim(), padding, kSpatial)) {
      NodePtr idx = index_constant(r, pad_sources(x->type().dims[static_cast<size_t>(dim)], low, high, kMode));
      std::vector<int64_t> dims = x->type().dims;
      dims[static_cast<size_t>(dim)] += low + high;
      const int64_t d = dim;
      x = r.op("take_rows", {x, idx}, {x->type().dtype, dims}, lazy::Attributes{}.add(d),
               [d](shlo::Function& f, const std::vector<shlo::Value>& in) {
                 return f.take_rows(in[0], in[1], d);
               });
    }
    at::Tensor out = at::empty(x->type().dims, self.options());
    r.write(out, x);
    return out;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, Op>::call(self, padding);
}

template <class Op, PadMode kMode, size_t kSpatial>
at::Tensor pad_backward(const at::Tensor& grad_output, const at::Tensor& self, c10::IntArrayRef padding) {
  try {
    Recorder r(Op::name);
    const ElementType t = float_dtype(self);
    if (grad_output.scalar_type() != self.scalar_type() || grad_output.dim() != self.dim()) throw NotLowered{};
    NodePtr g = r.convert(r.tensor(grad_output), t);
    auto padded = padded_dims(self.dim(), padding, kSpatial);
    for (auto it = padded.rbegin(); it != padded.rend(); ++it) {
      const auto [dim, low, high] = *it;
      const int64_t size = self.size(dim);
      if (g->type().dims[static_cast<size_t>(dim)] != size + low + high) throw NotLowered{};
      NodePtr idx = index_constant(r, pad_sources(size, low, high, kMode));
      std::vector<int64_t> dims = g->type().dims;
      dims[static_cast<size_t>(dim)] = size;
      const int64_t d = dim;
      g = r.op("scatter_add_rows", {r.splat(0.0, t, dims), idx, g}, {t, dims},
               lazy::Attributes{}.add(d), [d](shlo::Function& f, const std::vector<shlo::Value>& in) {
                 return f.scatter_add_rows(in[0], in[1], in[2], d);
               });
    }
    if (g->type().dims != vec(self.sizes())) throw NotLowered{};
    at::Tensor out = at::empty(self.sizes(), self.options());
    r.write(out, g);
    return out;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, Op>::call(grad_output, self,
                                                                padding);
}

}  // namespace

void register_pad(torch::Library& library) {
  library.impl("constant_pad_nd", TORCH_FN(constant_pad_nd));
  using namespace at::_ops;
  using M = PadMode;
  library.impl("reflection_pad1d", TORCH_FN((pad_forward<reflection_pad1d, M::kReflect, 1>)));
  library.impl("reflection_pad2d", TORCH_FN((pad_forward<reflection_pad2d, M::kReflect, 2>)));
  library.impl("reflection_pad3d", TORCH_FN((pad_forward<reflection_pad3d, M::kReflect, 3>)));
  library.impl("replication_pad1d", TORCH_FN((pad_forward<replication_pad1d, M::kReplicate, 1>)));
  library.impl("replication_pad2d", TORCH_FN((pad_forward<replication_pad2d, M::kReplicate, 2>)));
  library.impl("replication_pad3d", TORCH_FN((pad_forward<replication_pad3d, M::kReplicate, 3>)));
  library.impl("reflection_pad1d_backward", TORCH_FN((pad_backward<reflection_pad1d_backward, M::kReflect, 1>)));
  library.impl("reflection_pad2d_backward", TORCH_FN((pad_backward<reflection_pad2d_backward, M::kReflect, 2>)));
  library.impl("reflection_pad3d_backward", TORCH_FN((pad_backward<reflection_pad3d_backward, M::kReflect, 3>)));
  library.impl("replication_pad1d_backward",
               TORCH_FN((pad_backward<replication_pad1d_backward, M::kReplicate, 1>)));
  library.impl("replication_pad2d_backward",
               TORCH_FN((pad_backward<replication_pad2d_backward, M::kReplicate, 2>)));
  library.impl("replication_pad3d_backward",
               TORCH_FN((pad_backward<replication_pad3d_backward, M::kReplicate, 3>)));
}

}  // namespace strata::xla::detail::lowering
