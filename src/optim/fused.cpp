// The fused optimizers (include/strata/optim/fused.h).
#include "strata/optim/fused.h"

#include <ATen/ops/_fused_adam.h>
#include <ATen/ops/_fused_adamw.h>
#include <ATen/ops/_fused_sgd.h>
#include <ATen/ops/scalar_tensor.h>
#include <ATen/ops/zeros_like.h>
#include <torch/autograd.h>

#include <map>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace strata::optim {

// Note [Fused against the loop]
// torch::optim's step is a loop over parameters, each update several
// passes over memory (mul_, add_, addcmul_, sqrt, div, addcdiv_ for
// AdamW). ATen's fused kernels (what PyTorch's `fused=True` runs) make one
// pass per parameter and are called once per group of parameters that share
// a device and a dtype. They compute the same update with its operations
// grouped and ordered differently (the bias corrections, the step size)
// and, on the CPU, in vectorised lanes, so the two agree to a few float32
// ulps per step, and AdamW's normalisation (m / sqrt(v)) keeps that from
// growing: after 30 steps the parameters differ by 1.6e-7 to 2.9e-7 of
// their largest magnitude, plain SGD by nothing. The test
// (tests/optim/fused_test.cpp) bounds the difference at 1e-5, where a wrong
// formula (coupled against decoupled weight decay) is off by far more.
//
// The learning rate reaches the kernels as a scalar tensor, made for each
// call from the group's options (where schedulers write it), so a
// schedule changes a tensor's value rather than a constant of the call:
// the form a captured step (the xla device, docs/xla.md) needs to keep
// one program for every rate. On the CPU the kernel reads it back as the
// same double, so the results are those of the double argument, exactly.
//
// State lives in torch::optim's own objects (AdamWParamState, ...): step is
// its int64 counter, and the kernels read it through a float scalar tensor
// made for the call, so a checkpoint of either optimizer is the other's.
// Parameters that no fused kernel serves (sparse gradients) take
// torch::optim's loop for the whole step. On the xla device the three
// fused kernels are lowered, each group's step one graph node (Note [One
// node per fused step] in src/xla_device/kernels_optim.cpp).
namespace {

// Whether every parameter with a gradient is one a fused kernel serves: a
// dense float tensor on the CPU or a CUDA GPU, or an f32 one on the xla
// device (whose lowerings take f32: a bf16 parameter there takes the loop,
// whose ops are lowered, rather than the kernel's CPU fallback).
bool fusable(const std::vector<torch::optim::OptimizerParamGroup>& groups) {
  for (const auto& group : groups) {
    for (const auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      const auto type = p.device().type();
      const bool served = type == c10::DeviceType::CPU || type == c10::DeviceType::CUDA ||
                          (type == c10::DeviceType::PrivateUse1 && p.scalar_type() == at::kFloat);
      if (!served || p.grad().is_sparse() ||
          !at::isFloatingType(p.scalar_type()) || p.grad().device() != p.device() ||
          p.grad().scalar_type() != p.scalar_type())
        return false;
    }
  }
  return true;
}

using GroupKey = std::pair<c10::Device, c10::ScalarType>;

GroupKey key_of(const at::Tensor& p) { return {p.device(), p.scalar_type()}; }

/// The learning rate as the kernels' tensor argument (Note [Fused against
/// the loop]): a double on the CPU, whose kernel reads it back exactly; a
/// float on the device, as its kernels take it, where they compute in float.
at::Tensor lr_tensor(double lr, const c10::Device& device) {
  return at::scalar_tensor(lr, at::TensorOptions().dtype(device.is_cpu() ? at::kDouble : at::kFloat).device(device));
}

struct DeviceGroupLess {
  static auto rank(const GroupKey& k) {
    return std::make_tuple(static_cast<int>(k.first.type()), k.first.index(), static_cast<int>(k.second));
  }
  bool operator()(const GroupKey& a, const GroupKey& b) const { return rank(a) < rank(b); }
  bool operator()(const std::pair<GroupKey, bool>& a, const std::pair<GroupKey, bool>& b) const {
    return std::make_tuple(rank(a.first), a.second) < std::make_tuple(rank(b.first), b.second);
  }
};

using States = ska::flat_hash_map<void*, std::unique_ptr<torch::optim::OptimizerParamState>>;

/// One fused call's lists.
struct AdamLists {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
};

template <class State, class Options>
std::map<GroupKey, AdamLists, DeviceGroupLess> adam_lists(torch::optim::OptimizerParamGroup& group,
                                                            States& states,
                                                            const Options& options) {
  std::map<GroupKey, AdamLists, DeviceGroupLess> out;
  for (auto& p : group.params()) {
    if (!p.grad().defined()) continue;
    auto it = states.find(p.unsafeGetTensorImpl());
    if (it == states.end()) {
      // As torch::optim creates it, so that either optimizer resumes the other.
      auto state = std::make_unique<State>();
      state->step(0);
      state->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
      state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      if (options.amsgrad()) state->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
      it = states.emplace(p.unsafeGetTensorImpl(), std::move(state)).first;
    }
    auto& state = static_cast<State&>(*it->second);
    state.step(state.step() + 1);
    AdamLists& lists = out[key_of(p)];
    lists.params.push_back(p);
    lists.grads.push_back(p.grad());
    lists.exp_avgs.push_back(state.exp_avg());
    lists.exp_avg_sqs.push_back(state.exp_avg_sq());
    if (options.amsgrad()) lists.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
    lists.steps.push_back(
        at::scalar_tensor(static_cast<double>(state.step()), at::TensorOptions().dtype(at::kFloat).device(p.device())));
  }
  return out;
}

torch::Tensor closure_loss(const torch::optim::Optimizer::LossClosure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

}  // namespace

template <class Base>
torch::Tensor Fused<Base>::step(LossClosure closure) {
  if (!fusable(this->param_groups_)) {
    ++loop_steps_;
    return Base::step(std::move(closure));
  }
  torch::NoGradGuard no_grad;
  torch::Tensor loss = closure_loss(closure);
  fused_step();
  return loss;
}

template <>
void Fused<torch::optim::AdamW>::fused_step() {
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamWOptions&>(group.options());
    for (auto& [key, l] : adam_lists<torch::optim::AdamWParamState>(group, state_, o))
      at::_fused_adamw_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.max_exp_avg_sqs, l.steps,
                        lr_tensor(o.lr(), key.first),
                        std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(), o.amsgrad(),
                        /*maximize=*/false);
  }
}

