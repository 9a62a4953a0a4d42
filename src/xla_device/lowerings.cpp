// The xla device's lowered kernels: ops that record nodes of the lazy graph
// (lazy_graph.h) instead of running, emitted as StableHLO when the step is
// marked (Note [One program per step] in recorder.cpp).
//
// Note [What is lowered]
// A kernel lowers a call only in the simple, common case, and hands every
// other one to the CPU fallback (Note [The CPU fallback] in kernels.cpp),
// which syncs the step first and so stays correct for anything:
//   - each xla input is read from its storage's whole value: contiguous, a
//     transpose such as w.t(), or a strided sub-box of the storage such as
//     a split or a narrow (Note [Strided views as slices] in lowering.h);
//   - the output (out=, or self for in-place) is dense in any order of
//     dims, or a sub-box of its storage (a narrow, a strided slice, a
//     column), and has no two elements in one place (Note [Writes into a
//     view] in lowering.h);
//   - the other inputs are Scalars or 0-dim CPU tensors (wrapped numbers).
// Views keep resolving against their base's storage: a write into a view
// rebinds the base's storage to its value with the view's part replaced.
//
// Note [Shapes and dtypes from meta tensors]
// Each kernel runs its op on meta copies of its inputs (wrapped numbers
// stay wrapped), so the output's sizes and dtype follow LibTorch's own
// broadcasting and promotion rules; the emitted op converts every input to
// that dtype, computes in it, and converts to the out tensor's dtype last,
// as a TensorIterator kernel does.
//
// Note [Scalars in the graph]
// 0, 1 and -1 are baked into the program, as torch_xla does; every other
// Scalar and wrapped number is a host-scalar parameter fed at run time, so
// AdamW's step-varying bias corrections and learning rate give the same
// program text, and the compile cache hits, step after step. Constants that
// follow from shapes (the 1/N of a mean) are baked.
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/add.h>
#include <ATen/ops/addcdiv.h>
#include <ATen/ops/addcmul.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/div.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_strided.h>
#include <ATen/ops/fill.h>
#include <ATen/ops/maximum.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/minimum.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/mse_loss_backward.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/threshold_backward.h>
#include <ATen/ops/zero.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/WrapDimMinimal.h>
#include <ATen/ExpandUtils.h>
#include <torch/library.h>

#include <algorithm>
#include <numeric>

#include "strata/xla/lazy_graph.h"
#include "lazy_buffer.h"
#include "lowering.h"
#include "runtime.h"

