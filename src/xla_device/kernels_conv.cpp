// Lowered kernels of the convolutions: convolution_overrideable and
// convolution_backward_overrideable, where LibTorch sends the convolutions
// of a PrivateUse1 device (Note [What is lowered] in lowerings.cpp). 1-d,
// 2-d and 3-d, transposed, grouped, strided, dilated and padded, forward
// as one stablehlo.convolution and backward as the two transposes of it
// (Note [Convolution transposes]).
//
// Note [Convolutions on the host]
// The default kernels of the two overrideable ops throw ("You are likely
// triggering this with tensor backend other than CPU/CUDA/MKLDNN"), and
// the CPU fallback runs an op's CPU kernel, which for these is that
// default. So the ops get CPU kernels here that run LibTorch's own CPU
// convolution (at::convolution, at::convolution_backward): a call the
// lowering does not take falls back like any other op, counted and
// reported, and runs. CPU tensors never reach these ops themselves
// (LibTorch picks a CPU backend for them).
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/convolution_backward_overrideable.h>
#include <ATen/ops/convolution_overrideable.h>
#include <ATen/ops/empty.h>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

using ConvDims = shlo::Function::ConvDims;
using ConvWindow = shlo::Function::ConvWindow;

// A convolution's parameters, one entry per spatial dim.
struct ConvParams {
  size_t spatial = 0;
  std::vector<int64_t> stride, padding, dilation, output_padding;
  bool transposed = false;
  int64_t groups = 1;
};

std::vector<int64_t> expanded(c10::IntArrayRef values, size_t n) {
  if (values.size() == 1) return std::vector<int64_t>(n, values[0]);
  if (values.size() != n) throw NotLowered{};
  return vec(values);
}

ConvParams conv_params(const at::Tensor& weight, c10::IntArrayRef stride, c10::IntArrayRef padding,
                       c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding, int64_t groups) {
  if (weight.dim() < 3 || weight.dim() > 5 || groups < 1) throw NotLowered{};
  ConvParams p;
  p.spatial = static_cast<size_t>(weight.dim() - 2);
  p.stride = expanded(stride, p.spatial);
  p.padding = expanded(padding, p.spatial);
  p.dilation = expanded(dilation, p.spatial);
  p.output_padding = expanded(output_padding, p.spatial);
  p.transposed = transposed;
  p.groups = groups;
  for (size_t i = 0; i < p.spatial; ++i)
    if (p.stride[i] < 1 || p.dilation[i] < 1 || p.padding[i] < 0 || p.output_padding[i] < 0) throw NotLowered{};
  return p;
}

std::vector<int64_t> spatial_sizes(const NodePtr& x) {
  return {x->type().dims.begin() + 2, x->type().dims.end()};
}

// One stablehlo.convolution; the result's dims from the spec's rule.
NodePtr convolve(Recorder& r, const NodePtr& lhs, const NodePtr& rhs, const ConvDims& dims, const ConvWindow& w) {
  const auto& l = lhs->type().dims;
  const auto& k = rhs->type().dims;
  std::vector<int64_t> out(l.size());
  out[static_cast<size_t>(dims.output_batch)] = l[static_cast<size_t>(dims.input_batch)] / w.batch_group_count;
  out[static_cast<size_t>(dims.output_feature)] = k[static_cast<size_t>(dims.kernel_output_feature)];
  for (size_t i = 0; i < dims.input_spatial.size(); ++i) {
    const int64_t size = l[static_cast<size_t>(dims.input_spatial[i])];
    const int64_t base = (size - 1) * w.lhs_dilation[i] + 1 + w.padding_low[i] + w.padding_high[i];
    const int64_t span = (k[static_cast<size_t>(dims.kernel_spatial[i])] - 1) * w.rhs_dilation[i] + 1;
    if (size == 0 || base < span || w.padding_low[i] < 0 || w.padding_high[i] < 0) throw NotLowered{};
    out[static_cast<size_t>(dims.output_spatial[i])] = (base - span) / w.strides[i] + 1;
  }
  return r.op("convolution", {lhs, rhs}, {lhs->type().dtype, out},
              attributes_of(dims, w), [dims, w](shlo::Function& f, const std::vector<shlo::Value>& in) {
                return f.convolution(in[0], in[1], dims, w);
              });
}

