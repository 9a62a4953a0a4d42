// Lowered kernels of the activations and their backwards: sigmoid, tanh,
// rsqrt, silu, leaky_relu, hardtanh, elu, softplus and mish; exp, sgn and
// where
// (Note [What is lowered] in lowerings.cpp). Each follows the formula of
// LibTorch's CPU kernel (aten/src/ATen/native/cpu/Activation.cpp,
// UnaryOpsKernel.cpp, BinaryOpsKernel.cpp), computed in f32 for bf16 and
// f16 and rounded once (Note [bf16 computes in f32] in lowering.h); the
// Scalars (slopes, alpha, beta, bounds) are host scalars (Note [Scalars in
// the graph]). mish_backward is LibTorch's composite of these. The
// structured ops are registered as their out= kernels: LibTorch's
// generated functional and in-place forms call them.
#include <ATen/ExpandUtils.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/result_type.h>
#include <ATen/ops/elu.h>
#include <ATen/ops/elu_backward.h>
#include <ATen/ops/hardtanh.h>
#include <ATen/ops/hardtanh_backward.h>
#include <ATen/ops/leaky_relu.h>
#include <ATen/ops/leaky_relu_backward.h>
#include <ATen/ops/mish.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/sgn.h>
#include <ATen/ops/sigmoid_backward.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>
#include <ATen/ops/softplus.h>
#include <ATen/ops/softplus_backward.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/tanh_backward.h>
#include <ATen/ops/where.h>

#include <functional>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

using Direction = shlo::Direction;

NodePtr mul(Recorder& r, const NodePtr& a, const NodePtr& b) { return r.binary(Binary::kMultiply, a, b); }
NodePtr add(Recorder& r, const NodePtr& a, const NodePtr& b) { return r.binary(Binary::kAdd, a, b); }
NodePtr sub(Recorder& r, const NodePtr& a, const NodePtr& b) { return r.binary(Binary::kSubtract, a, b); }
NodePtr div(Recorder& r, const NodePtr& a, const NodePtr& b) { return r.binary(Binary::kDivide, a, b); }
NodePtr like(Recorder& r, double k, const NodePtr& x) { return r.splat(k, x->type().dtype, x->type().dims); }
NodePtr scalar_like(Recorder& r, const at::Scalar& s, const NodePtr& x) {
  return r.broadcast(r.scalar(s, x->type().dtype), x->type().dims);
}
NodePtr exp(Recorder& r, const NodePtr& x) { return r.unary("exponential", x, &shlo::Function::exponential); }
NodePtr neg(Recorder& r, const NodePtr& x) { return r.unary("negate", x, &shlo::Function::negate); }
NodePtr tanh(Recorder& r, const NodePtr& x) { return r.unary("tanh", x, &shlo::Function::tanh); }
NodePtr log1p(Recorder& r, const NodePtr& x) { return r.unary("log_plus_one", x, &shlo::Function::log_plus_one); }
// 1 / (1 + exp(-x)), LibTorch's sigmoid.
NodePtr sigmoid(Recorder& r, const NodePtr& x) { return div(r, like(r, 1.0, x), add(r, like(r, 1.0, x), exp(r, neg(r, x)))); }

at::Tensor& sigmoid_out(const at::Tensor& self, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::sigmoid(meta(self)); }, {&self}, out,
                    [](Recorder& r, const std::vector<NodePtr>& x) { return sigmoid(r, x[0]); });
  };
  STRATA_LOWER("aten::sigmoid.out", sigmoid_out, self, out);
}

// grad * (1 - y) * y.
at::Tensor& sigmoid_backward_out(const at::Tensor& grad, const at::Tensor& output, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::sigmoid_backward(meta(grad), meta(output)); }, {&grad, &output}, out,
                    [](Recorder& r, const std::vector<NodePtr>& x) {
                      return mul(r, mul(r, x[0], sub(r, like(r, 1.0, x[1]), x[1])), x[1]);
                    });
  };
  STRATA_LOWER("aten::sigmoid_backward.grad_input", sigmoid_backward_grad_input, grad, output, out);
}

at::Tensor& tanh_out(const at::Tensor& self, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::tanh(meta(self)); }, {&self}, out,
                    [](Recorder& r, const std::vector<NodePtr>& x) { return tanh(r, x[0]); });
  };
  STRATA_LOWER("aten::tanh.out", tanh_out, self, out);
}

// grad * (1 - y * y).
at::Tensor& tanh_backward_out(const at::Tensor& grad, const at::Tensor& output, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::tanh_backward(meta(grad), meta(output)); }, {&grad, &output}, out,
                    [](Recorder& r, const std::vector<NodePtr>& x) {
                      return mul(r, x[0], sub(r, like(r, 1.0, x[1]), mul(r, x[1], x[1])));
                    });
  };
  STRATA_LOWER("aten::tanh_backward.grad_input", tanh_backward_grad_input, grad, output, out);
}

