// One sharded parameter of an FSDP unit (Note [FSDP parameters]): its
// shard, its full value while the unit computes, and the storage of that
// full value freed and allocated again on any device. Private to the
// strategies area.
#pragma once

#include <torch/nn/module.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "../grad_hooks.h"
#include "first_use.h"

namespace strata::strategies::detail {

/// The parameter dictionary a module keeps (protected in LibTorch), where
/// shards replace the module's own tensors.
torch::OrderedDict<std::string, at::Tensor>& parameters_of(torch::nn::Module& module);

/// Note [Setup device]
/// FSDP keeps the shards, the full values and the gradients on the
/// strategy's root device (a GPU, or the CPU). While the strategy shards a
/// model (setup_module, or module_sharded_context as units are built) it
/// names that device with a SetupDeviceScope; value_at_setup then hands out
/// each tensor's value there, one tensor at a time, so a model built on the
/// CPU (or on the meta device) never needs to fit on the GPU whole. The
/// scope is per thread; without one the device is the CPU.
class SetupDeviceScope {
 public:
  explicit SetupDeviceScope(c10::Device device);
  ~SetupDeviceScope();
  SetupDeviceScope(const SetupDeviceScope&) = delete;
  SetupDeviceScope& operator=(const SetupDeviceScope&) = delete;
  /// The device of the innermost scope of this thread (the CPU: none).
  static c10::Device current();

 private:
  c10::Device previous_;
};

/// A module tensor's value at setup, on the setup device: itself (moved
/// there when it lives elsewhere), or zeros for one built on the meta
/// device (Note [Meta-device construction]).
at::Tensor value_at_setup(const at::Tensor& t);

/// Lets a tensor built on the meta device take a value on `device` through
/// set_data (Note [Meta-device construction]).
void leave_meta(at::Tensor& t, c10::Device device);

/// Creates the gradient accumulator of a module tensor while it holds its
/// full value `full` in `dtype` (autograd checks gradients against that
/// shape and dtype; the accumulator must then be kept alive, or the hook on
/// it dies with it), then empties the tensor. Null when it does not train.
GradAccumulator accumulator_then_empty(at::Tensor& compute, const at::Tensor& full, c10::ScalarType dtype,
                                       bool trainable);

/// Note [FSDP parameters]
/// Sharding is per parameter (as in PyTorch's FSDP2), so names, optimizer
/// param groups and checkpoints keep working by name. For every parameter
/// the module keeps two tensors:
/// - the *compute* tensor: the module's own tensor (LinearImpl::weight and
///   the like alias it). It keeps the full shape at all times, and its data
///   is swapped with set_data: a storage of 0 bytes while the unit is
///   sharded, the full value while the unit is unsharded. After a unit's
///   forward its storage is freed (0 bytes; the views autograd saved keep
///   pointing at that storage), and before its backward the storage is
///   allocated again and refilled, so the saved views see the values
///   again. An empty storage keeps a tag naming the parameter, and the
///   compute tensor carries a dispatch key, so that any operator that
///   reads it gathers its unit first (Note [Gather on first use]).
/// - the *shard*: this rank's piece, padded to an equal length on every
///   rank, fp32, a leaf that requires grad. It replaces the compute tensor
///   in the module's parameter dictionary, so module->parameters() lists
///   shards under the original names and the optimizer updates them. The
///   shards of one unit are views of one flat buffer, which is what the
///   unit's all-gather sends.
/// The compute tensor's gradient accumulator (made while the tensor is
/// full-sized, and kept alive by GradHooks) tells the unit when its
/// gradient is in (Note [Gradient hooks]).
struct ShardedParam {
  std::string name;            ///< first full name ("blocks.0.attn.c_attn.weight")
  at::Tensor compute;          ///< the module's own tensor: empty, or the full value
  at::Tensor shard;            ///< this rank's padded piece (fp32 leaf), in the module's dictionary
  std::vector<int64_t> shape;  ///< full shape
  int64_t numel = 0;
  int64_t chunk = 0;           ///< shard length (padded) on every rank
  int64_t offset = 0;          ///< where the shard sits in its unit's flat shard
  int64_t storage_bytes = 0;   ///< bytes of the storage of the full value: its unit's block
  size_t unit = 0;
  bool trainable = false;
  bool grad_ready = false;     ///< its gradient of this backward arrived
  bool grad_placed = false;    ///< its place in the unit's gradient block holds this backward's gradient
  std::vector<std::pair<torch::nn::Module*, std::string>> owners;  ///< where it is registered
  at::Tensor preshard;          ///< this rank's piece when sharded at construction (until set-up ends)
  GradAccumulator accumulator;  ///< made at construction, until set-up hooks it
  std::shared_ptr<const FirstUseTag> tag;  ///< what its empty storages keep

  /// Makes the compute tensor the full value: its place in `unit_block`,
  /// the unit's gathered parameters (Note [One block per unit]).
  void unshard(const at::Tensor& unit_block, int world);
  /// The storage of the full value (its unit's block, shared by the unit's
  /// parameters and the views autograd saved of them), freed after forward,
  /// allocated again, as a flat tensor of `numel` elements: what the
  /// backward's gather refills.
  at::Tensor reallocate_storage(int64_t numel);
  /// Frees the full value's storage, keeping the tensor's shape.
  void free_storage();
  /// Makes the compute tensor a full-shaped tensor of `dtype` over an
  /// empty storage again.
  void reshard(c10::ScalarType dtype);
  /// Puts the shard where the module registered the parameter.
  void install_shard();
};

}  // namespace strata::strategies::detail
