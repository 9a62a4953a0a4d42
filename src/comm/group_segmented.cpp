// comm::Group's segmented all-gather and reduce-scatter (Note [Segmented
// layouts] in backend.h): in place where the backend supports the layout,
// packed and unpacked around the plain collectives elsewhere.
#include "group_state.h"

namespace strata::comm {

namespace {

/// Checks a segmented call (Note [Segmented layouts]): a supported dtype,
/// the same on both sides, both contiguous, the full buffer (`full_name`:
/// "input" or "output") `world` times the shard's numel, and segments
/// that cut the shard.
void check_segmented(OpKind op, const char* name, const at::Tensor& full, const char* full_name,
                     const at::Tensor& shard, const std::vector<int64_t>& segments, int world) {
  check_dtype(op, shard);
  STRATA_CHECK(full.scalar_type() == shard.scalar_type(), ConfigError, "[comm] ", name, ": ", full_name, " dtype ",
               full.scalar_type(), " differs from the shard's ", shard.scalar_type());
  const char* shard_name = std::string(full_name) == "output" ? "input" : "output";
  STRATA_CHECK(full.is_contiguous() && shard.is_contiguous() && full.numel() == world * shard.numel(), ConfigError,
               "[comm] ", name, ": input and output must be contiguous and the ", full_name, " hold ",
               world * shard.numel(), " elements (size() * ", shard_name, ".numel()), got ", full.numel());
  int64_t sum = 0;
  for (int64_t s : segments) {
    STRATA_CHECK(s >= 0, ConfigError, "[comm] ", name, ": a segment length is ", s, "; lengths must be >= 0");
    sum += s;
  }
  STRATA_CHECK(sum == shard.numel(), ConfigError, "[comm] ", name, ": the segments sum to ", sum,
               " elements, but this rank's shard has ", shard.numel());
}

/// Copies between a full buffer in the segmented layout and the rank-major
/// one of all_gather and reduce_scatter ((world, n): rank r's shard in row r).
void copy_segments(const at::Tensor& segmented, const at::Tensor& rank_major, const std::vector<int64_t>& segments,
                   int world, bool to_segmented) {
  const int64_t n = rank_major.numel() / world;
  at::Tensor rows = rank_major.view({world, n});
  int64_t begin = 0;
  for (int64_t len : segments) {
    if (len > 0) {
      at::Tensor place = segmented.narrow(0, world * begin, world * len).view({world, len});
      at::Tensor piece = rows.narrow(1, begin, len);
      if (to_segmented) {
        place.copy_(piece);
      } else {
        piece.copy_(place);
      }
    }
    begin += len;
  }
}

}  // namespace

WorkPtr Group::all_gather_segmented_async(at::Tensor input, at::Tensor output, std::vector<int64_t> segments) {
  check_segmented(OpKind::kAllGather, "all_gather_segmented", output, "output", input, segments, size());
  std::shared_ptr<Backend> backend = state_->backend;
  std::shared_ptr<Task> task;
  if (backend->supports_segmented()) {
    task = make_task(OpKind::kAllGather, input.nbytes(), [backend, input, output, segments]() mutable {
      backend->all_gather_segmented(input, output, segments);
    });
  } else {
    auto gathered = std::make_shared<at::Tensor>();
    task = make_task(
        OpKind::kAllGather, input.nbytes(),
        [backend, input, output, gathered] {
          *gathered = at::empty({output.numel()}, output.options());
          backend->all_gather(input, *gathered);
        },
        [backend, output, gathered, segments] {
          copy_segments(output, *gathered, segments, backend->size(), /*to_segmented=*/true);
          gathered->reset();
        });
  }
  return state_->submit(task, &input, -1, -1, "", false);
}

WorkPtr Group::reduce_scatter_segmented_async(at::Tensor input, at::Tensor output, std::vector<int64_t> segments,
                                              ReduceOp op) {
  check_segmented(OpKind::kReduceScatter, "reduce_scatter_segmented", input, "input", output, segments, size());
  std::shared_ptr<Backend> backend = state_->backend;
  const ReduceOp backend_op = op == ReduceOp::kMean ? ReduceOp::kSum : op;
  auto packed = std::make_shared<at::Tensor>();  // kept until the result is in (stream-ordered backends)
  auto task = make_task(
      OpKind::kReduceScatter, input.nbytes(),
      [backend, input, output, segments, backend_op, packed]() mutable {
        if (backend->supports_segmented()) {
          backend->reduce_scatter_segmented(input, output, segments, backend_op);
          return;
        }
        *packed = at::empty({input.numel()}, input.options());
        copy_segments(input, *packed, segments, backend->size(), /*to_segmented=*/false);
        backend->reduce_scatter(*packed, output, backend_op);
      },
      [backend, output, op, packed]() mutable {
        if (op == ReduceOp::kMean) divide(output, backend->size());
        packed->reset();
      });
  return state_->submit(task, &input, static_cast<int64_t>(op), -1, "", false);
}

}  // namespace strata::comm
