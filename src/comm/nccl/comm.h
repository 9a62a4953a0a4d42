// Internals of the NCCL backend (nccl.cpp, watchdog.cpp): one communicator,
// its communication stream, the operations in flight and the watchdog that
// times them out. Compiled only with STRATA_WITH_NCCL.
#pragma once

#include <c10/core/Device.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "strata/comm/backend.h"

namespace strata::runtime {
class Store;
}

namespace strata::comm::nccl::detail {

/// Throws CommError naming `what`, the CUDA error and file:line.
void check_cuda(cudaError_t err, const char* what, const char* file, int line);
#define STRATA_CUDA_CHECK(expr) ::strata::comm::nccl::detail::check_cuda((expr), #expr, __FILE__, __LINE__)

/// One enqueued collective: its completion event on the communication
/// stream, and when it was enqueued (for the watchdog).
struct Op {
  int64_t seq = 0;
  const char* name = "";
  std::chrono::steady_clock::time_point start;
  cudaEvent_t done = nullptr;
  /// Set once `done` is recorded (an event never recorded reads as done).
  std::atomic<bool> recorded{false};
  /// Set by the watchdog or a waiter once `done` completed.
  std::atomic<bool> completed{false};

  Op(int64_t seq, const char* name);
  ~Op();
  Op(const Op&) = delete;
  Op& operator=(const Op&) = delete;
};

// Note [NCCL watchdog]
// The host never waits for a collective on the hot path, so nothing would
// notice one that never finishes. The watchdog thread polls the events of
// the operations in flight (cudaEventQuery, every kPollInterval) and the
// communicator's asynchronous error. When one has run past the timeout it
// works out which ranks are missing (Note [NCCL progress keys]), aborts the
// communicator (which ends the stuck kernels, so the streams waiting on them
// move on) and records a TimeoutError; every later wait() and call on the
// backend throws it. An operation whose enqueue itself hangs (NCCL
// connecting to a peer that never comes) is timed the same way.
//
// Note [NCCL progress keys]
// Each rank's watchdog publishes "progress/<rank>" = "<enqueued>
// <completed>" (operation numbers) in the store whenever it changed, at
// most every kPublishInterval. A rank that entered operation #k has
// enqueued >= k; the ranks timing out on #k read every rank's key, giving
// late publications a short grace period, and name those whose enqueued
// number is below k (or that never published) as missing.
class Comm {
 public:
  static constexpr std::chrono::milliseconds kPollInterval{50};
  static constexpr std::chrono::milliseconds kPublishInterval{200};

  /// Creates the communicator for `rank` of `size` on `device` (the NCCL id
  /// goes through `store`) and starts the watchdog.
  Comm(std::shared_ptr<runtime::Store> store, int rank, int size, c10::Device device,
       std::chrono::milliseconds timeout, std::chrono::milliseconds connect_timeout);
  ~Comm();
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  c10::Device device() const { return device_; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  c10::cuda::CUDAStream stream() const { return stream_; }

  /// Rethrows the failure the watchdog (or an earlier call) recorded.
  void throw_if_failed() const;
  /// True once a failure was recorded.
  bool failed() const;
  /// Records `error` as the communicator's failure (the first one wins)
  /// and aborts the communicator.
  void fail(std::exception_ptr error);

  /// Enqueues one collective (Note [NCCL stream order]): the communication
  /// stream waits for the caller's current stream, `call(comm, stream)`
  /// enqueues the NCCL call, and the completion event is recorded. Returns
  /// the operation. The caller holds a CUDAGuard for device().
  template <class Call>
  std::shared_ptr<Op> enqueue(const char* name, Call&& call) {
    throw_if_failed();
    auto op = begin(name);
    ncclResult_t result = ncclSuccess;
    {
      std::lock_guard<std::mutex> lock(comm_mu_);
      if (!aborted_) result = call(comm_, stream_.stream());
    }
    check_nccl(result, name, op->seq);
    settle(name, op->seq);
    finish(*op);
    return op;
  }

  /// Blocks this thread until `op` completed (polling, so the watchdog's
  /// failure ends the wait): barrier() only.
  void host_wait(const Op& op);

 private:
  std::shared_ptr<Op> begin(const char* name);
  void finish(Op& op);
  /// Throws CommError for an NCCL error of operation `seq`.
  void check_nccl(ncclResult_t result, const char* name, int64_t seq);
  /// Waits until a non-blocking communicator's last call left the
  /// ncclInProgress state; the watchdog times a hang out.
  void settle(const char* name, int64_t seq);
  void join(std::chrono::milliseconds timeout);
  void watch();
  void check_ops();
  void publish(bool force);
  std::string missing_ranks(int64_t seq);
  void abort_locked();

  std::shared_ptr<runtime::Store> store_;
  int rank_, size_;
  c10::Device device_;
  std::chrono::milliseconds timeout_;
  c10::cuda::CUDAStream stream_;
  ncclComm_t comm_ = nullptr;
  std::mutex comm_mu_;  // one NCCL call on comm_ at a time; abort included
  bool aborted_ = false;
  cudaEvent_t ready_ = nullptr;  // recorded on the caller's stream before each call

  mutable std::mutex mu_;  // guards the members below
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Op>> in_flight_;
  std::exception_ptr error_;
  bool stopping_ = false;
  int64_t enqueued_ = 0, completed_ = 0;

  std::string published_;
  std::chrono::steady_clock::time_point last_publish_;
  std::thread watchdog_;
};

}  // namespace strata::comm::nccl::detail
