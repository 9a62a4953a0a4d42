// Optimizer state as named tensors plus JSON, and back
// (include/strata/checkpoint/state_dict.h): LibTorch's SGD, Adam and AdamW.
//
// Loads validate everything before changing anything, so a failed load
// leaves the optimizer exactly as it was.
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_map>
#include <utility>

#include "state_messages.h"
#include "strata/checkpoint/input.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/core/error.h"

namespace strata::checkpoint {

using ::strata::detail::cat;
using namespace state_messages;

namespace {

enum class OptimizerKind { kSgd, kAdam, kAdamW };

// The one list of the types a checkpoint names, in the order messages list them.
constexpr std::pair<OptimizerKind, const char*> kKinds[] = {
    {OptimizerKind::kSgd, "sgd"}, {OptimizerKind::kAdam, "adam"}, {OptimizerKind::kAdamW, "adamw"}};

const char* kind_name(OptimizerKind kind) {
  for (const auto& [k, name] : kKinds) {
    if (k == kind) return name;
  }
  return "?";
}

// The kind a checkpoint's "type" names, or nullopt.
std::optional<OptimizerKind> kind_named(const std::string& name) {
  for (const auto& [k, n] : kKinds) {
    if (name == n) return k;
  }
  return std::nullopt;
}

// "'sgd', 'adam' or 'adamw'", for messages.
std::string kind_names() {
  std::string out;
  for (size_t i = 0; i < std::size(kKinds); ++i) {
    out += i == 0 ? "" : (i + 1 == std::size(kKinds) ? " or " : ", ");
    out += cat("'", kKinds[i].second, "'");
  }
  return out;
}

OptimizerKind kind_of(const torch::optim::Optimizer& optimizer, const std::string& source) {
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer)) return OptimizerKind::kAdamW;
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer)) return OptimizerKind::kAdam;
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer)) return OptimizerKind::kSgd;
  throw CheckpointError(cat("[checkpoint] ", source, ": optimizer type ",
                            c10::demangle(typeid(optimizer).name()),
                            " is not supported; supported: torch::optim::SGD, Adam, AdamW"));
}

// The key LibTorch's optimizers use in state(): the parameter's TensorImpl.
void* state_key(const at::Tensor& param) { return param.unsafeGetTensorImpl(); }

// The per-parameter tensors each kind keeps, in the order they are saved.
std::vector<std::string> tensor_fields(OptimizerKind kind, bool amsgrad) {
  if (kind == OptimizerKind::kSgd) return {"momentum_buffer"};
  if (amsgrad) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"exp_avg", "exp_avg_sq"};
}

template <class Options>
nlohmann::json adam_options_json(const Options& o) {
  return {{"lr", o.lr()},
          {"betas", {std::get<0>(o.betas()), std::get<1>(o.betas())}},
          {"eps", o.eps()},
          {"weight_decay", o.weight_decay()},
          {"amsgrad", o.amsgrad()}};
}

template <class Options>
void set_adam_options(Options& o, const nlohmann::json& j) {
  o.lr(j.at("lr").get<double>());
  o.betas({j.at("betas").at(0).get<double>(), j.at("betas").at(1).get<double>()});
  o.eps(j.at("eps").get<double>());
  o.weight_decay(j.at("weight_decay").get<double>());
  o.amsgrad(j.at("amsgrad").get<bool>());
}

nlohmann::json options_json(OptimizerKind kind, const torch::optim::OptimizerOptions& options) {
  switch (kind) {
    case OptimizerKind::kAdam:
      return adam_options_json(static_cast<const torch::optim::AdamOptions&>(options));
    case OptimizerKind::kAdamW:
      return adam_options_json(static_cast<const torch::optim::AdamWOptions&>(options));
    case OptimizerKind::kSgd: {
      const auto& o = static_cast<const torch::optim::SGDOptions&>(options);
      return {{"lr", o.lr()},
              {"momentum", o.momentum()},
              {"dampening", o.dampening()},
              {"weight_decay", o.weight_decay()},
              {"nesterov", o.nesterov()}};
    }
  }
  return {};
}

