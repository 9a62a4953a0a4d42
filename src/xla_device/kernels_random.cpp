// The xla device's random kernels: dropout (native_dropout and its
// backward) and bernoulli_ (feature dropout's noise), recorded into the
// step's graph, their bits drawn on the device by rng_bit_generator from a
// key fed as a graph parameter.
//
// Note [Random bits on the device]
// A dropout mask is made where it is used, inside the step's program: a
// THREE_FRY stream (stablehlo.rng_bit_generator) keyed by 64 bits that the
// kernel draws from the device's default generator when it records (Note
// [Generators on the host] in runtime.cpp), so torch::manual_seed makes the
// masks repeat, and every call gets a key of its own. The key reaches the
// program as two u32 host scalars (Note [Scalars in the graph]), so a new
// key each step changes no program text and compiles nothing. The masks
// are not the CPU's (another generator, as on any other device), but they
// follow the same law: an element is kept with probability 1 - p (a
// uniform float in [0, 1) at least p, in steps of 2^-23) and scaled by
// 1 / (1 - p), and the backward multiplies by the very mask the forward
// returned.
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ops/bernoulli.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/native_dropout.h>
#include <ATen/ops/native_dropout_backward.h>

#include <mutex>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

// 64 fresh bits from the device's default generator, as two u32 scalars.
std::pair<NodePtr, NodePtr> fresh_key(const c10::Device& device) {
  at::Generator generator = default_generator(device.index());
  uint32_t high = 0, low = 0;
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    auto* cpu = at::check_generator<at::CPUGeneratorImpl>(generator);
    high = cpu->random();
    low = cpu->random();
  }
  return {Node::host_scalar(high, ElementType::kU32), Node::host_scalar(low, ElementType::kU32)};
}

// Uniform f32 values in [0, 1) of shape `dims` from the key (high, low):
// THREE_FRY's state is {key, counter 0}.
NodePtr uniform(Recorder& r, const std::pair<NodePtr, NodePtr>& key, const std::vector<int64_t>& dims) {
  return r.op("rng_uniform", {key.first, key.second}, {ElementType::kF32, dims},
              lazy::Attributes{}.add(dims), [dims](shlo::Function& f, const std::vector<shlo::Value>& in) {
                const shlo::Type u64{ElementType::kU64, {}};
                const shlo::Value high = f.convert(in[0], ElementType::kU64);
                const shlo::Value low = f.convert(in[1], ElementType::kU64);
                const shlo::Value k = f.logical_or(f.shift_left(high, f.constant(u64, {32})), low);
                const shlo::Value state =
                    f.concatenate({f.reshape(k, {1}), f.constant({ElementType::kU64, {1}}, {0})}, 0);
                return f.uniform(state, dims)[1];
              });
}

// (input * mask / (1 - p), mask) with mask true where an element is kept.
std::tuple<at::Tensor, at::Tensor> native_dropout(const at::Tensor& input, double p, std::optional<bool> train) {
  try {
    Recorder r("aten::native_dropout");
    const ElementType t = element_type(input.scalar_type());
    // Evaluation, p = 0 and p = 1 are LibTorch's own special cases (no
    // random draw, or all dropped): the fallback computes them exactly.
    if (!is_floating(t) || (train.has_value() && !*train) || !(p > 0.0 && p < 1.0) || input.numel() == 0)
      throw NotLowered{};
    const std::vector<int64_t> dims = vec(input.sizes());
    const ElementType acc = opmath(t);
    NodePtr keep = r.compare(uniform(r, fresh_key(input.device()), dims), r.splat(p, ElementType::kF32, dims),
                             shlo::Direction::kGE);
    // The scale is a hyperparameter, constant from step to step: baked in.
    NodePtr kept = r.select(keep, r.convert(r.tensor(input), acc), r.splat(0.0, acc, dims));
    NodePtr scaled = r.binary(Binary::kMultiply, kept, r.splat(1.0 / (1.0 - p), acc, dims));
    at::Tensor out = at::empty(input.sizes(), input.options());
    at::Tensor mask = at::empty(input.sizes(), input.options().dtype(at::kBool));
    r.write(out, scaled);
    r.write(mask, keep);
    return {out, mask};
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::native_dropout>::call(input, p, train);
}

// grad * mask * scale, LibTorch's order.
at::Tensor native_dropout_backward(const at::Tensor& grad, const at::Tensor& mask, double scale) {
  try {
    Recorder r("aten::native_dropout_backward");
    const ElementType t = element_type(grad.scalar_type());
    if (!is_floating(t) || mask.scalar_type() != at::kBool || grad.sizes() != mask.sizes()) throw NotLowered{};
    const std::vector<int64_t> dims = vec(grad.sizes());
    const ElementType acc = opmath(t);
    NodePtr masked = r.binary(Binary::kMultiply, r.convert(r.tensor(grad), acc), r.convert(r.tensor(mask), acc));
    at::Tensor out = at::empty(grad.sizes(), grad.options());
    r.write(out, r.binary(Binary::kMultiply, rounded(r, masked, t), r.splat(scale, acc, dims)));
    return out;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::native_dropout_backward>::call(grad, mask, scale);
}

// self filled with 1 where a uniform value is below p, else 0 (LibTorch's
// rule): the noise of feature dropout (dropout2d, dropout3d), drawn as a
// dropout mask is (Note [Random bits on the device]). An explicit generator
// other than the device's own takes the fallback, which draws from it.
at::Tensor& bernoulli_(at::Tensor& self, double p, std::optional<at::Generator> generator) {
  try {
    Recorder r("aten::bernoulli_.float");
    if (generator.has_value() && generator->defined() && generator->device().type() != kXla) throw NotLowered{};
    if (!(p >= 0.0 && p <= 1.0) || self.numel() == 0) throw NotLowered{};  // LibTorch's own error
    const ElementType t = element_type(self.scalar_type());
    const std::vector<int64_t> dims = vec(self.sizes());
    NodePtr keep = r.compare(uniform(r, fresh_key(self.device()), dims), r.splat(p, ElementType::kF32, dims),
                             shlo::Direction::kLT);
    r.write(self, r.convert(keep, t));
    return self;
  } catch (const NotLowered&) {
  }
  return at::native::call_fallback_fn<&cpu_fallback, at::_ops::bernoulli__float>::call(self, p, generator);
}

}  // namespace

void register_random(torch::Library& library) {
  library.impl("native_dropout", TORCH_FN(native_dropout));
  library.impl("native_dropout_backward", TORCH_FN(native_dropout_backward));
  library.impl("bernoulli_.float", TORCH_FN(bernoulli_));
}

}  // namespace strata::xla::detail::lowering
