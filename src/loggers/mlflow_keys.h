// What MLflow takes as names and values, and how the MLflow logger makes
// Lightning's hyperparameters and metric names fit (Note [MLflow's keys]
// in mlflow_keys.cpp). Internal to the MLflow logger.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "strata/loggers/mlflow_logger.h"

namespace strata::trainer::detail {

// MLflow's limits (mlflow/utils/validation.py).
inline constexpr std::size_t kMaxKeyLength = 250;
inline constexpr std::size_t kMaxTagValueLength = 8000;

/// The number of UTF-8 code points in `text` (a stray byte counts as one).
std::size_t code_point_count(const std::string& text);

/// The first `limit` code points of `text` (Python's text[:limit]).
std::string cut_code_points(const std::string& text, std::size_t limit);

/// `value` cut to kMaxTagValueLength bytes, whole code points only.
std::string cut_tag_value(const std::string& value);

/// One hyperparameter as MLflow gets it: the flattened key, the value as
/// Python's str() writes it, cut to kMLFlowParamValueLimit code points.
struct FlatParam {
  std::string key;
  std::string value;
  std::size_t length = 0;  ///< code points before the cut
};

/// Lightning's _flatten_dict of `params`, in key order.
std::vector<FlatParam> flat_params(const Hyperparams& params);

/// Text from outside (a server's answer, a user's value), shortened for a
/// message.
std::string clip(const std::string& text);

}  // namespace strata::trainer::detail