ConvWindow unit_window(size_t n) {
  ConvWindow w;
  w.strides = w.lhs_dilation = w.rhs_dilation = std::vector<int64_t>(n, 1);
  w.padding_low = w.padding_high = std::vector<int64_t>(n, 0);
  return w;
}

// Note [Convolution transposes]
// With y[o] = sum_k x[o*s - p + k*d] w[k] along each spatial dim (stride
// s, padding p, dilation d, kernel size K, input size I, output size O),
// and the features split into g groups:
//  - forward: one convolution, PyTorch's layout;
//  - the input gradient: the output gradient dilated by s (lhs_dilation),
//    padded by d(K-1) - p before and by what makes I after, convolved at
//    stride 1 with the kernel flipped in space and its two feature dims
//    swapped within each group;
//  - the weight gradient: the input, with its batch and feature dims
//    swapped, convolved with the output gradient as the kernel (batch
//    contracted), at stride d with the kernel dilated by s, padded by p
//    before and by what makes K after; the groups become batch groups.
// A transposed convolution is the input gradient of the convolution with
// the same parameters (its forward), whose forward is then its input
// gradient and whose weight gradient swaps the roles of input and output.
// This is how XLA's and JAX's autodiff derive them.
NodePtr conv_forward(Recorder& r, const NodePtr& x, const NodePtr& w, const ConvParams& p) {
  ConvWindow win = unit_window(p.spatial);
  win.strides = p.stride;
  win.padding_low = win.padding_high = p.padding;
  win.rhs_dilation = p.dilation;
  win.feature_group_count = p.groups;
  return convolve(r, x, w, ConvDims::channels_first(static_cast<int64_t>(p.spatial)), win);
}

// The gradient of conv_forward(x, w) for x of spatial sizes `in` and
// `channels` features, from the output gradient `gy`.
NodePtr conv_input_grad(Recorder& r, const NodePtr& gy, const NodePtr& w, const ConvParams& p,
                        const std::vector<int64_t>& in) {
  const auto& k = w->type().dims;
  const int64_t g = p.groups, out_channels = k[0], group_in = k[1];
  if (out_channels % g != 0) throw NotLowered{};
  std::vector<int64_t> split = {g, out_channels / g, group_in};
  split.insert(split.end(), k.begin() + 2, k.end());
  std::vector<int64_t> perm = {0, 2, 1}, joined = {g * group_in, out_channels / g}, space;
  for (size_t i = 0; i < p.spatial; ++i) {
    perm.push_back(static_cast<int64_t>(3 + i));
    joined.push_back(k[2 + i]);
    space.push_back(static_cast<int64_t>(2 + i));
  }
  NodePtr swapped = r.reshape(r.transpose(r.reshape(w, split), perm), joined);
  NodePtr flipped = r.op("reverse", {swapped}, swapped->type(), lazy::Attributes{}.add(space),
                         [space](shlo::Function& f, const std::vector<shlo::Value>& v) {
                           return f.reverse(v[0], space);
                         });
  const std::vector<int64_t> out = spatial_sizes(gy);
  ConvWindow win = unit_window(p.spatial);
  win.lhs_dilation = p.stride;
  win.rhs_dilation = p.dilation;
  win.feature_group_count = g;
  // A padding wider than the kernel reaches (or an input tail no window
  // reads) would pad negatively: the convolution pads by 0 there and the
  // extra outputs are cut.
  std::vector<int64_t> cut_low(p.spatial, 0), cut_high(p.spatial, 0);
  for (size_t i = 0; i < p.spatial; ++i) {
    const int64_t span = p.dilation[i] * (k[2 + i] - 1);
    const int64_t low = span - p.padding[i];
    const int64_t high = in[i] - 1 - (out[i] - 1) * p.stride[i] - low + span;
    cut_low[i] = std::max<int64_t>(0, -low);
    cut_high[i] = std::max<int64_t>(0, -high);
    win.padding_low[i] = low + cut_low[i];
    win.padding_high[i] = high + cut_high[i];
  }
  NodePtr gx = convolve(r, gy, flipped, ConvDims::channels_first(static_cast<int64_t>(p.spatial)), win);
  std::vector<int64_t> start(gx->type().dims.size(), 0), limit = gx->type().dims;
  for (size_t i = 0; i < p.spatial; ++i) {
    start[2 + i] = cut_low[i];
    limit[2 + i] -= cut_high[i];
  }
  return r.slice(gx, start, limit);
}

