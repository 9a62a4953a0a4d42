// `strata ckpt`: look into and convert checkpoints without a training job.
//   strata ckpt inspect PATH [--json]             layout, entries, every tensor
//   strata ckpt consolidate SHARDED OUT           one full state.safetensors
//   strata ckpt reshard SHARDED OUT --world-size N  shard files for N ranks
//   strata ckpt verify PATH                       every check, every checksum
//   strata ckpt export PATH OUT                   model.safetensors + config.json
// The work is done by strata::checkpoint (StateReader,
// consolidate_checkpoint, reshard_checkpoint), streaming one tensor at a
// time; this file parses flags and prints.
#include "cli/commands.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "strata/checkpoint/atomic.h"
#include "strata/checkpoint/sharded.h"
#include "strata/checkpoint/single_file.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/core/error.h"
#include "strata/core/strings.h"
#include "strata/models/gpt.h"
#include "strata/strategies/strategy.h"
#include "strata/trainer/trainer_state.h"

namespace strata::cli {
namespace {

using checkpoint::StateReader;

/// What `strata ckpt` was asked to do, as parsed.
struct CkptConfig {
  std::string path;  // inspect: the checkpoint; consolidate/reshard: the source
  std::string out;
  bool json = false;
  int world_size = 0;
  CLI::App* inspect = nullptr;
  CLI::App* consolidate = nullptr;
  CLI::App* reshard = nullptr;
  CLI::App* verify = nullptr;
  CLI::App* export_ = nullptr;
  std::string entry;       // export: the module entry ("" = "model" or the only one)
  std::string model_size;  // export: preset for checkpoints saved without model_config
};

uint64_t tensor_bytes(const StateReader& reader, const std::string& name) {
  return checkpoint::TensorSpec{name, reader.dtype(name), reader.shape(name)}.nbytes();
}

// One line describing a state entry: its kind, and the value for values.
std::string entry_text(const nlohmann::json& entry) {
  if (!entry.is_object()) return entry.dump();
  const std::string kind = entry.value("kind", "?");
  if (kind == "value" && entry.contains("value")) return "value " + entry["value"].dump();
  if (kind == "optimizer" && entry.contains("state") && entry["state"].is_object() &&
      entry["state"].contains("type"))
    return "optimizer (" + (entry["state"]["type"].is_string() ? entry["state"]["type"].get<std::string>()
                                                                : entry["state"]["type"].dump()) + ")";
  return kind;
}

nlohmann::json inspect_json(const StateReader& reader) {
  const nlohmann::json& meta = reader.metadata();
  nlohmann::json out = {{"path", reader.path()},
                        {"layout", reader.sharded() ? "sharded" : reader.single_file() ? "file" : "full"},
                        {"world_size", reader.world_size()},
                        {"strategy", meta.value("strategy", nlohmann::json())},
                        {"format", meta.value("format", nlohmann::json())},
                        {"version", meta.value("version", nlohmann::json())},
                        {"files", meta.value("files", nlohmann::json::array())}};
  nlohmann::json entries = nlohmann::json::object();
  for (const auto& [key, entry] : reader.entries().items()) {
    nlohmann::json e = {{"kind", entry.is_object() ? entry.value("kind", "") : ""}};
    if (entry.is_object() && entry.contains("value")) e["value"] = entry["value"];
    if (entry.is_object() && entry.contains("state") && entry["state"].is_object() &&
        entry["state"].contains("type"))
      e["type"] = entry["state"]["type"];
    entries[key] = e;
  }
  out["entries"] = entries;
  nlohmann::json tensors = nlohmann::json::array();
  uint64_t total = 0;
  int64_t sharded = 0;
  for (const std::string& name : reader.tensor_names()) {
    const uint64_t bytes = tensor_bytes(reader, name);
    total += bytes;
    sharded += reader.is_sharded(name) ? 1 : 0;
    tensors.push_back({{"name", name},
                       {"shape", reader.shape(name)},
                       {"dtype", checkpoint::dtype_name(reader.dtype(name))},
                       {"sharded", reader.is_sharded(name)},
                       {"bytes", bytes}});
  }
  out["tensors"] = tensors;
  out["totals"] = {{"tensors", tensors.size()},
                   {"sharded", sharded},
                   {"whole", static_cast<int64_t>(tensors.size()) - sharded},
                   {"bytes", total}};
  return out;
}

// Note [The Trainer state in inspect and verify]
// A Trainer checkpoint's "trainer" value is checked field by field
// (trainer::validate_trainer_entry, the validator Trainer::restore runs),
// so inspect and verify refuse a state that resuming would refuse for its
// own sake: a count out of range, a field of the wrong type, a missing or
// renamed field, a ModelCheckpoint path outside its folder. What needs the
// run (batches_done against the data's batch count) is checked at resume.
int run_inspect(const CkptConfig& c) {
  const StateReader reader = StateReader::open(c.path);
  trainer::validate_trainer_entry(reader.entries(), reader.path());
  const nlohmann::json info = inspect_json(reader);
  if (c.json) {
    std::cout << info.dump(2) << "\n";
    return 0;
  }
  const nlohmann::json& meta = reader.metadata();
  std::cout << "checkpoint  " << reader.path() << "\n"
            << "layout      " << info["layout"].get<std::string>();
  if (reader.sharded()) std::cout << " (" << reader.world_size() << " rank files)";
  std::cout << "\n"
            << "world size  " << reader.world_size() << "\n"
            << "strategy    " << meta.value("strategy", "-") << "\n"
            << "format      " << meta.value("format", "-") << " version "
            << meta.value("version", 0) << "\n";
  if (meta.contains("consolidated_from"))
    std::cout << "converted   consolidated from world size " << meta["consolidated_from"].dump() << "\n";
  if (meta.contains("resharded_from"))
    std::cout << "converted   resharded from world size " << meta["resharded_from"].dump() << "\n";

  std::cout << "entries:\n";
  size_t key_width = 0;
  for (const auto& [key, entry] : reader.entries().items()) key_width = std::max(key_width, key.size());
  for (const auto& [key, entry] : reader.entries().items())
    std::cout << "  " << key << std::string(key_width - key.size() + 2, ' ') << entry_text(entry) << "\n";
  if (reader.entries().empty()) std::cout << "  (none)\n";

  // The tensor table, columns padded to their widest cell.
  std::vector<std::vector<std::string>> rows = {{"name", "shape", "dtype", "storage", "bytes"}};
  for (const auto& t : info["tensors"])
    rows.push_back({t["name"].get<std::string>(), shape_string(t["shape"].get<std::vector<int64_t>>()),
                    t["dtype"].get<std::string>(), t["sharded"].get<bool>() ? "sharded" : "whole",
                    std::to_string(t["bytes"].get<uint64_t>())});
  std::vector<size_t> width(5, 0);
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  std::cout << "tensors:\n";
  for (const auto& row : rows) {
    std::string line = "  ";
    for (size_t i = 0; i < row.size(); ++i) {
      if (i == 4)  // bytes: right-aligned
        line += std::string(width[i] - row[i].size(), ' ') + row[i];
      else
        line += row[i] + std::string(width[i] - row[i].size() + 2, ' ');
    }
    std::cout << line << "\n";
  }
  const nlohmann::json& totals = info["totals"];
  std::cout << "total: " << totals["tensors"].get<int64_t>() << " tensors ("
            << totals["sharded"].get<int64_t>() << " sharded, " << totals["whole"].get<int64_t>()
            << " whole), " << totals["bytes"].get<uint64_t>() << " bytes ("
            << human_bytes(totals["bytes"].get<uint64_t>()) << ")\n";
  return 0;
}

// Prints one line per file written (the conversions may take a while).
checkpoint::OnFileWritten progress(const std::string& out) {
  return [out](const checkpoint::WrittenFile& file) {
    std::cout << "wrote " << out << "/" << file.name << " (" << file.tensors << " tensors, "
              << human_bytes(file.bytes) << ")" << std::endl;
  };
}

std::string describe(const StateReader& reader) {
  return std::string(reader.sharded() ? "sharded" : reader.single_file() ? "one file" : "full") + ", world size " +
         std::to_string(reader.world_size());
}

int run_consolidate(const CkptConfig& c) {
  const StateReader source = StateReader::open(c.path);
  checkpoint::consolidate_checkpoint(source, c.out, progress(c.out));
  std::cout << "consolidated " << source.path() << " (" << describe(source) << ") into " << c.out
            << " (full)" << std::endl;
  return 0;
}

int run_reshard(const CkptConfig& c) {
  STRATA_CHECK(c.world_size >= 1, ConfigError, "[ckpt] --world-size must be at least 1, got ",
               c.world_size);
  const StateReader source = StateReader::open(c.path);
  checkpoint::reshard_checkpoint(source, c.out, c.world_size, progress(c.out));
  std::cout << "resharded " << source.path() << " (" << describe(source) << ") into " << c.out
            << " (sharded, world size " << c.world_size << ")" << std::endl;
  return 0;
}

int run_verify(const CkptConfig& c) {
  const StateReader reader = StateReader::open(c.path);
  trainer::validate_trainer_entry(reader.entries(), reader.path());  // Note [The Trainer state in inspect and verify]
  const size_t checked = reader.verify_checksums();
  size_t tensors = 0;
  for (const auto& file : reader.files()) tensors += file.keys().size();
  if (checked == 0 && tensors > 0) {
    std::cout << "verified " << reader.path() << " (" << describe(reader) << "): structure and metadata "
              << "checked; it has no checksums (written before strata stored them), so the tensor "
              << "data cannot be verified" << std::endl;
    return 0;
  }
  std::cout << "verified " << reader.path() << " (" << describe(reader) << "): " << reader.files().size()
            << " files, " << checked << " tensors, every checksum matches" << std::endl;
  return 0;
}


std::string preset_list() {
  std::string names;
  for (const std::string& n : models::GPTConfig::preset_names()) names += (names.empty() ? "" : ", ") + n;
  return names;
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

int run_export(const CkptConfig& c) {
  const StateReader reader = StateReader::open(c.path);
  std::string key = c.entry;
  if (key.empty()) {
    std::vector<std::string> modules;
    for (const auto& [k, entry] : reader.entries().items())
      if (entry.value("kind", "") == "module") modules.push_back(k);
    key = checkpoint::primary_module(modules);
    STRATA_CHECK(!key.empty(), ConfigError, "[ckpt] ", reader.path(), " has ", modules.size(),
                 " module entries and none is named 'model'; choose one with --entry");
  }
  models::GPTConfig config = export_config(reader, c);
  // The GPT may sit inside the saved module (a Trainer's module holds it as
  // a child, "model.wte.weight"): its names then share that prefix.
  std::string sub;
  std::vector<std::string> stored;
  for (const std::string& name : reader.names_under(key)) {
    const std::string anchor = "wte.weight";
    if (name.size() >= anchor.size() && name.compare(name.size() - anchor.size(), anchor.size(), anchor) == 0 &&
        (name.size() == anchor.size() || name[name.size() - anchor.size() - 1] == '.'))
      sub = name.substr(0, name.size() - anchor.size());
  }
  for (const std::string& name : reader.names_under(key))
    if (name.rfind(sub, 0) == 0) stored.push_back(name.substr(sub.size()));
  // The checkpoint's tensors must be this configuration's, name for name
  // and shape for shape, before anything is written.
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
      const std::string full = reader.tensor_of(key, sub + name);
      if (!reader.contains(full))
        problems.push_back("missing '" + name + "'");
      else if (reader.shape(full) != tensor.sizes().vec())
        problems.push_back("'" + name + "' has shape " + shape_string(reader.shape(full)) + ", the config gives " +
                           shape_string(tensor.sizes().vec()));
    }
    STRATA_CHECK(problems.empty() && stored.size() == expected.size(), ConfigError,
                 "[ckpt] ", reader.path(), " entry '", key, "' does not match its model configuration ",
                 config.to_json().dump(), ": ", problems.empty() ? std::string("other tensors") : problems[0],
                 problems.size() > 1 ? " (and " + std::to_string(problems.size() - 1) + " more)" : "");
  }
  std::error_code ec;
  std::filesystem::create_directories(c.out, ec);
  STRATA_CHECK(!ec, ConfigError, "[ckpt] cannot create ", c.out, ": ", ec.message());
  // PyTorch's state_dict lists a tied head under both names.
  std::vector<std::pair<std::string, std::string>> aliases;
  if (config.tie_weights) aliases.emplace_back("lm_head.weight", "wte.weight");
  const std::string model_file = c.out + "/model.safetensors";
  checkpoint::export_module(reader, key, model_file, aliases, sub);
  checkpoint::atomic_write_file(c.out + "/config.json", config.to_json().dump(2) + "\n");
  std::cout << "exported " << reader.path() << " (" << describe(reader) << ") entry '" << key << "' to " << model_file
            << " and " << c.out << "/config.json" << std::endl;
  return 0;
}

}  // namespace

