// Lowered kernels of the element-wise math of the core ATen opset and its
// remaining reductions (Note [What is lowered] in lowerings.cpp): the
// trigonometric and hyperbolic functions and their inverses, erf, expm1,
// the logarithms, reciprocal, the roundings, sign; atan2, fmod, remainder,
// pow with a tensor exponent or a scalar base, the bitwise and logical
// ops, clamp with
// tensor bounds, division with a rounding mode; amax, amin and prod; and
// nonzero (Note [Shapes that depend on values]). Each follows the formula
// of LibTorch's CPU kernel (aten/src/ATen/native/cpu/UnaryOpsKernel.cpp,
// BinaryOpsKernel.cpp, ReduceOpsKernel.cpp), in f32 for bf16 and f16
// (Note [bf16 computes in f32] in lowering.h). Integer divisions, whose
// division by zero LibTorch raises, are left to the fallback. The
// structured ops are registered as their out= kernels: LibTorch's
// generated functional and in-place forms call them.
#include <ATen/ops/acos.h>
#include <ATen/ops/acosh.h>
#include <ATen/ops/amax.h>
#include <ATen/ops/amin.h>
#include <ATen/ops/asin.h>
#include <ATen/ops/asinh.h>
#include <ATen/ops/atan.h>
#include <ATen/ops/atan2.h>
#include <ATen/ops/atanh.h>
#include <ATen/ops/bitwise_and.h>
#include <ATen/ops/bitwise_or.h>
#include <ATen/ops/bitwise_xor.h>
#include <ATen/ops/ceil.h>
#include <ATen/ops/clamp.h>
#include <ATen/ops/cos.h>
#include <ATen/ops/cosh.h>
#include <ATen/ops/div.h>
#include <ATen/ops/erf.h>
#include <ATen/ops/expm1.h>
#include <ATen/ops/floor.h>
#include <ATen/ops/fmod.h>
#include <ATen/ops/log.h>
#include <ATen/ops/log10.h>
#include <ATen/ops/log1p.h>
#include <ATen/ops/log2.h>
#include <ATen/ops/logical_and.h>
#include <ATen/ops/logical_or.h>
#include <ATen/ops/logical_xor.h>
#include <ATen/ops/nonzero.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/prod.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/remainder.h>
#include <ATen/ops/round.h>
#include <ATen/ops/sign.h>
#include <ATen/ops/sin.h>
#include <ATen/ops/sinh.h>
#include <ATen/ops/tan.h>
#include <ATen/ops/trunc.h>

#include <cmath>
#include <limits>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

using Direction = shlo::Direction;

NodePtr like(Recorder& r, double k, const NodePtr& x) { return r.splat(k, x->type().dtype, x->type().dims); }
NodePtr less_than_zero(Recorder& r, const NodePtr& x) { return r.compare(x, like(r, 0.0, x), Direction::kLT); }
NodePtr floor(Recorder& r, const NodePtr& x) { return r.unary("floor", x, &shlo::Function::floor); }
NodePtr ceil(Recorder& r, const NodePtr& x) { return r.unary("ceil", x, &shlo::Function::ceil); }
NodePtr fmod(Recorder& r, const NodePtr& a, const NodePtr& b) {
  return r.op("remainder", {a, b}, a->type(), [](shlo::Function& f, const std::vector<shlo::Value>& in) {
    return f.remainder(in[0], in[1]);
  });
}
NodePtr logical(Recorder& r, const char* name, const NodePtr& a, const NodePtr& b) {
  const std::string op = name;
  return r.op(op, {a, b}, a->type(), lazy::Attributes{}.add(op),
              [op](shlo::Function& f, const std::vector<shlo::Value>& in) {
                if (op == "and") return f.logical_and(in[0], in[1]);
                if (op == "or") return f.logical_or(in[0], in[1]);
                return f.logical_xor(in[0], in[1]);
              });
}
// x rounded toward zero.
NodePtr trunc(Recorder& r, const NodePtr& x) { return r.select(less_than_zero(r, x), ceil(r, x), floor(r, x)); }

// ---- Unary -----------------------------------------------------------------------------