namespace strata::xla::detail {
namespace {

using namespace lowering;

// alpha * x for add and sub. LibTorch's add kernel takes alpha in the
// result's dtype (alpha.to<scalar_t>()), so for a bf16 result alpha is
// rounded to bf16 before the f32 product (Note [bf16 computes in f32]).
NodePtr alpha_times(Recorder& r, const Result& res, const at::Scalar& alpha, const NodePtr& x) {
  if (!reduced_float(res.stored) || alpha.isComplex() || alpha.toDouble() == 1.0) return r.scaled(alpha, x);
  NodePtr a = r.convert(r.scalar(alpha, res.stored), res.dtype);
  return r.binary(Binary::kMultiply, r.broadcast(a, x->type().dims), x);
}

// Note [Complex arithmetic as parts]
// add, sub and mul with a complex result (the backwards of the Fourier
// transforms make them: gradients summed, a half spectrum doubled) are
// computed on the parts (Note [Complex tensors on the xla device] in
// lazy_buffer.h), as LibTorch's complex<float> computes them: (a + bi)(c +
// di) = (ac - bd) + (ad + bc)i, a real operand or alpha being c + 0i.
// Complex alphas and half-precision parts take the fallback.
using Parts = std::pair<NodePtr, NodePtr>;

// An operand of a complex op as its parts of `part`, broadcast to `dims`:
// a complex xla tensor, a real one, or a 0-dim CPU scalar.
Parts complex_operand(Recorder& r, const at::Tensor& t, ElementType part, const std::vector<int64_t>& dims) {
  if (t.device().is_cpu() && t.dim() == 0) {
    const c10::complex<double> z = t.item().toComplexDouble();
    return {r.broadcast(r.scalar(z.real(), part), dims), r.broadcast(r.scalar(z.imag(), part), dims)};
  }
  if (!t.is_complex()) return {r.operand(t, part, dims), r.splat(0.0, part, dims)};
  const auto [re, im] = parts_of(r, t);
  return {r.broadcast(r.convert(re, part), dims), r.broadcast(r.convert(im, part), dims)};
}

void complex_binary(Recorder& r, Binary kind, const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha,
                    at::Tensor& out) {
  if (alpha.isComplex()) throw NotLowered{};
  at::Tensor m;
  try {
    m = kind == Binary::kMultiply ? at::mul(meta(self), meta(other)) : at::add(meta(self), meta(other));
  } catch (const c10::Error&) {
    throw NotLowered{};
  }
  ElementType part = ElementType::kF32;
  if (m.scalar_type() != out.scalar_type() || !complex_storage_type_of(m.scalar_type(), part) ||
      part == ElementType::kF16)
    throw NotLowered{};
  const std::vector<int64_t> dims = vec(m.sizes());
  const auto [a, b] = complex_operand(r, self, part, dims);
  auto [c, d] = complex_operand(r, other, part, dims);
  if (kind == Binary::kMultiply) {
    write_complex(r, out, r.binary(Binary::kSubtract, r.binary(kind, a, c), r.binary(kind, b, d)),
                  r.binary(Binary::kAdd, r.binary(kind, a, d), r.binary(kind, b, c)));
    return;
  }
  c = r.scaled(alpha, c), d = r.scaled(alpha, d);
  write_complex(r, out, r.binary(kind, a, c), r.binary(kind, b, d));
}

at::Tensor& add_out(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    if (out.is_complex()) return complex_binary(r, Binary::kAdd, self, other, alpha, out);
    const Result res = result_of([&] { return at::add(meta(self), meta(other), alpha); }, &out);
    r.write(out, r.binary(Binary::kAdd, r.operand(self, res.dtype, res.dims),
                          alpha_times(r, res, alpha, r.operand(other, res.dtype, res.dims))));
  };
  STRATA_LOWER("aten::add.out", add_out, self, other, alpha, out);
}

at::Tensor& sub_out(const at::Tensor& self, const at::Tensor& other, const at::Scalar& alpha, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    if (out.is_complex()) return complex_binary(r, Binary::kSubtract, self, other, alpha, out);
    const Result res = result_of([&] { return at::sub(meta(self), meta(other), alpha); }, &out);
    r.write(out, r.binary(Binary::kSubtract, r.operand(self, res.dtype, res.dims),
                          alpha_times(r, res, alpha, r.operand(other, res.dtype, res.dims))));
  };
  STRATA_LOWER("aten::sub.out", sub_out, self, other, alpha, out);
}

at::Tensor& mul_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    if (out.is_complex()) return complex_binary(r, Binary::kMultiply, self, other, 1, out);
    const Result res = result_of([&] { return at::mul(meta(self), meta(other)); }, &out);
    r.write(out, r.binary(Binary::kMultiply, r.operand(self, res.dtype, res.dims),
                          r.operand(other, res.dtype, res.dims)));
  };
  STRATA_LOWER("aten::mul.out", mul_out, self, other, out);
}

at::Tensor& div_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::div(meta(self), meta(other)); }, &out);
    if (!is_floating(res.dtype)) throw NotLowered{};
    r.write(out, r.binary(Binary::kDivide, r.operand(self, res.dtype, res.dims),
                          r.operand(other, res.dtype, res.dims)));
  };
  STRATA_LOWER("aten::div.out", div_out, self, other, out);
}

// The element-wise maximum and minimum (Adam's amsgrad keeps a running
// maximum), NaN from either side (nan_propagating in lowering.h).
at::Tensor& maximum_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::maximum(meta(self), meta(other)); }, &out);
    r.write(out, nan_propagating(r, Binary::kMaximum, r.operand(self, res.dtype, res.dims),
                                 r.operand(other, res.dtype, res.dims)));
  };
  STRATA_LOWER("aten::maximum.out", maximum_out, self, other, out);
}

