// The transitions of one FSDP unit around forward and backward (the state
// machine drawn in unit.h).
#include "unit.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <utility>

#include "buffer_cache.h"

namespace strata::strategies::detail {

Unit::Unit(UnitContext& context, torch::nn::Module& module, std::string name, bool root,
           std::optional<size_t> parent, std::vector<ShardedParam*> params)
    : context_(context),
      module_(&module),
      name_(std::move(name)),
      type_(module.name()),
      root_(root),
      parent_(parent),
      params_(std::move(params)) {
  int64_t offset = 0;
  for (ShardedParam* p : params_) {
    p->offset = offset;
    offset += p->chunk;
    segments_.push_back(p->chunk);
    if (p->trainable) ++trainable_;
  }
  shard_numel_ = offset;
  flat_shard_ = at::zeros({offset}, at::TensorOptions().dtype(at::kFloat));
}

at::Tensor Unit::shard_view(const ShardedParam& p) const { return flat_shard_.narrow(0, p.offset, p.chunk); }

// Note [Shards on the device]
// Units keep their flat shard, and with it every parameter's shard, on the
// root device. Construction makes the full values there one tensor at a
// time (Note [Setup device]); a flat shard it made elsewhere moves here,
// and each shard (the same tensor object, which the module and the
// optimizer hold) is pointed at its slice of the moved flat shard with
// set_data, so it stays a view of what the unit's all-gather sends.
void Unit::move_shards_to(c10::Device device) {
  if (!flat_shard_.defined() || flat_shard_.device() == device) return;
  torch::NoGradGuard no_grad;
  flat_shard_ = flat_shard_.to(device);
  for (ShardedParam* p : params_) p->shard.set_data(shard_view(*p));
}

void Unit::unshard() {
  if (sharded_state_ == ShardedState::kUnsharded || unshard_work_) return;
  const int64_t numel = context_.world * shard_numel_;
  // After forward the block's storage is kept (empty) for autograd's saved
  // views: the gather refills it. Otherwise a fresh block.
  at::Tensor block = sharded_state_ == ShardedState::kStorageFreed && !params_.empty()
                         ? params_.front()->reallocate_storage(numel)
                         : empty_buffer({numel}, flat_shard_.options().dtype(context_.compute_dtype));
  unshard_work_ = start_all_gather(context_.group, flat_shard_, block, segments_, context_.compute_dtype);
}

void Unit::wait_for_unshard() {
  if (sharded_state_ == ShardedState::kUnsharded) return;
  unshard();
  const bool refill = sharded_state_ == ShardedState::kStorageFreed;
  finish_all_gather(*unshard_work_, params_, context_.world, refill);
  unshard_work_.reset();
  sharded_state_ = ShardedState::kUnsharded;
}

void Unit::free_storage() {
  if (sharded_state_ != ShardedState::kUnsharded) return;
  for (ShardedParam* p : params_) p->free_storage();
  sharded_state_ = ShardedState::kStorageFreed;
}

void Unit::reshard() {
  if (unshard_work_) {  // a prefetch nobody used: finish it so the group stays in order
    unshard_work_->work->wait();
    unshard_work_.reset();
    // A refill nobody used: empty the storage again.
    if (sharded_state_ == ShardedState::kStorageFreed && !params_.empty()) params_.front()->free_storage();
  }
  if (sharded_state_ == ShardedState::kSharded) return;
  for (ShardedParam* p : params_) p->reshard(context_.compute_dtype);
  sharded_state_ = ShardedState::kSharded;
}

bool Unit::pre_forward() {
  wait_for_unshard();
  // An evaluation (no grad) leaves the unit idle: no backward follows.
  if (training_state_ != TrainingState::kIdle || !c10::GradMode::is_enabled()) return false;
  training_state_ = TrainingState::kForward;
  return true;
}

bool Unit::post_forward(const TensorList& outputs, bool keep_gathered) {
  bool backward_follows = false;
  for (const at::Tensor& output : outputs) {
    backward_follows = backward_follows || (output.defined() && output.requires_grad());
  }
  backward_follows = backward_follows && c10::GradMode::is_enabled();
  if (!backward_follows) {
    // No backward will come for this forward (evaluation): reshard now.
    reshard();
    return false;
  }
  if (!root_ && !keep_gathered && context_.reshard_after_forward) free_storage();
  return true;
}

bool Unit::pre_backward() {
  // A late output gradient (an output that no parameter fed): the unit's
  // backward is over.
  if (training_state_ == TrainingState::kPostBackward) return false;
  wait_for_unshard();
  return true;
}

GradientArrival Unit::post_backward(ShardedParam& p, bool sync) {
  // Every gradient autograd adds until the unit's reduction starts goes to
  // the unit's block (Note [Gradient blocks]); under no_backward_sync they
  // stay on the compute tensors, where the next synchronised backward adds.
  if (sync && training_state_ != TrainingState::kPostBackward) {
    place_gradient(p, grad_block_, params_, context_.world, shard_numel_, context_.reduce_dtype);
  }
  if (p.grad_ready) return GradientArrival::kRepeat;
  p.grad_ready = true;
  if (++grads_ready_ < trainable_) return GradientArrival::kCounted;
  // Every gradient of the unit is in: its parameters are not needed again
  // in this backward.
  training_state_ = TrainingState::kPostBackward;
  if (!sync) reshard();
  return GradientArrival::kUnitComplete;
}

void Unit::start_reduction() {
  reduce_work_ = start_reduce_scatter(context_.group, params_, std::move(grad_block_), shard_numel_, segments_,
                                      flat_shard_.options().dtype(context_.reduce_dtype));
  grad_block_ = at::Tensor();
  reshard();
}

void Unit::finish_reduction() {
  finish_reduce_scatter(*reduce_work_, params_, flat_shard_.scalar_type());
  reduce_work_.reset();
}

void Unit::finalize_backward() {
  reshard();
  for (ShardedParam* p : params_) p->grad_ready = false;
  grads_ready_ = 0;
  training_state_ = TrainingState::kIdle;
}

}  // namespace strata::strategies::detail