// A unary op of float results: `f` of the operand in the computation dtype.
#define STRATA_FLOAT_UNARY(NAME, FORMULA)                                                        \
  at::Tensor& NAME##_out(const at::Tensor& self, at::Tensor& out) {                              \
    auto lower = [&](Recorder& r) {                                                              \
      lower_pointwise(r, [&] { return at::NAME(meta(self)); }, {&self}, out,                     \
                      [](Recorder& r, const std::vector<NodePtr>& in) -> NodePtr {               \
                        const NodePtr& x = in[0];                                                \
                        return FORMULA;                                                          \
                      });                                                                        \
    };                                                                                           \
    STRATA_LOWER("aten::" #NAME ".out", NAME##_out, self, out);                                  \
  }

STRATA_FLOAT_UNARY(acos, r.unary("acos", x, &shlo::Function::acos))
STRATA_FLOAT_UNARY(asin, r.unary("asin", x, &shlo::Function::asin))
STRATA_FLOAT_UNARY(atan, r.unary("atan", x, &shlo::Function::atan))
STRATA_FLOAT_UNARY(acosh, r.unary("acosh", x, &shlo::Function::acosh))
STRATA_FLOAT_UNARY(asinh, r.unary("asinh", x, &shlo::Function::asinh))
STRATA_FLOAT_UNARY(atanh, r.unary("atanh", x, &shlo::Function::atanh))
STRATA_FLOAT_UNARY(cosh, r.unary("cosh", x, &shlo::Function::cosh))
STRATA_FLOAT_UNARY(sinh, r.unary("sinh", x, &shlo::Function::sinh))
STRATA_FLOAT_UNARY(cos, r.unary("cosine", x, &shlo::Function::cosine))
STRATA_FLOAT_UNARY(sin, r.unary("sine", x, &shlo::Function::sine))
STRATA_FLOAT_UNARY(tan, r.unary("tan", x, &shlo::Function::tan))
STRATA_FLOAT_UNARY(erf, r.unary("erf", x, &shlo::Function::erf))
STRATA_FLOAT_UNARY(expm1, r.unary("exponential_minus_one", x, &shlo::Function::exponential_minus_one))
STRATA_FLOAT_UNARY(log, r.unary("log", x, &shlo::Function::log))
STRATA_FLOAT_UNARY(log1p, r.unary("log_plus_one", x, &shlo::Function::log_plus_one))
STRATA_FLOAT_UNARY(log2, r.binary(Binary::kDivide, r.unary("log", x, &shlo::Function::log), like(r, std::log(2.0), x)))
STRATA_FLOAT_UNARY(log10,
                   r.binary(Binary::kDivide, r.unary("log", x, &shlo::Function::log), like(r, std::log(10.0), x)))
STRATA_FLOAT_UNARY(reciprocal, r.binary(Binary::kDivide, like(r, 1.0, x), x))

#undef STRATA_FLOAT_UNARY

// The roundings: of a float as XLA's floor, ceil, round-half-to-even
// (torch.round) and toward zero; an integer is itself.
#define STRATA_ROUNDING(NAME, FORMULA)                                                           \
  at::Tensor& NAME##_out(const at::Tensor& self, at::Tensor& out) {                              \
    auto lower = [&](Recorder& r) {                                                              \
      const Result res = result_of([&] { return at::NAME(meta(self)); }, &out);                  \
      if (res.dtype == ElementType::kPred) throw NotLowered{};                                   \
      const NodePtr x = r.operand(self, res.dtype, res.dims);                                    \
      r.write(out, is_floating(res.dtype) ? (FORMULA) : x);                                      \
    };                                                                                           \
    STRATA_LOWER("aten::" #NAME ".out", NAME##_out, self, out);                                  \
  }

STRATA_ROUNDING(floor, floor(r, x))
STRATA_ROUNDING(ceil, ceil(r, x))
STRATA_ROUNDING(round, r.unary("round_nearest_even", x, &shlo::Function::round_nearest_even))
STRATA_ROUNDING(trunc, trunc(r, x))

#undef STRATA_ROUNDING

at::Tensor& sign_out(const at::Tensor& self, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::sign(meta(self)); }, &out);
    if (res.dtype == ElementType::kPred || self.scalar_type() == at::kByte) throw NotLowered{};
    r.write(out, libtorch_sign(r, r.operand(self, res.dtype, res.dims)));
  };
  STRATA_LOWER("aten::sign.out", sign_out, self, out);
}

// ---- Binary ----------------------------------------------------------------------------