at::Tensor& minimum_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::minimum(meta(self), meta(other)); }, &out);
    r.write(out, nan_propagating(r, Binary::kMinimum, r.operand(self, res.dtype, res.dims),
                                 r.operand(other, res.dtype, res.dims)));
  };
  STRATA_LOWER("aten::minimum.out", minimum_out, self, other, out);
}

// self + value * t1 * t2, in LibTorch's CPU kernel's order.
at::Tensor& addcmul_out(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2, const at::Scalar& value,
                        at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::addcmul(meta(self), meta(t1), meta(t2), value); }, &out);
    NodePtr product = r.binary(Binary::kMultiply, r.scaled(value, r.operand(t1, res.dtype, res.dims)),
                               r.operand(t2, res.dtype, res.dims));
    r.write(out, r.binary(Binary::kAdd, r.operand(self, res.dtype, res.dims), product));
  };
  STRATA_LOWER("aten::addcmul.out", addcmul_out, self, t1, t2, value, out);
}

// self + value * t1 / t2, in LibTorch's CPU kernel's order.
at::Tensor& addcdiv_out(const at::Tensor& self, const at::Tensor& t1, const at::Tensor& t2, const at::Scalar& value,
                        at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::addcdiv(meta(self), meta(t1), meta(t2), value); }, &out);
    if (!is_floating(res.dtype)) throw NotLowered{};
    NodePtr quotient = r.binary(Binary::kDivide, r.scaled(value, r.operand(t1, res.dtype, res.dims)),
                                r.operand(t2, res.dtype, res.dims));
    r.write(out, r.binary(Binary::kAdd, r.operand(self, res.dtype, res.dims), quotient));
  };
  STRATA_LOWER("aten::addcdiv.out", addcdiv_out, self, t1, t2, value, out);
}

at::Tensor& sqrt_out(const at::Tensor& self, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::sqrt(meta(self)); }, &out);
    if (!is_floating(res.dtype)) throw NotLowered{};
    NodePtr x = r.operand(self, res.dtype, res.dims);
    r.write(out, r.op("sqrt", {x}, x->type(), [](shlo::Function& f, const std::vector<shlo::Value>& in) {
      return f.sqrt(in[0]);
    }));
  };
  STRATA_LOWER("aten::sqrt.out", sqrt_out, self, out);
}

at::Tensor& neg_out(const at::Tensor& self, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::neg(meta(self)); }, &out);
    NodePtr x = r.operand(self, res.dtype, res.dims);
    r.write(out, r.op("negate", {x}, x->type(), [](shlo::Function& f, const std::vector<shlo::Value>& in) {
      return f.negate(in[0]);
    }));
  };
  STRATA_LOWER("aten::neg.out", neg_out, self, out);
}

// mat1 @ mat2 of two matrices in `dtype`.
NodePtr matmul(Recorder& r, const at::Tensor& mat1, const at::Tensor& mat2, ElementType dtype) {
  NodePtr a = r.convert(r.tensor(mat1), dtype), b = r.convert(r.tensor(mat2), dtype);
  if (a->type().dims.size() != 2 || b->type().dims.size() != 2) throw NotLowered{};
  const shlo::Type type{dtype, {a->type().dims[0], b->type().dims[1]}};
  return r.op("dot", {a, b}, type, [](shlo::Function& f, const std::vector<shlo::Value>& in) {
    return f.dot_general(in[0], in[1], shlo::DotDims{{}, {}, {1}, {0}});
  });
}

at::Tensor& mm_out(const at::Tensor& self, const at::Tensor& mat2, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::mm(meta(self), meta(mat2)); }, &out);
    r.write(out, matmul(r, self, mat2, res.dtype));
  };
  STRATA_LOWER("aten::mm.out", mm_out, self, mat2, out);
}

// beta * self + alpha * (mat1 @ mat2); self is not read when beta is 0.
at::Tensor& addmm_out(const at::Tensor& self, const at::Tensor& mat1, const at::Tensor& mat2, const at::Scalar& beta,
                      const at::Scalar& alpha, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::addmm(meta(self), meta(mat1), meta(mat2), beta, alpha); }, &out);
    NodePtr product = r.scaled(alpha, matmul(r, mat1, mat2, res.dtype));
    if (!beta.isComplex() && beta.toDouble() == 0.0) {
      r.write(out, product);
      return;
    }
    r.write(out, r.binary(Binary::kAdd, r.scaled(beta, r.operand(self, res.dtype, res.dims)), product));
  };
  STRATA_LOWER("aten::addmm.out", addmm_out, self, mat1, mat2, beta, alpha, out);
}

