// The fused optimizer steps on the xla device: `_fused_adam_`,
// `_fused_adamw_` and `_fused_sgd_` (each with a double or a tensor
// learning rate), what strata::optim::Adam, AdamW and SGD call once per
// group of parameters that share a device and a dtype (src/optim/fused.cpp).
//
// Note [One node per fused step]
// The per-op path records about ten ops per parameter (mul_, add_,
// addcmul_, sqrt, div, addcdiv_, ...), each with its shape inference: most
// of the host time of an xla step's optimizer. Here the whole group's
// update is one graph node: its emitter writes every parameter's update
// in StableHLO and returns the new parameters, first moments, second
// moments (and AMSGrad's maxima) flattened and joined, which the writes
// then take apart (XLA folds those slices of a concatenation into its
// operands). The formulas are LibTorch's CPU kernel's (FusedAdamKernel.cpp):
// the bias corrections 1 - beta^step, the step size lr / (1 - beta1^step)
// and AdamW's decay 1 - lr * weight_decay in double, from each parameter's
// step tensor and the learning rate, inside the program (they change every
// step: Note [Graph parameters]); the rest in float: the first moment as
// lerp(m, g, 1 - beta1), the second as v * beta2 + (1 - beta2) * g * g, the
// parameter as p - step_size * m / (sqrt(v) / sqrt(1 - beta2^step) + eps).
// XLA may fuse a multiply and an add where LibTorch's vector loop rounds
// both: equal to a rounding per step. SGD's step is one node the same way,
// with the formulas of LibTorch's FusedSGDKernel.cpp: the gradient (negated
// to maximize) plus weight_decay * p; with momentum the buffer, the
// gradient itself at the first step, else buffer * momentum + gradient *
// (1 - dampening), and Nesterov's gradient + momentum * buffer or the
// buffer itself; then p + gradient * -lr, every constant rounded to f32.
//
// Lowered: f32 parameters, gradients, moments and momentum buffers on the
// xla device, without grad_scale and found_inf (AMP's GradScaler takes the
// fallback).
#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#include <torch/library.h>

#include <cmath>
#include <functional>
#include <optional>
#include <utility>
#include <vector>

#include "lowering.h"

