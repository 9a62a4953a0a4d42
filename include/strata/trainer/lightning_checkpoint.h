// A strata checkpoint as one Lightning checkpoint file: what `strata ckpt
// export --format lightning` writes, so Lightning's tools (torch.load with
// weights_only=True, pl_load, LightningModule.load_from_checkpoint) open it.
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "strata/checkpoint/torch_file.h"

namespace strata::checkpoint {
class StateReader;
}

namespace strata::trainer {

/// The version written under "pytorch-lightning_version": the Lightning
/// release whose checkpoint layout the file follows.
inline constexpr const char* kLightningLayoutVersion = "2.6.6";

/// What to take from the checkpoint.
struct LightningExportOptions {
  /// The module entry whose tensors become "state_dict" ("module" in a
  /// Trainer checkpoint), under their own names ("model.wte.weight").
  std::string module_key = "module";
  /// More state_dict names for stored ones: {alias, stored name}, e.g. a
  /// tied head listed under both names as PyTorch's state_dict lists it
  /// (one storage in the file).
  std::vector<std::pair<std::string, std::string>> aliases;
  /// Called after each tensor written.
  std::function<void(const checkpoint::TorchFileProgress&)> on_progress;
};

/// Writes `reader`'s checkpoint to the file `out` (atomically; an existing
/// file is replaced) as a torch.save dict with Lightning's keys:
///   "epoch", "global_step"     the Trainer's (0 for a checkpoint without
///                              a Trainer entry);
///   "pytorch-lightning_version" kLightningLayoutVersion;
///   "state_dict"               every tensor of the module entry, whole;
///   "optimizer_states"         each optimizer_<i> entry as PyTorch's
///                              optimizer.state_dict(): parameters numbered
///                              in their param-group order, per-parameter
///                              state ("step" a float32 scalar tensor,
///                              exp_avg, ...), param_groups with PyTorch's
///                              option names and defaults;
///   "lr_schedulers", "callbacks"  the Trainer's scheduler and callback
///                              states as strata keeps them;
///   "hyper_parameters"         the module's hyperparameters, typed (what
///                              load_from_checkpoint passes to __init__).
/// Every value is a dict, list, tuple, str, int, float, bool, None or
/// tensor (Note [Pickling for weights_only] in torch_file.h). The source
/// was checked when `reader` opened it (metadata, files, optimizer state);
/// the Trainer entry is checked here (validate_trainer_entry). Throws
/// CheckpointError for a source that fails those checks, ConfigError when
/// the module entry is missing or holds no tensor.
void export_lightning_checkpoint(const checkpoint::StateReader& reader, const std::string& out,
                                 const LightningExportOptions& options = {});

/// A JSON value as the value of a Lightning checkpoint: objects as dicts,
/// arrays as lists, integers as int (above 2^63-1 as float), null as None.
c10::IValue json_to_ivalue(const nlohmann::json& value);

}  // namespace strata::trainer