at::Tensor& atan2_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::atan2(meta(self), meta(other)); }, {&self, &other}, out,
                    [](Recorder& r, const std::vector<NodePtr>& x) {
                      return r.op("atan2", {x[0], x[1]}, x[0]->type(),
                                  [](shlo::Function& f, const std::vector<shlo::Value>& in) {
                                    return f.atan2(in[0], in[1]);
                                  });
                    });
  };
  STRATA_LOWER("aten::atan2.out", atan2_out, self, other, out);
}

// C's fmod: the sign of the dividend.
at::Tensor& fmod_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::fmod(meta(self), meta(other)); }, {&self, &other}, out,
                    [](Recorder& r, const std::vector<NodePtr>& x) { return fmod(r, x[0], x[1]); });
  };
  STRATA_LOWER("aten::fmod.Tensor_out", fmod_Tensor_out, self, other, out);
}

// Where fmod's remainder `mod` is nonzero and its sign is not the divisor
// b's: there Python's modulo adds b, and floor division takes one off.
NodePtr off_by_one_divisor(Recorder& r, const NodePtr& mod, const NodePtr& b) {
  NodePtr nonzero = r.compare(mod, like(r, 0.0, mod), Direction::kNE);
  NodePtr differ = r.compare(less_than_zero(r, b), less_than_zero(r, mod), Direction::kNE);
  return logical(r, "and", nonzero, differ);
}

// Python's modulo, the sign of the divisor: fmod, plus the divisor where
// the two signs differ (LibTorch's float remainder).
at::Tensor& remainder_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::remainder(meta(self), meta(other)); }, {&self, &other}, out,
                    [](Recorder& r, const std::vector<NodePtr>& x) {
                      NodePtr mod = fmod(r, x[0], x[1]);
                      return r.select(off_by_one_divisor(r, mod, x[1]), r.binary(Binary::kAdd, mod, x[1]), mod);
                    });
  };
  STRATA_LOWER("aten::remainder.Tensor_out", remainder_Tensor_out, self, other, out);
}

NodePtr power(Recorder& r, const NodePtr& base, const NodePtr& exponent) {
  return r.op("power", {base, exponent}, base->type(), [](shlo::Function& f, const std::vector<shlo::Value>& in) {
    return f.power(in[0], in[1]);
  });
}

// self ** exponent, of float results (integer powers are left to the
// fallback).
at::Tensor& pow_tensor_out(const at::Tensor& self, const at::Tensor& exponent, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::pow(meta(self), meta(exponent)); }, {&self, &exponent}, out,
                    [](Recorder& r, const std::vector<NodePtr>& x) { return power(r, x[0], x[1]); });
  };
  STRATA_LOWER("aten::pow.Tensor_Tensor_out", pow_Tensor_Tensor_out, self, exponent, out);
}

// base ** exponent for a scalar base; 1 ** anything is 1, as LibTorch
// fills it.
at::Tensor& pow_scalar_out(const at::Scalar& base, const at::Tensor& exponent, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::pow(base, meta(exponent)); }, {&exponent}, out,
                    [&base](Recorder& r, const std::vector<NodePtr>& x) {
                      if (!base.isComplex() && base.toDouble() == 1.0) return like(r, 1.0, x[0]);
                      return power(r, r.broadcast(r.scalar(base, x[0]->type().dtype), x[0]->type().dims), x[0]);
                    });
  };
  STRATA_LOWER("aten::pow.Scalar_out", pow_Scalar_out, base, exponent, out);
}

