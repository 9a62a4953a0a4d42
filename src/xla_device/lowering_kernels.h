// What the xla device's lowered kernels share beside the Recorder
// (lowering.h, which ends by including this file): the shape and dtype of
// an op's result from meta tensors, STRATA_LOWER, which runs a lowering
// and takes the CPU fallback where it does not apply (Note [What is
// lowered] in lowerings.cpp), the formulas several kernels use, and the
// registration of each kernel file.
#pragma once

#include <ATen/ops/view_as_real.h>

#include <functional>
#include <utility>

#include "lowering.h"

namespace strata::xla::detail::lowering {

// The attributes of the emitters that capture StableHLO's dimension and
// window structs (Note [Programs known by their structure] in
// strata/xla/lazy_graph.h): every field, in order.
inline lazy::Attributes& add(lazy::Attributes& a, const shlo::GatherDims& g) {
  return a.add(g.offset_dims).add(g.collapsed_slice_dims).add(g.operand_batching_dims).add(g.start_indices_batching_dims)
      .add(g.start_index_map).add(g.index_vector_dim);
}
inline lazy::Attributes& add(lazy::Attributes& a, const shlo::ScatterDims& s) {
  return a.add(s.update_window_dims).add(s.inserted_window_dims).add(s.input_batching_dims)
      .add(s.scatter_indices_batching_dims).add(s.scatter_dims_to_operand_dims).add(s.index_vector_dim);
}
inline lazy::Attributes& add(lazy::Attributes& a, const shlo::Function::Window& w) {
  return a.add(w.dimensions).add(w.strides).add(w.base_dilations).add(w.window_dilations).add(w.padding_low)
      .add(w.padding_high);
}
inline lazy::Attributes& add(lazy::Attributes& a, const shlo::Function::ConvDims& d) {
  return a.add(d.input_batch).add(d.input_feature).add(d.input_spatial).add(d.kernel_output_feature)
      .add(d.kernel_input_feature).add(d.kernel_spatial).add(d.output_batch).add(d.output_feature).add(d.output_spatial);
}
inline lazy::Attributes& add(lazy::Attributes& a, const shlo::Function::ConvWindow& w) {
  return a.add(w.strides).add(w.padding_low).add(w.padding_high).add(w.lhs_dilation).add(w.rhs_dilation)
      .add(w.feature_group_count).add(w.batch_group_count);
}
template <class T>
lazy::Attributes& add(lazy::Attributes& a, const T& v) {
  return a.add(v);
}
template <class... T>
lazy::Attributes attributes_of(const T&... values) {
  lazy::Attributes a;
  (add(a, values), ...);
  return a;
}

// `x` (computed in f32) rounded to `stored` (bf16, f16) and back, where a
// LibTorch CPU kernel stores or computes an intermediate in that dtype
// (Note [bf16 computes in f32]); `x` itself for any other dtype.
inline NodePtr rounded(Recorder& r, const NodePtr& x, ElementType stored) {
  if (!reduced_float(stored) || x->type().dtype == stored) return x;
  return r.convert(r.convert(x, stored), x->type().dtype);
}

inline at::Tensor meta(const at::Tensor& t) {
  if (!t.defined()) return t;
  at::Tensor m = at::empty_strided(t.sizes(), t.strides(), t.options().device(at::kMeta));
  if (t.unsafeGetTensorImpl()->is_wrapped_number()) m.unsafeGetTensorImpl()->set_wrapped_number(true);
  return m;
}

// The shape and dtype of an op's result (Note [Shapes and dtypes from meta
// tensors]), and the check that `out` may hold it. `dtype` is the dtype
// the op computes in: the result's, or f32 for a bf16/f16 result (Note
// [bf16 computes in f32]); `stored` is the result's own.
struct Result {
  std::vector<int64_t> dims;
  ElementType dtype;
  ElementType stored = dtype;
};

template <class F>
Result result_of(F&& run_on_meta, const at::Tensor* out = nullptr) {
  at::Tensor m;
  try {
    m = run_on_meta();
  } catch (const c10::Error&) {
    throw NotLowered{};  // the fallback raises LibTorch's own error
  }
  if (out != nullptr && !c10::canCast(m.scalar_type(), out->scalar_type())) throw NotLowered{};
  const ElementType stored = element_type(m.scalar_type());
  return {vec(m.sizes()), opmath(stored), stored};
}

// The result of an element-wise op of float inputs: `f` of its operands
// (each in the computation dtype, broadcast) written to `out`.
using Formula = std::function<NodePtr(Recorder&, const std::vector<NodePtr>&)>;
template <class Meta>
inline void lower_pointwise(Recorder& r, Meta&& on_meta, const std::vector<const at::Tensor*>& inputs, const at::Tensor& out,
                     const Formula& f) {
  const Result res = result_of(std::forward<Meta>(on_meta), &out);
  if (!is_floating(res.dtype)) throw NotLowered{};
  std::vector<NodePtr> in;
  for (const at::Tensor* t : inputs) in.push_back(r.operand(*t, res.dtype, res.dims));
  r.write(out, f(r, in));
}

// The element-wise maximum or minimum as LibTorch's, which propagate a
// NaN from either side; XLA's CPU compiler keeps only the first operand's
// (measured: max(1, nan) is 1), so a NaN on either side is selected
// explicitly.
inline NodePtr nan_propagating(Recorder& r, Binary kind, const NodePtr& a, const NodePtr& b) {
  NodePtr m = r.binary(kind, a, b);
  if (!is_floating(a->type().dtype)) return m;
  return r.select(r.compare(a, a, shlo::Direction::kNE), a, r.select(r.compare(b, b, shlo::Direction::kNE), b, m));
}

// LibTorch's sign (and sgn of a real tensor): (0 < x) - (x < 0), so 0 for
// NaN and +0 for -0, where XLA's sign keeps both.
inline NodePtr libtorch_sign(Recorder& r, const NodePtr& x) {
  const shlo::Type& t = x->type();
  NodePtr one = r.splat(1.0, t.dtype, t.dims), zero = r.splat(0.0, t.dtype, t.dims);
  NodePtr above = r.select(r.compare(zero, x, shlo::Direction::kLT), one, zero);
  NodePtr below = r.select(r.compare(x, zero, shlo::Direction::kLT), one, zero);
  return r.binary(Binary::kSubtract, above, below);
}

// The real and imaginary parts of a complex xla tensor (Note [Complex
// tensors on the xla device] in lazy_buffer.h), read through view_as_real.
// A conjugated or negated view (a bit LibTorch resolves later) takes the
// fallback.
inline std::pair<NodePtr, NodePtr> parts_of(Recorder& r, const at::Tensor& t) {
  if (!t.defined() || !t.is_complex() || t.is_conj() || t.is_neg()) throw NotLowered{};
  const NodePtr parts = r.tensor(at::view_as_real(t));
  std::vector<int64_t> dims = parts->type().dims, start(dims.size(), 0), limit = dims;
  dims.pop_back();
  limit.back() = 1;
  const NodePtr re = r.reshape(r.slice(parts, start, limit), dims);
  start.back() = 1;
  limit.back() = 2;
  return {re, r.reshape(r.slice(parts, start, limit), dims)};
}

// The value of a complex xla tensor of f32 or f64 parts.
inline NodePtr complex_value(Recorder& r, const at::Tensor& t) {
  const auto [re, im] = parts_of(r, t);
  const ElementType part = re->type().dtype;
  if (part != ElementType::kF32 && part != ElementType::kF64) throw NotLowered{};
  return r.op("complex", {re, im}, {part == ElementType::kF32 ? ElementType::kC64 : ElementType::kC128, re->type().dims},
              [](shlo::Function& f, const std::vector<shlo::Value>& in) { return f.complex(in[0], in[1]); });
}

// The parts of a complex node, each times `scale`.
inline std::pair<NodePtr, NodePtr> complex_parts(Recorder& r, const NodePtr& value, double scale = 1.0) {
  const shlo::Type part{complex_part(value->type().dtype), value->type().dims};
  NodePtr re = r.op("real", {value}, part, [](shlo::Function& f, const std::vector<shlo::Value>& in) {
    return f.real(in[0]);
  });
  NodePtr im = r.op("imag", {value}, part, [](shlo::Function& f, const std::vector<shlo::Value>& in) {
    return f.imag(in[0]);
  });
  if (scale != 1.0) {
    re = r.binary(Binary::kMultiply, re, r.splat(scale, part.dtype, part.dims));
    im = r.binary(Binary::kMultiply, im, r.splat(scale, part.dtype, part.dims));
  }
  return {re, im};
}

// Rebinds the complex xla tensor `out` (resized to the value's dims first)
// to `re` + i `im`, each of out's dims, written through view_as_real.
inline void write_complex(Recorder& r, const at::Tensor& out, const NodePtr& re, const NodePtr& im) {
  if (!out.is_complex() || out.is_conj() || out.is_neg() || out.device().type() != kXla) throw NotLowered{};
  std::vector<int64_t> dims = re->type().dims;
  if (vec(out.sizes()) != dims) at::native::resize_output(out, dims);
  ElementType part = ElementType::kF32;
  complex_storage_type_of(out.scalar_type(), part);
  dims.push_back(1);
  r.write(at::view_as_real(out), r.concat({r.reshape(r.convert(re, part), dims), r.reshape(r.convert(im, part), dims)},
                                          static_cast<int64_t>(dims.size()) - 1));
}

// Runs `lower`; where it does not lower the call, the CPU fallback runs
// the op (Note [What is lowered]).
#define STRATA_LOWER(OP, FALLBACK_OP, ...)                                                   \
  try {                                                                                      \
    Recorder r(OP);                                                                          \
    lower(r);                                                                                \
    return out;                                                                              \
  } catch (const NotLowered&) {                                                              \
  }                                                                                          \
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::FALLBACK_OP>::call(__VA_ARGS__)

// The dtype a pooling or padding kernel computes in: a floating input's
// opmath type; an integer input is left to the fallback.
inline ElementType float_dtype(const at::Tensor& t) {
  const ElementType stored = element_type(t.scalar_type());
  if (!is_floating(stored)) throw NotLowered{};
  return opmath(stored);
}

// The dims a reduction over `dim` (none or empty: all) covers.
inline std::vector<int64_t> reduced_dims(const at::Tensor& self, at::OptionalIntArrayRef dim) {
  std::vector<int64_t> dims;
  if (!dim.has_value() || dim->empty()) {
    for (int64_t d = 0; d < self.dim(); ++d) dims.push_back(d);
    return dims;
  }
  for (int64_t d : *dim) dims.push_back(c10::maybe_wrap_dim(d, self.dim()));
  std::sort(dims.begin(), dims.end());
  dims.erase(std::unique(dims.begin(), dims.end()), dims.end());
  return dims;
}

/// The lowered kernels of the nn ops (kernels_nn.cpp) and of the shape and
/// indexing ops (kernels_shape.cpp).
void register_nn(torch::Library& library);
void register_shape(torch::Library& library);
/// The xla device's autocast kernels (AutocastPrivateUse1), the CPU's
/// policy (autocast.cpp).
void register_autocast();
/// The lowered kernels of the step's checks (kernels_checks.cpp).
void register_checks(torch::Library& library);
/// The lowered random kernels: dropout (kernels_random.cpp).
void register_random(torch::Library& library);
/// The activations and their backwards, and where
/// (kernels_activation.cpp).
void register_activation(torch::Library& library);
/// Batch norm and its backward, group norm's backward (kernels_norm.cpp).
void register_norm(torch::Library& library);
/// The losses and their backwards (kernels_loss.cpp).
void register_loss(torch::Library& library);
/// max, min, argmax, argmin, indexing, cumsum, sort, topk
/// (kernels_index.cpp), with gather and the scatters (kernels_scatter.cpp).
void register_index(torch::Library& library);
/// The element-wise math (trigonometry, logarithms, roundings, atan2,
/// fmod, remainder, pow, bitwise ops, clamp with tensor bounds, division
/// with a rounding mode), amax, amin, prod and nonzero (kernels_math.cpp).
void register_math(torch::Library& library);
/// The comparisons, logical_not, all and any (kernels_compare.cpp).
void register_compare(torch::Library& library);
/// The fused LSTM and GRU cells as decompositions into ATen ops, on
/// `library` (PrivateUse1) and on AutogradPrivateUse1 (kernels_rnn.cpp).
void register_rnn(torch::Library& library);
/// The lowered convolutions (kernels_conv.cpp), pooling and padding
/// (kernels_pool.cpp), folding (kernels_fold.cpp), and the CPU kernels the
/// convolutions' fallback runs.
void register_conv(torch::Library& library);
/// cdist and pdist and their backwards (kernels_distance.cpp).
void register_distance(torch::Library& library);
/// EmbeddingBag and its backwards (kernels_embedding_bag.cpp).
void register_embedding_bag(torch::Library& library);
/// grid_sampler_2d and its backward (kernels_grid_sampler.cpp).
void register_grid_sampler(torch::Library& library);
/// The fused Adam and AdamW steps (kernels_optim.cpp).
void register_optim(torch::Library& library);
/// The Fourier transforms (kernels_fft.cpp).
void register_fft(torch::Library& library);

}  // namespace strata::xla::detail::lowering