void set_options(OptimizerKind kind, torch::optim::OptimizerOptions& options,
                 const nlohmann::json& j) {
  switch (kind) {
    case OptimizerKind::kAdam:
      set_adam_options(static_cast<torch::optim::AdamOptions&>(options), j);
      return;
    case OptimizerKind::kAdamW:
      set_adam_options(static_cast<torch::optim::AdamWOptions&>(options), j);
      return;
    case OptimizerKind::kSgd: {
      auto& o = static_cast<torch::optim::SGDOptions&>(options);
      o.lr(j.at("lr").get<double>());
      o.momentum(j.at("momentum").get<double>());
      o.dampening(j.at("dampening").get<double>());
      o.weight_decay(j.at("weight_decay").get<double>());
      o.nesterov(j.at("nesterov").get<bool>());
      return;
    }
  }
}

// Reads one parameter's state out of LibTorch's state object: its scalar
// fields into `scalars` and its tensors into `tensors` (by field name).
void read_param_state(OptimizerKind kind, const torch::optim::OptimizerParamState& state,
                      nlohmann::json& scalars, std::map<std::string, at::Tensor>& tensors) {
  auto read_adam = [&](const auto& s) {
    scalars["step"] = s.step();
    tensors["exp_avg"] = s.exp_avg();
    tensors["exp_avg_sq"] = s.exp_avg_sq();
    if (s.max_exp_avg_sq().defined()) tensors["max_exp_avg_sq"] = s.max_exp_avg_sq();
  };
  switch (kind) {
    case OptimizerKind::kAdam:
      read_adam(static_cast<const torch::optim::AdamParamState&>(state));
      return;
    case OptimizerKind::kAdamW:
      read_adam(static_cast<const torch::optim::AdamWParamState&>(state));
      return;
    case OptimizerKind::kSgd: {
      const auto& s = static_cast<const torch::optim::SGDParamState&>(state);
      if (s.momentum_buffer().defined()) tensors["momentum_buffer"] = s.momentum_buffer();
      return;
    }
  }
}

// Builds LibTorch's state object for one parameter.
std::unique_ptr<torch::optim::OptimizerParamState> make_param_state(
    OptimizerKind kind, const nlohmann::json& scalars, std::map<std::string, at::Tensor>& tensors) {
  auto fill_adam = [&](auto state) {
    state->step(scalars.at("step").get<int64_t>());
    state->exp_avg(tensors.at("exp_avg"));
    state->exp_avg_sq(tensors.at("exp_avg_sq"));
    if (tensors.count("max_exp_avg_sq")) state->max_exp_avg_sq(tensors.at("max_exp_avg_sq"));
    return std::unique_ptr<torch::optim::OptimizerParamState>(std::move(state));
  };
  switch (kind) {
    case OptimizerKind::kAdam:
      return fill_adam(std::make_unique<torch::optim::AdamParamState>());
    case OptimizerKind::kAdamW:
      return fill_adam(std::make_unique<torch::optim::AdamWParamState>());
    case OptimizerKind::kSgd: {
      auto state = std::make_unique<torch::optim::SGDParamState>();
      if (tensors.count("momentum_buffer")) state->momentum_buffer(tensors.at("momentum_buffer"));
      return state;
    }
  }
  return nullptr;
}

const std::string& name_of(const ParamNames& names, const at::Tensor& param, size_t group,
                           size_t index, const std::string& source) {
  auto it = names.find(param.unsafeGetTensorImpl());
  STRATA_CHECK(it != names.end(), CheckpointError, "[checkpoint] ", source, ": parameter #", index,
               " of param group ", group, " (shape ", shape_string(param.sizes()),
               ") has no name; build the names with param_names(module) from the module the "
               "optimizer was built over");
  return it->second;
}

}  // namespace

