// The all-gather and reduce-scatter of an FSDP unit.
#include "collectives.h"

#include <ATen/ATen.h>

#include "buffer_cache.h"

namespace strata::strategies::detail {

AllGatherWork start_all_gather(comm::Group& group, const at::Tensor& flat_shard, const at::Tensor& block,
                               const std::vector<int64_t>& segments, c10::ScalarType dtype) {
  AllGatherWork gather;
  gather.input = flat_shard.scalar_type() == dtype ? flat_shard : flat_shard.to(dtype);
  gather.block = block;
  gather.work = group.all_gather_segmented_async(gather.input, block, segments);
  return gather;
}

void finish_all_gather(AllGatherWork& gather, const std::vector<ShardedParam*>& params, int world, bool refill) {
  gather.work->wait();
  if (!refill) {
    torch::NoGradGuard no_grad;
    for (ShardedParam* p : params) p->unshard(gather.block, world);
  }
  gather = AllGatherWork();
}

// Note [Gradient blocks]
// A unit's full gradients are reduce-scattered from one block in the
// layout of its gathered parameters (Note [One block per unit] in
// sharded_param.cpp): parameter p's gradient at world x p.offset, then
// zeros up to world x p.chunk. As each gradient arrives, the hook copies
// it into its place and drops it (place_gradient), so the unit's full
// gradients exist once and a backend with segmented collectives reduces
// from the block itself, with no packing (Note [Segmented layouts] in
// comm/backend.h). Should a parameter's accumulator run again before the
// unit's reduction starts, that gradient adds into its place.
void place_gradient(ShardedParam& p, at::Tensor& grad_block, const std::vector<ShardedParam*>& unit_params,
                    int world, int64_t shard_numel, c10::ScalarType dtype) {
  at::Tensor& grad = p.compute.mutable_grad();
  if (!grad.defined()) return;
  torch::NoGradGuard no_grad;
  if (!grad_block.defined()) {
    grad_block = empty_buffer({world * shard_numel}, grad.options().dtype(dtype));
    for (const ShardedParam* q : unit_params) {
      const int64_t padding = world * q->chunk - q->numel;
      if (padding > 0) grad_block.narrow(0, world * q->offset + q->numel, padding).zero_();
    }
  }
  at::Tensor place = grad_block.narrow(0, world * p.offset, p.numel).view(p.shape);
  if (p.grad_placed) {
    place.add_(grad);
  } else {
    place.copy_(grad);
    p.grad_placed = true;
  }
  grad = at::Tensor();
}

ReduceScatterWork start_reduce_scatter(comm::Group& group, const std::vector<ShardedParam*>& params,
                                       at::Tensor grad_block, int64_t shard_numel,
                                       const std::vector<int64_t>& segments, const at::TensorOptions& options) {
  const int world = group.size();
  torch::NoGradGuard no_grad;
  if (!grad_block.defined()) grad_block = empty_buffer({world * shard_numel}, options).zero_();
  const c10::ScalarType dtype = grad_block.scalar_type();
  for (ShardedParam* p : params) {
    // A gradient the hook did not see (accumulated under no_backward_sync
    // for a parameter this backward did not reach) still counts.
    if (p->trainable) place_gradient(*p, grad_block, params, world, shard_numel, dtype);
    if (!p->grad_placed && p->numel > 0) grad_block.narrow(0, world * p->offset, p->numel).zero_();
    p->grad_placed = false;
  }
  ReduceScatterWork reduce;
  reduce.input = std::move(grad_block);
  reduce.output = empty_gradient_shards({shard_numel}, reduce.input.options());
  reduce.work = group.reduce_scatter_segmented_async(reduce.input, reduce.output, segments, comm::ReduceOp::kMean);
  return reduce;
}

namespace {

// A tensor over `piece`'s memory that is not an autograd view of it, so it
// can be a gradient that LibTorch's zero_grad may detach_() in place (as
// DDP's bucket slots, Note [Gradients as bucket views] in ddp.cpp). The
// shards' gradients of a unit share the reduce-scatter's output this way,
// and its block goes back to the buffer cache once they are all dropped.
at::Tensor share_storage(const at::Tensor& piece) {
  at::Tensor alias = at::empty({0}, piece.options());
  alias.set_(piece.storage(), piece.storage_offset(), piece.sizes(), piece.strides());
  return alias;
}

}  // namespace

void finish_reduce_scatter(ReduceScatterWork& reduce, const std::vector<ShardedParam*>& params,
                           c10::ScalarType shard_dtype) {
  reduce.work->wait();
  torch::NoGradGuard no_grad;
  at::Tensor reduced = reduce.output.to(shard_dtype);
  for (ShardedParam* p : params) {
    if (!p->trainable) continue;
    at::Tensor piece = reduced.narrow(0, p->offset, p->chunk);
    if (p->shard.grad().defined()) {
      p->shard.mutable_grad().add_(piece);
    } else {
      p->shard.mutable_grad() = share_storage(piece);
    }
  }
  reduce = ReduceScatterWork();
}

at::Tensor gather_full(comm::Group& group, const ShardedParam& p, const at::Tensor& piece) {
  at::Tensor gathered = group.all_gather(piece.detach());  // (world, chunk)
  return gathered.reshape({-1}).narrow(0, 0, p.numel).view(p.shape);
}

}  // namespace strata::strategies::detail
