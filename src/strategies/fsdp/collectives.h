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

/// An all-gather of a unit's flat shard, in flight.
struct AllGatherWork {
  at::Tensor input, output;
  comm::WorkPtr work;
};

/// Starts gathering `flat_shard` (this rank's shards of a unit, back to
/// back) from every rank, cast to `dtype`.
AllGatherWork start_all_gather(comm::Group& group, const at::Tensor& flat_shard, c10::ScalarType dtype);

/// Waits for `gather` and copies the full values out into `params` (each
/// ShardedParam::unshard, `refill` as there).
void finish_all_gather(AllGatherWork& gather, const std::vector<ShardedParam*>& params, int world,
                       int64_t shard_numel, bool refill);

/// A reduce-scatter of a unit's gradients, in flight.
struct ReduceScatterWork {
  at::Tensor input, output;
  comm::WorkPtr work;
};

/// Packs the gradients of `params` rank-major (row r: for every parameter
/// the elements of rank r's shard) in `dtype`, drops them from the compute
/// tensors and starts their reduce-scatter (mean): each rank receives the
/// mean over ranks of its own shards' gradients.
ReduceScatterWork start_reduce_scatter(comm::Group& group, const std::vector<ShardedParam*>& params,
                                       const at::Tensor& flat_shard, c10::ScalarType dtype);

/// Waits for `reduce` and adds its result, cast to `shard_dtype`, to the
/// gradients of the shards of `params`.
void finish_reduce_scatter(ReduceScatterWork& reduce, const std::vector<ShardedParam*>& params,
                           c10::ScalarType shard_dtype);

/// The full value of a tensor sharded like `p`, from this rank's padded
/// piece (p.shard, or its optimizer state); a collective.
at::Tensor gather_full(comm::Group& group, const ShardedParam& p, const at::Tensor& piece);

}  // namespace strata::strategies::detail
