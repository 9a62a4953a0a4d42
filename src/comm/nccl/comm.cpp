// The NCCL communicator of one group: creation through the store, the
// enqueue path onto the communication stream (Note [NCCL stream order]),
// and teardown. The watchdog lives in watchdog.cpp.
#include "comm.h"

#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <cstring>

#include "strata/core/error.h"
#include "strata/runtime/store.h"

namespace strata::comm::nccl::detail {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using strata::detail::cat;

void check_cuda(cudaError_t err, const char* what, const char* file, int line) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();  // clear a non-sticky error so later calls do not report it again
  throw CommError(cat("[nccl] ", what, " failed: ", cudaGetErrorString(err), " (", file, ":", line, ")"));
}

Op::Op(int64_t s, const char* n) : seq(s), name(n), start(steady_clock::now()) {
  STRATA_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
}

Op::~Op() {
  if (done != nullptr) (void)cudaEventDestroy(done);
}

Comm::Comm(std::shared_ptr<runtime::Store> store, int rank, int size, c10::Device device, milliseconds timeout,
           milliseconds connect_timeout)
    : store_(std::move(store)),
      rank_(rank),
      size_(size),
      device_(device),
      timeout_(timeout),
      stream_(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index())) {
  c10::cuda::CUDAGuard guard(device_);
  join(connect_timeout);
  ncclUniqueId id;
  if (rank_ == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    STRATA_CHECK(r == ncclSuccess, CommError, "[nccl] ncclGetUniqueId failed on rank 0: ", ncclGetErrorString(r));
    store_->set("id", std::string(id.internal, sizeof(id.internal)));
  } else {
    store_->wait({"id"}, connect_timeout);
    const std::string value = store_->get("id");
    STRATA_CHECK(value.size() == sizeof(id.internal), CommError, "[nccl] rank ", rank_,
                 " read an NCCL id of ", value.size(), " bytes from the store, expected ", sizeof(id.internal),
                 " (another program wrote the key?)");
    std::memcpy(id.internal, value.data(), sizeof(id.internal));
  }
  // Note [Non-blocking communicator]: NCCL calls return at once (a call
  // that is not done says ncclInProgress), so no thread ever blocks inside
  // NCCL and the watchdog can always abort.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
  const auto deadline = steady_clock::now() + connect_timeout;
  while (r == ncclInProgress || r == ncclSuccess) {
    ncclResult_t state = ncclSuccess;
    r = ncclCommGetAsyncError(comm_, &state);
    if (r != ncclSuccess) break;
    if (state != ncclInProgress) {
      r = state;
      break;
    }
    if (steady_clock::now() > deadline) {
      (void)ncclCommAbort(comm_);
      throw TimeoutError(cat("[nccl] rank ", rank_, " of ", size_, " could not create its communicator on ", device_,
                             " within ", connect_timeout.count(),
                             " ms (every rank joined; check that the GPUs can reach each other, NCCL_DEBUG=INFO says more)"));
    }
    std::this_thread::sleep_for(milliseconds(1));
  }
  if (r != ncclSuccess) {
    const std::string last = comm_ != nullptr ? ncclGetLastError(comm_) : "";
    if (comm_ != nullptr) (void)ncclCommAbort(comm_);
    throw CommError(cat("[nccl] rank ", rank_, " of ", size_, " could not create its communicator on ", device_, ": ",
                        ncclGetErrorString(r), last.empty() ? "" : " (" + last + ")",
                        "; each rank needs its own GPU (NCCL refuses two ranks on one), NCCL_DEBUG=INFO says more"));
  }
  cudaError_t e = cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    (void)ncclCommAbort(comm_);
    check_cuda(e, "cudaEventCreateWithFlags", __FILE__, __LINE__);
  }
  last_publish_ = steady_clock::now();
  watchdog_ = std::thread([this] { watch(); });
}