NodePtr relu_of(Recorder& r, const at::Tensor& self) {
  NodePtr x = r.tensor(self);
  return r.binary(Binary::kMaximum, x, r.broadcast(r.constant(0.0, x->type().dtype), x->type().dims));
}

at::Tensor relu(const at::Tensor& self) {
  try {
    Recorder r("aten::relu");
    if (self.scalar_type() == at::kBool) throw NotLowered{};
    NodePtr value = relu_of(r, self);
    at::Tensor out = at::empty(self.sizes(), self.options());
    r.write(out, value);
    return out;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::relu>::call(self);
}

at::Tensor& relu_(at::Tensor& self) {
  try {
    Recorder r("aten::relu_");
    if (self.scalar_type() == at::kBool) throw NotLowered{};
    r.write(self, relu_of(r, self));
    return self;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::relu_>::call(self);
}

// grad_output where self > threshold, else 0.
at::Tensor& threshold_backward_out(const at::Tensor& grad_output, const at::Tensor& self, const at::Scalar& threshold,
                                   at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res =
        result_of([&] { return at::threshold_backward(meta(grad_output), meta(self), threshold); }, &out);
    NodePtr g = r.operand(grad_output, res.dtype, res.dims);
    NodePtr x = r.operand(self, res.dtype, res.dims);
    NodePtr t = r.broadcast(r.scalar(threshold, res.dtype), res.dims);
    NodePtr zero = r.broadcast(r.constant(0.0, res.dtype), res.dims);
    r.write(out, r.op("threshold_backward", {x, t, zero, g}, g->type(),
                      [](shlo::Function& f, const std::vector<shlo::Value>& in) {
                        return f.select(f.compare(in[0], in[1], shlo::Direction::kLE), in[2], in[3]);
                      }));
  };
  STRATA_LOWER("aten::threshold_backward.grad_input", threshold_backward_grad_input, grad_output, self, threshold,
               out);
}

at::Tensor& sum_out(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                    std::optional<at::ScalarType> dtype, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::sum(meta(self), dim, keepdim, dtype); }, &out);
    NodePtr x = r.convert(r.tensor(self), res.dtype);
    r.write(out, r.reshape(r.sum(x, reduced_dims(self, dim)), res.dims));
  };
  STRATA_LOWER("aten::sum.IntList_out", sum_IntList_out, self, dim, keepdim, dtype, out);
}

at::Tensor& mean_out(const at::Tensor& self, at::OptionalIntArrayRef dim, bool keepdim,
                     std::optional<at::ScalarType> dtype, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::mean(meta(self), dim, keepdim, dtype); }, &out);
    if (!is_floating(res.dtype)) throw NotLowered{};
    const std::vector<int64_t> dims = reduced_dims(self, dim);
    int64_t count = 1;
    for (int64_t d : dims) count *= self.size(d);
    NodePtr total = r.reshape(r.sum(r.convert(r.tensor(self), res.dtype), dims), res.dims);
    r.write(out, r.binary(Binary::kDivide, total, r.broadcast(r.constant(static_cast<double>(count), res.dtype), res.dims)));
  };
  STRATA_LOWER("aten::mean.out", mean_out, self, dim, keepdim, dtype, out);
}

// Reduction codes of LibTorch's losses (at::Reduction).
constexpr int64_t kReductionNone = 0, kReductionMean = 1, kReductionSum = 2;