at::Tensor& rsqrt_out(const at::Tensor& self, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::rsqrt(meta(self)); }, {&self}, out,
                    [](Recorder& r, const std::vector<NodePtr>& x) {
                      return r.unary("rsqrt", x[0], &shlo::Function::rsqrt);
                    });
  };
  STRATA_LOWER("aten::rsqrt.out", rsqrt_out, self, out);
}

// -1, 0 or 1 by the sign of x (0 for +-0 and NaN, as LibTorch's): abs's
// gradient.
at::Tensor& sgn_out(const at::Tensor& self, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    if (self.is_complex()) throw NotLowered{};
    const Result res = result_of([&] { return at::sgn(meta(self)); }, &out);
    if (res.dtype == ElementType::kPred) throw NotLowered{};
    r.write(out, libtorch_sign(r, r.operand(self, res.dtype, res.dims)));
  };
  STRATA_LOWER("aten::sgn.out", sgn_out, self, out);
}

at::Tensor& exp_out(const at::Tensor& self, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::exp(meta(self)); }, {&self}, out,
                    [](Recorder& r, const std::vector<NodePtr>& x) { return exp(r, x[0]); });
  };
  STRATA_LOWER("aten::exp.out", exp_out, self, out);
}

// x / (1 + exp(-x)).
at::Tensor& silu_out(const at::Tensor& self, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::silu(meta(self)); }, {&self}, out,
                    [](Recorder& r, const std::vector<NodePtr>& x) {
                      return div(r, x[0], add(r, like(r, 1.0, x[0]), exp(r, neg(r, x[0]))));
                    });
  };
  STRATA_LOWER("aten::silu.out", silu_out, self, out);
}

// grad * s * (1 + x * (1 - s)), s = sigmoid(x).
at::Tensor& silu_backward_out(const at::Tensor& grad, const at::Tensor& self, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::silu_backward(meta(grad), meta(self)); }, {&grad, &self}, out,
                    [](Recorder& r, const std::vector<NodePtr>& x) {
                      NodePtr s = sigmoid(r, x[1]);
                      NodePtr inner = add(r, like(r, 1.0, s), mul(r, x[1], sub(r, like(r, 1.0, s), s)));
                      return mul(r, mul(r, x[0], s), inner);
                    });
  };
  STRATA_LOWER("aten::silu_backward.grad_input", silu_backward_grad_input, grad, self, out);
}

// x > 0 ? x : x * slope.
at::Tensor& leaky_relu_out(const at::Tensor& self, const at::Scalar& slope, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::leaky_relu(meta(self), slope); }, {&self}, out,
                    [&slope](Recorder& r, const std::vector<NodePtr>& x) {
                      return r.select(r.compare(x[0], like(r, 0.0, x[0]), Direction::kGT), x[0],
                                      mul(r, x[0], scalar_like(r, slope, x[0])));
                    });
  };
  STRATA_LOWER("aten::leaky_relu.out", leaky_relu_out, self, slope, out);
}

// self > 0 ? grad : grad * slope.
at::Tensor& leaky_relu_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& slope,
                                    bool self_is_result, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::leaky_relu_backward(meta(grad), meta(self), slope, self_is_result); },
                    {&grad, &self}, out, [&slope](Recorder& r, const std::vector<NodePtr>& x) {
                      return r.select(r.compare(x[1], like(r, 0.0, x[1]), Direction::kGT), x[0],
                                      mul(r, x[0], scalar_like(r, slope, x[0])));
                    });
  };
  STRATA_LOWER("aten::leaky_relu_backward.grad_input", leaky_relu_backward_grad_input, grad, self, slope,
               self_is_result, out);
}

// hardtanh is LibTorch's clamp (Activation.cpp), lowered as clamp.out;
// its kernels are the CPU's only, so the xla device registers its own.
at::Tensor hardtanh(const at::Tensor& self, const at::Scalar& min, const at::Scalar& max) {
  return at::clamp(self, min, max);
}
at::Tensor& hardtanh_out(const at::Tensor& self, const at::Scalar& min, const at::Scalar& max, at::Tensor& out) {
  return at::clamp_out(out, self, min, max);
}
at::Tensor& hardtanh_(at::Tensor& self, const at::Scalar& min, const at::Scalar& max) {
  return at::clamp_(self, min, max);
}

