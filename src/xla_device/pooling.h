// What the pooling kernels share (kernels_pool.cpp: max pooling;
// kernels_avg_pool.cpp: average and adaptive average pooling): the sizes of
// one pooling and its window. Internal to the xla device.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "lowering.h"

namespace strata::xla::detail::lowering {

using Window = shlo::Function::Window;

// The sizes of one pooling: `lead` leading dims (the batch and the
// channels, or the channels alone), then `spatial` pooled dims.
struct Pool {
  size_t lead = 0, spatial = 0;
  std::vector<int64_t> in, out, kernel, stride, padding, dilation;
};

// The pooling of `self` over its last `spatial` dims, as LibTorch sizes it
// (its pooling_output_shape). Throws NotLowered for what is not lowered.
Pool pool_of(const at::Tensor& self, size_t spatial, c10::IntArrayRef kernel, c10::IntArrayRef stride,
             c10::IntArrayRef padding, c10::IntArrayRef dilation, bool ceil_mode);

// The window over the whole operand: 1 over the leading dims, the pool's
// over the others, padded at the end so that the last window (ceil_mode)
// is there.
Window window_of(const Pool& p);

// The result's sizes: the leading dims, then the pooled ones.
std::vector<int64_t> out_dims(const at::Tensor& self, const Pool& p);

// The average pooling kernels (kernels_avg_pool.cpp), registered by
// register_pool with the max pooling ones: LibTorch's ops of these names.
at::Tensor avg_pool2d(const at::Tensor& self, c10::IntArrayRef kernel, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                      std::optional<int64_t> divisor_override);
at::Tensor avg_pool3d(const at::Tensor& self, c10::IntArrayRef kernel, c10::IntArrayRef stride,
                      c10::IntArrayRef padding, bool ceil_mode, bool count_include_pad,
                      std::optional<int64_t> divisor_override);
at::Tensor avg_pool2d_backward(const at::Tensor& grad_output, const at::Tensor& self, c10::IntArrayRef kernel,
                               c10::IntArrayRef stride, c10::IntArrayRef padding, bool ceil_mode,
                               bool count_include_pad, std::optional<int64_t> divisor_override);
at::Tensor avg_pool3d_backward(const at::Tensor& grad_output, const at::Tensor& self, c10::IntArrayRef kernel,
                               c10::IntArrayRef stride, c10::IntArrayRef padding, bool ceil_mode,
                               bool count_include_pad, std::optional<int64_t> divisor_override);
at::Tensor adaptive_avg_pool2d(const at::Tensor& self, c10::IntArrayRef output_size);
at::Tensor adaptive_avg_pool3d(const at::Tensor& self, c10::IntArrayRef output_size);
at::Tensor adaptive_avg_pool2d_backward(const at::Tensor& grad_output, const at::Tensor& self);
at::Tensor adaptive_avg_pool3d_backward(const at::Tensor& grad_output, const at::Tensor& self);

}  // namespace strata::xla::detail::lowering
