// Lowered kernels of the comparisons (eq, ne, lt, le, gt, ge against a
// tensor or a Scalar), isnan, isneginf, logical_not, bitwise_not, and the
// logical reductions all and any
// (Note [What is lowered] in lowerings.cpp): what attention masks are made
// of (scaled_dot_product_attention's math form compares its scores with
// -inf and asks whether a row is all masked). Operands are compared in
// their promoted dtype (at::result_type), as TensorIterator does; a float
// NaN compares unequal to everything, as in IEEE and LibTorch.
#include <ATen/ops/all.h>
#include <ATen/ops/bitwise_not.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/isneginf.h>
#include <ATen/ops/any.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/ge.h>
#include <ATen/ops/gt.h>
#include <ATen/ops/le.h>
#include <ATen/ops/logical_not.h>
#include <ATen/ops/lt.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/result_type.h>

#include <limits>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

using Direction = shlo::Direction;

// a <direction> b, both in `t` and broadcast to `dims`, as a bool tensor.
void lower_compare(Recorder& r, const NodePtr& a, const NodePtr& b, Direction direction, const at::Tensor& out) {
  r.write(out, r.compare(a, b, direction));
}

#define STRATA_COMPARE(NAME, DIRECTION)                                                                      \
  at::Tensor& NAME##_tensor_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {         \
    auto lower = [&](Recorder& r) {                                                                         \
      const Result res = result_of([&] { return at::NAME(meta(self), meta(other)); }, &out);                \
      const ElementType t = element_type(at::result_type(self, other));                                     \
      lower_compare(r, r.operand(self, t, res.dims), r.operand(other, t, res.dims), DIRECTION, out);        \
    };                                                                                                      \
    STRATA_LOWER("aten::" #NAME ".Tensor_out", NAME##_Tensor_out, self, other, out);                         \
  }                                                                                                         \
  at::Tensor& NAME##_scalar_out(const at::Tensor& self, const at::Scalar& other, at::Tensor& out) {         \
    auto lower = [&](Recorder& r) {                                                                         \
      const Result res = result_of([&] { return at::NAME(meta(self), other); }, &out);                      \
      const ElementType t = element_type(at::result_type(self, other));                                     \
      lower_compare(r, r.operand(self, t, res.dims), r.broadcast(r.scalar(other, t), res.dims), DIRECTION,  \
                    out);                                                                                   \
    };                                                                                                      \
    STRATA_LOWER("aten::" #NAME ".Scalar_out", NAME##_Scalar_out, self, other, out);                         \
  }

STRATA_COMPARE(eq, Direction::kEQ)
STRATA_COMPARE(ne, Direction::kNE)
STRATA_COMPARE(lt, Direction::kLT)
STRATA_COMPARE(le, Direction::kLE)
STRATA_COMPARE(gt, Direction::kGT)
STRATA_COMPARE(ge, Direction::kGE)
#undef STRATA_COMPARE

// self == 0, in out's dtype.
at::Tensor& logical_not_out(const at::Tensor& self, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    NodePtr x = r.tensor(self);
    r.write(out, r.compare(x, r.splat(0.0, x->type().dtype, x->type().dims), Direction::kEQ));
  };
  STRATA_LOWER("aten::logical_not.out", logical_not_out, self, out);
}

// x != x: true where x is NaN (false for integers).
at::Tensor isnan(const at::Tensor& self) {
  try {
    Recorder r("aten::isnan");
    NodePtr x = r.tensor(self);
    at::Tensor out = at::empty(self.sizes(), self.options().dtype(at::kBool));
    r.write(out, r.compare(x, x, Direction::kNE));
    return out;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::isnan>::call(self);
}

// x == -inf (false for integers).
at::Tensor& isneginf_out(const at::Tensor& self, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    NodePtr x = r.tensor(self);
    const ElementType t = x->type().dtype;
    if (!is_floating(t)) {
      r.write(out, r.splat(0.0, ElementType::kPred, x->type().dims));
      return;
    }
    r.write(out, r.compare(x, r.splat(-std::numeric_limits<double>::infinity(), t, x->type().dims), Direction::kEQ));
  };
  STRATA_LOWER("aten::isneginf.out", isneginf_out, self, out);
}

// Logical not of a bool, bitwise not of an integer.
at::Tensor& bitwise_not_out(const at::Tensor& self, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    if (out.scalar_type() != self.scalar_type()) throw NotLowered{};
    NodePtr x = r.tensor(self);
    if (is_floating(x->type().dtype)) throw NotLowered{};  // LibTorch's own error
    r.write(out, r.unary("not", x, &shlo::Function::logical_not));
  };
  STRATA_LOWER("aten::bitwise_not.out", bitwise_not_out, self, out);
}

// Whether all (any) elements over `dims` are nonzero: the truth values as
// s32 reduced by min (max).
void lower_all_any(Recorder& r, bool all, const at::Tensor& self, const std::vector<int64_t>& dims,
                   const std::vector<int64_t>& out_dims, const at::Tensor& out) {
  if (self.numel() == 0) throw NotLowered{};  // LibTorch's identity (true, false): the fallback gives it
  NodePtr x = r.tensor(self);
  const std::vector<int64_t> over = self.dim() == 0 ? std::vector<int64_t>{} : dims;
  NodePtr truth = r.convert(r.compare(x, r.splat(0.0, x->type().dtype, x->type().dims), Direction::kNE),
                            ElementType::kS32);
  NodePtr reduced = r.reduce(truth, over, all ? shlo::ReduceOp::kMin : shlo::ReduceOp::kMax, all ? 1.0 : 0.0);
  r.write(out, r.reshape(r.convert(reduced, ElementType::kPred), out_dims));
}

