// The small interface every collectives backend implements (local, gloo,
// nccl). Strategies never see a backend directly: they use comm::Group,
// which adds async execution, mean reductions, shape handling, debug checks
// and statistics on top of these synchronous primitives.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

namespace strata::comm {

/// Reduction operations. kMean is implemented by Group (sum, then divide);
/// backends only see kSum, kMax, kMin and kProduct.
enum class ReduceOp { kSum, kMean, kMax, kMin, kProduct };

/// Parses "sum", "mean"/"avg", "max", "min", "product"/"prod" (any case).
/// Throws ConfigError listing the accepted names otherwise.
ReduceOp parse_reduce_op(const std::string& name);

/// "sum", "mean", "max", "min", "product".
std::string to_string(ReduceOp op);

/// Handle to an operation started with an *_async call of Group, or
/// enqueued by a stream-ordered backend.
class Work {
 public:
  virtual ~Work() = default;
  /// Blocks until the operation finished; rethrows its error (CommError,
  /// TimeoutError) on the waiting thread. For a stream-ordered backend
  /// (Backend::stream_ordered) it does not block the host: it makes the
  /// calling thread's current device stream wait for the operation, so
  /// work enqueued on that stream afterwards sees its result.
  virtual void wait() = 0;
  /// True once the operation finished (successfully or not).
  virtual bool is_completed() const = 0;
};
using WorkPtr = std::shared_ptr<Work>;

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
  /// Returns when every rank has called barrier(). Blocks the host on
  /// every backend, stream-ordered ones included.
  virtual void barrier() = 0;

  // Note [Segmented layouts]
  // FSDP keeps a unit's full parameters (and its full gradients) in one
  // buffer, parameter after parameter, each the concatenation of the
  // ranks' pieces of it; a rank's shard is its pieces back to back. With
  // `segments` the piece lengths in elements (their sum is the shard's
  // numel n), the full buffer holds size() * n elements, segment i at
  // size() * (segments[0] + ... + segments[i-1]) and rank r's piece of it
  // r * segments[i] further. A plain all_gather output is the one-segment
  // case. A backend that can read and write that layout in place skips the
  // pack and unpack copies Group otherwise makes around all_gather and
  // reduce_scatter.

  /// True when the backend implements the two *_segmented calls.
  virtual bool supports_segmented() const { return false; }
  /// all_gather whose `output` is in the segmented layout of `segments`
  /// (contiguous tensors; the segments sum to input.numel()).
  virtual void all_gather_segmented(const at::Tensor& input, at::Tensor& output,
                                    const std::vector<int64_t>& segments);
  /// reduce_scatter whose `input` is in the segmented layout of `segments`;
  /// `output` gets this rank's pieces of the result back to back. op is
  /// never kMean.
  virtual void reduce_scatter_segmented(const at::Tensor& input, at::Tensor& output,
                                        const std::vector<int64_t>& segments, ReduceOp op);

  /// The device whose tensors the backend takes: CPU, or the CUDA device of
  /// an NCCL backend. Group allocates its own buffers there (debug
  /// descriptors, byte transfers).
  virtual c10::Device device() const { return c10::Device(c10::kCPU); }

  // Note [Stream-ordered backends]
  // A stream-ordered backend (NCCL) does not run an operation when called:
  // it enqueues it on its communication stream, ordered after the work
  // already enqueued on the caller's current stream, and returns at once.
  // take_work() then hands over the operation's completion. Group calls
  // such a backend on the caller's thread (never its worker thread: the
  // enqueue is cheap, and the caller's current stream is what orders it),
  // and its Work::wait() orders the caller's current stream after the
  // operation instead of blocking the host.

  /// True for a stream-ordered backend (Note [Stream-ordered backends]);
  /// false (the default) when every call returns with the operation done.
  virtual bool stream_ordered() const { return false; }
  /// Stream-ordered backends: the Work of the operation the last call
  /// (all_reduce, all_gather, reduce_scatter, broadcast) enqueued. Called
  /// once after each such call, on the same thread. Others return nullptr.
  virtual WorkPtr take_work() { return nullptr; }
};

}  // namespace strata::comm
