// The all-gather and reduce-scatter of an FSDP unit.
#include "collectives.h"

#include <ATen/ATen.h>

#include "buffer_cache.h"
#include "strata/checkpoint/sharded.h"

namespace strata::strategies::detail {

AllGatherWork start_all_gather(comm::Group& group, const at::Tensor& flat_shard, c10::ScalarType dtype) {
  AllGatherWork gather;
  gather.input = flat_shard.scalar_type() == dtype ? flat_shard : flat_shard.to(dtype);
  gather.output = empty_buffer({group.size() * flat_shard.numel()}, gather.input.options());
  gather.work = group.all_gather_async(gather.input, gather.output);
  return gather;
}

void finish_all_gather(AllGatherWork& gather, const std::vector<ShardedParam*>& params, int world,
                       int64_t shard_numel, bool refill) {
  gather.work->wait();
  at::Tensor gathered = gather.output.view({world, shard_numel});
  torch::NoGradGuard no_grad;
  at::Tensor block;  // Note [One block per unit] in sharded_param.cpp
  if (!refill) block = empty_buffer({world * shard_numel}, gather.output.options());
  for (ShardedParam* p : params) {
    p->unshard(gathered.narrow(1, p->offset, p->chunk), block, world, refill);  // (world, chunk), rank-major
  }
  gather = AllGatherWork();
}

ReduceScatterWork start_reduce_scatter(comm::Group& group, const std::vector<ShardedParam*>& params,
                                       const at::Tensor& flat_shard, c10::ScalarType dtype) {
  const int world = group.size();
  const int64_t shard_numel = flat_shard.numel();
  torch::NoGradGuard no_grad;
  at::Tensor packed = empty_buffer({world, shard_numel}, flat_shard.options().dtype(dtype)).zero_();
  for (ShardedParam* p : params) {
    if (!p->trainable) continue;
    at::Tensor grad = p->compute.grad();
    if (!grad.defined()) continue;  // no gradient on this rank in this step: counts as zero
    at::Tensor flat = grad.reshape({-1});
    for (int r = 0; r < world; ++r) {
      checkpoint::FlatSlice slice = checkpoint::shard_slice(p->numel, world, r);
      if (slice.size() == 0) continue;
      packed[r].narrow(0, p->offset, slice.size()).copy_(flat.narrow(0, slice.begin, slice.size()));
    }
    p->compute.mutable_grad() = at::Tensor();
  }
  ReduceScatterWork reduce;
  reduce.input = packed;
  reduce.output = empty_buffer({shard_numel}, packed.options());
  reduce.work = group.reduce_scatter_async(packed, reduce.output, comm::ReduceOp::kMean);
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
