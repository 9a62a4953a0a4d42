// The table Lightning's ModelSummary prints at the start of fit: one row
// per top-level submodule (name, type, parameters, train/eval mode), then
// the trainable, non-trainable and total parameter counts, the estimated
// size in MB and the number of modules in each mode, formatted as
// Lightning 2.6 formats them (column widths, "1.2 K" counts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace strata::trainer {

/// One row of the table: a direct child of the summarized module.
struct LayerSummary {
  std::string name;        ///< the child's name ("model")
  std::string type;        ///< its class without namespace or "Impl" ("GPT", "Linear")
  int64_t parameters = 0;  ///< its parameters, each shared tensor once
  int64_t trainable = 0;   ///< those that require grad
  bool training = true;    ///< its train/eval mode
};

/// What the table shows, computed from a module.
struct ModelSummary {
  std::vector<LayerSummary> layers;
  int64_t total_parameters = 0;      ///< every parameter of the module, each tensor once
  int64_t trainable_parameters = 0;  ///< those that require grad
  /// Parameters directly on the module, in no child (Lightning's "other params" row).
  int64_t leftover_parameters = 0;
  double size_mb = 0;            ///< total_parameters x bytes of the precision / 1e6
  int64_t modules_in_train = 0;  ///< every submodule (the module itself excluded) in train mode
  int64_t modules_in_eval = 0;

  /// Lightning's table, lines joined by '\n' (no final newline).
  std::string table() const;
};

/// Summarizes `module` at depth 1 (Lightning's ModelSummary(max_depth=1)).
/// `precision` ("32-true", "bf16-mixed", ...) gives the bytes per parameter
/// of size_mb as Lightning counts them: 8 for 64, 2 for 16 and bf16 true
/// precisions, 4 otherwise (mixed precisions keep fp32 weights).
ModelSummary summarize(const torch::nn::Module& module, const std::string& precision = "32-true");

/// Lightning's get_human_readable_count: 123 -> "123  ", 1234 -> "1.2 K",
/// 2e6 -> "2.0 M", 4e14 -> "400 T", 5e15 -> "5,000 T".
std::string human_readable_count(int64_t number);

}  // namespace strata::trainer
