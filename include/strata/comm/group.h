// comm::Group: the collectives handle strategies use. A value type (copies
// share one backend and one worker thread) over a Backend. It accepts any
// tensor layout, implements mean reductions, runs operations in call order
// on a background thread so callers can overlap them with computation
// (the *_async forms), checks calls across ranks in debug mode, and counts
// time and bytes per operation. Over a stream-ordered backend (NCCL) it
// enqueues every operation on the caller's thread instead, and waiting
// orders the caller's device stream (Note [Stream-ordered backends] in
// backend.h).
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "strata/comm/backend.h"

namespace strata::runtime {
struct Environment;
}

namespace strata::comm {

/// Options of a group. Defaults follow PyTorch (30 min collective timeout).
struct GroupOptions {
  /// How long one collective may wait for its peers.
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  /// Check before every collective that all ranks call the same operation
  /// with the same dtype and shape (costs one small all-gather per call).
  bool debug = false;

  GroupOptions& with_timeout(std::chrono::milliseconds t) { timeout = t; return *this; }
  GroupOptions& with_debug(bool d) { debug = d; return *this; }
};

/// Time and bytes spent in collectives since the last reset_stats().
struct CommStats {
  struct Entry {
    int64_t calls = 0;
    int64_t bytes = 0;        ///< payload bytes this rank passed in
    /// Time the operation ran on the worker thread; over a stream-ordered
    /// backend, the time to enqueue it (the device runs it later).
    double seconds = 0.0;
  };
  Entry all_reduce, all_gather, reduce_scatter, broadcast, barrier;
  /// Sum over every operation.
  Entry total() const;
  /// A one-line human summary, e.g. "all_reduce 12x 4.0 MB 10.2 ms | ...".
  std::string summary() const;
};

/// A group of processes that run collectives together.
class Group {
 public:
  /// A one-rank group (backend "local"): every collective is the identity.
  Group();
  /// A group over `backend`.
  explicit Group(std::shared_ptr<Backend> backend, GroupOptions options = {});

  int rank() const;
  int size() const;
  /// The backend's name ("local", "shm", "gloo", "shm+gloo", "nccl").
  std::string backend_name() const;
  /// The device whose tensors the collectives take: CPU, or the CUDA
  /// device of an NCCL group.
  c10::Device device() const;
  bool debug() const;
  /// Turns the cross-rank debug checks on or off; every rank must make the
  /// same call at the same point.
  void set_debug(bool debug);

  /// Reduces `tensor` in place across ranks (any dtype of float32/64,
  /// bfloat16, float16, int32, int64; any layout). kMean divides the sum by
  /// size() (integer tensors: floor division).
  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::kMean);
  /// Async form; `tensor` holds the result after wait().
  WorkPtr all_reduce_async(at::Tensor tensor, ReduceOp op = ReduceOp::kMean);

  /// Gathers `tensor` from every rank into a new tensor of shape
  /// (size(), *tensor.shape) (a 0-d tensor gathers to shape (size(),)).
  at::Tensor all_gather(const at::Tensor& tensor);
  /// Synchronous form writing into `output` (contiguous, numel
  /// size()*input.numel()): no allocation per call.
  void all_gather(const at::Tensor& input, const at::Tensor& output);
  /// Async form writing into `output` (contiguous, numel size()*input.numel()).
  WorkPtr all_gather_async(at::Tensor input, at::Tensor output);

  /// Reduces `input` across ranks and returns this rank's piece: input's
  /// first dimension is split into size() equal pieces (it must be
  /// divisible by size()), rank r gets rows [r*k, (r+1)*k).
  at::Tensor reduce_scatter(const at::Tensor& input, ReduceOp op = ReduceOp::kMean);
  /// Synchronous form writing this rank's piece into `output` (numel
  /// input.numel()/size(), any layout).
  void reduce_scatter(const at::Tensor& input, const at::Tensor& output, ReduceOp op = ReduceOp::kMean);
  /// Async form: `input` contiguous with numel size()*output.numel();
  /// `output` (contiguous) gets this rank's piece.
  WorkPtr reduce_scatter_async(at::Tensor input, at::Tensor output, ReduceOp op = ReduceOp::kMean);

