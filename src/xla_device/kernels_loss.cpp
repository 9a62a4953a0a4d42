// Lowered kernels of the losses and their backwards: binary cross-entropy,
// log_sigmoid (which binary_cross_entropy_with_logits is made of), smooth
// L1 and xlogy (which kl_div is made of); Note [What is lowered] in
// lowerings.cpp. cross_entropy with label smoothing is LibTorch's
// composite of log_softmax, nll_loss and sums, all lowered. The formulas
// are those of LibTorch's CPU kernels (aten/src/ATen/native/Loss.cpp,
// cpu/BinaryOpsKernel.cpp, cpu/Activation.cpp): an element-wise loss is
// stored in the input's dtype, then reduced (Note [bf16 computes in f32] in
// lowering.h). The CPU kernel's check that binary cross-entropy's input
// lies in [0, 1] reads the values, which a lazy step cannot: out-of-range
// inputs give NaN or a clamped log here, where LibTorch raises.
#include <ATen/ops/binary_cross_entropy.h>
#include <ATen/ops/binary_cross_entropy_backward.h>
#include <ATen/ops/log_sigmoid_backward.h>
#include <ATen/ops/log_sigmoid_forward.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/smooth_l1_loss.h>
#include <ATen/ops/smooth_l1_loss_backward.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/xlogy.h>

#include <numeric>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

using Direction = shlo::Direction;

constexpr int64_t kReductionNone = 0, kReductionMean = 1, kReductionSum = 2;

NodePtr mul(Recorder& r, const NodePtr& a, const NodePtr& b) { return r.binary(Binary::kMultiply, a, b); }
NodePtr add(Recorder& r, const NodePtr& a, const NodePtr& b) { return r.binary(Binary::kAdd, a, b); }
NodePtr sub(Recorder& r, const NodePtr& a, const NodePtr& b) { return r.binary(Binary::kSubtract, a, b); }
NodePtr div(Recorder& r, const NodePtr& a, const NodePtr& b) { return r.binary(Binary::kDivide, a, b); }
NodePtr like(Recorder& r, double k, const NodePtr& x) { return r.splat(k, x->type().dtype, x->type().dims); }
NodePtr log(Recorder& r, const NodePtr& x) { return r.unary("log", x, &shlo::Function::log); }
NodePtr log1p(Recorder& r, const NodePtr& x) { return r.unary("log_plus_one", x, &shlo::Function::log_plus_one); }
NodePtr exp(Recorder& r, const NodePtr& x) { return r.unary("exponential", x, &shlo::Function::exponential); }
NodePtr neg(Recorder& r, const NodePtr& x) { return r.unary("negate", x, &shlo::Function::negate); }
NodePtr abs(Recorder& r, const NodePtr& x) { return r.unary("abs", x, &shlo::Function::abs); }

// The element-wise `loss` (stored as `stored`) reduced as `reduction` asks.
NodePtr reduced_loss(Recorder& r, NodePtr loss, int64_t reduction, ElementType stored) {
  loss = rounded(r, loss, stored);
  if (reduction == kReductionNone) return loss;
  std::vector<int64_t> all(loss->type().dims.size());
  std::iota(all.begin(), all.end(), 0);
  int64_t n = 1;
  for (int64_t s : loss->type().dims) n *= s;
  NodePtr total = r.sum(loss, all);
  if (reduction == kReductionSum) return total;
  if (reduction != kReductionMean) throw NotLowered{};
  return div(r, total, r.constant(static_cast<double>(n), total->type().dtype));
}

// The factor a gradient of `reduction` carries: 1 / N for a mean.
NodePtr norm(Recorder& r, int64_t reduction, int64_t numel, const NodePtr& like_this) {
  if (reduction != kReductionNone && reduction != kReductionMean && reduction != kReductionSum) throw NotLowered{};
  return like(r, reduction == kReductionMean ? 1.0 / static_cast<double>(numel) : 1.0, like_this);
}

// The incoming gradient broadcast to the loss's shape.
NodePtr incoming(Recorder& r, const at::Tensor& grad_output, ElementType t, const std::vector<int64_t>& dims) {
  return r.operand(grad_output, t, dims);
}

// (target - 1) * max(log1p(-x), -100) - target * max(log(x), -100), times
// weight.
NodePtr bce(Recorder& r, const at::Tensor& self, const at::Tensor& target, const std::optional<at::Tensor>& weight,
            ElementType t) {
  if (self.sizes() != target.sizes() || self.scalar_type() != target.scalar_type()) throw NotLowered{};
  const std::vector<int64_t> dims = vec(self.sizes());
  NodePtr x = r.convert(r.tensor(self), t), y = r.convert(r.tensor(target), t);
  NodePtr floor = like(r, -100.0, x);
  NodePtr log_x = r.binary(Binary::kMaximum, log(r, x), floor);
  NodePtr log_1mx = r.binary(Binary::kMaximum, log1p(r, neg(r, x)), floor);
  NodePtr loss = sub(r, mul(r, sub(r, y, like(r, 1.0, y)), log_1mx), mul(r, y, log_x));
  if (weight && weight->defined()) loss = mul(r, loss, r.operand(*weight, t, dims));
  return loss;
}

