// Lowered kernels of batch norm (training, with the running statistics
// updated in place, and evaluation) and its backward, of group norm's
// backward and var_mean (group norm's forward is LibTorch's composite over
// var_mean; instance norm is batch norm of a reshaped input): Note [What is lowered] in
// lowerings.cpp. The formulas are those of LibTorch's CPU kernels
// (aten/src/ATen/native/Normalization.cpp, cpu/batch_norm_kernel.cpp,
// cpu/group_norm_kernel.cpp), in f32 for bf16 and f16 inputs (Note [bf16
// computes in f32] in lowering.h).
#include <ATen/ops/empty.h>
#include <ATen/ops/native_batch_norm.h>
#include <ATen/ops/native_batch_norm_backward.h>
#include <ATen/ops/native_group_norm_backward.h>
#include <ATen/ops/var_mean.h>

#include <algorithm>
#include <array>
#include <optional>
#include <tuple>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

bool given(const std::optional<at::Tensor>& t) { return t.has_value() && t->defined(); }

NodePtr mul(Recorder& r, const NodePtr& a, const NodePtr& b) { return r.binary(Binary::kMultiply, a, b); }
NodePtr add(Recorder& r, const NodePtr& a, const NodePtr& b) { return r.binary(Binary::kAdd, a, b); }
NodePtr sub(Recorder& r, const NodePtr& a, const NodePtr& b) { return r.binary(Binary::kSubtract, a, b); }
NodePtr times(Recorder& r, double k, const NodePtr& x) { return mul(r, r.splat(k, x->type().dtype, x->type().dims), x); }

// A per-channel value ([C]) broadcast along dim 1 of `dims`.
NodePtr per_channel(Recorder& r, const NodePtr& v, const std::vector<int64_t>& dims) {
  return r.op("broadcast", {v}, {v->type().dtype, dims}, lazy::Attributes{}.add(dims),
              [dims](shlo::Function& f, const std::vector<shlo::Value>& in) {
                return f.broadcast_in_dim(in[0], dims, {1});
              });
}

// The dims batch norm reduces over: all but the channels (dim 1).
std::vector<int64_t> batch_dims(int64_t rank) {
  std::vector<int64_t> d = {0};
  for (int64_t i = 2; i < rank; ++i) d.push_back(i);
  return d;
}

// A per-channel parameter in `t`, or `fill` where it is not given.
NodePtr parameter(Recorder& r, const std::optional<at::Tensor>& p, ElementType t, int64_t channels, double fill) {
  if (!given(p)) return r.splat(fill, t, {channels});
  if (p->dim() != 1 || p->size(0) != channels) throw NotLowered{};
  return r.convert(r.tensor(*p), t);
}

// As LibTorch's CPU kernel: the statistics are f32 for a bf16 or f16
// input whose parameters are f32 (mixed types), else the input's dtype.
at::ScalarType stat_type(const at::Tensor& input, const std::optional<at::Tensor>& weight) {
  const bool mixed = at::isReducedFloatingType(input.scalar_type()) && given(weight) &&
                     weight->scalar_type() == at::kFloat;
  return mixed ? at::kFloat : input.scalar_type();
}