at::Tensor& all_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::all(meta(self), dim, keepdim); }, &out);
    lower_all_any(r, true, self, reduced_dims(self, at::IntArrayRef{dim}), res.dims, out);
  };
  STRATA_LOWER("aten::all.out", all_out, self, dim, keepdim, out);
}

at::Tensor& all_dims_out(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::all(meta(self), dim, keepdim); }, &out);
    lower_all_any(r, true, self, reduced_dims(self, dim), res.dims, out);
  };
  STRATA_LOWER("aten::all.dims_out", all_dims_out, self, dim, keepdim, out);
}

at::Tensor& all_all_out(const at::Tensor& self, at::Tensor& out) {
  auto lower = [&](Recorder& r) { lower_all_any(r, true, self, reduced_dims(self, std::nullopt), {}, out); };
  STRATA_LOWER("aten::all.all_out", all_all_out, self, out);
}

at::Tensor& any_out(const at::Tensor& self, int64_t dim, bool keepdim, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::any(meta(self), dim, keepdim); }, &out);
    lower_all_any(r, false, self, reduced_dims(self, at::IntArrayRef{dim}), res.dims, out);
  };
  STRATA_LOWER("aten::any.out", any_out, self, dim, keepdim, out);
}

at::Tensor& any_dims_out(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::any(meta(self), dim, keepdim); }, &out);
    lower_all_any(r, false, self, reduced_dims(self, dim), res.dims, out);
  };
  STRATA_LOWER("aten::any.dims_out", any_dims_out, self, dim, keepdim, out);
}

at::Tensor& any_all_out(const at::Tensor& self, at::Tensor& out) {
  auto lower = [&](Recorder& r) { lower_all_any(r, false, self, reduced_dims(self, std::nullopt), {}, out); };
  STRATA_LOWER("aten::any.all_out", any_all_out, self, out);
}

}  // namespace

// Note [equal on the device]
// equal answers on the host, so it reads its result back: one program runs
// (every pending write first) and `eq(...).all()` comes back. One case
// needs no read: a tensor compared with itself (the same storage, offset,
// sizes and strides), which LibTorch's MultiheadAttention does in every
// forward to detect self-attention (torch::equal(query, key)); it is true
// without running the step. LibTorch's CPU kernel also answers false there
// when the tensor holds a NaN, which the device does not look for.
bool equal(const at::Tensor& self, const at::Tensor& other) {
  TORCH_CHECK(self.device() == other.device(), "[xla] equal got tensors on ", self.device(), " and ",
              other.device(), "; move both to one device first");
  TORCH_CHECK(self.scalar_type() == other.scalar_type(), "[xla] equal got tensors of dtype ", self.scalar_type(),
              " and ", other.scalar_type(), "; convert one first");
  if (!self.is_same_size(other)) return false;
  if (self.numel() == 0) return true;
  if (self.is_alias_of(other) && self.storage_offset() == other.storage_offset() && self.strides() == other.strides())
    return true;
  return at::eq(self, other).all().item<bool>();
}

void register_compare(torch::Library& library) {
  library.impl("equal", TORCH_FN(equal));
  library.impl("eq.Tensor_out", TORCH_FN(eq_tensor_out));
  library.impl("eq.Scalar_out", TORCH_FN(eq_scalar_out));
  library.impl("ne.Tensor_out", TORCH_FN(ne_tensor_out));
  library.impl("ne.Scalar_out", TORCH_FN(ne_scalar_out));
  library.impl("lt.Tensor_out", TORCH_FN(lt_tensor_out));
  library.impl("lt.Scalar_out", TORCH_FN(lt_scalar_out));
  library.impl("le.Tensor_out", TORCH_FN(le_tensor_out));
  library.impl("le.Scalar_out", TORCH_FN(le_scalar_out));
  library.impl("gt.Tensor_out", TORCH_FN(gt_tensor_out));
  library.impl("gt.Scalar_out", TORCH_FN(gt_scalar_out));
  library.impl("ge.Tensor_out", TORCH_FN(ge_tensor_out));
  library.impl("ge.Scalar_out", TORCH_FN(ge_scalar_out));
  library.impl("logical_not.out", TORCH_FN(logical_not_out));
  library.impl("isnan", TORCH_FN(isnan));
  library.impl("isneginf.out", TORCH_FN(isneginf_out));
  library.impl("bitwise_not.out", TORCH_FN(bitwise_not_out));
  library.impl("all.out", TORCH_FN(all_out));
  library.impl("all.dims_out", TORCH_FN(all_dims_out));
  library.impl("all.all_out", TORCH_FN(all_all_out));
  library.impl("any.out", TORCH_FN(any_out));
  library.impl("any.dims_out", TORCH_FN(any_dims_out));
  library.impl("any.all_out", TORCH_FN(any_all_out));
}

}  // namespace strata::xla::detail::lowering