at::Tensor& binary_cross_entropy_out(const at::Tensor& self, const at::Tensor& target,
                                     const std::optional<at::Tensor>& weight, int64_t reduction, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const ElementType stored = element_type(self.scalar_type()), t = opmath(stored);
    if (!is_floating(t) || out.scalar_type() != self.scalar_type()) throw NotLowered{};
    r.write(out, reduced_loss(r, bce(r, self, target, weight, t), reduction, stored));
  };
  STRATA_LOWER("aten::binary_cross_entropy.out", binary_cross_entropy_out, self, target, weight, reduction, out);
}

at::Tensor binary_cross_entropy(const at::Tensor& self, const at::Tensor& target,
                                const std::optional<at::Tensor>& weight, int64_t reduction) {
  at::Tensor out = at::empty({0}, self.options());
  return binary_cross_entropy_out(self, target, weight, reduction, out);
}

// grad * (x - target) / max((1 - x) * x, 1e-12) * weight, / N for a mean.
at::Tensor& binary_cross_entropy_backward_out(const at::Tensor& grad_output, const at::Tensor& self,
                                              const at::Tensor& target, const std::optional<at::Tensor>& weight,
                                              int64_t reduction, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const ElementType t = opmath(element_type(self.scalar_type()));
    if (!is_floating(t) || self.sizes() != target.sizes()) throw NotLowered{};
    const std::vector<int64_t> dims = vec(self.sizes());
    NodePtr x = r.convert(r.tensor(self), t), y = r.convert(r.tensor(target), t);
    NodePtr denominator = r.binary(Binary::kMaximum, mul(r, sub(r, like(r, 1.0, x), x), x), like(r, 1e-12, x));
    NodePtr g = div(r, mul(r, incoming(r, grad_output, t, dims), sub(r, x, y)), denominator);
    if (weight && weight->defined()) g = mul(r, g, r.operand(*weight, t, dims));
    r.write(out, mul(r, g, norm(r, reduction, self.numel(), g)));
  };
  STRATA_LOWER("aten::binary_cross_entropy_backward.grad_input", binary_cross_entropy_backward_grad_input,
               grad_output, self, target, weight, reduction, out);
}

at::Tensor binary_cross_entropy_backward(const at::Tensor& grad_output, const at::Tensor& self,
                                         const at::Tensor& target, const std::optional<at::Tensor>& weight,
                                         int64_t reduction) {
  at::Tensor out = at::empty(self.sizes(), self.options());
  return binary_cross_entropy_backward_out(grad_output, self, target, weight, reduction, out);
}

// z = exp(-|x|): output min(x, 0) - log1p(z), buffer z.
std::tuple<at::Tensor&, at::Tensor&> log_sigmoid_forward_out(const at::Tensor& self, at::Tensor& output,
                                                             at::Tensor& buffer) {
  try {
    Recorder r("aten::log_sigmoid_forward.output");
    const ElementType t = opmath(element_type(self.scalar_type()));
    if (!is_floating(t)) throw NotLowered{};
    NodePtr x = r.convert(r.tensor(self), t);
    NodePtr z = exp(r, neg(r, abs(r, x)));
    NodePtr value = sub(r, r.binary(Binary::kMinimum, x, like(r, 0.0, x)), log1p(r, z));
    r.write(output, value);
    r.write(buffer, z);
    return {output, buffer};
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::log_sigmoid_forward_output>::call(self, output,
                                                                                                 buffer);
}

std::tuple<at::Tensor, at::Tensor> log_sigmoid_forward(const at::Tensor& self) {
  at::Tensor output = at::empty(self.sizes(), self.options()), buffer = at::empty(self.sizes(), self.options());
  log_sigmoid_forward_out(self, output, buffer);
  return {output, buffer};
}

// grad * (max_deriv - sign * z / (1 + z)): max_deriv 1 and sign 1 where
// x < 0, else 0 and -1.
at::Tensor& log_sigmoid_backward_out(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& buffer,
                                     at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const ElementType t = opmath(element_type(self.scalar_type()));
    if (!is_floating(t) || buffer.sizes() != self.sizes()) throw NotLowered{};
    const std::vector<int64_t> dims = vec(self.sizes());
    NodePtr x = r.convert(r.tensor(self), t), z = r.convert(r.tensor(buffer), t);
    NodePtr negative = r.compare(x, like(r, 0.0, x), Direction::kLT);
    NodePtr ratio = div(r, z, add(r, like(r, 1.0, z), z));
    NodePtr d = r.select(negative, sub(r, like(r, 1.0, z), ratio), ratio);
    r.write(out, mul(r, incoming(r, grad_output, t, dims), d));
  };
  STRATA_LOWER("aten::log_sigmoid_backward.grad_input", log_sigmoid_backward_grad_input, grad_output, self, buffer,
               out);
}

at::Tensor log_sigmoid_backward(const at::Tensor& grad_output, const at::Tensor& self, const at::Tensor& buffer) {
  at::Tensor out = at::empty(self.sizes(), self.options());
  return log_sigmoid_backward_out(grad_output, self, buffer, out);
}