  /// all_gather into the segmented layout of `segments` (Note [Segmented
  /// layouts] in backend.h): `input` holds this rank's pieces back to back
  /// (numel: the sum of `segments`), `output` (contiguous) size() times as
  /// many elements. Over a backend without that layout it gathers into a
  /// buffer and copies each piece into place.
  WorkPtr all_gather_segmented_async(at::Tensor input, at::Tensor output, std::vector<int64_t> segments);
  /// reduce_scatter from the segmented layout of `segments`: `input`
  /// (contiguous, numel size() * n, n the sum of `segments`) is reduced
  /// across ranks and this rank's pieces of the result land back to back
  /// in `output` (contiguous, numel n). Over a backend without that layout
  /// it packs the pieces rank-major first.
  WorkPtr reduce_scatter_segmented_async(at::Tensor input, at::Tensor output, std::vector<int64_t> segments,
                                         ReduceOp op = ReduceOp::kMean);

  /// Copies rank `src`'s `tensor` into `tensor` on every rank (in place;
  /// shapes and dtypes must match).
  void broadcast(at::Tensor& tensor, int src = 0);
  WorkPtr broadcast_async(at::Tensor tensor, int src = 0);

  /// Broadcasts bytes of any length from rank `src` (other ranks' `bytes`
  /// is ignored and may differ in size); returns src's bytes on every rank.
  std::string broadcast_bytes(const std::string& bytes, int src = 0);
  /// Gathers a byte string of any length from every rank, in rank order.
  std::vector<std::string> all_gather_bytes(const std::string& bytes);

  /// Broadcasts any value nlohmann::json can convert (numbers, strings,
  /// bools, vectors, maps, json, user types with to_json/from_json).
  template <class T>
  T broadcast_object(const T& value, int src = 0) {
    std::string bytes;
    if (rank() == src) {
      std::vector<uint8_t> cbor = nlohmann::json::to_cbor(nlohmann::json(value));
      bytes.assign(cbor.begin(), cbor.end());
    }
    std::string received = broadcast_bytes(bytes, src);
    return nlohmann::json::from_cbor(received).get<T>();
  }

  /// Gathers a value from every rank (as broadcast_object), in rank order.
  template <class T>
  std::vector<T> all_gather_object(const T& value) {
    std::vector<uint8_t> cbor = nlohmann::json::to_cbor(nlohmann::json(value));
    std::vector<std::string> parts = all_gather_bytes(std::string(cbor.begin(), cbor.end()));
    std::vector<T> out;
    out.reserve(parts.size());
    for (const std::string& p : parts) out.push_back(nlohmann::json::from_cbor(p).get<T>());
    return out;
  }

  /// Returns once every rank called barrier(); `name` appears in timeout
  /// and debug messages.
  void barrier(const std::string& name = "");

  /// Statistics since the last reset_stats().
  CommStats stats() const;
  void reset_stats();

  /// Waits for every pending async operation (over a stream-ordered
  /// backend: orders the current stream after them); rethrows the first
  /// error.
  void synchronize();

 private:
  // The operations behind the public forms; `sync` lets the call run on
  // this thread when the group is idle (group.cpp, Note [Synchronous fast path]).
  WorkPtr start_all_reduce(at::Tensor tensor, ReduceOp op, bool sync);
  WorkPtr start_all_gather(at::Tensor input, at::Tensor output, bool sync);
  WorkPtr start_reduce_scatter(at::Tensor input, at::Tensor output, ReduceOp op, bool sync);
  WorkPtr start_broadcast(at::Tensor tensor, int src, bool sync);

  struct State;
  std::shared_ptr<State> state_;
};

/// Which backend init_process_group uses: "auto" (local for one rank; for
/// CPU: shm when every rank is on one host, gloo when every host has one
/// rank, shm inside hosts and gloo between them otherwise; nccl for CUDA),
/// "shm", "gloo", "nccl", "local". STRATA_COMM_BACKEND (auto, gloo or shm)
/// overrides "auto", e.g. to compare with gloo.
struct ProcessGroupOptions {
  std::string backend = "auto";
  std::string device_type = "cpu";  ///< "cpu" or "cuda": picks the auto backend
  GroupOptions group;
  /// Rendezvous (store connect) timeout; 0 means env.timeout_s or 300 s.
  std::chrono::milliseconds rendezvous_timeout{0};
};

/// Creates the global group for this process: connects to the rendezvous
/// store of `env` (hosted by global rank 0) and builds the backend. With
/// world size 1, no store and the local backend. Throws ConfigError for an
/// unknown or unavailable backend (saying how to get it), CommError or
/// TimeoutError when the rendezvous fails.
Group init_process_group(const runtime::Environment& env, const ProcessGroupOptions& options = {});

}  // namespace strata::comm