void validate_optimizer_state(const nlohmann::json& j, const std::vector<std::string>& tensor_names,
                              const std::string& where, const std::string& field) {
  auto fail = [&](const std::string& at, const std::string& why) {
    throw CheckpointError(cat("[checkpoint] ", where, ": ", field, at, ": ", why));
  };
  if (!j.is_object()) fail("", cat("is ", j.type_name(), "; expected an object with type, param_groups, state"));
  for (const char* key : {"type", "param_groups", "state"})
    if (!j.contains(key)) fail("", cat("has no \"", key, "\""));
  for (const auto& [key, value] : j.items())
    if (key != "type" && key != "param_groups" && key != "state")
      fail(cat(".", key), "is not an optimizer-state field (expected type, param_groups, state)");
  if (!j["type"].is_string()) fail(".type", cat("is ", j["type"].dump(), "; expected a string"));
  const std::string type = j["type"].get<std::string>();
  const std::optional<OptimizerKind> kind = kind_named(type);
  if (!kind) fail(".type", cat("is '", type, "'; expected ", kind_names()));
  const bool adam = *kind != OptimizerKind::kSgd;
  if (!j["param_groups"].is_array()) fail(".param_groups", "is not an array");
  if (!j["state"].is_object()) fail(".state", "is not an object");

  // Options: exactly the type's, each in range.
  auto number = [&](const nlohmann::json& options, const std::string& at, const char* name,
                    double lo, double hi, bool hi_open) {
    if (!options.contains(name)) fail(at, cat("has no \"", name, "\""));
    const nlohmann::json& v = options[name];
    const double x = v.is_number() ? v.get<double>() : std::nan("");
    if (!v.is_number() || !std::isfinite(x) || x < lo || x > hi || (hi_open && x == hi))
      fail(cat(at, ".", name), cat("is ", v.dump(), "; expected a number in [", lo, ", ", hi,
                                   hi_open ? ")" : "]"));
    return x;
  };
  auto boolean = [&](const nlohmann::json& options, const std::string& at, const char* name) {
    if (!options.contains(name) || !options[name].is_boolean())
      fail(cat(at, ".", name), cat("is ", options.value(name, nlohmann::json()).dump(), "; expected true or false"));
    return options[name].get<bool>();
  };
  constexpr double kHuge = 1e30;
  std::map<std::string, bool> amsgrad_of;  // parameter -> its group's amsgrad
  for (size_t g = 0; g < j["param_groups"].size(); ++g) {
    const nlohmann::json& group = j["param_groups"][g];
    const std::string at = cat(".param_groups[", g, "]");
    if (!group.is_object() || !group.contains("params") || !group["params"].is_array() ||
        !group.contains("options") || !group["options"].is_object())
      fail(at, "expected {\"params\": [names], \"options\": {...}}");
    const nlohmann::json& o = group["options"];
    const std::string oat = at + ".options";
    std::set<std::string> known;
    bool amsgrad = false;
    number(o, oat, "lr", 0, kHuge, false);
    number(o, oat, "weight_decay", 0, kHuge, false);
    if (adam) {
      if (!o.contains("betas") || !o["betas"].is_array() || o["betas"].size() != 2)
        fail(oat + ".betas", cat("is ", o.value("betas", nlohmann::json()).dump(), "; expected [beta1, beta2]"));
      for (size_t b = 0; b < 2; ++b) {
        const nlohmann::json& beta = o["betas"][b];
        const double x = beta.is_number() ? beta.get<double>() : std::nan("");
        if (!beta.is_number() || !std::isfinite(x) || x < 0 || x >= 1)
          fail(cat(oat, ".betas[", b, "]"), cat("is ", beta.dump(), "; expected a number in [0, 1)"));
      }
      number(o, oat, "eps", 0, kHuge, false);
      amsgrad = boolean(o, oat, "amsgrad");
      known = {"lr", "betas", "eps", "weight_decay", "amsgrad"};
    } else {
      const double momentum = number(o, oat, "momentum", 0, kHuge, false);
      const double dampening = number(o, oat, "dampening", -kHuge, kHuge, false);
      if (boolean(o, oat, "nesterov") && (momentum <= 0 || dampening != 0))
        fail(oat + ".nesterov", "is true, which needs momentum > 0 and dampening 0");
      known = {"lr", "momentum", "dampening", "weight_decay", "nesterov"};
    }
    for (const auto& [key, value] : o.items())
      if (!known.count(key)) fail(cat(oat, ".", key), cat("is not a ", type, " option"));
    for (size_t i = 0; i < group["params"].size(); ++i) {
      const nlohmann::json& name = group["params"][i];
      if (!name.is_string()) fail(cat(at, ".params[", i, "]"), cat("is ", name.dump(), "; expected a parameter name"));
      if (!amsgrad_of.emplace(name.get<std::string>(), amsgrad).second)
        fail(cat(at, ".params[", i, "]"), cat("names '", name.get<std::string>(), "', already in a param group"));
    }
  }

  // Per-parameter state: a known parameter, known tensors, a valid step.
  std::set<std::string> expected;
  for (const auto& [name, entry] : j["state"].items()) {
    const std::string at = cat(".state['", name, "']");
    auto param = amsgrad_of.find(name);
    if (param == amsgrad_of.end())
      fail(at, "names no parameter of param_groups (renamed or from another model?); its state would be lost");
    if (!entry.is_object() || !entry.contains("tensors") || !entry["tensors"].is_array())
      fail(at, cat("is ", entry.dump().substr(0, 200), "; expected {\"tensors\": [...]", adam ? ", \"step\": N}" : "}"));
    std::set<std::string> allowed = adam ? std::set<std::string>{"exp_avg", "exp_avg_sq"}
                                         : std::set<std::string>{"momentum_buffer"};
    if (adam && param->second) allowed.insert("max_exp_avg_sq");
    std::set<std::string> listed;
    for (const auto& t : entry["tensors"]) {
      if (!t.is_string() || !allowed.count(t.get<std::string>()))
        fail(at + ".tensors", cat("lists ", t.dump(), ", not a ", type, " state tensor",
                                  adam && !param->second ? " (max_exp_avg_sq needs amsgrad)" : ""));
      if (!listed.insert(t.get<std::string>()).second)
        fail(at + ".tensors", cat("lists ", t.dump(), " twice"));
      expected.insert(name + "." + t.get<std::string>());
    }
    if (adam) {
      for (const char* needed : {"exp_avg", "exp_avg_sq"})
        if (!listed.count(needed)) fail(at + ".tensors", cat("lacks '", needed, "'"));
      if (!entry.contains("step")) fail(at, "has no \"step\"");
      checked_counter(entry["step"], where, cat(field, at, ".step"));
    }
    for (const auto& [key, value] : entry.items())
      if (key != "tensors" && !(adam && key == "step"))
        fail(cat(at, ".", key), cat("is not a ", type, " state field"));
  }
  std::set<std::string> stored(tensor_names.begin(), tensor_names.end());
  std::vector<std::string> orphans, absent;
  for (const std::string& name : stored)
    if (!expected.count(name)) orphans.push_back(name);
  for (const std::string& name : expected)
    if (!stored.count(name)) absent.push_back(name);
  if (!orphans.empty())
    fail(".state", cat(plural(orphans.size(), "stored tensor"), " match no parameter's state: ",
                       key_list(orphans), " (orphaned optimizer state)"));
  if (!absent.empty())
    fail(".state", cat("tensor '", absent[0], "' is listed in the state but missing",
                       absent.size() > 1 ? cat(" (and ", absent.size() - 1, " more)") : std::string()));
}