// and, or, xor: logical on bool, bitwise on integers.
#define STRATA_BITWISE(NAME, OP)                                                                       \
  at::Tensor& bitwise_##NAME##_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) { \
    auto lower = [&](Recorder& r) {                                                                    \
      const Result res = result_of([&] { return at::bitwise_##NAME(meta(self), meta(other)); }, &out); \
      if (is_floating(res.dtype)) throw NotLowered{};                                                  \
      r.write(out, logical(r, OP, r.operand(self, res.dtype, res.dims), r.operand(other, res.dtype, res.dims))); \
    };                                                                                                 \
    STRATA_LOWER("aten::bitwise_" #NAME ".Tensor_out", bitwise_##NAME##_Tensor_out, self, other, out); \
  }

STRATA_BITWISE(and, "and")
STRATA_BITWISE(or, "or")
STRATA_BITWISE(xor, "xor")

#undef STRATA_BITWISE

// logical_and, logical_or, logical_xor: the truth of each side (nonzero,
// NaN included) combined, written in out's dtype (bool, or 0 and 1).
at::Tensor& logical_out(const char* name, const char* op, const at::Tensor& self, const at::Tensor& other,
                        at::Tensor& out) {
  Recorder r(name);
  if (self.is_complex() || other.is_complex()) throw NotLowered{};
  const std::vector<int64_t> dims = vec(at::infer_size(self.sizes(), other.sizes()));
  auto truth = [&](const at::Tensor& t) {
    const ElementType type = element_type(t.scalar_type());
    NodePtr x = r.operand(t, type, dims);
    return type == ElementType::kPred ? x : r.compare(x, r.splat(0.0, type, dims), Direction::kNE);
  };
  r.write(out, logical(r, op, truth(self), truth(other)));
  return out;
}

#define STRATA_LOGICAL(NAME)                                                                              \
  at::Tensor& logical_##NAME##_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {    \
    try {                                                                                                 \
      return logical_out("aten::logical_" #NAME ".out", #NAME, self, other, out);                        \
    } catch (const NotLowered&) {                                                                         \
    }                                                                                                     \
    return at::native::call_fallback_fn<&cpu_fallback, at::_ops::logical_##NAME##_out>::call(self, other, out); \
  }

STRATA_LOGICAL(and)
STRATA_LOGICAL(or)
STRATA_LOGICAL(xor)

#undef STRATA_LOGICAL

// min(max(x, lo), hi) with tensor bounds, as clamp.out with scalars.
at::Tensor& clamp_tensor_out(const at::Tensor& self, const std::optional<at::Tensor>& min,
                             const std::optional<at::Tensor>& max, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::clamp(meta(self), min ? meta(*min) : min, max ? meta(*max) : max); },
                                 &out);
    if (res.dtype == ElementType::kPred) throw NotLowered{};
    NodePtr x = r.operand(self, res.dtype, res.dims);
    // A NaN in x or in either bound gives NaN, as LibTorch's kernel.
    if (min && min->defined()) x = nan_propagating(r, Binary::kMaximum, x, r.operand(*min, res.dtype, res.dims));
    if (max && max->defined()) x = nan_propagating(r, Binary::kMinimum, x, r.operand(*max, res.dtype, res.dims));
    r.write(out, x);
  };
  STRATA_LOWER("aten::clamp.Tensor_out", clamp_Tensor_out, self, min, max, out);
}

// LibTorch's floor division of floats (div_floor_floating): through fmod,
// so a quotient just under an integer is not rounded up by the division;
// a zero divisor gives the plain quotient (inf or NaN), a zero quotient
// keeps the sign of a / b.
NodePtr floor_divide(Recorder& r, const NodePtr& a, const NodePtr& b) {
  NodePtr mod = fmod(r, a, b);
  NodePtr div = r.binary(Binary::kDivide, r.binary(Binary::kSubtract, a, mod), b);
  div = r.select(off_by_one_divisor(r, mod, b), r.binary(Binary::kSubtract, div, like(r, 1.0, div)), div);
  NodePtr floored = floor(r, div);
  NodePtr up = r.compare(r.binary(Binary::kSubtract, div, floored), like(r, 0.5, div), Direction::kGT);
  floored = r.select(up, r.binary(Binary::kAdd, floored, like(r, 1.0, div)), floored);
  NodePtr quotient = r.binary(Binary::kDivide, a, b);
  // copysign(0, a / b) where div is 0: 0 * quotient keeps its sign (a
  // zero quotient here is finite).
  NodePtr signed_zero = r.binary(Binary::kMultiply, like(r, 0.0, div), quotient);
  floored = r.select(r.compare(div, like(r, 0.0, div), Direction::kEQ), signed_zero, floored);
  return r.select(r.compare(b, like(r, 0.0, b), Direction::kEQ), quotient, floored);
}

at::Tensor& div_mode_out(const at::Tensor& self, const at::Tensor& other, std::optional<c10::string_view> mode,
                         at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    lower_pointwise(r, [&] { return at::div(meta(self), meta(other), mode); }, {&self, &other}, out,
                    [&mode](Recorder& r, const std::vector<NodePtr>& x) {
                      if (!mode.has_value()) return r.binary(Binary::kDivide, x[0], x[1]);
                      if (*mode == "trunc") return trunc(r, r.binary(Binary::kDivide, x[0], x[1]));
                      return floor_divide(r, x[0], x[1]);
                    });
  };
  STRATA_LOWER("aten::div.out_mode", div_out_mode, self, other, mode, out);
}

