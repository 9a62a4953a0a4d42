// Lowered kernels of the nn ops the example GPT reaches: softmax and log
// softmax, gelu (erf and tanh forms), layer norm, the negative log
// likelihood loss, norms, pow and clamp, forward and backward (Note [What is
// lowered] in lowerings.cpp). Each computes in the dtype LibTorch's kernel
// computes in; the formulas follow LibTorch's CPU kernels, so only the
// order of the sums differs (the tolerances in tests/xla_device say where).
#include <ATen/ops/_log_softmax.h>
#include <ATen/ops/_softmax.h>
#include <ATen/ops/abs.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/native_layer_norm.h>
#include <ATen/ops/native_layer_norm_backward.h>
#include <ATen/ops/nll_loss_backward.h>
#include <ATen/ops/nll_loss_forward.h>
#include <ATen/ops/norm.h>
#include <ATen/ops/pow.h>

#include <cmath>
#include <limits>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

using Direction = shlo::Direction;
using ReduceOp = shlo::ReduceOp;

std::vector<int64_t> one_dim(const at::Tensor& t, int64_t dim) { return {c10::maybe_wrap_dim(dim, t.dim())}; }

// Note [Softmax in f32]: like LibTorch's CPU kernel, x - max(x) before the
// exponential, the sum accumulated in the computation dtype (f32 for a
// bf16 softmax, which rounds once at the end: Note [bf16 computes in f32]
// in lowering.h).
NodePtr softmax_of(Recorder& r, const NodePtr& x, const std::vector<int64_t>& d, bool log) {
  const auto& dims = x->type().dims;
  const ElementType t = x->type().dtype;
  NodePtr shifted = r.binary(Binary::kSubtract, x,
                             r.expand_back(r.reduce(x, d, ReduceOp::kMax, -std::numeric_limits<double>::infinity()), dims, d));
  NodePtr e = r.unary("exponential", shifted, &shlo::Function::exponential);
  NodePtr total = r.sum(e, d);
  if (!log) {
    // Over the last dim LibTorch multiplies by the sum's reciprocal.
    if (d.size() == 1 && d[0] + 1 == static_cast<int64_t>(dims.size()))
      return r.binary(Binary::kMultiply, e,
                      r.expand_back(r.binary(Binary::kDivide, r.splat(1.0, t, total->type().dims), total), dims, d));
    return r.binary(Binary::kDivide, e, r.expand_back(total, dims, d));
  }
  total = r.expand_back(total, dims, d);
  return r.binary(Binary::kSubtract, shifted, r.unary("log", total, &shlo::Function::log));
}

at::Tensor& softmax_out(const at::Tensor& self, int64_t dim, bool half_to_float, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::_softmax(meta(self), dim, half_to_float); }, &out);
    if (!is_floating(res.dtype) || self.dim() == 0) throw NotLowered{};
    r.write(out, softmax_of(r, r.convert(r.tensor(self), res.dtype), one_dim(self, dim), false));
  };
  STRATA_LOWER("aten::_softmax.out", _softmax_out, self, dim, half_to_float, out);
}

at::Tensor& log_softmax_out(const at::Tensor& self, int64_t dim, bool half_to_float, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::_log_softmax(meta(self), dim, half_to_float); }, &out);
    if (!is_floating(res.dtype) || self.dim() == 0) throw NotLowered{};
    r.write(out, softmax_of(r, r.convert(r.tensor(self), res.dtype), one_dim(self, dim), true));
  };
  STRATA_LOWER("aten::_log_softmax.out", _log_softmax_out, self, dim, half_to_float, out);
}