OptimizerState optimizer_state(const torch::optim::Optimizer& optimizer, const ParamNames& names) {
  const std::string source = "optimizer state";
  const OptimizerKind kind = kind_of(optimizer, source);
  OptimizerState out;
  out.json = {{"type", kind_name(kind)},
              {"param_groups", nlohmann::json::array()},
              {"state", nlohmann::json::object()}};
  const auto& states = optimizer.state();
  for (size_t g = 0; g < optimizer.param_groups().size(); ++g) {
    const auto& group = optimizer.param_groups()[g];
    nlohmann::json params = nlohmann::json::array();
    for (size_t i = 0; i < group.params().size(); ++i) {
      const at::Tensor& param = group.params()[i];
      const std::string& name = name_of(names, param, g, i, source);
      params.push_back(name);
      auto it = states.find(state_key(param));
      if (it == states.end()) continue;  // never stepped: no state yet
      nlohmann::json scalars = nlohmann::json::object();
      std::map<std::string, at::Tensor> tensors;
      read_param_state(kind, *it->second, scalars, tensors);
      nlohmann::json fields = nlohmann::json::array();
      for (const auto& [field, tensor] : tensors) {
        out.tensors.emplace_back(name + "." + field, tensor);
        fields.push_back(field);
      }
      scalars["tensors"] = fields;
      out.json["state"][name] = scalars;
    }
    out.json["param_groups"].push_back({{"params", params}, {"options", options_json(kind, group.options())}});
  }
  return out;
}

