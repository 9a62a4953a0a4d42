// The NCCL backend: CUDA collectives, stream-ordered (Note [Stream-ordered
// backends] in backend.h). Each call enqueues one NCCL collective on the
// group's communication stream after the caller's current stream (Note
// [NCCL stream order] in comm.cpp) and returns; its Work orders the
// waiting thread's current stream after it. A watchdog times operations
// out (Note [NCCL watchdog] in comm.h). Reductions run natively in every
// dtype Group accepts, bfloat16 included; all_gather and broadcast move
// bytes. Compiled only with STRATA_WITH_NCCL (no_nccl.cpp otherwise).
#include "strata/comm/nccl/backend.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include <atomic>
#include <initializer_list>
#include <utility>

#include "comm.h"
#include "strata/core/error.h"
#include "strata/runtime/store.h"

namespace strata::comm::nccl {
namespace {

using detail::Comm;
using detail::Op;
using std::chrono::milliseconds;

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kProduct: return ncclProd;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMean: break;
  }
  STRATA_ASSERT(false, "[nccl] mean must be lowered to sum by comm::Group");
}

ncclDataType_t to_nccl(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat: return ncclFloat32;
    case at::kDouble: return ncclFloat64;
    case at::kBFloat16: return ncclBfloat16;
    case at::kHalf: return ncclFloat16;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    default:
      throw ConfigError(strata::detail::cat("[nccl] ", op, ": dtype ", t.scalar_type(),
                                            " is not supported; use float32, float64, bfloat16, float16, int32 or int64"));
  }
}

/// The completion of one enqueued collective.
class NcclWork final : public Work {
 public:
  NcclWork(std::shared_ptr<Comm> comm, std::shared_ptr<Op> op) : comm_(std::move(comm)), op_(std::move(op)) {}

  /// Orders this thread's current stream (on the group's device) after
  /// the collective; the host does not wait.
  void wait() override {
    comm_->throw_if_failed();
    c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(comm_->device().index());
    if (current != comm_->stream()) STRATA_CUDA_CHECK(cudaStreamWaitEvent(current.stream(), op_->done, 0));
  }

  bool is_completed() const override {
    if (op_->completed || comm_->failed()) return true;
    cudaError_t e = cudaEventQuery(op_->done);
    if (e == cudaErrorNotReady) return false;
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return true;  // finished badly: wait() reports what the watchdog recorded
    }
    op_->completed = true;
    return true;
  }

 private:
  std::shared_ptr<Comm> comm_;
  std::shared_ptr<Op> op_;
};

class NcclBackend final : public Backend {
 public:
  explicit NcclBackend(std::shared_ptr<Comm> comm) : comm_(std::move(comm)) {}

  std::string name() const override { return "nccl"; }
  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  milliseconds timeout() const override { return comm_->timeout(); }
  c10::Device device() const override { return comm_->device(); }
  bool stream_ordered() const override { return true; }
  WorkPtr take_work() override { return std::exchange(last_, nullptr); }

  void all_reduce(at::Tensor& tensor, ReduceOp op) override {
    check(tensor, "all_reduce");
    const ncclDataType_t type = to_nccl(tensor, "all_reduce");
    const ncclRedOp_t red = to_nccl(op);
    void* data = tensor.data_ptr();
    const size_t count = static_cast<size_t>(tensor.numel());
    last_ = run("all_reduce", {tensor}, [&](ncclComm_t comm, cudaStream_t stream) {
      return count == 0 ? ncclSuccess : ncclAllReduce(data, data, count, type, red, comm, stream);
    });
  }

  void all_gather(const at::Tensor& input, at::Tensor& output) override {
    check(input, "all_gather");
    check(output, "all_gather");
    STRATA_ASSERT(output.nbytes() == input.nbytes() * static_cast<size_t>(size()));
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    const size_t bytes = input.nbytes();
    last_ = run("all_gather", {input, output}, [&](ncclComm_t comm, cudaStream_t stream) {
      return bytes == 0 ? ncclSuccess : ncclAllGather(in, out, bytes, ncclUint8, comm, stream);
    });
  }