// output * (g - sum(g * output)) over dim; bf16 in f32, rounded once (Note
// [bf16 computes in f32] in lowering.h), as LibTorch's vectorised kernel.
at::Tensor& softmax_backward_out(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                                 at::ScalarType input_dtype, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    if (grad_output.scalar_type() != output.scalar_type() || grad_output.sizes() != output.sizes() || output.dim() == 0)
      throw NotLowered{};
    const ElementType t = opmath(element_type(output.scalar_type()));
    if (!is_floating(t)) throw NotLowered{};
    const auto d = one_dim(output, dim);
    NodePtr g = r.convert(r.tensor(grad_output), t), y = r.convert(r.tensor(output), t);
    NodePtr dot = r.expand_back(r.sum(r.binary(Binary::kMultiply, g, y), d), y->type().dims, d);
    r.write(out, r.binary(Binary::kMultiply, y, r.binary(Binary::kSubtract, g, dot)));
  };
  STRATA_LOWER("aten::_softmax_backward_data.out", _softmax_backward_data_out, grad_output, output, dim, input_dtype,
               out);
}

// g - exp(output) * sum(g) over dim; bf16 in f32, rounded once.
at::Tensor& log_softmax_backward_out(const at::Tensor& grad_output, const at::Tensor& output, int64_t dim,
                                     at::ScalarType input_dtype, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    if (grad_output.scalar_type() != output.scalar_type() || grad_output.sizes() != output.sizes() || output.dim() == 0)
      throw NotLowered{};
    const ElementType t = opmath(element_type(output.scalar_type()));
    if (!is_floating(t)) throw NotLowered{};
    const auto d = one_dim(output, dim);
    NodePtr g = r.convert(r.tensor(grad_output), t), y = r.convert(r.tensor(output), t);
    NodePtr total = r.expand_back(r.sum(g, d), y->type().dims, d);
    NodePtr p = r.unary("exponential", y, &shlo::Function::exponential);
    r.write(out, r.binary(Binary::kSubtract, g, r.binary(Binary::kMultiply, p, total)));
  };
  STRATA_LOWER("aten::_log_softmax_backward_data.out", _log_softmax_backward_data_out, grad_output, output, dim,
               input_dtype, out);
}

constexpr double kSqrt1_2 = 0.70710678118654752440;
constexpr double kBeta = 0.79788456080286535588;  // sqrt(2 / pi)
constexpr double kKappa = 0.044715;

NodePtr mul(Recorder& r, const NodePtr& a, const NodePtr& b) { return r.binary(Binary::kMultiply, a, b); }
NodePtr add(Recorder& r, const NodePtr& a, const NodePtr& b) { return r.binary(Binary::kAdd, a, b); }
NodePtr times(Recorder& r, double k, const NodePtr& x) {
  return mul(r, r.splat(k, x->type().dtype, x->type().dims), x);
}
NodePtr plus(Recorder& r, double k, const NodePtr& x) { return add(r, r.splat(k, x->type().dtype, x->type().dims), x); }

at::Tensor& gelu_out(const at::Tensor& self, c10::string_view approximate, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::gelu(meta(self), approximate); }, &out);
    if (!is_floating(res.dtype)) throw NotLowered{};
    NodePtr x = r.convert(r.tensor(self), opmath(res.dtype));
    NodePtr inner;
    if (approximate == "none") {
      inner = r.unary("erf", times(r, kSqrt1_2, x), &shlo::Function::erf);
    } else if (approximate == "tanh") {
      NodePtr cube = mul(r, mul(r, x, x), x);
      inner = r.unary("tanh", times(r, kBeta, add(r, x, times(r, kKappa, cube))), &shlo::Function::tanh);
    } else {
      throw NotLowered{};
    }
    r.write(out, mul(r, times(r, 0.5, x), plus(r, 1.0, inner)));
  };
  STRATA_LOWER("aten::gelu.out", gelu_out, self, approximate, out);
}

