// The NCCL watchdog (Note [NCCL watchdog] in comm.h): completion of the
// operations in flight, timeouts, asynchronous NCCL errors, and the
// progress keys that name the missing ranks (Note [NCCL progress keys]).
#include <c10/cuda/CUDAFunctions.h>

#include <algorithm>
#include <sstream>

#include "comm.h"
#include "strata/core/error.h"
#include "strata/runtime/store.h"

namespace strata::comm::nccl::detail {

using std::chrono::milliseconds;
using std::chrono::steady_clock;
using strata::detail::cat;

void Comm::watch() {
  try {
    c10::cuda::set_device(device_.index());  // event queries and the abort act on this device
  } catch (const std::exception& e) {
    fail(std::make_exception_ptr(CommError(cat("[nccl] the watchdog of rank ", rank_, " could not select ", device_,
                                               ": ", e.what()))));
    return;
  }
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, kPollInterval, [&] { return stopping_ || error_ != nullptr; });
      if (stopping_ || error_ != nullptr) return;
    }
    try {
      check_ops();
      publish(false);
    } catch (const std::exception& e) {
      fail(std::make_exception_ptr(CommError(cat("[nccl] the watchdog of rank ", rank_, " failed: ", e.what()))));
      return;
    }
  }
}

/// Operations on one stream complete in order: only the oldest one in
/// flight can be the one that is late.
void Comm::check_ops() {
  {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclSuccess;
    std::string last;
    {
      std::lock_guard<std::mutex> lock(comm_mu_);
      if (aborted_) return;
      r = ncclCommGetAsyncError(comm_, &state);
      if (r == ncclSuccess && state != ncclSuccess && state != ncclInProgress) last = ncclGetLastError(comm_);
    }
    if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      const ncclResult_t bad = r != ncclSuccess ? r : state;
      fail(std::make_exception_ptr(CommError(cat("[nccl] rank ", rank_, " of ", size_, ": the communicator reported ",
                                                 ncclGetErrorString(bad), last.empty() ? "" : " (" + last + ")",
                                                 "; it was aborted (a peer may have failed)"))));
      return;
    }
  }
  std::shared_ptr<Op> late;
  for (;;) {
    std::shared_ptr<Op> op;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (in_flight_.empty()) return;
      op = in_flight_.front();
    }
    if (op->recorded) {
      cudaError_t e = cudaEventQuery(op->done);
      if (e == cudaSuccess) {
        op->completed = true;
        std::lock_guard<std::mutex> lock(mu_);
        completed_ = std::max(completed_, op->seq);
        in_flight_.pop_front();
        continue;
      }
      if (e != cudaErrorNotReady) check_cuda(e, "cudaEventQuery (watchdog)", __FILE__, __LINE__);
    }
    if (steady_clock::now() - op->start > timeout_) late = op;
    break;
  }
  if (!late) return;
  const std::string missing = missing_ranks(late->seq);
  fail(std::make_exception_ptr(TimeoutError(cat(
      "[nccl] ", late->name, " #", late->seq, " timed out after ", timeout_.count(), " ms on rank ", rank_, " of ",
      size_, " (", late->recorded ? "on the device" : "while enqueueing it", "); ", missing,
      "; the communicator was aborted, create a new group to go on"))));
}

void Comm::publish(bool force) {
  std::string value;
  {
    std::lock_guard<std::mutex> lock(mu_);
    value = std::to_string(enqueued_) + " " + std::to_string(completed_);
  }
  const auto now = steady_clock::now();
  if (value == published_ || (!force && now - last_publish_ < kPublishInterval)) return;
  try {
    store_->set("progress/" + std::to_string(rank_), value);
    published_ = value;
    last_publish_ = now;
  } catch (const std::exception&) {
    // The store may be gone at the end of a job; the next tick tries again.
  }
}

std::string Comm::missing_ranks(int64_t seq) {
  publish(true);
  const milliseconds grace = std::clamp(timeout_ / 4, milliseconds(1000), milliseconds(10000));
  const auto deadline = steady_clock::now() + grace;
  try {
    for (;;) {
      std::vector<std::pair<int, int64_t>> missing;  // rank, its last enqueued operation (-1: never published)
      for (int r = 0; r < size_; ++r) {
        const std::string key = "progress/" + std::to_string(r);
        if (!store_->check({key})) {
          missing.push_back({r, -1});
          continue;
        }
        std::istringstream in(store_->get(key));
        int64_t enqueued = -1;
        in >> enqueued;
        if (enqueued < seq) missing.push_back({r, enqueued});
      }
      if (missing.empty()) {
        return "every rank reached it, so a connection between them failed or a peer's GPU is stuck";
      }
      if (steady_clock::now() >= deadline) {
        std::string out;
        for (const auto& [r, last] : missing) {
          out += cat(out.empty() ? "" : ", ", "rank ", r,
                     last < 0 ? std::string(" (no progress seen)") : cat(" (last operation #", last, ")"));
        }
        return cat(missing.size() == 1 ? "missing " : "missing ranks ", out, ": never reached this call");
      }
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, milliseconds(100), [&] { return stopping_; })) return "the group was being destroyed";
    }
  } catch (const std::exception& e) {
    return cat("could not ask the store which ranks are missing: ", e.what());
  }
}

}  // namespace strata::comm::nccl::detail
