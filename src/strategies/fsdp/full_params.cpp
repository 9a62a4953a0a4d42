// Full views of a sharded module for the user: summon_full_params (the
// full parameters, and on request their gradients, inside a scope) and the
// full optimizer state gathered on one rank.
#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include "fsdp_state.h"
#include "strata/checkpoint/sharded.h"
#include "strata/core/error.h"

namespace strata::strategies {

using detail::FSDPState;

Scope FSDPStrategy::summon_full_params(torch::nn::Module& module, bool writeback, bool with_grads) {
  FSDPState* found = state_of(module);
  STRATA_CHECK(found != nullptr, ConfigError, "[fsdp] summon_full_params got a module that was not set up (",
               module.name(), "); pass one returned by setup_module");
  std::shared_ptr<FSDPState> state = found->shared_from_this();
  state->reshard_idle();  // the last unit of an evaluation without hooks
  for (const detail::Unit& unit : state->units()) {
    STRATA_CHECK(unit.sharded_state() == detail::ShardedState::kSharded && unit.grads_ready() == 0, ConfigError,
                 "[fsdp] summon_full_params inside a forward or backward (unit '", unit.name(),
                 "' is gathered): enter it between training steps");
  }
  torch::NoGradGuard no_grad;
  detail::NoFirstUse internal;
  // Every parameter's full value (fp32, gathered from the shards) becomes
  // the module's own tensor, which typed members (LinearImpl::weight) alias,
  // and takes the shard's place in the parameter dictionary. All ranks
  // gather in the same order.
  for (detail::ShardedParam& p : state->params()) {
    p.compute.set_data(state->gather_full(p, p.shard.detach()));
    if (with_grads && p.shard.grad().defined()) {
      p.compute.mutable_grad() = state->gather_full(p, p.shard.grad());
    }
    for (auto& [owner, name] : p.owners) detail::parameters_of(*owner)[name] = p.compute;
  }
  return Scope([state, writeback] {
    torch::NoGradGuard no_grad;
    detail::NoFirstUse internal;
    for (detail::ShardedParam& p : state->params()) {
      if (writeback) {
        at::Tensor mine = checkpoint::shard_of(p.compute.detach().to(at::kFloat), state->world(), state->rank());
        p.shard.detach().narrow(0, 0, mine.numel()).copy_(mine);
      }
      p.compute.mutable_grad() = at::Tensor();
      p.reshard(state->compute_dtype());
      p.install_shard();
    }
  });
}

checkpoint::OptimizerState FSDPStrategy::full_optimizer_state(torch::optim::Optimizer& optimizer, int rank) {
  FSDPState* state = state_of(optimizer);
  STRATA_CHECK(state != nullptr, ConfigError, "[fsdp] full_optimizer_state got an optimizer that holds no sharded "
               "parameter of a module set up: build it from the parameters of the module setup_module returned");
  STRATA_CHECK(rank >= 0 && rank < world_size(), ConfigError, "[fsdp] full_optimizer_state: rank ", rank,
               " is not in the group of ", world_size());
  checkpoint::OptimizerState sharded = checkpoint::optimizer_state(optimizer, checkpoint::param_names(*state->root_module()));
  checkpoint::OptimizerState out;
  out.json = sharded.json;
  // Every rank gathers, in the optimizer's order; only `rank` keeps them.
  for (const auto& [name, tensor] : sharded.tensors) {
    const detail::ShardedParam* p = state->param_of_state(name);
    at::Tensor full = p && tensor.dim() == 1 && tensor.numel() == p->chunk ? state->gather_full(*p, tensor.detach())
                                                                          : tensor.detach().clone();
    if (global_rank() == rank) out.tensors.emplace_back(name, full);
  }
  return out;
}

}  // namespace strata::strategies
