// export_lightning_checkpoint (trainer/lightning_checkpoint.h): strata's
// Trainer checkpoint mapped onto Lightning's checkpoint dict.
#include "strata/trainer/lightning_checkpoint.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <limits>
#include <map>

#include "strata/checkpoint/sharded.h"
#include "strata/core/error.h"
#include "strata/trainer/trainer_state.h"

namespace strata::trainer {
namespace {

using json = nlohmann::json;
using checkpoint::StateReader;
using checkpoint::TorchFileWriter;

// The Trainer's entry value, or null for a checkpoint without one.
const json* trainer_value(const StateReader& reader) {
  const json& entries = reader.entries();
  auto it = entries.find("trainer");
  if (it == entries.end() || !it->is_object() || it->value("kind", "") != "value") return nullptr;
  auto value = it->find("value");
  if (value == it->end() || !value->is_object() || !value->contains("format")) return nullptr;
  return &*value;
}

at::Tensor lazy_stored(TorchFileWriter& writer, const StateReader& reader, const std::string& stored) {
  return writer.lazy_tensor(reader.dtype(stored), reader.shape(stored),
                            [&reader, stored] { return reader.full(stored); });
}

// PyTorch's param_group of a strata one: its options under PyTorch's names,
// with the defaults torch.optim gives the options LibTorch has not.
c10::impl::GenericDict param_group(const std::string& type, const json& options, int64_t first, size_t count) {
  c10::impl::GenericDict g = checkpoint::any_dict();
  auto number = [&](const char* key, double fallback) {
    return options.contains(key) ? options[key].get<double>() : fallback;
  };
  g.insert("lr", number("lr", 0.001));
  if (type == "sgd") {
    g.insert("momentum", number("momentum", 0));
    g.insert("dampening", number("dampening", 0));
    g.insert("weight_decay", number("weight_decay", 0));
    g.insert("nesterov", options.value("nesterov", false));
    g.insert("maximize", false);
    g.insert("foreach", c10::IValue());
    g.insert("differentiable", false);
    g.insert("fused", c10::IValue());
  } else {  // adam, adamw (validate_optimizer_state admits no other)
    const json betas = options.value("betas", json::array({0.9, 0.999}));
    g.insert("betas", c10::ivalue::Tuple::create(
                          std::vector<c10::IValue>{betas.at(0).get<double>(), betas.at(1).get<double>()}));
    g.insert("eps", number("eps", 1e-8));
    g.insert("weight_decay", number("weight_decay", type == "adamw" ? 0.01 : 0));
    g.insert("amsgrad", options.value("amsgrad", false));
    g.insert("maximize", false);
    g.insert("foreach", c10::IValue());
    g.insert("capturable", false);
    g.insert("differentiable", false);
    g.insert("fused", c10::IValue());
    g.insert("decoupled_weight_decay", type == "adamw");
  }
  c10::impl::GenericList params = checkpoint::any_list();
  for (size_t i = 0; i < count; ++i) params.push_back(first + static_cast<int64_t>(i));
  g.insert("params", params);
  return g;
}

// One optimizer entry as torch.optim.Optimizer.state_dict() gives it.
c10::impl::GenericDict optimizer_state(TorchFileWriter& writer, const StateReader& reader, const std::string& key) {
  const json& state = reader.entries()[key]["state"];  // validate_optimizer_state checked it at open
  const std::string type = state["type"].get<std::string>();
  c10::impl::GenericDict per_param = checkpoint::any_dict();
  c10::impl::GenericList groups = checkpoint::any_list();
  int64_t index = 0;
  for (const json& group : state["param_groups"]) {
    const json& params = group["params"];
    groups.push_back(param_group(type, group.value("options", json::object()), index, params.size()));
    for (const json& name_json : params) {
      const std::string name = name_json.get<std::string>();
      auto it = state["state"].find(name);
      if (it != state["state"].end()) {
        c10::impl::GenericDict s = checkpoint::any_dict();
        if (it->contains("step")) {
          const double step = (*it)["step"].get<double>();
          s.insert("step", writer.lazy_tensor(at::kFloat, {}, [step] { return at::scalar_tensor(step, at::kFloat); }));
        }
        for (const json& t : it->value("tensors", json::array())) {
          const std::string tensor = t.get<std::string>();
          s.insert(tensor, lazy_stored(writer, reader, reader.tensor_of(key, name + "." + tensor)));
        }
        per_param.insert(index, s);
      }
      ++index;
    }
  }
  c10::impl::GenericDict out = checkpoint::any_dict();
  out.insert("state", per_param);
  out.insert("param_groups", groups);
  return out;
}

}  // namespace

c10::IValue json_to_ivalue(const json& value) {
  switch (value.type()) {
    case json::value_t::null: return c10::IValue();
    case json::value_t::boolean: return value.get<bool>();
    case json::value_t::number_integer: return value.get<int64_t>();
    case json::value_t::number_unsigned: {
      const uint64_t v = value.get<uint64_t>();
      if (v <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return static_cast<int64_t>(v);
      return static_cast<double>(v);
    }
    case json::value_t::number_float: return value.get<double>();
    case json::value_t::string: return value.get<std::string>();
    case json::value_t::array: {
      c10::impl::GenericList list = checkpoint::any_list();
      for (const json& item : value) list.push_back(json_to_ivalue(item));
      return list;
    }
    case json::value_t::object: {
      c10::impl::GenericDict dict = checkpoint::any_dict();
      for (auto it = value.begin(); it != value.end(); ++it) dict.insert(it.key(), json_to_ivalue(it.value()));
      return dict;
    }
    default: return c10::IValue();
  }
}

void export_lightning_checkpoint(const StateReader& reader, const std::string& out,
                                 const LightningExportOptions& options) {
  validate_trainer_entry(reader.entries(), reader.path());
  const json* trainer = trainer_value(reader);
  const std::vector<std::string> names = reader.names_under(options.module_key);
  STRATA_CHECK(!names.empty(), ConfigError, "[ckpt] ", reader.path(), " has no tensors under the module entry '",
               options.module_key, "'");
  TorchFileWriter writer;

  c10::impl::GenericDict state_dict = checkpoint::any_dict();
  std::map<std::string, at::Tensor> placeholders;
  for (const std::string& name : names) {
    at::Tensor t = lazy_stored(writer, reader, reader.tensor_of(options.module_key, name));
    placeholders[name] = t;
    state_dict.insert(name, t);
  }
  for (const auto& [alias, stored] : options.aliases) {
    auto it = placeholders.find(stored);
    STRATA_CHECK(it != placeholders.end(), ConfigError, "[ckpt] ", reader.path(), ": '", stored,
                 "' (the tensor behind '", alias, "') is not in the module entry '", options.module_key, "'");
    if (!state_dict.contains(alias)) state_dict.insert(alias, it->second);
  }

  // optimizer_0, optimizer_1, ...: the order of configure_optimizers.
  std::vector<std::pair<int64_t, std::string>> optimizers;
  for (auto it = reader.entries().begin(); it != reader.entries().end(); ++it) {
    const std::string& key = it.key();
    if (it->value("kind", "") != "optimizer") continue;
    const std::string digits = key.rfind("optimizer_", 0) == 0 ? key.substr(10) : "";
    const bool numbered =
        !digits.empty() && digits.size() <= 9 && digits.find_first_not_of("0123456789") == std::string::npos;
    optimizers.emplace_back(numbered ? std::stoll(digits) : std::numeric_limits<int64_t>::max(), key);
  }
  std::sort(optimizers.begin(), optimizers.end());
  c10::impl::GenericList optimizer_states = checkpoint::any_list();
  for (const auto& [index, key] : optimizers) optimizer_states.push_back(optimizer_state(writer, reader, key));

  auto field = [&](const char* name, const json& fallback) {
    return trainer ? trainer->value(name, fallback) : fallback;
  };
  c10::impl::GenericDict ckpt = checkpoint::any_dict();
  ckpt.insert("epoch", json_to_ivalue(field("epoch", 0)));
  ckpt.insert("global_step", json_to_ivalue(field("global_step", 0)));
  ckpt.insert("pytorch-lightning_version", std::string(kLightningLayoutVersion));
  ckpt.insert("state_dict", state_dict);
  ckpt.insert("callbacks", json_to_ivalue(field("callbacks", json::object())));
  ckpt.insert("optimizer_states", optimizer_states);
  ckpt.insert("lr_schedulers", json_to_ivalue(field("lr_schedulers", json::array())));
  ckpt.insert("hyper_parameters", json_to_ivalue(field("hparams", json::object())));
  writer.write(out, ckpt, options.on_progress);
}

}  // namespace strata::trainer