// (self <= min || self >= max) ? 0 : grad.
NodePtr hardtanh_grad(Recorder& r, const std::vector<NodePtr>& x, const at::Scalar& min, const at::Scalar& max) {
  NodePtr outside = r.op("or", {r.compare(x[1], scalar_like(r, min, x[1]), Direction::kLE),
                                r.compare(x[1], scalar_like(r, max, x[1]), Direction::kGE)},
                         {ElementType::kPred, x[1]->type().dims},
                         [](shlo::Function& f, const std::vector<shlo::Value>& in) { return f.logical_or(in[0], in[1]); });
  return r.select(outside, like(r, 0.0, x[0]), x[0]);
}

at::Tensor& hardtanh_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& min,
                                  const at::Scalar& max, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    // hardtanh_backward has no meta kernel: a product's meta result gives
    // the broadcast shape and the promoted dtype.
    lower_pointwise(r, [&] { return at::mul(meta(grad), meta(self)); }, {&grad, &self}, out,
                    [&](Recorder& r, const std::vector<NodePtr>& x) { return hardtanh_grad(r, x, min, max); });
  };
  STRATA_LOWER("aten::hardtanh_backward.grad_input", hardtanh_backward_grad_input, grad, self, min, max, out);
}

at::Tensor hardtanh_backward(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& min,
                             const at::Scalar& max) {
  at::Tensor out = at::empty({0}, grad.options());
  return hardtanh_backward_out(grad, self, min, max, out);
}

// x <= 0 ? expm1(x * input_scale) * alpha * scale : x * scale.
at::Tensor& elu_out(const at::Tensor& self, const at::Scalar& alpha, const at::Scalar& scale,
                    const at::Scalar& input_scale, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::elu(meta(self), alpha, scale, input_scale); }, {&self}, out,
                    [&](Recorder& r, const std::vector<NodePtr>& x) {
                      const at::Scalar negcoef = alpha.toDouble() * scale.toDouble();
                      NodePtr negative = mul(r, r.unary("exponential_minus_one", mul(r, x[0], scalar_like(r, input_scale, x[0])),
                                                        &shlo::Function::exponential_minus_one),
                                             scalar_like(r, negcoef, x[0]));
                      return r.select(r.compare(x[0], like(r, 0.0, x[0]), Direction::kLE), negative,
                                      mul(r, x[0], scalar_like(r, scale, x[0])));
                    });
  };
  STRATA_LOWER("aten::elu.out", elu_out, self, alpha, scale, input_scale, out);
}

// From the result y: y <= 0 ? g * input_scale * (y + alpha * scale) : g * scale;
// from the input x: x <= 0 ? g * input_scale * alpha * scale * exp(x * input_scale) : g * scale.
at::Tensor& elu_backward_out(const at::Tensor& grad, const at::Scalar& alpha, const at::Scalar& scale,
                             const at::Scalar& input_scale, bool is_result, const at::Tensor& self_or_result,
                             at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(
        r, [&] { return at::elu_backward(meta(grad), alpha, scale, input_scale, is_result, meta(self_or_result)); },
        {&grad, &self_or_result}, out, [&](Recorder& r, const std::vector<NodePtr>& x) {
          const at::Scalar negcoef = alpha.toDouble() * scale.toDouble();
          NodePtr g = x[0], b = x[1];
          NodePtr negative =
              is_result ? mul(r, mul(r, g, scalar_like(r, input_scale, g)), add(r, b, scalar_like(r, negcoef, b)))
                        : mul(r, mul(r, mul(r, g, scalar_like(r, input_scale, g)), scalar_like(r, negcoef, g)),
                              exp(r, mul(r, b, scalar_like(r, input_scale, b))));
          return r.select(r.compare(b, like(r, 0.0, b), Direction::kLE), negative, mul(r, g, scalar_like(r, scale, g)));
        });
  };
  STRATA_LOWER("aten::elu_backward.grad_input", elu_backward_grad_input, grad, alpha, scale, input_scale, is_result,
               self_or_result, out);
}

// x * beta > threshold ? x : log1p(exp(x * beta)) / beta.
NodePtr softplus_of(Recorder& r, const NodePtr& x, const at::Scalar& beta, const at::Scalar& threshold) {
  NodePtr xb = mul(r, x, scalar_like(r, beta, x));
  NodePtr soft = div(r, log1p(r, exp(r, xb)), scalar_like(r, beta, x));
  return r.select(r.compare(xb, scalar_like(r, threshold, x), Direction::kGT), x, soft);
}

at::Tensor& softplus_out(const at::Tensor& self, const at::Scalar& beta, const at::Scalar& threshold, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::softplus(meta(self), beta, threshold); }, {&self}, out,
                    [&](Recorder& r, const std::vector<NodePtr>& x) { return softplus_of(r, x[0], beta, threshold); });
  };
  STRATA_LOWER("aten::softplus.out", softplus_out, self, beta, threshold, out);
}

