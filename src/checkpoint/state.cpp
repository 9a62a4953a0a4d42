// Module, optimizer and RNG state as named tensors plus JSON
// (include/strata/checkpoint/state.h).
//
// Loads validate everything before changing anything, so a failed load
// leaves the module or optimizer exactly as it was.
#include "strata/checkpoint/state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <unordered_map>

#include "strata/checkpoint/input.h"
#include "strata/core/error.h"

namespace strata::checkpoint {
namespace {

using ::strata::detail::cat;

constexpr size_t kListedKeys = 10;

std::string shape_string(at::IntArrayRef shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// "'a', 'b', ... and K more" (the first kListedKeys names).
std::string key_list(const std::vector<std::string>& keys) {
  std::string out;
  for (size_t i = 0; i < keys.size() && i < kListedKeys; ++i)
    out += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > kListedKeys) out += cat(" and ", keys.size() - kListedKeys, " more");
  return out;
}

std::string plural(size_t n, const char* word) {
  return cat(n, " ", word, n == 1 ? "" : "s");
}

// Throws the strict-load error for `report`, when it is not ok.
void check_strict(const LoadReport& report, const std::string& source, const char* what) {
  if (report.ok()) return;
  std::string message = cat("[checkpoint] ", source, ": ", what, " do not match (strict load):");
  if (!report.missing.empty())
    message += cat(" ", plural(report.missing.size(), "missing key"), ": ", key_list(report.missing),
                   report.unexpected.empty() ? "" : ";");
  if (!report.unexpected.empty())
    message += cat(" ", plural(report.unexpected.size(), "unexpected key"), ": ",
                   key_list(report.unexpected));
  message += ". Load with strict=false to take the matching keys only";
  throw CheckpointError(message);
}

std::unordered_map<std::string, at::Tensor> index_tensors(const NamedTensors& tensors,
                                                          const std::string& source) {
  std::unordered_map<std::string, at::Tensor> index;
  for (const auto& [name, tensor] : tensors)
    STRATA_CHECK(index.emplace(name, tensor).second, CheckpointError, "[checkpoint] ", source,
                 ": key '", name, "' appears twice");
  return index;
}

}  // namespace

// ---- module state ---------------------------------------------------------------

NamedTensors module_state(const torch::nn::Module& module) {
  NamedTensors out;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    out.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true))
    if (item.value().defined()) out.emplace_back(item.key(), item.value());
  return out;
}

LoadReport load_module_state(torch::nn::Module& module, const NamedTensors& tensors, bool strict,
                             const std::string& source) {
  const auto index = index_tensors(tensors, source);
  const NamedTensors targets = module_state(module);
  LoadReport report;
  std::set<std::string> expected;
  std::vector<std::pair<at::Tensor, at::Tensor>> copies;  // (target, source)
  for (const auto& [name, target] : targets) {
    expected.insert(name);
    auto it = index.find(name);
    if (it == index.end()) {
      report.missing.push_back(name);
      continue;
    }
    const at::Tensor& value = it->second;
    STRATA_CHECK(value.defined(), CheckpointError, "[checkpoint] ", source, ": key '", name,
                 "' holds an undefined tensor");
    STRATA_CHECK(value.sizes() == target.sizes(), CheckpointError, "[checkpoint] ", source,
                 ": key '", name, "' has shape ", shape_string(value.sizes()),
                 " but the module's has shape ", shape_string(target.sizes()));
    STRATA_CHECK(value.scalar_type() == target.scalar_type(), CheckpointError, "[checkpoint] ",
                 source, ": key '", name, "' has dtype ", c10::toString(value.scalar_type()),
                 " but the module's has dtype ", c10::toString(target.scalar_type()));
    copies.emplace_back(target, value);
  }
  for (const auto& [name, tensor] : tensors)
    if (!expected.count(name)) report.unexpected.push_back(name);
  if (strict) check_strict(report, source, "the module's keys");

  torch::NoGradGuard no_grad;
  for (auto& [target, value] : copies) target.copy_(value);
  return report;
}

// ---- optimizer state --------------------------------------------------------------

ParamNames param_names(const torch::nn::Module& module) {
  ParamNames names;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  return names;
}

namespace {

enum class OptimizerKind { kSgd, kAdam, kAdamW };

const char* kind_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::kSgd: return "sgd";
    case OptimizerKind::kAdam: return "adam";
    case OptimizerKind::kAdamW: return "adamw";
  }
  return "?";
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
  if (type != "sgd" && type != "adam" && type != "adamw")
    fail(".type", cat("is '", type, "'; expected 'sgd', 'adam' or 'adamw'"));
  const bool adam = type != "sgd";
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

// ---- RNG state ------------------------------------------------------------------

namespace {

// Note [Generator state]
// Every device's default generator exposes its state as a uint8 CPU
// tensor (CPU: the mt19937 state; CUDA: the Philox seed and offset) through
// at::Generator, so one pair of functions serves every device. The state
// is checked before it reaches the generator, whose own checks report
// device-specific text; a refused state leaves the generator as it was.
at::Tensor rng_state_of(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_rng_state_of(at::Generator generator, const std::string& what, const at::Tensor& state,
                      const std::string& source) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  const at::Tensor previous = generator.get_state();
  const int64_t expected = previous.numel();
  STRATA_CHECK(state.defined() && state.scalar_type() == at::kByte && state.dim() == 1 &&
                   state.numel() == expected,
               CheckpointError, "[checkpoint] ", source, ": ", what, " RNG state must be a 1-D uint8 tensor of ",
               expected, " bytes, got ",
               state.defined() ? cat(c10::toString(state.scalar_type()), " ",
                                     shape_string(state.sizes()))
                               : std::string("an undefined tensor"));
  // The generator checks the contents (an all-zero CPU state is refused as
  // "Invalid mt19937 state"); report that as a checkpoint error.
  try {
    generator.set_state(state.cpu().contiguous());
  } catch (const c10::Error& e) {
    try {
      generator.set_state(previous);
    } catch (const c10::Error&) {
    }
    throw CheckpointError(cat("[checkpoint] ", source, ": not a valid ", what, " generator state (",
                              e.what_without_backtrace(), ")"));
  }
}

}  // namespace

at::Tensor cpu_rng_state() { return rng_state_of(at::detail::getDefaultCPUGenerator()); }

void set_cpu_rng_state(const at::Tensor& state, const std::string& source) {
  set_rng_state_of(at::detail::getDefaultCPUGenerator(), "CPU", state, source);
}

at::Tensor device_rng_state(c10::Device device) {
  if (device.is_cpu()) return cpu_rng_state();
  return rng_state_of(at::globalContext().defaultGenerator(device));
}

void set_device_rng_state(c10::Device device, const at::Tensor& state, const std::string& source) {
  if (device.is_cpu()) return set_cpu_rng_state(state, source);
  set_rng_state_of(at::globalContext().defaultGenerator(device), device.str(), state, source);
}

}  // namespace strata::checkpoint
