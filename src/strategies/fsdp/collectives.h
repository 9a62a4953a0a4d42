// The collectives of an FSDP unit: the all-gather of its flat shard and
// the copy-out into full parameters, the reduce-scatter of its gradients
// and the copy-in into the shards' gradients, with the dtype casts on the
// way. Private to the strategies area.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "strata/comm/group.h"
#include "sharded_param.h"

namespace strata::strategies::detail {

/// An all-gather of a unit's flat shard into its block (Note [One block
/// per unit] in sharded_param.cpp), in flight.
struct AllGatherWork {
  at::Tensor input, block;
  comm::WorkPtr work;
};

/// Starts gathering `flat_shard` (this rank's shards of a unit, back to
/// back), cast to `dtype`, from every rank straight into `block` (the
/// unit's full values, in the segmented layout of `segments`).
AllGatherWork start_all_gather(comm::Group& group, const at::Tensor& flat_shard, const at::Tensor& block,
                               const std::vector<int64_t>& segments, c10::ScalarType dtype);

/// Waits for `gather`; unless `refill` (the block is the storage that the
/// compute tensors and autograd's saved views already share), points each
/// parameter's compute tensor at its place in the block.
void finish_all_gather(AllGatherWork& gather, const std::vector<ShardedParam*>& params, int world, bool refill);

/// Moves the gradient autograd left on `p`'s compute tensor into its place
/// in `grad_block` (the unit's full gradients in the segmented layout,
/// allocated with its padding zeroed when still undefined; Note [Gradient
/// blocks]) and drops it from the compute tensor. Nothing without one.
void place_gradient(ShardedParam& p, at::Tensor& grad_block, const std::vector<ShardedParam*>& unit_params,
                    int world, int64_t shard_numel, c10::ScalarType dtype);

/// A reduce-scatter of a unit's gradients, in flight.
struct ReduceScatterWork {
  at::Tensor input, output;
  comm::WorkPtr work;
};

/// Places what gradients are left on the compute tensors of `params`,
/// zeroes the places of those without one (no gradient on this rank counts
/// as zero), and starts the reduce-scatter (mean) of `grad_block` (taken):
/// each rank receives the mean over ranks of its own shards' gradients.
ReduceScatterWork start_reduce_scatter(comm::Group& group, const std::vector<ShardedParam*>& params,
                                       at::Tensor grad_block, int64_t shard_numel,
                                       const std::vector<int64_t>& segments, const at::TensorOptions& options);

/// Waits for `reduce` and adds its result, cast to `shard_dtype`, to the
/// gradients of the shards of `params`.
void finish_reduce_scatter(ReduceScatterWork& reduce, const std::vector<ShardedParam*>& params,
                           c10::ScalarType shard_dtype);

/// The full value of a tensor sharded like `p`, from this rank's padded
/// piece (p.shard, or its optimizer state); a collective.
at::Tensor gather_full(comm::Group& group, const ShardedParam& p, const at::Tensor& piece);

}  // namespace strata::strategies::detail
