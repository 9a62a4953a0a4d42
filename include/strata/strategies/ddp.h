// Data-parallel training (Lightning's XLAStrategy): every rank holds the
// whole model; gradients are averaged across ranks by bucketed all-reduces
// started from per-parameter hooks while backward is still running. Each
// parameter's gradient is a view into its bucket (no copies in or out).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "strata/strategies/strategy.h"

namespace strata::strategies {

class GradHooks;

/// Options of DDPStrategy, with Lightning's XLAStrategy defaults.
struct DDPOptions {
  /// Check every collective across ranks and print a per-step
  /// communication report on rank 0.
  bool debug = false;
  /// Broadcast parameters and buffers from rank 0 in setup_module.
  bool sync_module_states = true;
  /// Broadcast rank 0's buffers (BatchNorm's running statistics) to every
  /// rank after each synchronised backward, so that every forward starts
  /// from rank 0's buffers (PyTorch DDP's broadcast_buffers, default on:
  /// Note [Buffers from rank 0] in ddp.cpp).
  bool broadcast_buffers = true;
  /// Lightning's sync_batchnorm: BatchNorm layers normalise over the
  /// global batch of all ranks (Strategy::sync_batchnorm).
  bool sync_batchnorm = false;
  /// Gradient bucket size (PyTorch's DDP default: 25 MB).
  int64_t bucket_cap_mb = 25;
  /// Accepted for Lightning's signature; strata lists its own devices from the
  /// environment. When set, its size must equal the local world size.
  std::optional<std::vector<c10::Device>> parallel_devices;
  /// Accepted for Lightning's signature; must be empty (no CheckpointIO plugins).
  nlohmann::json checkpoint_io = nullptr;

  DDPOptions& with_debug(bool d) { debug = d; return *this; }
  DDPOptions& with_sync_module_states(bool s) { sync_module_states = s; return *this; }
  DDPOptions& with_broadcast_buffers(bool b) { broadcast_buffers = b; return *this; }
  DDPOptions& with_sync_batchnorm(bool s) { sync_batchnorm = s; return *this; }
  DDPOptions& with_bucket_cap_mb(int64_t mb) { bucket_cap_mb = mb; return *this; }
  DDPOptions& with_parallel_devices(std::vector<c10::Device> d) { parallel_devices = std::move(d); return *this; }
};

/// The data-parallel strategy.
class DDPStrategy : public Strategy {
 public:
  explicit DDPStrategy(std::shared_ptr<Accelerator> accelerator = cpu_accelerator(),
                       std::optional<Precision> precision = std::nullopt, DDPOptions options = {});
  ~DDPStrategy() override;

  std::string name() const override { return "ddp"; }
  const DDPOptions& options() const { return options_; }
  bool debug() const { return options_.debug; }
  bool sync_module_states() const { return options_.sync_module_states; }
  bool broadcast_buffers() const { return options_.broadcast_buffers; }

  void setup_environment() override;
  /// Moves the module to the device, broadcasts its parameters and buffers
  /// from rank 0 (sync_module_states; the buffers also with
  /// broadcast_buffers), registers the gradient hooks and, with
  /// sync_batchnorm, its BatchNorm layers (apply_sync_batchnorm).
  /// Several modules may be set up (a GAN's generator and critic): each
  /// gets its own buckets; a module set up already is returned as it is.
  ModulePtr setup_module(ModulePtr module) override;
  /// Backpropagates, averages the gradients and, with broadcast_buffers,
  /// gives every rank rank 0's buffers of each module set up (not under
  /// no_backward_sync: Note [Buffers from rank 0] in ddp.cpp).
  void backward(const at::Tensor& loss) override;
  Scope no_backward_sync(torch::nn::Module& module, bool enabled = true) override;
  void teardown() override;

  /// Number of gradient buckets of the modules set up (for tests and reports).
  size_t num_buckets() const;
  /// The buckets of `module`, in the order their all-reduces start: each
  /// lists its parameters as indices into the module's parameters() that
  /// require grad. Reverse registration order until the first synchronised
  /// backward, then the order that backward produced the gradients in (rank
  /// 0's, on every rank: Note [Rebuilt bucket order] in ddp.cpp).
  std::vector<std::vector<size_t>> bucket_layout(const torch::nn::Module& module) const;
  /// The flat gradient buffer of each bucket of `module`, in the same order.
  /// Parameters' gradients are views of these (Note [Gradients as bucket
  /// views] in ddp.cpp).
  std::vector<at::Tensor> bucket_buffers(const torch::nn::Module& module) const;

 protected:
  /// Whether buffers are broadcast from rank 0 before each forward:
  /// broadcast_buffers on a job of several ranks (XlaStrategy: never).
  virtual bool broadcasts_buffers() const;

 private:
  struct Reducer;
  struct Replica;
  Replica* replica_of(const torch::nn::Module& module) const;
  DDPOptions options_;
  std::vector<std::unique_ptr<Replica>> replicas_;  ///< one per module set up, in set-up order
  int64_t step_ = 0;
};

}  // namespace strata::strategies
