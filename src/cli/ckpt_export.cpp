// `strata ckpt export`: a checkpoint's model as model.safetensors and
// config.json, or as one Lightning checkpoint file (Note [What export
// checks]).
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "cli/ckpt.h"
#include "strata/checkpoint/atomic.h"
#include "strata/checkpoint/convert.h"
#include "strata/checkpoint/single_file.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/core/error.h"
#include "strata/core/strings.h"
#include "strata/models/gpt.h"
#include "strata/runtime/progress_line.h"
#include "strata/strategies/strategy.h"
#include "strata/trainer/lightning_checkpoint.h"

namespace strata::cli::ckpt_cmd {
namespace {

using checkpoint::StateReader;

std::string preset_list() {
  std::string names;
  for (const std::string& n : models::GPTConfig::preset_names()) names += (names.empty() ? "" : ", ") + n;
  return names;
}

// True when the checkpoint keeps its GPT configuration (export_config).
bool has_saved_config(const StateReader& reader) {
  const nlohmann::json& entries = reader.entries();
  if (entries.contains("model_config") && entries["model_config"].value("kind", "") == "value") return true;
  if (!entries.contains("trainer") || entries["trainer"].value("kind", "") != "value") return false;
  const nlohmann::json& value = entries["trainer"].value("value", nlohmann::json());
  return value.is_object() && value.contains("module_extra") && value["module_extra"].is_object() &&
         value["module_extra"].contains("model_config");
}

// The GPT configuration of the checkpoint: its "model_config" entry, or the
// preset named by --model-size for checkpoints saved before it existed.
models::GPTConfig export_config(const StateReader& reader, const CkptConfig& c) {
  const nlohmann::json& entries = reader.entries();
  // A Fabric job's value entry, or the Trainer's checkpoint dict (the
  // module's own values, "module_extra").
  auto value_of = [&](const char* key) -> const nlohmann::json* {
    if (!entries.contains(key) || entries[key].value("kind", "") != "value") return nullptr;
    return &entries[key]["value"];
  };
  const nlohmann::json* saved = value_of("model_config");
  const nlohmann::json* trainer = value_of("trainer");
  if (!saved && trainer && trainer->is_object() && trainer->contains("module_extra") &&
      (*trainer)["module_extra"].is_object() && (*trainer)["module_extra"].contains("model_config"))
    saved = &(*trainer)["module_extra"]["model_config"];
  if (saved) return models::GPTConfig::from_json(*saved, reader.path() + ": the saved model_config");
  STRATA_CHECK(!c.model_size.empty(), ConfigError, "[ckpt] ", reader.path(),
               " has no 'model_config' entry (saved before strata stored the model's configuration); pass "
               "--model-size with the preset it was trained with (", preset_list(), ")");
  models::GPTConfig config = models::GPTConfig::preset(c.model_size);
  if (const nlohmann::json* size = value_of("model_size"))
    STRATA_CHECK(*size == c.model_size, ConfigError, "[ckpt] ", reader.path(),
                 " holds a ", size->dump(), " model, not --model-size ", c.model_size);
  return config;
}

// The module entry to export, the prefix of the GPT's names inside it
// ("model." in a Trainer checkpoint, whose module holds the GPT as its
// child "model"), and the GPT's configuration when there is one.
struct ExportSource {
  std::string key;
  std::string sub;
  std::optional<models::GPTConfig> config;
};

// Note [What export checks]
// The source was checked when StateReader opened it (metadata, files,
// tensors, optimizer state). With a GPT configuration (saved, or
// --model-size), the module's tensors must be that GPT's, name for name and
// shape for shape, before anything is written. The safetensors export needs
// one; the Lightning export writes any module as it is.
ExportSource export_source(const StateReader& reader, const CkptConfig& c, bool need_config) {
  ExportSource source;
  source.key = c.entry;
  if (source.key.empty()) {
    std::vector<std::string> modules;
    for (const auto& [k, entry] : reader.entries().items())
      if (entry.value("kind", "") == "module") modules.push_back(k);
    source.key = checkpoint::primary_module(modules);
    STRATA_CHECK(!source.key.empty(), ConfigError, "[ckpt] ", reader.path(), " has ", modules.size(),
                 " module entries and none is named 'model'; choose one with --entry");
  }
  if (!need_config && c.model_size.empty() && !has_saved_config(reader)) return source;
  const models::GPTConfig config = export_config(reader, c);
  std::vector<std::string> stored;
  for (const std::string& name : reader.names_under(source.key)) {
    const std::string anchor = "wte.weight";
    if (name.size() >= anchor.size() && name.compare(name.size() - anchor.size(), anchor.size(), anchor) == 0 &&
        (name.size() == anchor.size() || name[name.size() - anchor.size() - 1] == '.'))
      source.sub = name.substr(0, name.size() - anchor.size());
  }
  for (const std::string& name : reader.names_under(source.key))
    if (name.rfind(source.sub, 0) == 0) stored.push_back(name.substr(source.sub.size()));
  {
    // Names and shapes only: the model is built on the meta device.
    torch::NoGradGuard no_grad;
    models::GPT model{nullptr};
    {
      strategies::Scope meta = strategies::meta_device_scope();
      model = models::GPT(config);
    }
    const checkpoint::NamedTensors expected = checkpoint::module_state(*model);
    std::vector<std::string> problems;
    for (const auto& [name, tensor] : expected) {
      const std::string full = reader.tensor_of(source.key, source.sub + name);
      if (!reader.contains(full))
        problems.push_back("missing '" + name + "'");
      else if (reader.shape(full) != tensor.sizes().vec())
        problems.push_back("'" + name + "' has shape " + shape_string(reader.shape(full)) + ", the config gives " +
                           shape_string(tensor.sizes().vec()));
    }
    STRATA_CHECK(problems.empty() && stored.size() == expected.size(), ConfigError,
                 "[ckpt] ", reader.path(), " entry '", source.key, "' does not match its model configuration ",
                 config.to_json().dump(), ": ", problems.empty() ? std::string("other tensors") : problems[0],
                 problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) + " more)" : "");
  }
  source.config = config;
  return source;
}

int run_export_safetensors(const CkptConfig& c) {
  const StateReader reader = StateReader::open(c.path);
  const ExportSource source = export_source(reader, c, /*need_config=*/true);
  const models::GPTConfig& config = *source.config;
  std::error_code ec;
  std::filesystem::create_directories(c.out, ec);
  STRATA_CHECK(!ec, ConfigError, "[ckpt] cannot create ", c.out, ": ", ec.message());
  // PyTorch's state_dict lists a tied head under both names.
  std::vector<std::pair<std::string, std::string>> aliases;
  if (config.tie_weights) aliases.emplace_back("lm_head.weight", "wte.weight");
  const std::string model_file = c.out + "/model.safetensors";
  runtime::ProgressLine line = progress_line("exporting");
  checkpoint::export_module(reader, source.key, model_file, aliases, source.sub, on_progress(line));
  line.finish();
  checkpoint::atomic_write_file(c.out + "/config.json", config.to_json().dump(2) + "\n");
  std::cout << "exported " << reader.path() << " (" << describe(reader) << ") entry '" << source.key << "' to "
            << model_file << " and " << c.out << "/config.json" << std::endl;
  return 0;
}

// Progress as the other conversions' (Note [Conversion progress]).
int run_export_lightning(const CkptConfig& c) {
  const StateReader reader = StateReader::open(c.path);
  const ExportSource source = export_source(reader, c, /*need_config=*/false);
  trainer::LightningExportOptions options;
  options.module_key = source.key;
  // PyTorch's state_dict lists a tied head under both names.
  if (source.config && source.config->tie_weights)
    options.aliases.emplace_back(source.sub + "lm_head.weight", source.sub + "wte.weight");
  uint64_t bytes = 0;
  size_t tensors = 0;
  runtime::ProgressLine line = progress_line("exporting");
  options.on_progress = [&](const checkpoint::TorchFileProgress& p) {
    bytes = p.bytes_total;
    tensors = p.tensors_total;
    line.update({p.tensors_done, p.tensors_total, p.bytes_done, p.bytes_total});
  };
  trainer::export_lightning_checkpoint(reader, c.out, options);
  line.finish();
  std::cout << "exported " << reader.path() << " (" << describe(reader) << ") entry '" << source.key << "' to "
            << c.out << " (Lightning checkpoint, " << tensors << " tensor records, " << human_bytes(bytes) << ")"
            << std::endl;
  return 0;
}

}  // namespace

int run_export(const CkptConfig& c) {
  if (c.format == "lightning") return run_export_lightning(c);
  STRATA_CHECK(c.format == "safetensors", ConfigError, "[ckpt] --format '", c.format,
               "' is not a format; choose safetensors or lightning");
  return run_export_safetensors(c);
}

}  // namespace strata::cli::ckpt_cmd
