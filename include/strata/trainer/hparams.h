// Hyperparameters as Lightning writes them: hparams.yaml (what Lightning's
// save_hparams_to_yaml writes and load_hparams_from_yaml reads), and the
// flat name -> value list Lightning's TensorBoardLogger hands to
// TensorBoard's HPARAMS tab.
#pragma once

#include <string>
#include <vector>

#include "strata/loggers/event_file.h"
#include "strata/loggers/logger.h"

namespace strata::trainer {

/// `params` as hparams.yaml (Lightning's save_hparams_to_yaml layout),
/// written by yaml-cpp: keys sorted, nested maps indented, lists as
/// "- item" lines, ints as 2, floats as Python's repr made YAML 1.1 (0.01,
/// 3.0, 1.0e-05, .inf, .nan), true/false, null, strings plain when they are
/// simple words (AdamW, fsdp) and double-quoted otherwise ("0.003", "yes",
/// "h\u00E9llo"). Every value reads back as itself through Lightning's
/// load_hparams_from_yaml (PyYAML). Bytes that are not UTF-8 are written
/// as U+FFFD. "{}\n" when empty.
std::string hparams_yaml(const Hyperparams& params);

/// What Lightning's TensorBoardLogger gives TensorBoard for `params`:
/// nested maps flattened with '/' ("model/n_layer"), numbers as numbers,
/// booleans as the numbers 1 and 0 (Python's bool is an int), strings as
/// text, null and lists as their Python str() ("None", "[0.9, 0.95]"); an
/// empty map gives no entry. In key order.
std::vector<HparamValue> tensorboard_hparams(const Hyperparams& params);

/// Python's repr() of a JSON value: None, True, 0.01, 1e-05, 'text',
/// [1, 'a'], {'k': 2}.
std::string python_repr(const nlohmann::json& value);

/// Python's repr() of a float: the shortest text that reads back as the
/// same double, fixed notation for exponents from -4 to 15 ("0.0001",
/// "3.0"), else scientific ("1e-05", "1e+16"); "nan", "inf", "-inf".
std::string python_float_repr(double value);

}  // namespace strata::trainer