// The gradient of conv_forward(x, w) with respect to w, of spatial sizes
// `kernel`, from the output gradient `gy`.
NodePtr conv_weight_grad(Recorder& r, const NodePtr& x, const NodePtr& gy, const ConvParams& p,
                         const std::vector<int64_t>& kernel) {
  ConvDims dims = ConvDims::channels_first(static_cast<int64_t>(p.spatial));
  dims.input_batch = 1;
  dims.input_feature = 0;
  dims.kernel_input_feature = 0;
  dims.kernel_output_feature = 1;
  dims.output_batch = 1;
  dims.output_feature = 0;
  const std::vector<int64_t> in = spatial_sizes(x), out = spatial_sizes(gy);
  ConvWindow win = unit_window(p.spatial);
  win.strides = p.dilation;
  win.rhs_dilation = p.stride;
  win.batch_group_count = p.groups;
  NodePtr lhs = x;
  std::vector<int64_t> limit = x->type().dims;
  for (size_t i = 0; i < p.spatial; ++i) {
    win.padding_low[i] = p.padding[i];
    win.padding_high[i] = p.dilation[i] * (kernel[i] - 1) + (out[i] - 1) * p.stride[i] + 1 - in[i] - p.padding[i];
    // Input elements past the last window (output_padding of a transposed
    // convolution) are cut rather than padded negatively.
    if (win.padding_high[i] < 0) {
      limit[2 + i] += win.padding_high[i];
      win.padding_high[i] = 0;
    }
  }
  if (limit != x->type().dims) lhs = r.slice(x, std::vector<int64_t>(limit.size(), 0), limit);
  return convolve(r, lhs, gy, dims, win);
}

// The spatial sizes of a transposed convolution's output.
std::vector<int64_t> transposed_sizes(const NodePtr& x, const NodePtr& w, const ConvParams& p) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < p.spatial; ++i)
    out.push_back((x->type().dims[2 + i] - 1) * p.stride[i] - 2 * p.padding[i] +
                  p.dilation[i] * (w->type().dims[2 + i] - 1) + p.output_padding[i] + 1);
  return out;
}

// The computation dtype of a convolution of `input` by `weight`, which
// LibTorch requires to share their dtype (and the bias too).
ElementType conv_dtype(const at::Tensor& input, const at::Tensor& weight, const at::Tensor* bias) {
  if (input.scalar_type() != weight.scalar_type() || (bias != nullptr && bias->scalar_type() != input.scalar_type()))
    throw NotLowered{};
  const ElementType t = element_type(input.scalar_type());
  if (!is_floating(t)) throw NotLowered{};
  return opmath(t);
}