at::Tensor& gelu_backward_out(const at::Tensor& grad_output, const at::Tensor& self, c10::string_view approximate,
                              at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    if (grad_output.scalar_type() != self.scalar_type() || grad_output.sizes() != self.sizes()) throw NotLowered{};
    const ElementType t = element_type(self.scalar_type());
    if (!is_floating(t)) throw NotLowered{};
    NodePtr x = r.convert(r.tensor(self), opmath(t)), g = r.convert(r.tensor(grad_output), opmath(t));
    NodePtr derivative;
    if (approximate == "none") {
      // cdf + x * pdf, pdf = exp(-x^2 / 2) / sqrt(2 pi).
      NodePtr cdf = times(r, 0.5, plus(r, 1.0, r.unary("erf", times(r, kSqrt1_2, x), &shlo::Function::erf)));
      NodePtr pdf = times(r, 0.5 * kBeta, r.unary("exponential", times(r, -0.5, mul(r, x, x)),
                                                       &shlo::Function::exponential));
      derivative = add(r, cdf, mul(r, x, pdf));
    } else if (approximate == "tanh") {
      NodePtr x2 = mul(r, x, x);
      NodePtr inner = times(r, kBeta, add(r, x, times(r, kKappa, mul(r, x2, x))));
      NodePtr th = r.unary("tanh", inner, &shlo::Function::tanh);
      NodePtr left = times(r, 0.5, x);
      NodePtr right = plus(r, 1.0, th);
      NodePtr left_d = times(r, 0.5, right);
      NodePtr sech2 = plus(r, 1.0, r.unary("negate", mul(r, th, th), &shlo::Function::negate));
      NodePtr inner_d = times(r, kBeta, plus(r, 1.0, times(r, 3.0 * kKappa, x2)));
      derivative = add(r, left_d, mul(r, left, mul(r, sech2, inner_d)));
    } else {
      throw NotLowered{};
    }
    r.write(out, mul(r, g, derivative));
  };
  STRATA_LOWER("aten::gelu_backward.grad_input", gelu_backward_grad_input, grad_output, self, approximate, out);
}

// The dims layer norm normalises over (the last len(normalized_shape)).
std::vector<int64_t> norm_dims(const at::Tensor& input, c10::IntArrayRef normalized_shape) {
  const int64_t k = static_cast<int64_t>(normalized_shape.size());
  if (k == 0 || k > input.dim()) throw NotLowered{};
  if (input.sizes().slice(static_cast<size_t>(input.dim() - k)) != normalized_shape) throw NotLowered{};
  std::vector<int64_t> d;
  for (int64_t i = input.dim() - k; i < input.dim(); ++i) d.push_back(i);
  return d;
}

// The shape of mean and rstd: the input's, 1 over the normalised dims.
std::vector<int64_t> stat_dims(const at::Tensor& input, const std::vector<int64_t>& d) {
  std::vector<int64_t> s = vec(input.sizes());
  for (int64_t i : d) s[static_cast<size_t>(i)] = 1;
  return s;
}

