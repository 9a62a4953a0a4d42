// Lowered kernels of pooling (Note [What is lowered] in lowerings.cpp):
// the sizes and window of a pooling (pooling.h), max pooling with its
// indices (1-d reaches the 2-d op) and its backward, and adaptive max
// pooling of even windows, 1-d to 3-d. Average pooling is in
// kernels_avg_pool.cpp, the pads in kernels_pad.cpp. Each computes in the
// dtype LibTorch's CPU kernel computes in (f32 for bf16: Note [bf16
// computes in f32] in lowering.h).
#include <ATen/ops/adaptive_max_pool2d.h>
#include <ATen/ops/adaptive_max_pool2d_backward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/max_pool2d_with_indices.h>
#include <ATen/ops/max_pool2d_with_indices_backward.h>
#include <ATen/ops/max_pool3d_with_indices.h>
#include <ATen/ops/max_pool3d_with_indices_backward.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include "lowering.h"
#include "pooling.h"

namespace strata::xla::detail::lowering {
namespace {

std::vector<int64_t> per_dim(c10::IntArrayRef values, size_t n, c10::IntArrayRef otherwise) {
  if (values.empty()) values = otherwise;
  if (values.size() == 1) return std::vector<int64_t>(n, values[0]);
  if (values.size() != n) throw NotLowered{};
  return vec(values);
}

// LibTorch's pooling_output_shape: with ceil_mode the last window may
// start in the right padding, but not past it.
int64_t pooled_size(int64_t in, int64_t kernel, int64_t pad, int64_t stride, int64_t dilation, bool ceil_mode) {
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1 + (ceil_mode ? stride - 1 : 0);
  if (span < 0) throw NotLowered{};
  int64_t out = span / stride + 1;
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  return out;
}

int64_t product(const std::vector<int64_t>& v) {
  int64_t n = 1;
  for (int64_t x : v) n *= x;
  return n;
}

}  // namespace

Pool pool_of(const at::Tensor& self, size_t spatial, c10::IntArrayRef kernel, c10::IntArrayRef stride,
             c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil_mode) {
  if (self.dim() != static_cast<int64_t>(spatial) + 1 && self.dim() != static_cast<int64_t>(spatial) + 2)
    throw NotLowered{};
  Pool p;
  p.spatial = spatial;
  p.lead = static_cast<size_t>(self.dim()) - spatial;
  p.kernel = per_dim(kernel, spatial, kernel);
  p.stride = per_dim(stride, spatial, kernel);
  p.padding = per_dim(padding, spatial, padding);
  p.dilation = per_dim(dilation, spatial, {1});
  for (size_t i = 0; i < spatial; ++i) {
    if (p.kernel[i] < 1 || p.stride[i] < 1 || p.dilation[i] < 1 || p.padding[i] < 0 ||
        2 * p.padding[i] > p.kernel[i])
      throw NotLowered{};
    p.in.push_back(self.size(static_cast<int64_t>(p.lead + i)));
    p.out.push_back(pooled_size(p.in[i], p.kernel[i], p.padding[i], p.stride[i], p.dilation[i], ceil_mode));
    if (p.in[i] < 1 || p.out[i] < 1) throw NotLowered{};
  }
  return p;
}

Window window_of(const Pool& p) {
  Window w;
  w.dimensions = w.strides = w.window_dilations = std::vector<int64_t>(p.lead, 1);
  w.padding_low = w.padding_high = std::vector<int64_t>(p.lead, 0);
  for (size_t i = 0; i < p.spatial; ++i) {
    w.dimensions.push_back(p.kernel[i]);
    w.strides.push_back(p.stride[i]);
    w.window_dilations.push_back(p.dilation[i]);
    w.padding_low.push_back(p.padding[i]);
    const int64_t reach = (p.out[i] - 1) * p.stride[i] + p.dilation[i] * (p.kernel[i] - 1) + 1;
    w.padding_high.push_back(std::max(p.padding[i], reach - p.in[i] - p.padding[i]));
  }
  return w;
}

std::vector<int64_t> out_dims(const at::Tensor& self, const Pool& p) {
  std::vector<int64_t> dims(self.sizes().begin(), self.sizes().begin() + static_cast<int64_t>(p.lead));
  dims.insert(dims.end(), p.out.begin(), p.out.end());
  return dims;
}

namespace {

// ---- Max pooling --------------------------------------------------------------------

// Result `which` (0: the max, 1: its index) of the argmax over each window.
// Note [Two results, two nodes]: a graph node has one result, so the max
// and its index are two nodes, each one variadic reduce_window of the
// same operands (XLA may merge the two; the results are the same either
// way).
NodePtr window_argmax(Recorder& r, const NodePtr& x, const NodePtr& index, const Window& w,
                      const std::vector<int64_t>& out, size_t which) {
  const shlo::Type type{which == 0 ? x->type().dtype : index->type().dtype, out};
  return r.op(which == 0 ? "reduce_window_max" : "reduce_window_argmax", {x, index}, type,
              attributes_of(w, which), [w, which](shlo::Function& f, const std::vector<shlo::Value>& in) {
                return f.reduce_window_argmax(in[0], in[1], w)[which];
              });
}

// {max, flat index of the max within its plane} over each window, as
// LibTorch's max pooling returns them.
std::tuple<at::Tensor, at::Tensor> max_pool_with_indices(Recorder& r, const at::Tensor& self, size_t spatial,
                                                         c10::IntArrayRef kernel, c10::IntArrayRef stride,
                                                         c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                                         bool ceil_mode) {
  const ElementType t = float_dtype(self);
  const Pool p = pool_of(self, spatial, kernel, stride, padding, dilation, ceil_mode);
  const std::vector<int64_t> dims = vec(self.sizes()), out = out_dims(self, p);
  NodePtr x = r.convert(r.tensor(self), t);
  NodePtr index = r.broadcast(r.reshape(r.iota(ElementType::kS64, {product(p.in)}, 0), p.in), dims);
  const Window w = window_of(p);
  at::Tensor values = at::empty(out, self.options()), indices = at::empty(out, self.options().dtype(at::kLong));
  NodePtr max = window_argmax(r, x, index, w, out, 0), argmax = window_argmax(r, x, index, w, out, 1);
  r.write(values, max);
  r.write(indices, argmax);
  return {values, indices};
}

std::tuple<at::Tensor, at::Tensor> max_pool2d_with_indices(const at::Tensor& self, c10::IntArrayRef kernel,
                                                           c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                           c10::IntArrayRef dilation, bool ceil_mode) {
  try {
    Recorder r("aten::max_pool2d_with_indices");
    return max_pool_with_indices(r, self, 2, kernel, stride, padding, dilation, ceil_mode);
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::max_pool2d_with_indices>::call(
      self, kernel, stride, padding, dilation, ceil_mode);
}

std::tuple<at::Tensor, at::Tensor> max_pool3d_with_indices(const at::Tensor& self, c10::IntArrayRef kernel,
                                                           c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                           c10::IntArrayRef dilation, bool ceil_mode) {
  try {
    Recorder r("aten::max_pool3d_with_indices");
    return max_pool_with_indices(r, self, 3, kernel, stride, padding, dilation, ceil_mode);
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::max_pool3d_with_indices>::call(
      self, kernel, stride, padding, dilation, ceil_mode);
}

// Each output gradient added at its max's index within its plane: one
// scatter-add into the planes laid end to end, the indices offset by
// their plane's start. Overlapping windows that share a max add up, as in
// LibTorch's kernel.
NodePtr max_pool_grad(Recorder& r, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& indices,
                      size_t spatial) {
  const ElementType t = float_dtype(self);
  if (grad_output.scalar_type() != self.scalar_type() || grad_output.sizes() != indices.sizes() ||
      self.dim() != grad_output.dim() || self.dim() < static_cast<int64_t>(spatial) + 1)
    throw NotLowered{};
  const int64_t lead = self.dim() - static_cast<int64_t>(spatial);
  int64_t planes = 1, plane = 1, per_plane = 1;
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (self.size(d) != grad_output.size(d) && d < lead) throw NotLowered{};
    (d < lead ? planes : plane) *= self.size(d);
    if (d >= lead) per_plane *= grad_output.size(d);
  }
  NodePtr g = r.reshape(r.convert(r.tensor(grad_output), t), {planes * per_plane});
  NodePtr idx = r.reshape(r.convert(r.tensor(indices), ElementType::kS64), {planes, per_plane});
  NodePtr start = r.binary(Binary::kMultiply, r.iota(ElementType::kS64, {planes, per_plane}, 0),
                           r.splat(static_cast<double>(plane), ElementType::kS64, {planes, per_plane}));
  NodePtr flat = r.reshape(r.binary(Binary::kAdd, idx, start), {planes * per_plane});
  NodePtr zeros = r.splat(0.0, t, {planes * plane});
  NodePtr summed = r.op("scatter_add_rows", {zeros, flat, g}, zeros->type(),
                        [](shlo::Function& f, const std::vector<shlo::Value>& in) {
                          return f.scatter_add_rows(in[0], in[1], in[2]);
                        });
  return r.reshape(summed, vec(self.sizes()));
}

at::Tensor max_pool2d_with_indices_backward(const at::Tensor& grad_output, const at::Tensor& self,
                                            c10::IntArrayRef kernel, c10::IntArrayRef stride, c10::IntArrayRef padding,
                                            c10::IntArrayRef dilation, bool ceil_mode, const at::Tensor& indices) {
  try {
    Recorder r("aten::max_pool2d_with_indices_backward");
    NodePtr value = max_pool_grad(r, grad_output, self, indices, 2);
    at::Tensor out = at::empty(self.sizes(), self.options());
    r.write(out, value);
    return out;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::max_pool2d_with_indices_backward>::call(
      grad_output, self, kernel, stride, padding, dilation, ceil_mode, indices);
}

at::Tensor max_pool3d_with_indices_backward(const at::Tensor& grad_output, const at::Tensor& self,
                                            c10::IntArrayRef kernel, c10::IntArrayRef stride, c10::IntArrayRef padding,
                                            c10::IntArrayRef dilation, bool ceil_mode, const at::Tensor& indices) {
  try {
    Recorder r("aten::max_pool3d_with_indices_backward");
    NodePtr value = max_pool_grad(r, grad_output, self, indices, 3);
    at::Tensor out = at::empty(self.sizes(), self.options());
    r.write(out, value);
    return out;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::max_pool3d_with_indices_backward>::call(
      grad_output, self, kernel, stride, padding, dilation, ceil_mode, indices);
}

// Max pooling's .out forms: the functional kernel's results (lowered, or
// from its own fallback) copied into the given tensors, resized as
// LibTorch resizes an out= argument.
template <auto Functional>
std::tuple<at::Tensor&, at::Tensor&> max_pool_out(const at::Tensor& self, c10::IntArrayRef kernel,
                                                  c10::IntArrayRef stride, c10::IntArrayRef padding,
                                                  c10::IntArrayRef dilation, bool ceil_mode, at::Tensor& out,
                                                  at::Tensor& indices) {
  const auto [values, where] = Functional(self, kernel, stride, padding, dilation, ceil_mode);
  at::native::resize_output(out, values.sizes());
  at::native::resize_output(indices, where.sizes());
  out.copy_(values);
  indices.copy_(where);
  return {out, indices};
}

template <auto Functional>
at::Tensor& max_pool_backward_out(const at::Tensor& grad_output, const at::Tensor& self, c10::IntArrayRef kernel,
                                  c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                                  bool ceil_mode, const at::Tensor& indices, at::Tensor& grad_input) {
  const at::Tensor value = Functional(grad_output, self, kernel, stride, padding, dilation, ceil_mode, indices);
  at::native::resize_output(grad_input, value.sizes());
  grad_input.copy_(value);
  return grad_input;
}

// Adaptive max pooling where each output cell covers in/out input cells
// (the output size divides the input's): max pooling with that window and
// stride. Other sizes, whose windows overlap unevenly, take the fallback.
// The backward is max pooling's, whatever the forward's sizes: the
// indices are flat within each plane either way.
std::tuple<at::Tensor&, at::Tensor&> adaptive_max_pool2d_out(const at::Tensor& self, c10::IntArrayRef output_size,
                                                             at::Tensor& out, at::Tensor& indices) {
  try {
    Recorder r("aten::adaptive_max_pool2d.out");
    if ((self.dim() != 3 && self.dim() != 4) || output_size.size() != 2) throw NotLowered{};
    std::vector<int64_t> window;
    for (size_t i = 0; i < 2; ++i) {
      const int64_t in = self.size(self.dim() - 2 + static_cast<int64_t>(i)), n = output_size[i];
      if (n < 1 || in % n != 0) throw NotLowered{};
      window.push_back(in / n);
    }
    if (out.scalar_type() != self.scalar_type() || indices.scalar_type() != at::kLong) throw NotLowered{};
    const auto [values, where] = max_pool_with_indices(r, self, 2, window, window, {0, 0}, {1, 1}, false);
    at::native::resize_output(out, values.sizes());
    at::native::resize_output(indices, where.sizes());
    out.copy_(values);
    indices.copy_(where);
    return {out, indices};
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::adaptive_max_pool2d_out>::call(self, output_size, out,
                                                                                              indices);
}

at::Tensor& adaptive_max_pool2d_backward_out(const at::Tensor& grad_output, const at::Tensor& self,
                                             const at::Tensor& indices, at::Tensor& grad_input) {
  try {
    Recorder r("aten::adaptive_max_pool2d_backward.grad_input");
    NodePtr value = max_pool_grad(r, grad_output, self, indices, 2);
    at::native::resize_output(grad_input, self.sizes());
    r.write(grad_input, value);
    return grad_input;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::adaptive_max_pool2d_backward_grad_input>::call(
      grad_output, self, indices, grad_input);
}

}  // namespace

void register_pool(torch::Library& library) {
  library.impl("max_pool2d_with_indices", TORCH_FN(max_pool2d_with_indices));
  library.impl("max_pool3d_with_indices", TORCH_FN(max_pool3d_with_indices));
  library.impl("max_pool2d_with_indices_backward", TORCH_FN(max_pool2d_with_indices_backward));
  library.impl("max_pool3d_with_indices_backward", TORCH_FN(max_pool3d_with_indices_backward));
  library.impl("max_pool2d_with_indices.out", TORCH_FN(max_pool_out<&max_pool2d_with_indices>));
  library.impl("max_pool3d_with_indices.out", TORCH_FN(max_pool_out<&max_pool3d_with_indices>));
  library.impl("max_pool2d_with_indices_backward.grad_input",
               TORCH_FN(max_pool_backward_out<&max_pool2d_with_indices_backward>));
  library.impl("max_pool3d_with_indices_backward.grad_input",
               TORCH_FN(max_pool_backward_out<&max_pool3d_with_indices_backward>));
  library.impl("adaptive_max_pool2d.out", TORCH_FN(adaptive_max_pool2d_out));
  library.impl("adaptive_max_pool2d_backward.grad_input", TORCH_FN(adaptive_max_pool2d_backward_out));
  library.impl("avg_pool2d", TORCH_FN(avg_pool2d));
  library.impl("avg_pool3d", TORCH_FN(avg_pool3d));
  library.impl("avg_pool2d_backward", TORCH_FN(avg_pool2d_backward));
  library.impl("avg_pool3d_backward", TORCH_FN(avg_pool3d_backward));
  library.impl("_adaptive_avg_pool2d", TORCH_FN(adaptive_avg_pool2d));
  library.impl("_adaptive_avg_pool3d", TORCH_FN(adaptive_avg_pool3d));
  library.impl("_adaptive_avg_pool2d_backward", TORCH_FN(adaptive_avg_pool2d_backward));
  library.impl("_adaptive_avg_pool3d_backward", TORCH_FN(adaptive_avg_pool3d_backward));
}

}  // namespace strata::xla::detail::lowering