Comm::~Comm() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (watchdog_.joinable()) watchdog_.join();
  c10::cuda::CUDAGuard guard(device_);
  // Operations still in flight get a bounded time to finish; the
  // communicator is then finalized, or aborted when they, or the
  // finalization, do not end in that time.
  const auto deadline = steady_clock::now() + std::min<milliseconds>(timeout_, std::chrono::seconds(30));
  bool clean = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    clean = error_ == nullptr;
    for (const auto& op : in_flight_) {
      if (!clean) break;
      if (!op->recorded) {
        clean = false;
        break;
      }
      cudaError_t e;
      while ((e = cudaEventQuery(op->done)) == cudaErrorNotReady && steady_clock::now() < deadline) {
        std::this_thread::sleep_for(milliseconds(1));
      }
      clean = e == cudaSuccess;
    }
  }
  std::lock_guard<std::mutex> lock(comm_mu_);
  if (!aborted_ && comm_ != nullptr) {
    if (clean) {
      ncclResult_t r = ncclCommFinalize(comm_);
      ncclResult_t state = r;
      while (r == ncclSuccess || r == ncclInProgress) {
        r = ncclCommGetAsyncError(comm_, &state);
        if (state != ncclInProgress || steady_clock::now() >= deadline) break;
        std::this_thread::sleep_for(milliseconds(1));
      }
      clean = r == ncclSuccess && state == ncclSuccess;
    }
    if (clean) (void)ncclCommDestroy(comm_);
    else (void)ncclCommAbort(comm_);
    aborted_ = true;
  }
  if (ready_ != nullptr) (void)cudaEventDestroy(ready_);
}

void Comm::join(milliseconds timeout) { runtime::join_ranks(*store_, "nccl", rank_, size_, timeout); }

void Comm::throw_if_failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
}

bool Comm::failed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_ != nullptr;
}

void Comm::fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!error_) error_ = std::move(error);
  }
  cv_.notify_all();
  std::lock_guard<std::mutex> lock(comm_mu_);
  abort_locked();
}

void Comm::abort_locked() {
  if (aborted_ || comm_ == nullptr) return;
  (void)ncclCommAbort(comm_);  // ends the kernels in flight: waiting streams move on
  aborted_ = true;
}

// Note [NCCL stream order]
// The communication stream first waits for an event recorded on the
// caller's current stream, so the collective reads its inputs only after
// the kernels that produce them; the caller's stream never waits for the
// communication stream until Work::wait(). `ready_` is reused: a stream
// wait captures the event as last recorded, and calls come one at a time.
std::shared_ptr<Op> Comm::begin(const char* name) {
  auto op = std::make_shared<Op>(0, name);
  STRATA_CUDA_CHECK(cudaEventRecord(ready_, c10::cuda::getCurrentCUDAStream(device_.index()).stream()));
  STRATA_CUDA_CHECK(cudaStreamWaitEvent(stream_.stream(), ready_, 0));
  std::lock_guard<std::mutex> lock(mu_);
  op->seq = ++enqueued_;
  in_flight_.push_back(op);  // from now on the watchdog times it, its enqueue included
  return op;
}

void Comm::finish(Op& op) {
  STRATA_CUDA_CHECK(cudaEventRecord(op.done, stream_.stream()));
  op.recorded = true;
}

void Comm::check_nccl(ncclResult_t result, const char* name, int64_t seq) {
  if (result == ncclSuccess || result == ncclInProgress) return;
  std::string last;
  {
    std::lock_guard<std::mutex> lock(comm_mu_);
    if (!aborted_) last = ncclGetLastError(comm_);
  }
  auto error = std::make_exception_ptr(CommError(cat("[nccl] ", name, " #", seq, " failed on rank ", rank_, " of ",
                                                     size_, ": ", ncclGetErrorString(result),
                                                     last.empty() ? "" : " (" + last + ")")));
  fail(error);
  std::rethrow_exception(error);
}

void Comm::settle(const char* name, int64_t seq) {
  for (int spins = 0;; ++spins) {
    throw_if_failed();
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(comm_mu_);
      if (aborted_) continue;  // throw_if_failed() reports why
      r = ncclCommGetAsyncError(comm_, &state);
    }
    check_nccl(r, name, seq);
    if (state != ncclInProgress) return check_nccl(state, name, seq);
    if (spins < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

void Comm::host_wait(const Op& op) {
  for (int spins = 0;; ++spins) {
    throw_if_failed();
    if (op.completed) return;
    cudaError_t e = cudaEventQuery(op.done);
    if (e == cudaSuccess) return throw_if_failed();  // an abort also completes the event
    if (e != cudaErrorNotReady) check_cuda(e, "cudaEventQuery", __FILE__, __LINE__);
    if (spins < 64) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

}  // namespace strata::comm::nccl::detail