at::Tensor& mse_loss_out(const at::Tensor& self, const at::Tensor& target, int64_t reduction, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    // mse_loss has no meta kernel: the element-wise difference's meta
    // result gives the dtype and the broadcast shape.
    const Result diff_res = result_of([&] { return at::sub(meta(self), meta(target)); }, &out);
    if (!is_floating(diff_res.dtype)) throw NotLowered{};
    const std::vector<int64_t> shape = diff_res.dims;
    const Result res{reduction == kReductionNone ? shape : std::vector<int64_t>{}, diff_res.dtype, diff_res.stored};
    NodePtr diff = r.binary(Binary::kSubtract, r.operand(self, res.dtype, shape), r.operand(target, res.dtype, shape));
    // LibTorch stores the squares in the input's dtype, then sums them (in
    // f32 for bf16, Note [bf16 computes in f32]).
    NodePtr squared = rounded(r, r.binary(Binary::kMultiply, diff, diff), res.stored);
    if (reduction == kReductionNone) {
      r.write(out, squared);
      return;
    }
    std::vector<int64_t> all(shape.size());
    std::iota(all.begin(), all.end(), 0);
    NodePtr total = r.sum(squared, all);
    if (reduction == kReductionMean) {
      int64_t n = 1;
      for (int64_t s : shape) n *= s;
      total = r.binary(Binary::kDivide, total, r.constant(static_cast<double>(n), res.dtype));
    } else if (reduction != kReductionSum) {
      throw NotLowered{};
    }
    r.write(out, r.reshape(total, res.dims));
  };
  STRATA_LOWER("aten::mse_loss.out", mse_loss_out, self, target, reduction, out);
}

// norm * (self - target) * grad_output, norm = 2 (2/N for a mean), as
// LibTorch's CPU kernel computes it: in bf16 its vectorised kernel rounds
// norm and each product to bf16 (Vectorized<BFloat16> arithmetic), so
// the lowering does too.
NodePtr mse_loss_grad(Recorder& r, const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
                      int64_t reduction) {
  if (reduction != kReductionNone && reduction != kReductionMean && reduction != kReductionSum) throw NotLowered{};
  if (self.scalar_type() != target.scalar_type() || self.scalar_type() != grad_output.scalar_type()) throw NotLowered{};
  const ElementType stored = element_type(self.scalar_type()), dtype = opmath(stored);
  if (!is_floating(dtype)) throw NotLowered{};
  const std::vector<int64_t> dims = vec(self.sizes());
  if (at::infer_size(at::infer_size(self.sizes(), target.sizes()), grad_output.sizes()) != self.sizes())
    throw NotLowered{};
  const double norm = reduction == kReductionMean ? 2.0 / static_cast<double>(self.numel()) : 2.0;
  NodePtr diff =
      rounded(r, r.binary(Binary::kSubtract, r.operand(self, dtype, dims), r.operand(target, dtype, dims)), stored);
  NodePtr k = r.convert(r.constant(norm, stored), dtype);
  NodePtr scaled = rounded(r, r.binary(Binary::kMultiply, r.broadcast(k, dims), diff), stored);
  return r.binary(Binary::kMultiply, scaled, r.operand(grad_output, dtype, dims));
}