namespace strata::xla::detail::lowering {
namespace {

struct AdamHyper {
  double beta1, beta2, weight_decay, eps;
  bool amsgrad, maximize, decoupled;  // decoupled: AdamW's weight decay
};

// Note [One node per fused step]: the updated tensors of parameter i, in
// order p, m, v (, v_max), given its values in `in` from `first` on (p, g,
// m, v (, v_max)), its step, and the learning rate (both 0-dim, f32 or f64).
std::vector<shlo::Value> adam_update(shlo::Function& f, const AdamHyper& h, const shlo::Value& lr,
                                     const shlo::Value& step, const std::vector<shlo::Value>& in, size_t first) {
  const shlo::Type scalar64{ElementType::kF64, {}}, scalar32{ElementType::kF32, {}};
  const std::vector<int64_t> dims = in[first].type.dims;
  auto c64 = [&](double v) { return f.constant(scalar64, {v}); };
  auto splat = [&](const shlo::Value& s32) { return f.broadcast_in_dim(s32, dims, {}); };
  auto c32 = [&](double v) { return splat(f.constant(scalar32, {static_cast<double>(static_cast<float>(v))})); };
  auto to32 = [&](const shlo::Value& s64) { return splat(f.convert(s64, ElementType::kF32)); };
  const shlo::Value lr64 = f.convert(lr, ElementType::kF64), step64 = f.convert(step, ElementType::kF64);
  const shlo::Value bias1 = f.subtract(c64(1), f.power(c64(h.beta1), step64));
  const shlo::Value bias2 = f.subtract(c64(1), f.power(c64(h.beta2), step64));
  const shlo::Value neg_step_size = to32(f.negate(f.divide(lr64, bias1)));
  const shlo::Value bias2_sqrt = to32(f.sqrt(bias2));
  shlo::Value p = in[first], g = in[first + 1], m = in[first + 2], v = in[first + 3];
  if (h.maximize) g = f.negate(g);
  if (h.weight_decay != 0) {
    if (h.decoupled) {
      p = f.multiply(p, to32(f.subtract(c64(1), f.multiply(lr64, c64(h.weight_decay)))));
    } else {
      g = f.add(g, f.multiply(p, c32(h.weight_decay)));
    }
  }
  // m.lerp_(g, w) as LibTorch's kernel takes it: from m for a small weight,
  // from g for a large one.
  const double w = static_cast<float>(1 - h.beta1);
  const bool small = std::abs(w) < 0.5;
  m = f.add(f.multiply(c32(small ? w : w - 1), f.subtract(g, m)), small ? m : g);
  v = f.add(f.multiply(v, c32(h.beta2)), f.multiply(f.multiply(c32(1 - h.beta2), g), g));
  std::vector<shlo::Value> out{p, m, v};
  shlo::Value second = v;
  if (h.amsgrad) {
    second = f.maximum(in[first + 4], v);
    out.push_back(second);
  }
  const shlo::Value denom = f.add(f.divide(f.sqrt(second), bias2_sqrt), c32(h.eps));
  out[0] = f.add(p, f.divide(f.multiply(neg_step_size, m), denom));
  return out;
}

// Whether `t` is an f32 xla tensor of `param`'s shape, and, where
// `written`, dense: every tensor a step writes must be (not overlapping),
// so that no write can refuse after another has bound its value (the
// fallback would then step those tensors twice).
bool like_param(const at::Tensor& t, const at::Tensor& param, bool written) {
  return t.defined() && t.device().type() == kXla && t.scalar_type() == at::kFloat && t.sizes() == param.sizes() &&
         (!written || t.is_non_overlapping_and_dense());
}

// AMP's GradScaler (grad_scale, found_inf) takes the fallback.
bool unscaled(const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf) {
  return !(grad_scale.has_value() && grad_scale->defined()) && !(found_inf.has_value() && found_inf->defined());
}

// Whether an Adam group's step is lowered.
bool lowerable(at::TensorList params, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
               at::TensorList max_exp_avg_sqs, at::TensorList state_steps, bool amsgrad,
               const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf) {
  const size_t n = params.size();
  if (n == 0 || !unscaled(grad_scale, found_inf)) return false;
  if (grads.size() != n || exp_avgs.size() != n || exp_avg_sqs.size() != n || state_steps.size() != n ||
      max_exp_avg_sqs.size() != (amsgrad ? n : 0))
    return false;
  for (size_t i = 0; i < n; ++i) {
    const at::Tensor& p = params[i];
    if (!like_param(p, p, true) || !like_param(grads[i], p, false) || !like_param(exp_avgs[i], p, true) ||
        !like_param(exp_avg_sqs[i], p, true) || (amsgrad && !like_param(max_exp_avg_sqs[i], p, true)) ||
        state_steps[i].numel() != 1)
      return false;
  }
  return true;
}

// One param's updated tensors, in the order of `lists` (parameter first),
// from the node's inputs `in`.
using UpdateFn = std::function<std::vector<shlo::Value>(shlo::Function&, const std::vector<shlo::Value>&, size_t)>;

// Note [One node per fused step]: the group's update as one node named
// `name` of `inputs`, whose emitter runs `update` for each of the n
// parameters and returns every updated tensor flattened and joined, list
// by list; each tensor of `lists` is then bound to its slice.
// `hyper` names what `update` bakes into the text (Note [Programs known
// by their structure] in strata/xla/lazy_graph.h).
void record_fused(Recorder& r, const char* name, std::vector<NodePtr> inputs, const std::vector<at::TensorList>& lists,
                  lazy::Attributes hyper, UpdateFn update) {
  const size_t n = lists.front().size(), kinds = lists.size();
  int64_t total = 0;
  for (at::TensorList list : lists)
    for (const at::Tensor& t : list) total += t.numel();
  for (at::TensorList list : lists)
    for (const at::Tensor& t : list) hyper.add(t.numel());
  NodePtr step = r.op(name, std::move(inputs), {ElementType::kF32, {total}}, hyper.add(n).add(kinds),
                      [n, kinds, update](shlo::Function& f, const std::vector<shlo::Value>& in) {
                        std::vector<std::vector<shlo::Value>> updated;
                        for (size_t i = 0; i < n; ++i) updated.push_back(update(f, in, i));
                        std::vector<shlo::Value> flat;
                        for (size_t kind = 0; kind < kinds; ++kind)
                          for (size_t i = 0; i < n; ++i)
                            flat.push_back(f.reshape(updated[i][kind], {updated[i][kind].type.numel()}));
                        return flat.size() == 1 ? flat[0] : f.concatenate(flat, 0);
                      });
  int64_t offset = 0;
  for (at::TensorList list : lists) {
    for (const at::Tensor& t : list) {
      r.write(t, r.reshape(r.slice(step, {offset}, {offset + t.numel()}), vec(t.sizes())));
      offset += t.numel();
    }
  }
}

// Records the group's step into `r` (Note [One node per fused step]);
// `lr` is the learning rate's node.
void record_adam(Recorder& r, const char* name, at::TensorList params, at::TensorList grads,
                 at::TensorList exp_avgs, at::TensorList exp_avg_sqs, at::TensorList max_exp_avg_sqs,
                 at::TensorList state_steps, NodePtr lr, const AdamHyper& h) {
  const size_t n = params.size(), per = h.amsgrad ? 5 : 4;
  std::vector<NodePtr> inputs{std::move(lr)};
  for (const at::Tensor& step : state_steps)
    inputs.push_back(r.reshape(r.operand(step, ElementType::kF32, vec(step.sizes())), {}));
  for (size_t i = 0; i < n; ++i) {
    for (const at::Tensor* t : {&params[i], &grads[i], &exp_avgs[i], &exp_avg_sqs[i]}) inputs.push_back(r.tensor(*t));
    if (h.amsgrad) inputs.push_back(r.tensor(max_exp_avg_sqs[i]));
  }
  // The node's outputs, in order: every parameter, then every first
  // moment, every second moment (and every maximum).
  std::vector<at::TensorList> lists{params, exp_avgs, exp_avg_sqs};
  if (h.amsgrad) lists.push_back(max_exp_avg_sqs);
  const lazy::Attributes hyper = lazy::Attributes{}.add(h.beta1).add(h.beta2).add(h.weight_decay).add(h.eps)
                                     .add(h.amsgrad).add(h.maximize).add(h.decoupled).add(n).add(per);
  record_fused(r, name, std::move(inputs), lists, hyper,
               [h, n, per](shlo::Function& f, const std::vector<shlo::Value>& in, size_t i) {
                 return adam_update(f, h, in[0], in[1 + i], in, 1 + n + i * per);
               });
}

// The learning rate's node: a tensor's value (on the device or a 0-dim
// CPU tensor), or a double fed as a host scalar (Note [Graph parameters]).
NodePtr lr_node(Recorder& r, const at::Tensor& lr) {
  if (lr.numel() != 1) throw NotLowered{};
  return r.reshape(r.operand(lr, ElementType::kF64, vec(lr.sizes())), {});
}
NodePtr lr_node(Recorder&, double lr) { return Node::host_scalar(lr, ElementType::kF64); }

// `Op`'s kernel (Adam or AdamW, `Lr` a double or a tensor): the group's
// step recorded where it is lowered, else the CPU fallback.
template <class Op, bool kDecoupled, class Lr>
void fused_adam(at::TensorList self, at::TensorList grads, at::TensorList exp_avgs, at::TensorList exp_avg_sqs,
                at::TensorList max_exp_avg_sqs, at::TensorList state_steps, Lr lr, double beta1, double beta2,
                double weight_decay, double eps, bool amsgrad, bool maximize,
                const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf) {
  if (lowerable(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, amsgrad, grad_scale, found_inf)) {
    try {
      Recorder r(Op::name);
      record_adam(r, Op::name, self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, state_steps, lr_node(r, lr),
                  {beta1, beta2, weight_decay, eps, amsgrad, maximize, kDecoupled});
      return;
    } catch (const NotLowered&) {
    }
  }
  at::native::call_fallback_fn<&cpu_fallback, Op>::call(self, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs,
                                                        state_steps, lr, beta1, beta2, weight_decay, eps, amsgrad,
                                                        maximize, grad_scale, found_inf);
}

struct SgdHyper {
  double weight_decay, momentum, dampening;
  bool nesterov, maximize, is_first_step;
};

// Note [One node per fused step]: parameter i's new value (and momentum
// buffer), from its values in `in` from `first` on (p, g (, buffer)) and
// the learning rate (0-dim f64).
std::vector<shlo::Value> sgd_update(shlo::Function& f, const SgdHyper& h, const shlo::Value& lr,
                                    const std::vector<shlo::Value>& in, size_t first) {
  const std::vector<int64_t> dims = in[first].type.dims;
  const shlo::Type scalar32{ElementType::kF32, {}};
  auto c32 = [&](double v) {
    return f.broadcast_in_dim(f.constant(scalar32, {static_cast<double>(static_cast<float>(v))}), dims, {});
  };
  shlo::Value p = in[first], g = in[first + 1];
  if (h.maximize) g = f.negate(g);
  if (h.weight_decay != 0) g = f.add(g, f.multiply(p, c32(h.weight_decay)));
  std::vector<shlo::Value> out{p};
  if (h.momentum != 0) {
    const shlo::Value buffer =
        h.is_first_step ? g : f.add(f.multiply(in[first + 2], c32(h.momentum)), f.multiply(g, c32(1 - h.dampening)));
    out.push_back(buffer);
    g = h.nesterov ? f.add(g, f.multiply(buffer, c32(h.momentum))) : buffer;
  }
  const shlo::Value neg_lr = f.broadcast_in_dim(f.negate(f.convert(lr, ElementType::kF32)), dims, {});
  out[0] = f.add(p, f.multiply(g, neg_lr));
  return out;
}

// `Op`'s kernel (`Lr` a double or a tensor): the group's step as one node
// where it is lowered (f32 on the device, dense, no AMP scaling), else the
// CPU fallback.
template <class Op, class Lr>
void fused_sgd(at::TensorList self, at::TensorList grads, at::TensorList momentum_buffers, double weight_decay,
               double momentum, Lr lr, double dampening, bool nesterov, bool maximize, bool is_first_step,
               const std::optional<at::Tensor>& grad_scale, const std::optional<at::Tensor>& found_inf) {
  const bool with_buffers = momentum != 0;
  const size_t n = self.size();
  bool lowered = n > 0 && unscaled(grad_scale, found_inf) && grads.size() == n &&
                 momentum_buffers.size() == (with_buffers ? n : 0);
  for (size_t i = 0; lowered && i < n; ++i)
    lowered = like_param(self[i], self[i], true) && like_param(grads[i], self[i], false) &&
              (!with_buffers || like_param(momentum_buffers[i], self[i], true));
  if (lowered) {
    try {
      Recorder r(Op::name);
      const SgdHyper h{weight_decay, momentum, dampening, nesterov, maximize, is_first_step};
      const size_t per = with_buffers ? 3 : 2;
      std::vector<NodePtr> inputs{lr_node(r, lr)};
      for (size_t i = 0; i < n; ++i) {
        inputs.push_back(r.tensor(self[i]));
        inputs.push_back(r.tensor(grads[i]));
        if (with_buffers) inputs.push_back(r.tensor(momentum_buffers[i]));
      }
      std::vector<at::TensorList> lists{self};
      if (with_buffers) lists.push_back(momentum_buffers);
      const lazy::Attributes hyper = lazy::Attributes{}.add(h.weight_decay).add(h.momentum).add(h.dampening)
                                         .add(h.nesterov).add(h.maximize).add(h.is_first_step).add(per);
      record_fused(r, Op::name, std::move(inputs), lists, hyper,
                   [h, per](shlo::Function& f, const std::vector<shlo::Value>& in, size_t i) {
                     return sgd_update(f, h, in[0], in, 1 + i * per);
                   });
      return;
    } catch (const NotLowered&) {
    }
  }
  at::native::call_fallback_fn<&cpu_fallback, Op>::call(self, grads, momentum_buffers, weight_decay, momentum, lr,
                                                        dampening, nesterov, maximize, is_first_step, grad_scale,
                                                        found_inf);
}

}  // namespace

void register_optim(torch::Library& library) {
  using namespace at::_ops;
  using Tensor = const at::Tensor&;
  library.impl("_fused_adamw_", TORCH_FN((fused_adam<_fused_adamw_, true, double>)));
  library.impl("_fused_adamw_.tensor_lr", TORCH_FN((fused_adam<_fused_adamw__tensor_lr, true, Tensor>)));
  library.impl("_fused_adam_", TORCH_FN((fused_adam<_fused_adam_, false, double>)));
  library.impl("_fused_adam_.tensor_lr", TORCH_FN((fused_adam<_fused_adam__tensor_lr, false, Tensor>)));
  library.impl("_fused_sgd_", TORCH_FN((fused_sgd<_fused_sgd_, double>)));
  library.impl("_fused_sgd_.tensor_lr", TORCH_FN((fused_sgd<_fused_sgd__tensor_lr, Tensor>)));
}

}  // namespace strata::xla::detail::lowering