// ---- Reductions ------------------------------------------------------------------------

// `x` reduced over `dims` by max or min (NaN wins, as in LibTorch), shaped
// as the result. An empty reduced dim is LibTorch's error: the fallback's.
NodePtr extreme(Recorder& r, const at::Tensor& self, const std::vector<int64_t>& dims, const Result& res, bool max) {
  if (res.dtype == ElementType::kPred) throw NotLowered{};
  for (int64_t d : dims)
    if (self.size(d) == 0) throw NotLowered{};
  double init;
  if (is_floating(res.dtype)) {
    init = max ? -std::numeric_limits<double>::infinity() : std::numeric_limits<double>::infinity();
  } else {
    // Signed integers of up to 32 bits (2^63 - 1 has no double).
    const at::ScalarType t = self.scalar_type();
    if (t != at::kChar && t != at::kShort && t != at::kInt) throw NotLowered{};
    const double highest = std::ldexp(1.0, 8 * static_cast<int>(self.element_size()) - 1);
    init = max ? -highest : highest - 1;
  }
  NodePtr x = r.convert(r.tensor(self), res.dtype);
  NodePtr m = r.reduce(x, dims, max ? shlo::ReduceOp::kMax : shlo::ReduceOp::kMin, init);
  if (is_floating(res.dtype)) {
    // XLA's max keeps one operand's NaN only: where a reduced element is
    // NaN, the sum over the same elements, NaN too, is taken instead.
    NodePtr nan = r.select(r.compare(x, x, Direction::kNE), like(r, 1.0, x), like(r, 0.0, x));
    NodePtr any_nan = r.compare(r.reduce(nan, dims, shlo::ReduceOp::kMax, 0.0), like(r, 0.0, m), Direction::kGT);
    m = r.select(any_nan, r.sum(x, dims), m);
  }
  return r.reshape(m, res.dims);
}

at::Tensor& amax_out(const at::Tensor& self, at::IntArrayRef dim, bool keepdim, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::amax(meta(self), dim, keepdim); }, &out);
    r.write(out, extreme(r, self, reduced_dims(self, dim), res, /*max=*/true));
  };
  STRATA_LOWER("aten::amax.out", amax_out, self, dim, keepdim, out);
}

at::Tensor& amin_out(const at::Tensor& self, at::IntArrayRef dim, bool keepdim, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::amin(meta(self), dim, keepdim); }, &out);
    r.write(out, extreme(r, self, reduced_dims(self, dim), res, /*max=*/false));
  };
  STRATA_LOWER("aten::amin.out", amin_out, self, dim, keepdim, out);
}

// The product over `dims`, in the result's computation dtype (f32 for
// bf16; integers and bool as int64).
NodePtr product(Recorder& r, const at::Tensor& self, const std::vector<int64_t>& dims, const Result& res) {
  if (res.dtype == ElementType::kPred) throw NotLowered{};
  NodePtr x = r.convert(r.tensor(self), res.dtype);
  return r.reshape(r.reduce(x, dims, shlo::ReduceOp::kProduct, 1.0), res.dims);
}

at::Tensor& prod_int_out(const at::Tensor& self, int64_t dim, bool keepdim, std::optional<at::ScalarType> dtype,
                         at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::prod(meta(self), dim, keepdim, dtype); }, &out);
    if (self.dim() == 0) throw NotLowered{};
    r.write(out, product(r, self, {c10::maybe_wrap_dim(dim, self.dim())}, res));
  };
  STRATA_LOWER("aten::prod.int_out", prod_int_out, self, dim, keepdim, dtype, out);
}