// Note [Batch norm as LibTorch computes it]
// Training: mean and the biased variance over the batch dims (two passes,
// as the CPU's contiguous kernel), invstd = 1 / sqrt(var + eps); the
// output is x * alpha + beta with alpha = invstd * w, beta = b - mean *
// alpha; running_mean and running_var (the unbiased variance) move by
// momentum, written in place. Evaluation: the same transform from the
// running statistics, and empty saved statistics.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var, bool training,
    double momentum, double eps) {
  try {
    Recorder r("aten::native_batch_norm");
    const ElementType stored = element_type(input.scalar_type()), t = opmath(stored);
    if (t != ElementType::kF32 && t != ElementType::kF64) throw NotLowered{};
    if (input.dim() < 2) throw NotLowered{};
    const int64_t channels = input.size(1);
    const int64_t n = input.numel() / channels;
    const std::vector<int64_t> dims = vec(input.sizes());
    const std::vector<int64_t> reduced = batch_dims(input.dim());
    const bool update = given(running_mean) && given(running_var);
    if (given(running_mean) != given(running_var)) throw NotLowered{};
    if (!training && !update) throw NotLowered{};
    NodePtr x = r.convert(r.tensor(input), t);
    NodePtr mean, var, invstd;
    if (training) {
      if (n <= 1 && update) throw NotLowered{};  // LibTorch's own error
      mean = times(r, 1.0 / static_cast<double>(n), r.sum(x, reduced));
      NodePtr centred = sub(r, x, per_channel(r, mean, dims));
      var = times(r, 1.0 / static_cast<double>(n), r.sum(mul(r, centred, centred), reduced));
    } else {
      mean = parameter(r, running_mean, t, channels, 0.0);
      var = parameter(r, running_var, t, channels, 1.0);
    }
    invstd = r.unary("rsqrt", add(r, var, r.splat(eps, t, {channels})), &shlo::Function::rsqrt);
    NodePtr alpha = mul(r, invstd, parameter(r, weight, t, channels, 1.0));
    NodePtr beta = sub(r, parameter(r, bias, t, channels, 0.0), mul(r, mean, alpha));
    NodePtr y = add(r, mul(r, x, per_channel(r, alpha, dims)), per_channel(r, beta, dims));
    const at::ScalarType stats = stat_type(input, weight);
    at::Tensor out = at::empty(input.sizes(), input.options());
    at::Tensor save_mean = at::empty({training ? channels : 0}, input.options().dtype(stats));
    at::Tensor save_invstd = at::empty({training ? channels : 0}, input.options().dtype(stats));
    // The running statistics, read before anything is written.
    NodePtr new_mean, new_var;
    if (training && update) {
      const double m = momentum, unbias = static_cast<double>(n) / static_cast<double>(n - 1);
      NodePtr rm = r.convert(r.tensor(*running_mean), t), rv = r.convert(r.tensor(*running_var), t);
      new_mean = add(r, times(r, m, mean), times(r, 1.0 - m, rm));
      new_var = add(r, times(r, m * unbias, var), times(r, 1.0 - m, rv));
    }
    r.write(out, y);
    if (training) {
      r.write(save_mean, mean);
      r.write(save_invstd, invstd);
    }
    if (new_mean) {
      r.write(*running_mean, new_mean);
      r.write(*running_var, new_var);
    }
    return {out, save_mean, save_invstd};
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::native_batch_norm>::call(
      input, weight, bias, running_mean, running_var, training, momentum, eps);
}

// LibTorch's CPU backward: with s = sum(dy), dotp = sum((x - mean) * dy)
// over the batch dims, training gives dx = (dy - s / n - (x - mean) *
// dotp * invstd^2 / n) * invstd * w, evaluation dx = dy * invstd * w (the
// running statistics' invstd); dw = dotp * invstd, db = s.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const std::optional<at::Tensor>& weight,
    const std::optional<at::Tensor>& running_mean, const std::optional<at::Tensor>& running_var,
    const std::optional<at::Tensor>& save_mean, const std::optional<at::Tensor>& save_invstd, bool train, double eps,
    std::array<bool, 3> output_mask) {
  try {
    Recorder r("aten::native_batch_norm_backward");
    const ElementType t = opmath(element_type(input.scalar_type()));
    if ((t != ElementType::kF32 && t != ElementType::kF64) || input.dim() < 2) throw NotLowered{};
    if (grad_out.sizes() != input.sizes()) throw NotLowered{};
    const int64_t channels = input.size(1);
    const int64_t n = input.numel() / channels;
    const std::vector<int64_t> dims = vec(input.sizes());
    const std::vector<int64_t> reduced = batch_dims(input.dim());
    NodePtr mean, invstd;
    if (train) {
      if (!given(save_mean) || !given(save_invstd)) throw NotLowered{};
      mean = parameter(r, save_mean, t, channels, 0.0);
      invstd = parameter(r, save_invstd, t, channels, 1.0);
    } else {
      if (!given(running_mean) || !given(running_var)) throw NotLowered{};
      mean = parameter(r, running_mean, t, channels, 0.0);
      invstd = r.unary("rsqrt", add(r, parameter(r, running_var, t, channels, 1.0), r.splat(eps, t, {channels})),
                       &shlo::Function::rsqrt);
    }
    NodePtr x = r.convert(r.tensor(input), t), dy = r.convert(r.tensor(grad_out), t);
    NodePtr w = parameter(r, weight, t, channels, 1.0);
    NodePtr centred = sub(r, x, per_channel(r, mean, dims));
    NodePtr total = r.sum(dy, reduced);
    NodePtr dotp = r.sum(mul(r, centred, dy), reduced);
    at::Tensor dx, dw, db;
    if (output_mask[0]) {
      NodePtr scale = mul(r, invstd, w);
      NodePtr value;
      if (train) {
        const double inv_n = 1.0 / static_cast<double>(n);
        NodePtr k = times(r, inv_n, mul(r, mul(r, dotp, invstd), invstd));
        NodePtr grad_mean = times(r, inv_n, total);
        NodePtr inner = sub(r, sub(r, dy, per_channel(r, grad_mean, dims)), mul(r, centred, per_channel(r, k, dims)));
        value = mul(r, inner, per_channel(r, scale, dims));
      } else {
        value = mul(r, dy, per_channel(r, scale, dims));
      }
      dx = at::empty(input.sizes(), input.options());
      r.write(dx, value);
    }
    const at::TensorOptions param_options =
        given(weight) ? weight->options() : input.options().dtype(stat_type(input, weight));
    if (output_mask[1]) {
      dw = at::empty({channels}, param_options);
      r.write(dw, mul(r, dotp, invstd));
    }
    if (output_mask[2]) {
      db = at::empty({channels}, param_options);
      r.write(db, total);
    }
    return {dx, dw, db};
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::native_batch_norm_backward>::call(
      grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps, output_mask);
}

// Group norm's backward over x viewed [N, G, D, HxW] (D = C / G), as layer
// norm's over each (n, g): with xhat = (x - mean) * rstd and g = dy * w,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dw = sum(dy * xhat),
// db = sum(dy) over N and HxW.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_group_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, const at::Tensor& mean, const at::Tensor& rstd,
    const std::optional<at::Tensor>& weight, int64_t N, int64_t C, int64_t HxW, int64_t group,
    std::array<bool, 3> output_mask) {
  try {
    Recorder r("aten::native_group_norm_backward");
    const ElementType t = opmath(element_type(input.scalar_type()));
    if ((t != ElementType::kF32 && t != ElementType::kF64) || group <= 0 || C % group != 0) throw NotLowered{};
    if (input.numel() != N * C * HxW || grad_out.sizes() != input.sizes() || mean.numel() != N * group ||
        rstd.numel() != N * group)
      throw NotLowered{};
    const int64_t D = C / group;
    const std::vector<int64_t> dims = {N, group, D, HxW}, sums = {2, 3};
    auto stat = [&](const at::Tensor& s) {
      NodePtr v = r.reshape(r.convert(r.tensor(s), t), {N, group});
      return r.op("broadcast", {v}, {t, dims}, lazy::Attributes{}.add(dims),
                  [dims](shlo::Function& f, const std::vector<shlo::Value>& in) {
                    return f.broadcast_in_dim(in[0], dims, {0, 1});
                  });
    };
    NodePtr x = r.reshape(r.convert(r.tensor(input), t), dims), dy = r.reshape(r.convert(r.tensor(grad_out), t), dims);
    NodePtr s = stat(rstd);
    NodePtr xhat = mul(r, sub(r, x, stat(mean)), s);
    NodePtr g = dy;
    if (given(weight)) {
      NodePtr w = r.reshape(r.convert(r.tensor(*weight), t), {group, D});
      NodePtr spread = r.op("broadcast", {w}, {t, dims}, lazy::Attributes{}.add(dims),
                            [dims](shlo::Function& f, const std::vector<shlo::Value>& in) {
                              return f.broadcast_in_dim(in[0], dims, {1, 2});
                            });
      g = mul(r, dy, spread);
    }
    at::Tensor dx, dw, db;
    if (output_mask[0]) {
      const double inv = 1.0 / static_cast<double>(D * HxW);
      NodePtr mean_g = r.expand_back(times(r, inv, r.sum(g, sums)), dims, sums);
      NodePtr mean_gx = r.expand_back(times(r, inv, r.sum(mul(r, g, xhat), sums)), dims, sums);
      dx = at::empty(input.sizes(), input.options());
      r.write(dx, r.reshape(mul(r, s, sub(r, sub(r, g, mean_g), mul(r, xhat, mean_gx))), vec(input.sizes())));
    }
    const at::TensorOptions param_options = given(weight) ? weight->options() : input.options();
    if (output_mask[1]) {
      dw = at::empty({C}, param_options);
      r.write(dw, r.reshape(r.sum(mul(r, dy, xhat), {0, 3}), {C}));
    }
    if (output_mask[2]) {
      db = at::empty({C}, param_options);
      r.write(db, r.reshape(r.sum(dy, {0, 3}), {C}));
    }
    return {dx, dw, db};
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::native_group_norm_backward>::call(
      grad_out, input, mean, rstd, weight, N, C, HxW, group, output_mask);
}

// The variance and mean over `dim` (all dims when absent), written to
// fresh tensors: the mean of x, and the sum of (x - mean)^2 over
// n - correction (1 when not given), as group norm's composite and
// torch.var ask for them. Throws NotLowered where LibTorch's answer is inf
// or NaN (n <= correction): the fallback gives it.
std::tuple<at::Tensor, at::Tensor> moments(Recorder& r, const at::Tensor& self, at::OptionalIntArrayRef dim,
                                           const std::optional<at::Scalar>& correction, bool keepdim) {
  const ElementType stored = element_type(self.scalar_type()), t = opmath(stored);
  if ((t != ElementType::kF32 && t != ElementType::kF64) || self.numel() == 0) throw NotLowered{};
  const std::vector<int64_t> over = reduced_dims(self, dim), dims = vec(self.sizes());
  int64_t n = 1;
  for (int64_t d : over) n *= self.size(d);
  const double c = correction.has_value() ? correction->toDouble() : 1.0;
  if (static_cast<double>(n) - c <= 0) throw NotLowered{};
  std::vector<int64_t> out_dims;
  for (int64_t d = 0; d < self.dim(); ++d) {
    if (!std::binary_search(over.begin(), over.end(), d)) out_dims.push_back(self.size(d));
    else if (keepdim) out_dims.push_back(1);
  }
  NodePtr x = r.convert(r.tensor(self), t);
  NodePtr mean = times(r, 1.0 / static_cast<double>(n), r.sum(x, over));
  NodePtr centred = sub(r, x, r.expand_back(mean, dims, over));
  NodePtr var = times(r, 1.0 / (static_cast<double>(n) - c), r.sum(mul(r, centred, centred), over));
  at::Tensor out_var = at::empty(out_dims, self.options()), out_mean = at::empty(out_dims, self.options());
  r.write(out_var, r.reshape(var, out_dims));
  r.write(out_mean, r.reshape(mean, out_dims));
  return {out_var, out_mean};
}

std::tuple<at::Tensor, at::Tensor> var_mean(const at::Tensor& self, at::OptionalIntArrayRef dim,
                                            const std::optional<at::Scalar>& correction, bool keepdim) {
  try {
    Recorder r("aten::var_mean.correction");
    return moments(r, self, dim, correction, keepdim);
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::var_mean_correction>::call(self, dim, correction,
                                                                                          keepdim);
}

at::Tensor var(const at::Tensor& self, at::OptionalIntArrayRef dim, const std::optional<at::Scalar>& correction,
               bool keepdim) {
  try {
    Recorder r("aten::var.correction");
    return std::get<0>(moments(r, self, dim, correction, keepdim));
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::var_correction>::call(self, dim, correction, keepdim);
}

// The functional batch norms export and the decompositions use: the same
// kernel as native_batch_norm, with the running statistics given (updated
// in place) or absent.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm_legit(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    at::Tensor& running_mean, at::Tensor& running_var, bool training, double momentum, double eps) {
  return lowering::native_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_batch_norm_legit_no_stats(
    const at::Tensor& input, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    bool training, double momentum, double eps) {
  return lowering::native_batch_norm(input, weight, bias, std::nullopt, std::nullopt, training, momentum, eps);
}

}  // namespace

void register_norm(torch::Library& library) {
  library.impl("var_mean.correction", TORCH_FN(var_mean));
  library.impl("var.correction", TORCH_FN(var));
  library.impl("_native_batch_norm_legit", TORCH_FN(native_batch_norm_legit));
  library.impl("_native_batch_norm_legit.no_stats", TORCH_FN(native_batch_norm_legit_no_stats));
  library.impl("native_batch_norm", TORCH_FN(native_batch_norm));
  library.impl("native_batch_norm_backward", TORCH_FN(native_batch_norm_backward));
  library.impl("native_group_norm_backward", TORCH_FN(native_group_norm_backward));
}

}  // namespace strata::xla::detail::lowering