LoadReport load_optimizer_state(torch::optim::Optimizer& optimizer, const ParamNames& names,
                                const OptimizerState& state, bool strict,
                                const std::string& source) {
  const OptimizerKind kind = kind_of(optimizer, source);
  const nlohmann::json& j = state.json;
  {
    std::vector<std::string> names_stored;
    for (const auto& [name, tensor] : state.tensors) names_stored.push_back(name);
    validate_optimizer_state(j, names_stored, source, "optimizer state");
  }
  const std::string type = j["type"].get<std::string>();
  STRATA_CHECK(type == kind_name(kind), CheckpointError, "[checkpoint] ", source, ": holds '",
               type, "' optimizer state but the optimizer is '", kind_name(kind), "'");
  auto& groups = optimizer.param_groups();
  STRATA_CHECK(j["param_groups"].size() == groups.size(), CheckpointError, "[checkpoint] ", source,
               ": has ", j["param_groups"].size(), " param groups but the optimizer has ",
               groups.size());
  const auto tensors = index_tensors(state.tensors, source);

  // Pass 1: match names and build every new state object, changing nothing.
  LoadReport report;
  struct Pending {
    void* key;
    std::unique_ptr<torch::optim::OptimizerParamState> state;  // null: clear
  };
  std::vector<Pending> pending;
  try {
    for (size_t g = 0; g < groups.size(); ++g) {
      const nlohmann::json& saved_group = j["param_groups"][g];
      std::set<std::string> saved;
      for (const auto& name : saved_group.at("params")) saved.insert(name.get<std::string>());
      std::set<std::string> present;
      for (size_t i = 0; i < groups[g].params().size(); ++i) {
        const at::Tensor& param = groups[g].params()[i];
        const std::string& name = name_of(names, param, g, i, source);
        present.insert(name);
        if (!saved.count(name)) {
          report.missing.push_back(name);
          continue;
        }
        if (!j["state"].contains(name)) {
          pending.push_back({state_key(param), nullptr});
          continue;
        }
        const nlohmann::json& scalars = j["state"][name];
        std::map<std::string, at::Tensor> fields;
        for (const auto& field : scalars.at("tensors")) {
          const std::string key = name + "." + field.get<std::string>();
          auto it = tensors.find(key);
          STRATA_CHECK(it != tensors.end(), CheckpointError, "[checkpoint] ", source,
                       ": tensor '", key, "' is listed in the state but missing");
          STRATA_CHECK(it->second.defined() && it->second.sizes() == param.sizes(), CheckpointError,
                       "[checkpoint] ", source, ": tensor '", key, "' has shape ",
                       it->second.defined() ? shape_string(it->second.sizes()) : std::string("(undefined)"),
                       " but parameter '", name, "' has shape ", shape_string(param.sizes()));
          STRATA_CHECK(it->second.scalar_type() == param.scalar_type(), CheckpointError,
                       "[checkpoint] ", source, ": tensor '", key, "' has dtype ",
                       c10::toString(it->second.scalar_type()), " but parameter '", name,
                       "' has dtype ", c10::toString(param.scalar_type()));
          fields[field.get<std::string>()] =
              it->second.to(param.device(), /*non_blocking=*/false, /*copy=*/true);
        }
        for (const auto& field : tensor_fields(kind, /*amsgrad=*/false))
          STRATA_CHECK(fields.count(field), CheckpointError, "[checkpoint] ", source,
                       ": parameter '", name, "' has state but no '", field, "' tensor");
        pending.push_back({state_key(param), make_param_state(kind, scalars, fields)});
      }
      for (const auto& name : saved)
        if (!present.count(name)) report.unexpected.push_back(name);
    }
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(cat("[checkpoint] ", source, ": malformed optimizer state JSON (",
                              e.what(), ")"));
  }
  if (strict) check_strict(report, source, "the optimizer's parameter names");
  if (!strict && !report.ok())
    warn(cat(source, ": non-strict load of optimizer state skipped ",
             report.unexpected.empty() ? std::string("no") : key_list(report.unexpected),
             " (saved, no such parameter here) and left ",
             report.missing.empty() ? std::string("no") : key_list(report.missing),
             " (parameters here, nothing saved) without state"));

  // Pass 2: apply (options may still throw on malformed JSON; check first).
  std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
  try {
    for (size_t g = 0; g < groups.size(); ++g) {
      options.push_back(groups[g].options().clone());
      set_options(kind, *options.back(), j["param_groups"][g].at("options"));
    }
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(cat("[checkpoint] ", source, ": malformed param-group options (",
                              e.what(), ")"));
  }
  for (size_t g = 0; g < groups.size(); ++g) groups[g].set_options(std::move(options[g]));
  auto& states = optimizer.state();
  for (auto& p : pending) {
    if (p.state)
      states[p.key] = std::move(p.state);
    else
      states.erase(p.key);
  }
  return report;
}

}  // namespace strata::checkpoint