at::Tensor mse_loss_backward(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
                             int64_t reduction) {
  try {
    Recorder r("aten::mse_loss_backward");
    NodePtr value = mse_loss_grad(r, grad_output, self, target, reduction);
    at::Tensor out = at::empty(self.sizes(), self.options());
    r.write(out, value);
    return out;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::mse_loss_backward>::call(grad_output, self, target,
                                                                                        reduction);
}

at::Tensor& mse_loss_backward_out(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& target,
                                  int64_t reduction, at::Tensor& out) {
  auto lower = [&](Recorder& r) { r.write(out, mse_loss_grad(r, grad_output, self, target, reduction)); };
  STRATA_LOWER("aten::mse_loss_backward.grad_input", mse_loss_backward_grad_input, grad_output, self, target,
               reduction, out);
}

// The whole of `self` set to `value` (a view that is not its whole
// storage takes the fallback).
void fill_whole(Recorder& r, const at::Tensor& self, const at::Scalar& value) {
  if (self.is_complex()) {
    ElementType part = ElementType::kF32;
    complex_storage_type_of(self.scalar_type(), part);
    const c10::complex<double> z = value.toComplexDouble();
    const std::vector<int64_t> dims = vec(self.sizes());
    write_complex(r, self, r.broadcast(r.scalar(z.real(), part), dims), r.broadcast(r.scalar(z.imag(), part), dims));
    return;
  }
  const ElementType dtype = element_type(self.scalar_type());
  r.write(self, r.broadcast(r.scalar(value, dtype), vec(self.sizes())));
}

at::Tensor& fill_(at::Tensor& self, const at::Scalar& value) {
  try {
    Recorder r("aten::fill_.Scalar");
    fill_whole(r, self, value);
    return self;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::fill__Scalar>::call(self, value);
}

at::Tensor& zero_(at::Tensor& self) {
  try {
    Recorder r("aten::zero_");
    fill_whole(r, self, 0);
    return self;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::zero_>::call(self);
}

#undef STRATA_LOWER

}  // namespace

// A copy into a tensor of any layout a write takes (the bf16 copy of a
// transposed weight that autocast makes: `to` keeps the source's strides;
// a copy_ into a narrowed view) is the source cast and broadcast to the
// destination's shape (Note [Writes into a view] in lowering.h).
bool lower_copy(const at::Tensor& src, const at::Tensor& dst) {
  try {
    Recorder r("aten::_copy_from");
    if (dst.is_complex()) {
      // A real source is the real part (Note [Complex tensors on the xla
      // device] in lazy_buffer.h); a complex source to a real destination
      // drops the imaginary part with LibTorch's warning, on the fallback.
      const std::vector<int64_t> dims = vec(dst.sizes());
      if (src.is_complex()) {
        const auto [re, im] = parts_of(r, src);
        write_complex(r, dst, r.broadcast(re, dims), r.broadcast(im, dims));
      } else {
        const NodePtr re = r.broadcast(r.tensor(src), dims);
        write_complex(r, dst, re, r.splat(0.0, re->type().dtype, dims));
      }
      return true;
    }
    const ElementType dtype = element_type(dst.scalar_type());
    r.write(dst, r.broadcast(r.convert(r.tensor(src), dtype), vec(dst.sizes())));
    return true;
  } catch (const NotLowered&) {
    return false;
  }
}

void register_lowerings(torch::Library& library) {
  lowering::register_nn(library);
  lowering::register_shape(library);
  lowering::register_autocast();
  lowering::register_checks(library);
  lowering::register_random(library);
  lowering::register_rnn(library);
  lowering::register_activation(library);
  lowering::register_norm(library);
  lowering::register_loss(library);
  lowering::register_index(library);
  lowering::register_compare(library);
  lowering::register_math(library);
  lowering::register_conv(library);
  lowering::register_distance(library);
  lowering::register_embedding_bag(library);
  lowering::register_grid_sampler(library);
  lowering::register_optim(library);
  lowering::register_fft(library);
  library.impl("add.out", TORCH_FN(add_out));
  library.impl("sub.out", TORCH_FN(sub_out));
  library.impl("mul.out", TORCH_FN(mul_out));
  library.impl("div.out", TORCH_FN(div_out));
  library.impl("maximum.out", TORCH_FN(maximum_out));
  library.impl("minimum.out", TORCH_FN(minimum_out));
  library.impl("addcmul.out", TORCH_FN(addcmul_out));
  library.impl("addcdiv.out", TORCH_FN(addcdiv_out));
  library.impl("sqrt.out", TORCH_FN(sqrt_out));
  library.impl("neg.out", TORCH_FN(neg_out));
  library.impl("mm.out", TORCH_FN(mm_out));
  library.impl("addmm.out", TORCH_FN(addmm_out));
  library.impl("relu", TORCH_FN(relu));
  library.impl("relu_", TORCH_FN(relu_));
  library.impl("threshold_backward.grad_input", TORCH_FN(threshold_backward_out));
  library.impl("sum.IntList_out", TORCH_FN(sum_out));
  library.impl("mean.out", TORCH_FN(mean_out));
  library.impl("mse_loss.out", TORCH_FN(mse_loss_out));
  library.impl("mse_loss_backward", TORCH_FN(mse_loss_backward));
  library.impl("mse_loss_backward.grad_input", TORCH_FN(mse_loss_backward_out));
  library.impl("fill_.Scalar", TORCH_FN(fill_));
  library.impl("zero_", TORCH_FN(zero_));
}

}  // namespace strata::xla::detail
