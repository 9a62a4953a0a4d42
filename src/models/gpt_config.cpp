// GPTConfig as JSON: what a checkpoint stores so that a reader can rebuild
// the model from the checkpoint alone, and the checks applied when reading
// it back (a checkpoint is hostile input).
#include <set>

#include "strata/core/error.h"
#include "strata/models/gpt.h"

namespace strata::models {
namespace {

constexpr const char* kModelType = "strata-gpt";

// A size field: an integer in [1, max].
int64_t size_field(const nlohmann::json& json, const char* field, int64_t max, const std::string& source) {
  STRATA_CHECK(json.contains(field), ConfigError, "[gpt] ", source, ": the model config has no \"", field,
               "\"");
  const nlohmann::json& value = json[field];
  STRATA_CHECK(value.is_number_integer() && value.get<int64_t>() >= 1 && value.get<int64_t>() <= max &&
                   !(value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(max)),
               ConfigError, "[gpt] ", source, ": \"", field, "\" is ", value.dump().substr(0, 64),
               "; expected an integer from 1 to ", max);
  return value.get<int64_t>();
}

bool bool_field(const nlohmann::json& json, const char* field, const std::string& source) {
  STRATA_CHECK(json.contains(field) && json[field].is_boolean(), ConfigError, "[gpt] ", source, ": \"", field,
               "\" is ", json.contains(field) ? json[field].dump().substr(0, 64) : std::string("missing"),
               "; expected true or false");
  return json[field].get<bool>();
}

}  // namespace

nlohmann::json GPTConfig::to_json() const {
  return {{"model_type", kModelType}, {"vocab_size", vocab_size}, {"block_size", block_size},
          {"n_layer", n_layer},      {"n_head", n_head},         {"n_embd", n_embd},
          {"dropout", dropout},      {"tie_weights", tie_weights}, {"bias", bias}};
}

GPTConfig GPTConfig::from_json(const nlohmann::json& json, const std::string& source) {
  STRATA_CHECK(json.is_object(), ConfigError, "[gpt] ", source, ": the model config is ",
               json.dump().substr(0, 64), "; expected an object as GPTConfig::to_json writes");
  STRATA_CHECK(json.contains("model_type") && json["model_type"] == kModelType, ConfigError, "[gpt] ", source,
               ": \"model_type\" is ",
               json.contains("model_type") ? json["model_type"].dump().substr(0, 64) : std::string("missing"),
               "; expected \"", kModelType, "\"");
  static const std::set<std::string> known = {"model_type", "vocab_size", "block_size", "n_layer", "n_head",
                                              "n_embd",     "dropout",    "tie_weights", "bias"};
  for (const auto& item : json.items())
    STRATA_CHECK(known.count(item.key()), ConfigError, "[gpt] ", source, ": unknown model config field \"",
                 item.key().substr(0, 64), "\" (written by a newer strata?)");
  constexpr int64_t kMaxSize = int64_t(1) << 20;
  GPTConfig config;
  config.with_vocab_size(size_field(json, "vocab_size", int64_t(1) << 24, source))
      .with_block_size(size_field(json, "block_size", kMaxSize, source))
      .with_n_layer(size_field(json, "n_layer", kMaxSize, source))
      .with_n_head(size_field(json, "n_head", kMaxSize, source))
      .with_n_embd(size_field(json, "n_embd", kMaxSize, source))
      .with_tie_weights(bool_field(json, "tie_weights", source))
      .with_bias(bool_field(json, "bias", source));
  STRATA_CHECK(json.contains("dropout") && json["dropout"].is_number(), ConfigError, "[gpt] ", source,
               ": \"dropout\" is ", json.contains("dropout") ? json["dropout"].dump().substr(0, 64) : "missing",
               "; expected a number in [0, 1)");
  config.dropout = json["dropout"].get<double>();
  config.validate();
  return config;
}

}  // namespace strata::models
