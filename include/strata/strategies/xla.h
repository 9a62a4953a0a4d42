// The `xla` strategy (Lightning's XLAStrategy): data-parallel training on
// xla devices. Every replica holds the whole model; gradients are reduced
// inside the compiled step by DDP's buckets, whose all-reduces the
// replicas' comm backend records into the step (strata/xla_device/replicas.h), so
// the reduction runs where XLA schedules it, beside the backward.
//
// Note [Ranks as threads]
// A PJRT plugin that drives every local device from one process (the CPU
// plugin's devices, a TPU host's chips) runs one rank per device on a
// thread of that process: the thread-ranks launcher
// (strategies/launchers/thread_ranks.h) starts the threads, each with a
// strategy of its own (Strategy::replica()) whose environment is rank r of
// the devices, and Fabric's calls on a rank's thread go to that rank's
// strategy. Build the model, the optimizer and the data inside the launched
// function, as each worker process would. The Trainer gives each rank a
// Trainer and a module of its own (Note [The Trainer's ranks as threads]
// in trainer/trainer.h).
#pragma once

#include "strata/strategies/ddp.h"
#include "strata/strategies/fsdp.h"

namespace strata::strategies {

class XlaStrategy : public DDPStrategy {
 public:
  /// `accelerator` must be the xla accelerator (ConfigError otherwise);
  /// the options are DDP's: debug, sync_module_states, bucket_cap_mb.
  explicit XlaStrategy(std::shared_ptr<Accelerator> accelerator, std::optional<Precision> precision = std::nullopt,
                       DDPOptions options = {});

  std::string name() const override { return "xla"; }
  std::shared_ptr<Strategy> replica() const override;

  /// Lightning's XLAStrategy.reduce (seed 002): all_reduce under the name
  /// Lightning's Trainer strategies give it. Every other strategy has only
  /// all_reduce, Fabric's name (Note [One name for each operation] in
  /// strategies/strategy.h).
  at::Tensor reduce(const at::Tensor& tensor, comm::ReduceOp op = comm::ReduceOp::kMean) {
    return all_reduce(tensor, op);
  }
  at::Tensor reduce(const at::Tensor& tensor, const std::string& op) { return all_reduce(tensor, op); }

 protected:
  /// False: Lightning's XLAStrategy broadcasts no buffers (Note [Buffers
  /// from rank 0] in ddp.cpp).
  bool broadcasts_buffers() const override { return false; }
};

/// The `xla_fsdp` strategy (Lightning Fabric's XLAFSDPStrategy): FSDP on
/// xla devices. Each unit's all-gather before its forward (and again before
/// its backward) and its gradients' reduce-scatter are recorded into the
/// step by the replicas' backend, in FSDP's segmented layout, with no pack
/// or unpack copies; parameters, gradients and optimizer state stay 1/N
/// per device. The options are FSDP's.
class XlaFSDPStrategy : public FSDPStrategy {
 public:
  /// `accelerator` must be the xla accelerator (ConfigError otherwise).
  explicit XlaFSDPStrategy(std::shared_ptr<Accelerator> accelerator,
                           std::optional<Precision> precision = std::nullopt, FSDPOptions options = {});

  std::string name() const override { return "xla_fsdp"; }
  std::shared_ptr<Strategy> replica() const override;
};

}  // namespace strata::strategies