Command make_ckpt_command() {
  auto config = std::make_shared<CkptConfig>();
  Command command;
  command.register_fn = [config](CLI::App& app) {
    CkptConfig& c = *config;
    CLI::App* ckpt = app.add_subcommand(
        "ckpt",
        "Inspect and convert checkpoints (full or sharded) without a training job.\n"
        "Examples:\n"
        "  strata ckpt inspect ckpt/step-00000300\n"
        "  strata ckpt consolidate ckpt/step-00000300 model-full\n"
        "  strata ckpt reshard ckpt/step-00000300 ckpt-4 --world-size 4");
    ckpt->require_subcommand(1);

    c.inspect = ckpt->add_subcommand(
        "inspect",
        "Print a checkpoint's layout (full or sharded), world size, strategy, format\n"
        "version, state entries (values such as the step printed) and every tensor:\n"
        "name, full shape, dtype, sharded or whole, bytes; then totals.\n"
        "Example: strata ckpt inspect ckpt/step-00000300 --json");
    c.inspect->add_option("path", c.path, "Checkpoint directory")->required();
    c.inspect->add_flag("--json", c.json, "Print one JSON object instead of text");

    c.consolidate = ckpt->add_subcommand(
        "consolidate",
        "Write SHARDED (a sharded checkpoint, any world size) as a full checkpoint at\n"
        "OUT: one state.safetensors with every tensor whole, same entries and\n"
        "strategy, loadable by every strategy. One tensor in memory at a time; OUT\n"
        "appears only when complete and must not exist (or be an empty directory).\n"
        "Example: strata ckpt consolidate ckpt/step-00000300 model-full");
    c.consolidate->add_option("sharded", c.path, "Checkpoint to read (sharded or full)")->required();
    c.consolidate->add_option("out", c.out, "New checkpoint directory to write")->required();

    c.reshard = ckpt->add_subcommand(
        "reshard",
        "Write SHARDED (sharded at any world size, or full) as a sharded checkpoint\n"
        "for N ranks at OUT: one shard-RRRRR-of-NNNNN.safetensors per rank. One\n"
        "slice in memory at a time; OUT appears only when complete and must not\n"
        "exist (or be an empty directory).\n"
        "Example: strata ckpt reshard ckpt/step-00000300 ckpt-4 --world-size 4");
    c.reshard->add_option("sharded", c.path, "Checkpoint to read (sharded or full)")->required();
    c.reshard->add_option("out", c.out, "New checkpoint directory to write")->required();
    c.reshard->add_option("--world-size", c.world_size, "Ranks to shard for (at least 1)")->required();

    c.verify = ckpt->add_subcommand(
        "verify",
        "Check a whole checkpoint: the metadata, every file and record, a Trainer\n"
        "checkpoint's state (every field's type and range), and every tensor's\n"
        "bytes against the checksum saved with it. Exit status 1 with an error\n"
        "naming the file and the tensor (or the field) when anything differs.\n"
        "Example: strata ckpt verify ckpt/step-00000300");
    c.verify->add_option("path", c.path, "Checkpoint directory")->required();

    c.export_ = ckpt->add_subcommand(
        "export",
        "Write a checkpoint's model (any layout, any world size) as a plain pair that\n"
        "PyTorch and other tools read without strata: OUT/model.safetensors (every\n"
        "tensor whole, under the model's own names, a tied head under both names)\n"
        "and OUT/config.json (every GPT hyperparameter). docs/checkpoints.md shows\n"
        "how to load it into a PyTorch GPT.\n"
        "Example: strata ckpt export ckpt/step-00000300 exported");
    c.export_->add_option("path", c.path, "Checkpoint to read")->required();
    c.export_->add_option("out", c.out, "Folder to write model.safetensors and config.json into")->required();
    c.export_->add_option("--entry", c.entry, "Module entry to export (default: 'model', or the only module)");
    c.export_->add_option("--model-size", c.model_size,
                          "GPT preset, for checkpoints saved without their model configuration");
    return ckpt;
  };
  command.run = [config] {
    const CkptConfig& c = *config;
    if (c.inspect->parsed()) return run_inspect(c);
    if (c.consolidate->parsed()) return run_consolidate(c);
    if (c.verify->parsed()) return run_verify(c);
    if (c.export_->parsed()) return run_export(c);
    return run_reshard(c);
  };
  return command;
}

}  // namespace strata::cli