at::Tensor convolution(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                       c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed,
                       c10::IntArrayRef output_padding, int64_t groups) {
  try {
    Recorder r("aten::convolution_overrideable");
    const bool has_bias = bias && bias->defined();
    const ElementType t = conv_dtype(input, weight, has_bias ? &*bias : nullptr);
    const ConvParams p = conv_params(weight, stride, padding, dilation, transposed, output_padding, groups);
    if (input.dim() != weight.dim()) throw NotLowered{};
    NodePtr x = r.convert(r.tensor(input), t), w = r.convert(r.tensor(weight), t);
    NodePtr y = transposed ? conv_input_grad(r, x, w, p, transposed_sizes(x, w, p)) : conv_forward(r, x, w, p);
    const std::vector<int64_t> dims = y->type().dims;
    if (has_bias) {
      if (bias->dim() != 1 || bias->size(0) != dims[1]) throw NotLowered{};
      NodePtr b = r.convert(r.tensor(*bias), t);
      NodePtr spread = r.op("broadcast", {b}, {t, dims}, lazy::Attributes{}.add(dims),
                            [dims](shlo::Function& f, const std::vector<shlo::Value>& in) {
                              return f.broadcast_in_dim(in[0], dims, {1});
                            });
      y = r.binary(Binary::kAdd, y, spread);
    }
    at::Tensor out = at::empty(dims, input.options());
    r.write(out, y);
    return out;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::convolution_overrideable>::call(
      input, weight, bias, stride, padding, dilation, transposed, output_padding, groups);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  try {
    Recorder r("aten::convolution_backward_overrideable");
    const ElementType t = conv_dtype(input, weight, &grad_output);
    const ConvParams p = conv_params(weight, stride, padding, dilation, transposed, output_padding, groups);
    if (input.dim() != weight.dim() || grad_output.dim() != weight.dim()) throw NotLowered{};
    NodePtr x = r.convert(r.tensor(input), t), w = r.convert(r.tensor(weight), t);
    NodePtr gy = r.convert(r.tensor(grad_output), t);
    const std::vector<int64_t> kernel = spatial_sizes(w);
    // Built first, written after: nothing is written if any part is not
    // lowered (the fallback then runs the whole call).
    NodePtr gx, gw, gb;
    if (output_mask[0]) gx = transposed ? conv_forward(r, gy, w, p) : conv_input_grad(r, gy, w, p, spatial_sizes(x));
    if (output_mask[1]) gw = transposed ? conv_weight_grad(r, gy, x, p, kernel) : conv_weight_grad(r, x, gy, p, kernel);
    if (output_mask[2]) {
      std::vector<int64_t> over = {0};
      for (size_t i = 0; i < p.spatial; ++i) over.push_back(static_cast<int64_t>(2 + i));
      gb = r.sum(gy, over);
    }
    if ((gx && gx->type().dims != vec(input.sizes())) || (gw && gw->type().dims != vec(weight.sizes())))
      throw NotLowered{};
    at::Tensor grad_input, grad_weight, grad_bias;
    if (gx) {
      grad_input = at::empty(input.sizes(), input.options());
      r.write(grad_input, gx);
    }
    if (gw) {
      grad_weight = at::empty(weight.sizes(), weight.options());
      r.write(grad_weight, gw);
    }
    if (gb) {
      grad_bias = at::empty(gb->type().dims, grad_output.options());
      r.write(grad_bias, gb);
    }
    return {grad_input, grad_weight, grad_bias};
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::convolution_backward_overrideable>::call(
      grad_output, input, weight, stride, padding, dilation, transposed, output_padding, groups, output_mask);
}

// Note [Convolutions on the host]: what the fallback runs.
at::Tensor convolution_on_host(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                               c10::IntArrayRef stride, c10::IntArrayRef padding, c10::IntArrayRef dilation,
                               bool transposed, c10::IntArrayRef output_padding, int64_t groups) {
  return at::convolution(input, weight, bias, stride, padding, dilation, transposed, output_padding, groups);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_on_host(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::IntArrayRef stride,
    c10::IntArrayRef padding, c10::IntArrayRef dilation, bool transposed, c10::IntArrayRef output_padding,
    int64_t groups, std::array<bool, 3> output_mask) {
  const std::vector<int64_t> bias_sizes = {grad_output.size(1)};
  return at::convolution_backward(grad_output, input, weight, bias_sizes, stride, padding, dilation, transposed,
                                  output_padding, groups, output_mask);
}

}  // namespace

// The pooling, padding and folding kernels (kernels_pool.cpp,
// kernels_pad.cpp, kernels_fold.cpp), registered with these.
void register_pool(torch::Library& library);
void register_pad(torch::Library& library);
void register_fold(torch::Library& library);

void register_conv(torch::Library& library) {
  library.impl("convolution_overrideable", TORCH_FN(convolution));
  library.impl("convolution_backward_overrideable", TORCH_FN(convolution_backward));
  // Note [Registered at init, not at load] (runtime.cpp).
  static auto* host = new torch::Library(torch::Library::IMPL, "aten", c10::DispatchKey::CPU, __FILE__, __LINE__);
  host->impl("convolution_overrideable", TORCH_FN(convolution_on_host));
  host->impl("convolution_backward_overrideable", TORCH_FN(convolution_backward_on_host));
  register_pool(library);
  register_pad(library);
  register_fold(library);
}

}  // namespace strata::xla::detail::lowering
