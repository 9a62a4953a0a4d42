// The small interface every collectives backend implements (local, gloo,
// nccl). Strategies never see a backend directly: they use comm::Group,
// which adds async execution, mean reductions, shape handling, debug checks
// and statistics on top of these synchronous primitives.
#pragma once

#include <ATen/core/Tensor.h>

#include <chrono>
#include <string>

namespace strata::comm {

/// Reduction operations. kMean is implemented by Group (sum, then divide);
/// backends only see kSum, kMax, kMin and kProduct.
enum class ReduceOp { kSum, kMean, kMax, kMin, kProduct };

/// Parses "sum", "mean"/"avg", "max", "min", "product"/"prod" (any case).
/// Throws ConfigError listing the accepted names otherwise.
ReduceOp parse_reduce_op(const std::string& name);

/// "sum", "mean", "max", "min", "product".
std::string to_string(ReduceOp op);

/// Synchronous collectives over this process's peers. Every call is made by
/// every rank in the same order; tensors are contiguous and, for all ranks,
/// of the same dtype and size (Group guarantees both). A call that does not
/// complete within timeout() throws TimeoutError naming the operation, this
/// rank and the peers still missing. Calls come from one thread at a time.
class Backend {
 public:
  virtual ~Backend() = default;

  /// "local", "gloo", "nccl".
  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  /// Reduces `tensor` in place across ranks; op is never kMean.
  virtual void all_reduce(at::Tensor& tensor, ReduceOp op) = 0;
  /// Writes every rank's `input` into `output` (numel size()*input.numel(),
  /// rank r's data at offset r*input.numel()).
  virtual void all_gather(const at::Tensor& input, at::Tensor& output) = 0;
  /// Reduces `input` (numel size()*output.numel()) across ranks and writes
  /// the r-th piece of the result into rank r's `output`; op is never kMean.
  virtual void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) = 0;
  /// Copies `tensor` of rank `src` into `tensor` on every other rank.
  virtual void broadcast(at::Tensor& tensor, int src) = 0;
  /// Returns when every rank has called barrier().
  virtual void barrier() = 0;
};

}  // namespace strata::comm