  void reduce_scatter(const at::Tensor& input, at::Tensor& output, ReduceOp op) override {
    check(input, "reduce_scatter");
    check(output, "reduce_scatter");
    STRATA_ASSERT(input.nbytes() == output.nbytes() * static_cast<size_t>(size()));
    const ncclDataType_t type = to_nccl(input, "reduce_scatter");
    const ncclRedOp_t red = to_nccl(op);
    const void* in = input.data_ptr();
    void* out = output.data_ptr();
    const size_t count = static_cast<size_t>(output.numel());
    last_ = run("reduce_scatter", {input, output}, [&](ncclComm_t comm, cudaStream_t stream) {
      return count == 0 ? ncclSuccess : ncclReduceScatter(in, out, count, type, red, comm, stream);
    });
  }

  void broadcast(at::Tensor& tensor, int src) override {
    check(tensor, "broadcast");
    STRATA_CHECK(src >= 0 && src < size(), ConfigError, "[nccl] broadcast from rank ", src, " in a group of ", size());
    void* data = tensor.data_ptr();
    const size_t bytes = tensor.nbytes();
    last_ = run("broadcast", {tensor}, [&](ncclComm_t comm, cudaStream_t stream) {
      return bytes == 0 ? ncclSuccess : ncclBroadcast(data, data, bytes, ncclUint8, src, comm, stream);
    });
  }

  /// A one-element all-reduce on the communication stream, then a host
  /// wait for it (bounded by the watchdog).
  void barrier() override {
    c10::cuda::CUDAGuard guard(comm_->device());
    if (!barrier_.defined()) barrier_ = at::zeros({1}, at::TensorOptions(at::kFloat).device(comm_->device()));
    void* data = barrier_.data_ptr();
    std::shared_ptr<Op> op = comm_->enqueue("barrier", [&](ncclComm_t comm, cudaStream_t stream) {
      return ncclAllReduce(data, data, 1, ncclFloat32, ncclSum, comm, stream);
    });
    comm_->host_wait(*op);
  }

 private:
  void check(const at::Tensor& t, const char* op) const {
    STRATA_CHECK(t.is_cuda() && t.device().index() == comm_->device().index(), ConfigError, "[nccl] ", op,
                 ": tensor is on ", t.device(), ", but this NCCL group runs on ", comm_->device(),
                 " (move the tensor there; CPU tensors need the gloo or shm backend)");
    STRATA_ASSERT(t.is_contiguous(), "[nccl] ", op, " needs a contiguous tensor");
  }

  /// Enqueues `call` and keeps the tensors' memory from being reused until
  /// the communication stream is done with them (the caching allocator
  /// would otherwise hand it out once the caller's stream moves on).
  template <class Call>
  WorkPtr run(const char* name, std::initializer_list<at::Tensor> tensors, Call&& call) {
    c10::cuda::CUDAGuard guard(comm_->device());
    for (const at::Tensor& t : tensors) {
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), comm_->stream());
    }
    return std::make_shared<NcclWork>(comm_, comm_->enqueue(name, std::forward<Call>(call)));
  }

  std::shared_ptr<Comm> comm_;
  WorkPtr last_;
  at::Tensor barrier_;
};

std::atomic<int> group_counter{0};

}  // namespace

bool is_available() { return true; }

std::shared_ptr<Backend> create(std::shared_ptr<runtime::Store> store, int rank, int size, milliseconds timeout) {
  STRATA_CHECK(store != nullptr, ConfigError, "[nccl] create needs a store, got nullptr");
  STRATA_CHECK(size >= 1 && rank >= 0 && rank < size, ConfigError, "[nccl] invalid rank ", rank, " for size ", size);
  STRATA_CHECK(timeout.count() > 0, ConfigError, "[nccl] timeout must be positive, got ", timeout.count(), " ms");
  const int devices = c10::cuda::device_count();
  STRATA_CHECK(devices > 0, ConfigError, "[nccl] rank ", rank,
               " sees no CUDA device (check the driver and CUDA_VISIBLE_DEVICES); the nccl backend needs one GPU "
               "per rank, use gloo for CPU tensors");
  const c10::Device device(c10::kCUDA, c10::cuda::current_device());
  // Every process creates its groups in the same order, so the n-th group
  // gets the same key prefix on every rank.
  const int id = group_counter++;
  auto prefixed = runtime::prefix_store(std::move(store), "strata/nccl/" + std::to_string(id));
  return std::make_shared<NcclBackend>(std::make_shared<Comm>(std::move(prefixed), rank, size, device, timeout, timeout));
}

}  // namespace strata::comm::nccl
