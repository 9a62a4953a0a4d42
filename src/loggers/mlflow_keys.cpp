// MLflow's names and values (mlflow_keys.h, and the public helpers of
// loggers/mlflow_logger.h).
//
// Note [MLflow's keys]
// As Lightning: hyperparameters are flattened with '/' (_flatten_dict) and
// sent as Python's str() of the value, cut to 250 characters; metric names
// get the prefix joined by '-' and lose every character other than
// letters, digits, '_', '/', '.', ' ' and '-' (MLflow refuses them), with a
// warning. strata applies the same cleaning to param and tag keys (the
// server would refuse the whole batch of 100 otherwise) and drops, with a
// warning, a key over MLflow's 250 characters and cuts a tag value over
// its 8000.
#include "mlflow_keys.h"

#include <nlohmann/json.hpp>

#include "strata/trainer/hparams.h"

namespace strata::trainer {
namespace detail {
namespace {

using json = nlohmann::json;

// The longest text from outside a message quotes.
constexpr std::size_t kMaxErrorText = 400;

// Python's str() of a hyperparameter value.
std::string python_str(const json& value) {
  if (value.is_string()) return value.get<std::string>();
  return python_repr(value);  // numbers, True/False, None and lists as str() writes them
}

void flatten_params(const json& value, const std::string& key, std::vector<FlatParam>& out) {
  if (value.is_object()) {  // _flatten_dict: an empty map gives no entry
    for (auto it = value.begin(); it != value.end(); ++it) flatten_params(it.value(), key + "/" + it.key(), out);
    return;
  }
  FlatParam p;
  p.key = key;
  const std::string text = python_str(value);
  p.length = code_point_count(text);
  p.value = cut_code_points(text, kMLFlowParamValueLimit);
  out.push_back(std::move(p));
}

}  // namespace

std::size_t code_point_count(const std::string& text) {
  std::size_t n = 0;
  for (char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::string cut_code_points(const std::string& text, std::size_t limit) {
  std::size_t seen = 0;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if ((static_cast<unsigned char>(text[i]) & 0xC0) != 0x80) {
      if (seen == limit) return text.substr(0, i);
      ++seen;
    }
  }
  return text;
}

std::string cut_tag_value(const std::string& value) {
  std::string out = cut_code_points(value, kMaxTagValueLength);
  while (out.size() > kMaxTagValueLength) out = cut_code_points(out, code_point_count(out) - 1);
  return out;
}

std::vector<FlatParam> flat_params(const Hyperparams& params) {
  std::vector<FlatParam> out;
  for (const auto& [key, value] : params) flatten_params(value, key, out);
  return out;
}

std::string clip(const std::string& text) {
  if (text.size() <= kMaxErrorText) return text;
  return text.substr(0, kMaxErrorText) + "... (" + std::to_string(text.size()) + " bytes)";
}

}  // namespace detail

std::vector<std::pair<std::string, std::string>> mlflow_params(const Hyperparams& params) {
  std::vector<std::pair<std::string, std::string>> out;
  for (detail::FlatParam& p : detail::flat_params(params)) out.emplace_back(std::move(p.key), std::move(p.value));
  return out;
}

std::string mlflow_metric_key(const std::string& key) {
  std::string out;
  for (char c : key) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '/' || c == '.' || c == ' ' || c == '-';
    if (ok) out.push_back(c);
  }
  return out;
}

}  // namespace strata::trainer