// z = |x - y|: z < beta ? 0.5 * z^2 / beta : z - 0.5 * beta.
at::Tensor& smooth_l1_loss_out(const at::Tensor& self, const at::Tensor& target, int64_t reduction, double beta,
                               at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result diff = result_of([&] { return at::sub(meta(self), meta(target)); }, &out);
    (void)result_of([&] { return at::smooth_l1_loss(meta(self), meta(target), reduction, beta); }, &out);
    if (!is_floating(diff.dtype)) throw NotLowered{};
    NodePtr z = abs(r, sub(r, r.operand(self, diff.dtype, diff.dims), r.operand(target, diff.dtype, diff.dims)));
    NodePtr quadratic = div(r, mul(r, like(r, 0.5, z), mul(r, z, z)), r.broadcast(r.scalar(beta, diff.dtype), diff.dims));
    NodePtr linear = sub(r, z, r.broadcast(r.scalar(0.5 * beta, diff.dtype), diff.dims));
    NodePtr loss = r.select(r.compare(z, r.broadcast(r.scalar(beta, diff.dtype), diff.dims), Direction::kLT),
                            quadratic, linear);
    r.write(out, reduced_loss(r, loss, reduction, diff.stored));
  };
  STRATA_LOWER("aten::smooth_l1_loss.out", smooth_l1_loss_out, self, target, reduction, beta, out);
}

// d = x - y: d <= -beta ? -norm * g : d >= beta ? norm * g : norm * d * g / beta.
at::Tensor& smooth_l1_loss_backward_out(const at::Tensor& grad_output, const at::Tensor& self,
                                        const at::Tensor& target, int64_t reduction, double beta, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const ElementType t = opmath(element_type(self.scalar_type()));
    if (!is_floating(t) || out.scalar_type() != self.scalar_type()) throw NotLowered{};
    const Result res = result_of([&] { return at::sub(meta(self), meta(target)); }, &out);
    const std::vector<int64_t> dims = res.dims;
    NodePtr d = sub(r, r.operand(self, t, dims), r.operand(target, t, dims));
    NodePtr g = mul(r, norm(r, reduction, self.numel(), d), incoming(r, grad_output, t, dims));
    NodePtr b = r.broadcast(r.scalar(beta, t), dims), minus_b = r.broadcast(r.scalar(-beta, t), dims);
    NodePtr inside = div(r, mul(r, d, g), b);
    NodePtr value = r.select(r.compare(d, minus_b, Direction::kLE), neg(r, g),
                             r.select(r.compare(d, b, Direction::kGE), g, inside));
    r.write(out, value);
  };
  STRATA_LOWER("aten::smooth_l1_loss_backward.grad_input", smooth_l1_loss_backward_grad_input, grad_output, self,
               target, reduction, beta, out);
}

// x * log(y), 0 where x is 0 (and y not NaN), NaN where y is NaN.
at::Tensor& xlogy_out(const at::Tensor& self, const at::Tensor& other, at::Tensor& out) {
  auto lower = [&](Recorder& r) {
    const Result res = result_of([&] { return at::xlogy(meta(self), meta(other)); }, &out);
    if (!is_floating(res.dtype)) throw NotLowered{};
    NodePtr x = r.operand(self, res.dtype, res.dims), y = r.operand(other, res.dtype, res.dims);
    NodePtr product = mul(r, x, log(r, y));
    NodePtr zero = r.op("and", {r.compare(x, like(r, 0.0, x), Direction::kEQ), r.compare(y, y, Direction::kEQ)},
                        {ElementType::kPred, res.dims},
                        [](shlo::Function& f, const std::vector<shlo::Value>& in) { return f.logical_and(in[0], in[1]); });
    r.write(out, r.select(zero, like(r, 0.0, x), product));
  };
  STRATA_LOWER("aten::xlogy.OutTensor", xlogy_OutTensor, self, other, out);
}

}  // namespace

void register_loss(torch::Library& library) {
  library.impl("binary_cross_entropy", TORCH_FN(binary_cross_entropy));
  library.impl("binary_cross_entropy.out", TORCH_FN(binary_cross_entropy_out));
  library.impl("binary_cross_entropy_backward", TORCH_FN(binary_cross_entropy_backward));
  library.impl("binary_cross_entropy_backward.grad_input", TORCH_FN(binary_cross_entropy_backward_out));
  library.impl("log_sigmoid_forward", TORCH_FN(log_sigmoid_forward));
  library.impl("log_sigmoid_forward.output", TORCH_FN(log_sigmoid_forward_out));
  library.impl("log_sigmoid_backward", TORCH_FN(log_sigmoid_backward));
  library.impl("log_sigmoid_backward.grad_input", TORCH_FN(log_sigmoid_backward_out));
  library.impl("smooth_l1_loss.out", TORCH_FN(smooth_l1_loss_out));
  library.impl("smooth_l1_loss_backward.grad_input", TORCH_FN(smooth_l1_loss_backward_out));
  library.impl("xlogy.OutTensor", TORCH_FN(xlogy_out));
}

}  // namespace strata::xla::detail::lowering