at::Tensor prod(const at::Tensor& self, std::optional<at::ScalarType> dtype) {
  try {
    Recorder r("aten::prod");
    // prod has no meta kernel: its result type is LibTorch's rule.
    const at::ScalarType result_type =
        dtype.value_or(at::isIntegralType(self.scalar_type(), /*includeBool=*/true) ? at::kLong : self.scalar_type());
    const ElementType stored = element_type(result_type);
    const Result res{{}, opmath(stored), stored};
    at::Tensor out = at::empty({}, self.options().dtype(result_type));
    r.write(out, product(r, self, reduced_dims(self, std::nullopt), res));
    return out;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::prod>::call(self, dtype);
}

// Note [Shapes that depend on values]
// nonzero's result has one row per nonzero element: its shape is its
// input's values, which a compiled program cannot have. It is worked out
// where those values are: the input is read to the host (on the xla device
// that runs the step so far, as `.item()` does, and counts in
// device_to_host_count), LibTorch's CPU kernel lists the coordinates, and
// they come back as a new device tensor, an input of the next program.
// That is what a fallback would do too, but it is the op's nature, not a
// missing lowering: it is not counted as a fallback. Boolean-mask indexing
// (Note [Indexing by integer tensors] in kernels_index.cpp) goes through
// it.
at::Tensor nonzero_on_host(const at::Tensor& self) { return at::nonzero(self.cpu()).to(self.device()); }

at::Tensor& nonzero_out(const at::Tensor& self, at::Tensor& out) {
  const at::Tensor coordinates = nonzero_on_host(self);
  at::native::resize_output(out, coordinates.sizes());
  return out.copy_(coordinates);
}

}  // namespace

void register_math(torch::Library& library) {
  library.impl("acos.out", TORCH_FN(acos_out));
  library.impl("asin.out", TORCH_FN(asin_out));
  library.impl("atan.out", TORCH_FN(atan_out));
  library.impl("acosh.out", TORCH_FN(acosh_out));
  library.impl("asinh.out", TORCH_FN(asinh_out));
  library.impl("atanh.out", TORCH_FN(atanh_out));
  library.impl("cosh.out", TORCH_FN(cosh_out));
  library.impl("sinh.out", TORCH_FN(sinh_out));
  library.impl("cos.out", TORCH_FN(cos_out));
  library.impl("sin.out", TORCH_FN(sin_out));
  library.impl("tan.out", TORCH_FN(tan_out));
  library.impl("erf.out", TORCH_FN(erf_out));
  library.impl("expm1.out", TORCH_FN(expm1_out));
  library.impl("log.out", TORCH_FN(log_out));
  library.impl("log1p.out", TORCH_FN(log1p_out));
  library.impl("log2.out", TORCH_FN(log2_out));
  library.impl("log10.out", TORCH_FN(log10_out));
  library.impl("reciprocal.out", TORCH_FN(reciprocal_out));
  library.impl("floor.out", TORCH_FN(floor_out));
  library.impl("ceil.out", TORCH_FN(ceil_out));
  library.impl("round.out", TORCH_FN(round_out));
  library.impl("trunc.out", TORCH_FN(trunc_out));
  library.impl("sign.out", TORCH_FN(sign_out));
  library.impl("atan2.out", TORCH_FN(atan2_out));
  library.impl("fmod.Tensor_out", TORCH_FN(fmod_out));
  library.impl("remainder.Tensor_out", TORCH_FN(remainder_out));
  library.impl("pow.Tensor_Tensor_out", TORCH_FN(pow_tensor_out));
  library.impl("pow.Scalar_out", TORCH_FN(pow_scalar_out));
  library.impl("bitwise_and.Tensor_out", TORCH_FN(bitwise_and_out));
  library.impl("bitwise_or.Tensor_out", TORCH_FN(bitwise_or_out));
  library.impl("bitwise_xor.Tensor_out", TORCH_FN(bitwise_xor_out));
  library.impl("logical_and.out", TORCH_FN(logical_and_out));
  library.impl("logical_or.out", TORCH_FN(logical_or_out));
  library.impl("logical_xor.out", TORCH_FN(logical_xor_out));
  library.impl("clamp.Tensor_out", TORCH_FN(clamp_tensor_out));
  library.impl("div.out_mode", TORCH_FN(div_mode_out));
  library.impl("amax.out", TORCH_FN(amax_out));
  library.impl("amin.out", TORCH_FN(amin_out));
  library.impl("prod.int_out", TORCH_FN(prod_int_out));
  library.impl("prod", TORCH_FN(prod));
  library.impl("nonzero", TORCH_FN(nonzero_on_host));
  library.impl("nonzero.out", TORCH_FN(nonzero_out));
}

}  // namespace strata::xla::detail::lowering