// An affine parameter broadcast over the batch dims, in `dtype`.
NodePtr affine(Recorder& r, const at::Tensor& p, ElementType dtype, const std::vector<int64_t>& dims) {
  return r.broadcast(r.convert(r.tensor(p), dtype), dims);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm(const at::Tensor& input,
                                                                 c10::IntArrayRef normalized_shape,
                                                                 const std::optional<at::Tensor>& weight,
                                                                 const std::optional<at::Tensor>& bias, double eps) {
  try {
    Recorder r("aten::native_layer_norm");
    const ElementType t = element_type(input.scalar_type());
    if (!is_floating(t)) throw NotLowered{};
    const ElementType acc = opmath(t);
    const auto d = norm_dims(input, normalized_shape);
    const std::vector<int64_t> dims = vec(input.sizes());
    int64_t n = 1;
    for (int64_t i : d) n *= input.size(i);
    NodePtr x = r.convert(r.tensor(input), acc);
    NodePtr mean = times(r, 1.0 / static_cast<double>(n), r.sum(x, d));
    NodePtr centred = r.binary(Binary::kSubtract, x, r.expand_back(mean, dims, d));
    NodePtr var = times(r, 1.0 / static_cast<double>(n), r.sum(mul(r, centred, centred), d));
    NodePtr rstd = r.unary("rsqrt", plus(r, eps, var), &shlo::Function::rsqrt);
    NodePtr y = mul(r, centred, r.expand_back(rstd, dims, d));
    if (weight && weight->defined()) y = mul(r, y, affine(r, *weight, acc, dims));
    if (bias && bias->defined()) y = add(r, y, affine(r, *bias, acc, dims));
    const auto stats = stat_dims(input, d);
    // As LibTorch's CPU kernel (param_scalar_type): the statistics are f32
    // for a bf16 input with f32 affine parameters (autocast's mixed case),
    // else in the input's dtype, rounded from the f32 accumulators.
    const bool mixed = reduced_float(t) && ((weight && weight->defined() && weight->scalar_type() == at::kFloat) ||
                                            (bias && bias->defined() && bias->scalar_type() == at::kFloat));
    const at::ScalarType stat_type = mixed ? at::kFloat : input.scalar_type();
    at::Tensor out = at::empty(input.sizes(), input.options());
    at::Tensor out_mean = at::empty(stats, input.options().dtype(stat_type));
    at::Tensor out_rstd = at::empty(stats, input.options().dtype(stat_type));
    if (acc != ElementType::kF32) throw NotLowered{};
    r.write(out, y);
    r.write(out_mean, r.reshape(mean, stats));
    r.write(out_rstd, r.reshape(rstd, stats));
    return {out, out_mean, out_rstd};
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::native_layer_norm>::call(
      input, normalized_shape, weight, bias, eps);
}

// LibTorch's formulas (layer_norm_kernel.cpp): with xhat = (x - mean) * rstd
// and g = dy * w, dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
// dw = sum(dy * xhat), db = sum(dy) over the batch dims.
std::tuple<at::Tensor, at::Tensor, at::Tensor> native_layer_norm_backward(
    const at::Tensor& grad_out, const at::Tensor& input, c10::IntArrayRef normalized_shape, const at::Tensor& mean,
    const at::Tensor& rstd, const std::optional<at::Tensor>& weight, const std::optional<at::Tensor>& bias,
    std::array<bool, 3> output_mask) {
  try {
    Recorder r("aten::native_layer_norm_backward");
    // bf16 computes in f32 and rounds each result once (Note [bf16
    // computes in f32] in lowering.h), as LibTorch's kernel does.
    const ElementType t = opmath(element_type(input.scalar_type()));
    if (t != ElementType::kF32 || grad_out.scalar_type() != input.scalar_type() || grad_out.sizes() != input.sizes())
      throw NotLowered{};
    const auto d = norm_dims(input, normalized_shape);
    const std::vector<int64_t> dims = vec(input.sizes());
    std::vector<int64_t> batch;
    for (int64_t i = 0; i < input.dim() - static_cast<int64_t>(d.size()); ++i) batch.push_back(i);
    int64_t n = 1;
    for (int64_t i : d) n *= input.size(i);
    NodePtr x = r.convert(r.tensor(input), t), dy = r.convert(r.tensor(grad_out), t);
    NodePtr m = r.broadcast(r.convert(r.tensor(mean), t), dims), s = r.broadcast(r.convert(r.tensor(rstd), t), dims);
    NodePtr xhat = mul(r, r.binary(Binary::kSubtract, x, m), s);
    const bool has_weight = weight && weight->defined();
    NodePtr g = has_weight ? mul(r, dy, affine(r, *weight, t, dims)) : dy;
    at::Tensor dx, dw, db;
    if (output_mask[0]) {
      const double inv = 1.0 / static_cast<double>(n);
      NodePtr mean_g = r.expand_back(times(r, inv, r.sum(g, d)), dims, d);
      NodePtr mean_gx = r.expand_back(times(r, inv, r.sum(mul(r, g, xhat), d)), dims, d);
      NodePtr inner = r.binary(Binary::kSubtract, r.binary(Binary::kSubtract, g, mean_g), mul(r, xhat, mean_gx));
      dx = at::empty(input.sizes(), input.options());
      r.write(dx, mul(r, s, inner));
    }
    if (output_mask[1] && has_weight) {
      dw = at::empty(weight->sizes(), weight->options());
      r.write(dw, r.reshape(r.sum(mul(r, dy, xhat), batch), vec(weight->sizes())));
    }
    if (output_mask[2] && bias && bias->defined()) {
      db = at::empty(bias->sizes(), bias->options());
      r.write(db, r.reshape(r.sum(dy, batch), vec(bias->sizes())));
    }
    return {dx, dw, db};
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::native_layer_norm_backward>::call(
      grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask);
}

// Per row of `self` ([N, C] or [C]): the one-hot of target, the weight of
// each target (0 where ignored).
struct Picked {
  NodePtr onehot;     // pred, self's shape
  NodePtr weight;     // self's dtype, target's shape
};

Picked pick(Recorder& r, const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight,
            int64_t ignore_index) {
  if (self.dim() != 2 || target.dim() != 1 || target.size(0) != self.size(0)) throw NotLowered{};
  const ElementType t = opmath(element_type(self.scalar_type()));
  const std::vector<int64_t> dims = vec(self.sizes()), rows = {self.size(0)};
  NodePtr tgt = r.convert(r.tensor(target), ElementType::kS64);
  NodePtr tgt2 = r.op("broadcast", {tgt}, {ElementType::kS64, dims}, lazy::Attributes{}.add(dims),
                      [dims](shlo::Function& f, const std::vector<shlo::Value>& in) {
                        return f.broadcast_in_dim(in[0], dims, {0});
                      });
  NodePtr onehot = r.compare(r.iota(ElementType::kS64, dims, 1), tgt2, Direction::kEQ);
  NodePtr w = r.splat(1.0, t, rows);
  if (weight && weight->defined()) {
    NodePtr cw = r.broadcast(r.convert(r.tensor(*weight), t), dims);
    w = r.sum(r.select(onehot, cw, r.splat(0.0, t, dims)), {1});
  }
  NodePtr keep = r.compare(tgt, r.splat(static_cast<double>(ignore_index), ElementType::kS64, rows), Direction::kNE);
  return {onehot, r.select(keep, w, r.splat(0.0, t, rows))};
}

std::tuple<at::Tensor&, at::Tensor&> nll_loss_forward_out(const at::Tensor& self, const at::Tensor& target,
                                                          const std::optional<at::Tensor>& weight, int64_t reduction,
                                                          int64_t ignore_index, at::Tensor& output,
                                                          at::Tensor& total_weight) {
  try {
    Recorder r("aten::nll_loss_forward.output");
    const ElementType t = opmath(element_type(self.scalar_type()));
    if (!is_floating(t) || output.scalar_type() != self.scalar_type()) throw NotLowered{};
    const Picked p = pick(r, self, target, weight, ignore_index);
    NodePtr x = r.convert(r.tensor(self), t);
    NodePtr picked = r.sum(r.select(p.onehot, x, r.splat(0.0, t, x->type().dims)), {1});
    NodePtr losses = r.unary("negate", mul(r, picked, p.weight), &shlo::Function::negate);
    NodePtr total = r.sum(p.weight, {0});
    if (reduction == 0) {
      r.write(output, losses);
    } else if (reduction == 1) {
      r.write(output, r.binary(Binary::kDivide, r.sum(losses, {0}), total));
    } else if (reduction == 2) {
      r.write(output, r.sum(losses, {0}));
    } else {
      throw NotLowered{};
    }
    r.write(total_weight, total);
    return {output, total_weight};
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::nll_loss_forward_output>::call(
      self, target, weight, reduction, ignore_index, output, total_weight);
}

at::Tensor& nll_loss_backward_out(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
                                  const std::optional<at::Tensor>& weight, int64_t reduction, int64_t ignore_index,
                                  const at::Tensor& total_weight, at::Tensor& out) {
  try {
    Recorder r("aten::nll_loss_backward.grad_input");
    const ElementType t = opmath(element_type(self.scalar_type()));
    if (!is_floating(t) || reduction < 0 || reduction > 2) throw NotLowered{};
    const Picked p = pick(r, self, target, weight, ignore_index);
    const std::vector<int64_t> dims = vec(self.sizes()), rows = {self.size(0)};
    NodePtr g = r.convert(r.tensor(grad_output), t);
    g = reduction == 0 ? g : r.broadcast(r.reshape(g, {}), rows);
    NodePtr per_row = r.unary("negate", mul(r, p.weight, g), &shlo::Function::negate);
    if (reduction == 1)
      per_row = r.binary(Binary::kDivide, per_row, r.broadcast(r.reshape(r.convert(r.tensor(total_weight), t), {}), rows));
    NodePtr spread = r.op("broadcast", {per_row}, {t, dims}, lazy::Attributes{}.add(dims),
                          [dims](shlo::Function& f, const std::vector<shlo::Value>& in) {
                            return f.broadcast_in_dim(in[0], dims, {0});
                          });
    r.write(out, r.select(p.onehot, spread, r.splat(0.0, t, dims)));
    return out;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::nll_loss_backward_grad_input>::call(
      grad_output, self, target, weight, reduction, ignore_index, total_weight, out);
}

// The 2-norm (sqrt of the sum of squares) and the inf-norm (max |x|).
at::Tensor& norm_out(const at::Tensor& self, const std::optional<at::Scalar>& p, at::IntArrayRef dim, bool keepdim,
                     at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::norm(meta(self), p, dim, keepdim); }, &out);
    if (!is_floating(res.dtype)) throw NotLowered{};
    const double order = p ? p->toDouble() : 2.0;
    const auto d = reduced_dims(self, dim);
    NodePtr x = r.convert(r.tensor(self), res.dtype);
    NodePtr value;
    if (order == 2.0) {
      value = r.unary("sqrt", r.sum(mul(r, x, x), d), &shlo::Function::sqrt);
    } else if (std::isinf(order) && order > 0) {
      value = r.reduce(r.unary("abs", x, &shlo::Function::abs), d, ReduceOp::kMax, 0.0);
    } else {
      throw NotLowered{};
    }
    r.write(out, r.reshape(value, res.dims));
  };
  STRATA_LOWER("aten::norm.out", norm_out, self, p, dim, keepdim, out);
}

at::Tensor& clamp_out(const at::Tensor& self, const std::optional<at::Scalar>& min, const std::optional<at::Scalar>& max,
                      at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::clamp(meta(self), min, max); }, &out);
    if (res.dtype == ElementType::kPred) throw NotLowered{};
    NodePtr x = r.convert(r.tensor(self), res.dtype);
    // Like LibTorch: min(max(x, lo), hi), so hi wins where lo > hi.
    if (min) x = r.binary(Binary::kMaximum, x, r.broadcast(r.scalar(*min, res.dtype), res.dims));
    if (max) x = r.binary(Binary::kMinimum, x, r.broadcast(r.scalar(*max, res.dtype), res.dims));
    r.write(out, x);
  };
  STRATA_LOWER("aten::clamp.out", clamp_out, self, min, max, out);
}