// z = exp(x * beta); x * beta > threshold ? g : g * z / (z + 1).
at::Tensor& softplus_backward_out(const at::Tensor& grad, const at::Tensor& self, const at::Scalar& beta,
                                  const at::Scalar& threshold, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::softplus_backward(meta(grad), meta(self), beta, threshold); }, {&grad, &self},
                    out, [&](Recorder& r, const std::vector<NodePtr>& x) {
                      NodePtr xb = mul(r, x[1], scalar_like(r, beta, x[1]));
                      NodePtr z = exp(r, xb);
                      NodePtr soft = div(r, mul(r, x[0], z), add(r, z, like(r, 1.0, z)));
                      return r.select(r.compare(xb, scalar_like(r, threshold, xb), Direction::kGT), x[0], soft);
                    });
  };
  STRATA_LOWER("aten::softplus_backward.grad_input", softplus_backward_grad_input, grad, self, beta, threshold, out);
}

// x * tanh(log1p(exp(x))).
at::Tensor& mish_out(const at::Tensor& self, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::mish(meta(self)); }, {&self}, out,
                    [](Recorder& r, const std::vector<NodePtr>& x) {
                      return mul(r, x[0], tanh(r, log1p(r, exp(r, x[0]))));
                    });
  };
  STRATA_LOWER("aten::mish.out", mish_out, self, out);
}

// condition ? self : other, in the promoted dtype of self and other
// (where has no meta kernel: the shape and dtype are LibTorch's rules).
Result where_result(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  if (condition.scalar_type() != at::kBool) throw NotLowered{};
  const ElementType t = element_type(at::result_type(self, other));
  return {vec(at::infer_size(condition.sizes(), at::infer_size(self.sizes(), other.sizes()))), t, t};
}

NodePtr where_of(Recorder& r, const Result& res, const at::Tensor& condition, const at::Tensor& self,
                 const at::Tensor& other) {
  // A 0-dim CPU condition (pow's backward compares a wrapped exponent) is
  // a host scalar, as the values are.
  NodePtr c = r.operand(condition, ElementType::kPred, res.dims);
  return r.select(c, r.operand(self, res.dtype, res.dims), r.operand(other, res.dtype, res.dims));
}

at::Tensor where(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  try {
    Recorder r("aten::where.self");
    const Result res = where_result(condition, self, other);
    const at::Tensor& on_device = self.device().type() == kXla ? self : other.device().type() == kXla ? other : condition;
    at::Tensor out = at::empty(res.dims, on_device.options().dtype(at::result_type(self, other)));
    r.write(out, where_of(r, res, condition, self, other));
    return out;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::where_self>::call(condition, self, other);
}

at::Tensor& where_out(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = where_result(condition, self, other);
    if (!c10::canCast(at::result_type(self, other), out.scalar_type())) throw NotLowered{};
    r.write(out, where_of(r, res, condition, self, other));
  };
  STRATA_LOWER("aten::where.self_out", where_self_out, condition, self, other, out);
}

}  // namespace

void register_activation(torch::Library& library) {
  library.impl("sigmoid.out", TORCH_FN(sigmoid_out));
  library.impl("sigmoid_backward.grad_input", TORCH_FN(sigmoid_backward_out));
  library.impl("tanh.out", TORCH_FN(tanh_out));
  library.impl("tanh_backward.grad_input", TORCH_FN(tanh_backward_out));
  library.impl("rsqrt.out", TORCH_FN(rsqrt_out));
  library.impl("sgn.out", TORCH_FN(sgn_out));
  library.impl("exp.out", TORCH_FN(exp_out));
  library.impl("silu.out", TORCH_FN(silu_out));
  library.impl("silu_backward.grad_input", TORCH_FN(silu_backward_out));
  library.impl("leaky_relu.out", TORCH_FN(leaky_relu_out));
  library.impl("leaky_relu_backward.grad_input", TORCH_FN(leaky_relu_backward_out));
  library.impl("hardtanh", TORCH_FN(hardtanh));
  library.impl("hardtanh.out", TORCH_FN(hardtanh_out));
  library.impl("hardtanh_", TORCH_FN(hardtanh_));
  library.impl("hardtanh_backward", TORCH_FN(hardtanh_backward));
  library.impl("hardtanh_backward.grad_input", TORCH_FN(hardtanh_backward_out));
  library.impl("elu.out", TORCH_FN(elu_out));
  library.impl("elu_backward.grad_input", TORCH_FN(elu_backward_out));
  library.impl("softplus.out", TORCH_FN(softplus_out));
  library.impl("softplus_backward.grad_input", TORCH_FN(softplus_backward_out));
  library.impl("mish.out", TORCH_FN(mish_out));
  library.impl("where.self", TORCH_FN(where));
  library.impl("where.self_out", TORCH_FN(where_out));
}

}  // namespace strata::xla::detail::lowering