template <>
void Fused<torch::optim::Adam>::fused_step() {
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::AdamOptions&>(group.options());
    for (auto& [key, l] : adam_lists<torch::optim::AdamParamState>(group, state_, o))
      at::_fused_adam_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.max_exp_avg_sqs, l.steps,
                       lr_tensor(o.lr(), key.first),
                       std::get<0>(o.betas()), std::get<1>(o.betas()), o.weight_decay(), o.eps(), o.amsgrad(),
                       /*maximize=*/false);
  }
}

template <>
void Fused<torch::optim::SGD>::fused_step() {
  for (auto& group : param_groups_) {
    const auto& o = static_cast<const torch::optim::SGDOptions&>(group.options());
    // A parameter's first step with momentum starts its buffer from the
    // gradient (is_first_step), as torch::optim's clone does: one call for
    // those, one for the rest, per device and dtype.
    struct Lists {
      std::vector<at::Tensor> params, grads, buffers;
    };
    std::map<std::pair<GroupKey, bool>, Lists, DeviceGroupLess> calls;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      bool first = false;
      at::Tensor buffer;
      if (o.momentum() != 0) {
        auto it = state_.find(p.unsafeGetTensorImpl());
        if (it == state_.end()) {
          auto state = std::make_unique<torch::optim::SGDParamState>();
          state->momentum_buffer(at::zeros_like(p, at::MemoryFormat::Preserve));
          it = state_.emplace(p.unsafeGetTensorImpl(), std::move(state)).first;
          first = true;
        }
        buffer = static_cast<torch::optim::SGDParamState&>(*it->second).momentum_buffer();
      }
      Lists& lists = calls[{key_of(p), first}];
      lists.params.push_back(p);
      lists.grads.push_back(p.grad());
      if (buffer.defined()) lists.buffers.push_back(buffer);
    }
    for (auto& [key, l] : calls)
      at::_fused_sgd_(l.params, l.grads, l.buffers, o.weight_decay(), o.momentum(), lr_tensor(o.lr(), key.first.first),
                      o.dampening(),
                      o.nesterov(), /*maximize=*/false, /*is_first_step=*/key.second);
  }
}

template class Fused<torch::optim::AdamW>;
template class Fused<torch::optim::Adam>;
template class Fused<torch::optim::SGD>;

bool is_fused(const torch::optim::Optimizer& optimizer) {
  return dynamic_cast<const AdamW*>(&optimizer) != nullptr || dynamic_cast<const Adam*>(&optimizer) != nullptr ||
         dynamic_cast<const SGD*>(&optimizer) != nullptr;
}

}  // namespace strata::optim