// x ** exponent, the exponent baked in (it is structural, as in a norm).
// The exponents LibTorch's CPU kernel special-cases (2, 3, 0.5, -0.5, -1,
// -2) are computed as it does, so the results match it to the bit; any
// other takes XLA's power.
at::Tensor& pow_out(const at::Tensor& self, const at::Scalar& exponent, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::pow(meta(self), exponent); }, &out);
    if (exponent.isComplex() || res.dtype == ElementType::kPred) throw NotLowered{};
    const double e = exponent.toDouble();
    NodePtr x = r.convert(r.tensor(self), res.dtype);
    const bool floating = is_floating(res.dtype);
    auto reciprocal = [&](const NodePtr& v) { return r.binary(Binary::kDivide, r.splat(1.0, res.dtype, res.dims), v); };
    NodePtr value;
    if (e == 1) {
      value = x;
    } else if (e == 2) {
      value = mul(r, x, x);
    } else if (e == 3) {
      value = mul(r, mul(r, x, x), x);
    } else if (floating && e == 0.5) {
      value = r.unary("sqrt", x, &shlo::Function::sqrt);
    } else if (floating && e == -0.5) {
      value = r.unary("rsqrt", x, &shlo::Function::rsqrt);
    } else if (floating && e == -1) {
      value = reciprocal(x);
    } else if (floating && e == -2) {
      value = reciprocal(mul(r, x, x));
    } else if (floating) {
      value = r.op("power", {x, r.splat(e, res.dtype, res.dims)}, x->type(),
                   [](shlo::Function& f, const std::vector<shlo::Value>& in) { return f.power(in[0], in[1]); });
    } else {
      throw NotLowered{};
    }
    r.write(out, value);
  };
  STRATA_LOWER("aten::pow.Tensor_Scalar_out", pow_Tensor_Scalar_out, self, exponent, out);
}

