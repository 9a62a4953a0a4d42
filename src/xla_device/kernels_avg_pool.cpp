// Lowered kernels of average pooling (Note [What is lowered] in
// lowerings.cpp): average pooling (count_include_pad, ceil_mode,
// divisor_override) and its backward, adaptive average pooling and its
// backward, 1-d to 3-d. Each computes in the dtype LibTorch's CPU kernel
// computes in (f32 for bf16: Note [bf16 computes in f32] in lowering.h).
#include <ATen/ops/_adaptive_avg_pool2d.h>
#include <ATen/ops/_adaptive_avg_pool2d_backward.h>
#include <ATen/ops/_adaptive_avg_pool3d.h>
#include <ATen/ops/_adaptive_avg_pool3d_backward.h>
#include <ATen/ops/avg_pool2d.h>
#include <ATen/ops/avg_pool2d_backward.h>
#include <ATen/ops/avg_pool3d.h>
#include <ATen/ops/avg_pool3d_backward.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <limits>
#include <tuple>

#include "lowering.h"
#include "pooling.h"

namespace strata::xla::detail::lowering {
namespace {

// A 1-d constant of `values` (f32 counts or s64 indices) broadcast along
// dim `dim` of `dims`.
NodePtr along(Recorder& r, const std::vector<double>& values, ElementType dtype, const std::vector<int64_t>& dims,
              int64_t dim) {
  const shlo::Type type{dtype, {static_cast<int64_t>(values.size())}};
  NodePtr c = r.op("constant", {}, type, lazy::Attributes{}.add(type).add(values),
                   [type, values](shlo::Function& f, const std::vector<shlo::Value>&) {
                     return f.constant(type, values);
                   });
  return r.op("broadcast", {c}, {dtype, dims}, lazy::Attributes{}.add(dims).add(dim),
              [dims, dim](shlo::Function& f, const std::vector<shlo::Value>& in) {
                return f.broadcast_in_dim(in[0], dims, {dim});
              });
}

// What LibTorch divides each window's sum by: divisor_override, else the
// window's size clipped to the padded input (count_include_pad) or to the
// input; a product over the pooled dims, broadcast to `dims`.
NodePtr avg_divisor(Recorder& r, const Pool& p, ElementType t, const std::vector<int64_t>& dims,
                    bool count_include_pad, std::optional<int64_t> divisor_override) {
  if (divisor_override) {
    if (*divisor_override == 0) throw NotLowered{};
    return r.splat(static_cast<double>(*divisor_override), t, dims);
  }
  NodePtr divisor;
  for (size_t i = 0; i < p.spatial; ++i) {
    std::vector<double> counts;
    for (int64_t o = 0; o < p.out[i]; ++o) {
      int64_t start = o * p.stride[i] - p.padding[i];
      int64_t end = std::min(start + p.kernel[i], p.in[i] + p.padding[i]);
      if (!count_include_pad) {
        start = std::max<int64_t>(start, 0);
        end = std::min(end, p.in[i]);
      }
      counts.push_back(static_cast<double>(end - start));
    }
    NodePtr c = along(r, counts, t, dims, static_cast<int64_t>(p.lead + i));
    divisor = divisor ? r.binary(Binary::kMultiply, divisor, c) : c;
  }
  return divisor;
}

Window avg_window(const Pool& p) {
  Window w = window_of(p);
  w.window_dilations.clear();
  return w;
}

NodePtr avg_pool_value(Recorder& r, const at::Tensor& self, const Pool& p, bool count_include_pad,
                       std::optional<int64_t> divisor_override) {
  const ElementType t = float_dtype(self);
  const std::vector<int64_t> out = out_dims(self, p);
  NodePtr x = r.convert(r.tensor(self), t);
  const Window w = avg_window(p);
  NodePtr zero = r.constant(0.0, t);
  NodePtr sum = r.op("reduce_window_sum", {x, zero}, {t, out}, attributes_of(w),
                     [w](shlo::Function& f, const std::vector<shlo::Value>& in) {
                       return f.reduce_window(in[0], in[1], w, shlo::ReduceOp::kSum);
                     });
  return r.binary(Binary::kDivide, sum, avg_divisor(r, p, t, out, count_include_pad, divisor_override));
}

// The adjoint of a window sum: each output gradient (divided by its
// window's divisor) added to every input element of its window. The
// gradient dilated by the stride (base_dilations), padded by kernel - 1 -
// padding before and to the input's size after, summed over windows of
// the kernel's size at stride 1; the padding's own elements get nothing.
NodePtr avg_pool_grad(Recorder& r, const at::Tensor& grad_output, const at::Tensor& self, const Pool& p,
                      bool count_include_pad, std::optional<int64_t> divisor_override) {
  const ElementType t = float_dtype(self);
  const std::vector<int64_t> out = out_dims(self, p);
  if (grad_output.scalar_type() != self.scalar_type() || vec(grad_output.sizes()) != out) throw NotLowered{};
  NodePtr g = r.binary(Binary::kDivide, r.convert(r.tensor(grad_output), t),
                       avg_divisor(r, p, t, out, count_include_pad, divisor_override));
  Window w;
  w.dimensions = w.strides = w.base_dilations = std::vector<int64_t>(p.lead, 1);
  w.padding_low = w.padding_high = std::vector<int64_t>(p.lead, 0);
  for (size_t i = 0; i < p.spatial; ++i) {
    const int64_t low = p.kernel[i] - 1 - p.padding[i];
    w.dimensions.push_back(p.kernel[i]);
    w.strides.push_back(1);
    w.base_dilations.push_back(p.stride[i]);
    w.padding_low.push_back(low);
    w.padding_high.push_back(p.in[i] + p.kernel[i] - 2 - (p.out[i] - 1) * p.stride[i] - low);
    if (w.padding_high.back() < 0) throw NotLowered{};
  }
  NodePtr zero = r.constant(0.0, t);
  const std::vector<int64_t> dims = vec(self.sizes());
  return r.op("reduce_window_sum", {g, zero}, {t, dims}, attributes_of(w),
              [w](shlo::Function& f, const std::vector<shlo::Value>& in) {
                return f.reduce_window(in[0], in[1], w, shlo::ReduceOp::kSum);
              });
}

at::Tensor avg_pool(const char* op, const at::Tensor& self, size_t spatial, c10::IntArrayRef kernel,
                    c10::IntArrayRef stride, c10::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                    std::optional<int64_t> divisor_override) {
  Recorder r(op);
  const Pool p = pool_of(self, spatial, kernel, stride, padding, {1}, ceil_mode);
  NodePtr value = avg_pool_value(r, self, p, count_include_pad, divisor_override);
  at::Tensor out = at::empty(out_dims(self, p), self.options());
  r.write(out, value);
  return out;
}

at::Tensor avg_pool_backward(const char* op, const at::Tensor& grad_output, const at::Tensor& self, size_t spatial,
                             c10::IntArrayRef kernel, c10::IntArrayRef stride, c10::IntArrayRef padding,
                             bool ceil_mode, bool count_include_pad, std::optional<int64_t> divisor_override) {
  Recorder r(op);
  const Pool p = pool_of(self, spatial, kernel, stride, padding, {1}, ceil_mode);
  NodePtr value = avg_pool_grad(r, grad_output, self, p, count_include_pad, divisor_override);
  at::Tensor out = at::empty(self.sizes(), self.options());
  r.write(out, value);
  return out;
}


}  // namespace

at::Tensor avg_pool2d(const at::Tensor& self, c10::IntArrayRef kernel, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                      std::optional<int64_t> divisor_override) {
  try {
    return avg_pool("aten::avg_pool2d", self, 2, kernel, stride, padding, ceil_mode, count_include_pad,
                    divisor_override);
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::avg_pool2d>::call(
      self, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override);
}

at::Tensor avg_pool3d(const at::Tensor& self, c10::IntArrayRef kernel, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                      std::optional<int64_t> divisor_override) {
  try {
    return avg_pool("aten::avg_pool3d", self, 3, kernel, stride, padding, ceil_mode, count_include_pad,
                    divisor_override);
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::avg_pool3d>::call(
      self, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override);
}

at::Tensor avg_pool2d_backward(const at::Tensor& grad_output, const at::Tensor& self, c10::IntArrayRef kernel,
                               c10::IntArrayRef stride, c10::IntArrayRef padding, bool ceil_mode,
                               bool count_include_pad, std::optional<int64_t> divisor_override) {
  try {
    return avg_pool_backward("aten::avg_pool2d_backward", grad_output, self, 2, kernel, stride, padding, ceil_mode,
                             count_include_pad, divisor_override);
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::avg_pool2d_backward>::call(
      grad_output, self, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override);
}

at::Tensor avg_pool3d_backward(const at::Tensor& grad_output, const at::Tensor& self, c10::IntArrayRef kernel,
                               c10::IntArrayRef stride, c10::IntArrayRef padding, bool ceil_mode,
                               bool count_include_pad, std::optional<int64_t> divisor_override) {
  try {
    return avg_pool_backward("aten::avg_pool3d_backward", grad_output, self, 3, kernel, stride, padding, ceil_mode,
                             count_include_pad, divisor_override);
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::avg_pool3d_backward>::call(
      grad_output, self, kernel, stride, padding, ceil_mode, count_include_pad, divisor_override);
}

// ---- Adaptive average pooling -------------------------------------------------------

namespace {

// Note [Adaptive pooling as products]
// Output o of a dim of size I pooled to O averages the inputs
// [floor(o I / O), ceil((o + 1) I / O)); the windows differ in size, but
// the pooling is separable: per pooled dim, a product with the 0/1
// matrix M[o, i] = (i in window o), then a division by the product of the
// windows' sizes, as LibTorch divides each window's sum. The backward is
// the same products with M transposed, of the output gradient divided
// first.
std::vector<double> adaptive_matrix(int64_t in, int64_t out, bool transposed, std::vector<double>& sizes) {
  std::vector<double> m(static_cast<size_t>(in * out), 0.0);
  sizes.clear();
  for (int64_t o = 0; o < out; ++o) {
    const int64_t start = (o * in) / out, end = ((o + 1) * in + out - 1) / out;
    sizes.push_back(static_cast<double>(end - start));
    for (int64_t i = start; i < end; ++i) m[static_cast<size_t>(transposed ? i * out + o : o * in + i)] = 1.0;
  }
  return m;
}

// `x` ([lead..., spatial...]) with each pooled dim i (of size from[i])
// multiplied by its matrix to size to[i]; `transposed` for the backward.
NodePtr adaptive_products(Recorder& r, NodePtr x, size_t lead, const std::vector<int64_t>& from,
                          const std::vector<int64_t>& to, bool transposed, const std::vector<int64_t>& in_sizes,
                          const std::vector<int64_t>& out_sizes) {
  const ElementType t = x->type().dtype;
  const size_t n = from.size();
  // Each product contracts the last dim still pooled and appends the new
  // one; after all, the pooled dims are in reverse order.
  for (size_t k = n; k-- > 0;) {
    std::vector<double> sizes;
    const shlo::Type type{t, {to[k], from[k]}};
    const std::vector<double> values = adaptive_matrix(in_sizes[k], out_sizes[k], transposed, sizes);
    NodePtr m = r.op("constant", {}, type, lazy::Attributes{}.add(type).add(values),
                     [type, values](shlo::Function& f, const std::vector<shlo::Value>&) {
                       return f.constant(type, values);
                     });
    std::vector<int64_t> dims = x->type().dims;
    const int64_t contracted = static_cast<int64_t>(lead + k);
    dims.erase(dims.begin() + contracted);
    dims.push_back(to[k]);
    x = r.op("dot", {x, m}, {t, dims}, lazy::Attributes{}.add(contracted),
             [contracted](shlo::Function& f, const std::vector<shlo::Value>& in) {
               return f.dot_general(in[0], in[1], shlo::DotDims{{}, {}, {contracted}, {1}});
             });
  }
  std::vector<int64_t> perm;
  for (size_t d = 0; d < lead; ++d) perm.push_back(static_cast<int64_t>(d));
  for (size_t k = n; k-- > 0;) perm.push_back(static_cast<int64_t>(lead + k));
  return r.transpose(x, perm);
}

// The product over the pooled dims of each output's window size, of `dims`.
NodePtr adaptive_divisor(Recorder& r, size_t lead, const std::vector<int64_t>& in, const std::vector<int64_t>& out,
                         ElementType t, const std::vector<int64_t>& dims) {
  NodePtr divisor;
  for (size_t i = 0; i < in.size(); ++i) {
    std::vector<double> sizes;
    adaptive_matrix(in[i], out[i], false, sizes);
    NodePtr c = along(r, sizes, t, dims, static_cast<int64_t>(lead + i));
    divisor = divisor ? r.binary(Binary::kMultiply, divisor, c) : c;
  }
  return divisor;
}

at::Tensor adaptive_avg_pool(const char* op, const at::Tensor& self, c10::IntArrayRef output_size, size_t spatial) {
  Recorder r(op);
  const ElementType t = float_dtype(self);
  if (output_size.size() != spatial || (self.dim() != static_cast<int64_t>(spatial) + 1 &&
                                        self.dim() != static_cast<int64_t>(spatial) + 2))
    throw NotLowered{};
  const size_t lead = static_cast<size_t>(self.dim()) - spatial;
  const std::vector<int64_t> in(self.sizes().begin() + static_cast<int64_t>(lead), self.sizes().end());
  const std::vector<int64_t> out = vec(output_size);
  for (size_t i = 0; i < spatial; ++i)
    if (in[i] < 1 || out[i] < 1) throw NotLowered{};
  std::vector<int64_t> dims(self.sizes().begin(), self.sizes().begin() + static_cast<int64_t>(lead));
  dims.insert(dims.end(), out.begin(), out.end());
  NodePtr sums = adaptive_products(r, r.convert(r.tensor(self), t), lead, in, out, false, in, out);
  NodePtr value = r.binary(Binary::kDivide, sums, adaptive_divisor(r, lead, in, out, t, dims));
  at::Tensor result = at::empty(dims, self.options());
  r.write(result, value);
  return result;
}

at::Tensor adaptive_avg_pool_backward(const char* op, const at::Tensor& grad_output, const at::Tensor& self,
                                      size_t spatial) {
  Recorder r(op);
  const ElementType t = float_dtype(self);
  if (grad_output.scalar_type() != self.scalar_type() || grad_output.dim() != self.dim() ||
      self.dim() < static_cast<int64_t>(spatial) + 1)
    throw NotLowered{};
  const size_t lead = static_cast<size_t>(self.dim()) - spatial;
  const std::vector<int64_t> in(self.sizes().begin() + static_cast<int64_t>(lead), self.sizes().end());
  const std::vector<int64_t> out(grad_output.sizes().begin() + static_cast<int64_t>(lead), grad_output.sizes().end());
  NodePtr g = r.convert(r.tensor(grad_output), t);
  g = r.binary(Binary::kDivide, g, adaptive_divisor(r, lead, in, out, t, g->type().dims));
  NodePtr value = adaptive_products(r, g, lead, out, in, true, in, out);
  at::Tensor result = at::empty(self.sizes(), self.options());
  r.write(result, value);
  return result;
}

}  // namespace

at::Tensor adaptive_avg_pool2d(const at::Tensor& self, c10::IntArrayRef output_size) {
  try {
    return adaptive_avg_pool("aten::_adaptive_avg_pool2d", self, output_size, 2);
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::_adaptive_avg_pool2d>::call(
      self, output_size);
}

at::Tensor adaptive_avg_pool3d(const at::Tensor& self, c10::IntArrayRef output_size) {
  try {
    return adaptive_avg_pool("aten::_adaptive_avg_pool3d", self, output_size, 3);
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::_adaptive_avg_pool3d>::call(
      self, output_size);
}

at::Tensor adaptive_avg_pool2d_backward(const at::Tensor& grad_output, const at::Tensor& self) {
  try {
    return adaptive_avg_pool_backward("aten::_adaptive_avg_pool2d_backward", grad_output, self, 2);
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::_adaptive_avg_pool2d_backward>::call(grad_output,
                                                                                                   self);
}

at::Tensor adaptive_avg_pool3d_backward(const at::Tensor& grad_output, const at::Tensor& self) {
  try {
    return adaptive_avg_pool_backward("aten::_adaptive_avg_pool3d_backward", grad_output, self, 3);
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::_adaptive_avg_pool3d_backward>::call(grad_output,
                                                                                                   self);
}


}  // namespace strata::xla::detail::lowering