at::Tensor& abs_out(const at::Tensor& self, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    // abs has no meta kernel: a real tensor's abs keeps its dtype.
    const Result res{vec(self.sizes()), element_type(self.scalar_type())};
    if (res.dtype == ElementType::kPred || out.scalar_type() != self.scalar_type()) throw NotLowered{};
    r.write(out, r.unary("abs", r.convert(r.tensor(self), res.dtype), &shlo::Function::abs));
  };
  STRATA_LOWER("aten::abs.out", abs_out, self, out);
}

at::Tensor& clamp_max_out(const at::Tensor& self, const at::Scalar& max, at::Tensor& out) {
  return clamp_out(self, std::nullopt, max, out);
}

at::Tensor& clamp_min_out(const at::Tensor& self, const at::Scalar& min, at::Tensor& out) {
  return clamp_out(self, min, std::nullopt, out);
}

}  // namespace

void register_nn(torch::Library& library) {
  library.impl("_softmax.out", TORCH_FN(softmax_out));
  library.impl("_log_softmax.out", TORCH_FN(log_softmax_out));
  library.impl("_softmax_backward_data.out", TORCH_FN(softmax_backward_out));
  library.impl("_log_softmax_backward_data.out", TORCH_FN(log_softmax_backward_out));
  library.impl("gelu.out", TORCH_FN(gelu_out));
  library.impl("gelu_backward.grad_input", TORCH_FN(gelu_backward_out));
  library.impl("native_layer_norm", TORCH_FN(native_layer_norm));
  library.impl("native_layer_norm_backward", TORCH_FN(native_layer_norm_backward));
  library.impl("nll_loss_forward.output", TORCH_FN(nll_loss_forward_out));
  library.impl("nll_loss_backward.grad_input", TORCH_FN(nll_loss_backward_out));
  library.impl("norm.out", TORCH_FN(norm_out));
  library.impl("pow.Tensor_Scalar_out", TORCH_FN(pow_out));
  library.impl("abs.out", TORCH_FN(abs_out));
  library.impl("clamp.out", TORCH_FN(clamp_out));
  library.impl("clamp_max.out", TORCH_FN(clamp_max_out));
  library.impl("clamp_min.out", TORCH_FN(clamp_min_out));
}

}  // namespace strata::xla::detail::lowering
