// `strata ckpt`: look into and convert checkpoints without a training job.
//   strata ckpt inspect PATH [--json]             layout, entries, every tensor
//   strata ckpt consolidate SHARDED OUT           one full state.safetensors
//   strata ckpt reshard SHARDED OUT --world-size N  shard files for N ranks
//   strata ckpt verify PATH                       every check, every checksum
//   strata ckpt export PATH OUT                   model.safetensors + config.json
//   strata ckpt export PATH OUT.ckpt --format lightning   one Lightning checkpoint file
// The work is done by strata::checkpoint (StateReader,
// consolidate_checkpoint, reshard_checkpoint), streaming one tensor at a
// time; this file parses flags and prints.
#include "cli/commands.h"

#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "strata/checkpoint/atomic.h"
#include "strata/checkpoint/convert.h"
#include "strata/checkpoint/sharded.h"
#include "strata/checkpoint/single_file.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/core/error.h"
#include "strata/core/strings.h"
#include "strata/models/gpt.h"
#include "strata/runtime/progress_line.h"
#include "strata/strategies/strategy.h"
#include "strata/trainer/lightning_checkpoint.h"
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
  std::string format = "safetensors";  // export: safetensors (a folder) or lightning (one file)
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

// Note [Inspect output is bounded]
// A checkpoint is hostile input: StateReader::open and
// validate_trainer_entry have checked its structure, but a value may still
// be large (a list of a million numbers, a string of a megabyte, deep
// nesting up to the JSON parser's limit) or carry control characters. The
// summary and the readable values print at most kMaxListItems items of a
// list, kMaxObjectKeys keys of an object, kMaxDepth levels and kMaxText
// characters of a string or key, each elision saying how much was left out,
// and replace control characters, so the output stays a screenful however
// the file was made.
constexpr size_t kMaxListItems = 8;
constexpr size_t kMaxObjectKeys = 40;
constexpr int kMaxDepth = 8;
constexpr size_t kMaxText = 120;
constexpr size_t kMaxModuleRows = 24;  // sub-modules listed per module entry

// `text` with control characters replaced by '?' and cut at kMaxText.
std::string printable(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < kMaxText; ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    out += (c < 0x20 || c == 0x7f) ? '?' : static_cast<char>(c);
  }
  if (text.size() > kMaxText) out += "... (" + std::to_string(text.size()) + " characters)";
  return out;
}

// A scalar as JSON writes it (strings quoted and escaped), cut at kMaxText.
std::string scalar_text(const nlohmann::json& value) {
  if (value.is_string()) return printable(nlohmann::json(value.get<std::string>()).dump());
  return value.dump();
}

bool is_scalar(const nlohmann::json& value) { return !value.is_object() && !value.is_array(); }

// Prints `value` readably, one key per line, nested values indented under
// their key; short lists of scalars on one line. Bounded (Note [Inspect
// output is bounded]).
void print_value(std::ostream& out, const nlohmann::json& value, const std::string& indent, int depth) {
  if (value.is_object()) {
    if (depth >= kMaxDepth) {
      out << indent << "... (an object of " << value.size() << " keys)\n";
      return;
    }
    size_t shown = 0;
    for (const auto& [key, item] : value.items()) {
      if (shown++ == kMaxObjectKeys) {
        out << indent << "... (" << value.size() - kMaxObjectKeys << " more keys)\n";
        break;
      }
      out << indent << printable(key) << ":";
      if (is_scalar(item))
        out << " " << scalar_text(item) << "\n";
      else if (item.empty())
        out << " " << (item.is_object() ? "{}" : "[]") << "\n";
      else if (item.is_array() && std::all_of(item.begin(), item.end(), is_scalar) && item.size() <= kMaxListItems)
        out << " " << [&] {
          std::string line = "[";
          for (size_t i = 0; i < item.size(); ++i) line += (i ? ", " : "") + scalar_text(item[i]);
          return line + "]";
        }() << "\n";
      else {
        out << "\n";
        print_value(out, item, indent + "  ", depth + 1);
      }
    }
    return;
  }
  if (value.is_array()) {
    if (depth >= kMaxDepth) {
      out << indent << "... (a list of " << value.size() << " items)\n";
      return;
    }
    if (std::all_of(value.begin(), value.end(), is_scalar)) {
      std::string line = "[";
      for (size_t i = 0; i < value.size() && i < kMaxListItems; ++i) line += (i ? ", " : "") + scalar_text(value[i]);
      if (value.size() > kMaxListItems)
        line += ", ... (" + std::to_string(value.size()) + " items)";
      out << indent << line << "]\n";
      return;
    }
    for (size_t i = 0; i < value.size(); ++i) {
      if (i == kMaxListItems) {
        out << indent << "... (" << value.size() - kMaxListItems << " more items, " << value.size() << " in all)\n";
        break;
      }
      out << indent << "- [" << i << "]";
      if (is_scalar(value[i])) {
        out << " " << scalar_text(value[i]) << "\n";
      } else {
        out << "\n";
        print_value(out, value[i], indent + "  ", depth + 1);
      }
    }
    return;
  }
  out << indent << scalar_text(value) << "\n";
}

// One row of the summary's table: tensors, elements and bytes of a group.
struct GroupSize {
  std::string name;
  int64_t tensors = 0;
  uint64_t elements = 0;
  uint64_t bytes = 0;
};

uint64_t tensor_elements(const StateReader& reader, const std::string& name) {
  uint64_t n = 1;
  for (int64_t d : reader.shape(name)) n *= static_cast<uint64_t>(d);  // the reader checked the sizes
  return n;
}

// The tensors grouped by the first component of their stored name (the
// entry: "model/wte.weight" is "model"; a one-file checkpoint's model
// tensors, stored without a prefix, are its primary module's), in
// first-seen order.
std::vector<GroupSize> entry_groups(const StateReader& reader) {
  std::string primary = "model";
  if (reader.single_file()) {
    std::vector<std::string> modules;
    for (const auto& [key, entry] : reader.entries().items())
      if (entry.is_object() && entry.value("kind", "") == "module") modules.push_back(key);
    if (!checkpoint::primary_module(modules).empty()) primary = checkpoint::primary_module(modules);
  }
  std::vector<GroupSize> groups;
  std::map<std::string, size_t> index;
  for (const std::string& name : reader.tensor_names()) {
    const size_t slash = name.find('/');
    const std::string group = slash == std::string::npos ? (reader.single_file() ? primary : name) : name.substr(0, slash);
    auto [it, added] = index.emplace(group, groups.size());
    if (added) groups.push_back({group});
    GroupSize& g = groups[it->second];
    g.tensors += 1;
    g.elements += tensor_elements(reader, name);
    g.bytes += tensor_bytes(reader, name);
  }
  return groups;
}

// A module entry's tensors grouped by their top-level sub-module (the first
// dotted component: "wte", "h", "ln_f"); a module that wraps one child (a
// Trainer's module holding its GPT as "model") is looked through, so the
// rows are the GPT's ("model.wte", "model.h", ...).
std::vector<GroupSize> module_groups(const StateReader& reader, const std::string& key) {
  const std::vector<std::string> names = reader.names_under(key);
  auto first = [](const std::string& n) { return n.substr(0, n.find('.')); };
  std::string wrapper;
  if (!names.empty() && names[0].find('.') != std::string::npos) {
    wrapper = first(names[0]) + ".";
    for (const std::string& n : names)
      if (n.rfind(wrapper, 0) != 0 || n.size() == wrapper.size()) wrapper.clear();
  }
  std::vector<GroupSize> groups;
  std::map<std::string, size_t> index;
  for (const std::string& n : names) {
    const std::string group = wrapper + first(n.substr(wrapper.size()));
    auto [it, added] = index.emplace(group, groups.size());
    if (added) groups.push_back({group});
    const std::string stored = reader.tensor_of(key, n);
    GroupSize& g = groups[it->second];
    g.tensors += 1;
    g.elements += tensor_elements(reader, stored);
    g.bytes += tensor_bytes(reader, stored);
  }
  return groups;
}

// The Trainer state of a Trainer checkpoint (validated), or null.
const nlohmann::json* trainer_state(const StateReader& reader) {
  const nlohmann::json& entries = reader.entries();
  auto it = entries.find("trainer");
  if (it == entries.end() || !it->is_object() || it->value("kind", "") != "value") return nullptr;
  auto v = it->find("value");
  if (v == it->end() || !v->is_object() || !v->contains("format")) return nullptr;
  return &*v;
}

// A count named `key`: the Trainer state's field, else a value entry of
// that name (a Fabric job's "step"); null when neither holds an integer.
nlohmann::json count_of(const StateReader& reader, const char* trainer_key, const char* entry_key) {
  if (const nlohmann::json* t = trainer_state(reader))
    if (t->contains(trainer_key) && (*t)[trainer_key].is_number_integer()) return (*t)[trainer_key];
  const nlohmann::json& entries = reader.entries();
  auto it = entries.find(entry_key);
  if (it != entries.end() && it->is_object() && it->value("kind", "") == "value" && it->contains("value") &&
      (*it)["value"].is_number_integer())
    return (*it)["value"];
  return nullptr;
}

nlohmann::json summary_json(const StateReader& reader) {
  const nlohmann::json& meta = reader.metadata();
  nlohmann::json modules = nlohmann::json::array();
  for (const GroupSize& g : entry_groups(reader)) {
    nlohmann::json row = {{"name", g.name}, {"tensors", g.tensors}, {"elements", g.elements}, {"bytes", g.bytes}};
    const nlohmann::json& entries = reader.entries();
    if (entries.contains(g.name) && entries[g.name].is_object() && entries[g.name].value("kind", "") == "module") {
      nlohmann::json children = nlohmann::json::array();
      for (const GroupSize& c : module_groups(reader, g.name))
        children.push_back({{"name", c.name}, {"tensors", c.tensors}, {"elements", c.elements}, {"bytes", c.bytes}});
      row["modules"] = children;
    }
    modules.push_back(row);
  }
  return {{"kind", reader.sharded() ? "sharded" : "full"},
          {"strategy", meta.value("strategy", nlohmann::json())},
          {"step", count_of(reader, "global_step", "step")},
          {"epoch", count_of(reader, "epoch", "epoch")},
          {"world_size", reader.world_size()},
          {"groups", modules}};
}

// The summary's table: one row per group, right-aligned numbers.
void print_groups(std::ostream& out, const nlohmann::json& groups) {
  std::vector<std::vector<std::string>> rows = {{"", "tensors", "parameters", "bytes"}};
  for (const auto& g : groups) {
    rows.push_back({printable(g["name"].get<std::string>()), std::to_string(g["tensors"].get<int64_t>()),
                    std::to_string(g["elements"].get<uint64_t>()), human_bytes(g["bytes"].get<uint64_t>())});
    if (!g.contains("modules")) continue;
    const nlohmann::json& children = g["modules"];
    for (size_t i = 0; i < children.size() && i < kMaxModuleRows; ++i)
      rows.push_back({"  " + printable(children[i]["name"].get<std::string>()),
                      std::to_string(children[i]["tensors"].get<int64_t>()),
                      std::to_string(children[i]["elements"].get<uint64_t>()),
                      human_bytes(children[i]["bytes"].get<uint64_t>())});
    if (children.size() > kMaxModuleRows)
      rows.push_back({"  ... (" + std::to_string(children.size() - kMaxModuleRows) + " more)", "", "", ""});
  }
  std::vector<size_t> width(4, 0);
  for (const auto& row : rows)
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  for (const auto& row : rows) {
    std::string line = "    " + row[0] + std::string(width[0] - row[0].size(), ' ');
    for (size_t i = 1; i < row.size(); ++i) line += "  " + std::string(width[i] - row[i].size(), ' ') + row[i];
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out << line << "\n";
  }
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
  out["summary"] = summary_json(reader);
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
  // The summary first (Note [Inspect output is bounded]).
  const nlohmann::json& summary = info["summary"];
  auto count = [](const nlohmann::json& v) { return v.is_null() ? std::string("-") : v.dump(); };
  std::cout << "checkpoint  " << printable(reader.path()) << "\n"
            << "summary:\n"
            << "  kind        " << summary["kind"].get<std::string>() << ", strategy "
            << (summary["strategy"].is_string() ? printable(summary["strategy"].get<std::string>()) : "-") << "\n"
            << "  step        " << count(summary["step"]) << "\n"
            << "  epoch       " << count(summary["epoch"]) << "\n"
            << "  world size  " << reader.world_size() << "\n"
            << "  by entry and module:\n";
  print_groups(std::cout, summary["groups"]);
  std::cout << "layout      " << info["layout"].get<std::string>();
  if (reader.sharded()) std::cout << " (" << reader.world_size() << " rank files)";
  std::cout << "\n"
            << "world size  " << reader.world_size() << "\n"
            << "strategy    " << printable(meta.value("strategy", "-")) << "\n"
            << "format      " << printable(meta.value("format", "-")) << " version "
            << meta.value("version", 0) << "\n";
  if (meta.contains("consolidated_from"))
    std::cout << "converted   consolidated from world size " << meta["consolidated_from"].dump() << "\n";
  if (meta.contains("resharded_from"))
    std::cout << "converted   resharded from world size " << meta["resharded_from"].dump() << "\n";

  // Entries one a line; a structured value (the Trainer state) key by key
  // under its entry instead of one long JSON line.
  std::cout << "entries:\n";
  size_t key_width = 0;
  for (const auto& [key, entry] : reader.entries().items()) key_width = std::max(key_width, printable(key).size());
  for (const auto& [key, entry] : reader.entries().items()) {
    const std::string name = printable(key);
    const bool structured = entry.is_object() && entry.value("kind", "") == "value" && entry.contains("value") &&
                            !is_scalar(entry["value"]) && !entry["value"].empty();
    std::cout << "  " << name << std::string(key_width - name.size() + 2, ' ')
              << (structured ? std::string(entry["value"].is_object() ? "value:" : "value (a list):")
                             : printable(entry_text(entry)))
              << "\n";
    if (structured) print_value(std::cout, entry["value"], "    ", 0);
  }
  if (reader.entries().empty()) std::cout << "  (none)\n";

  // The tensor table, columns padded to their widest cell.
  std::vector<std::vector<std::string>> rows = {{"name", "shape", "dtype", "storage", "bytes"}};
  for (const auto& t : info["tensors"])
    rows.push_back({printable(t["name"].get<std::string>()), shape_string(t["shape"].get<std::vector<int64_t>>()),
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

// Note [Conversion progress]
// consolidate, reshard and export stream one tensor at a time and may take
// minutes on a large checkpoint: a progress line (tensors and bytes done of
// the total, rate, ETA; runtime::ProgressLine) is redrawn in place when
// stdout is a terminal, and otherwise printed every kProgressSeconds, none
// for a conversion quicker than that. Each file written is reported on a
// line of its own.
constexpr int kProgressSeconds = 5;

runtime::ProgressLine progress_line(const char* label) {
  return runtime::ProgressLine(std::cout, label, "tensors", runtime::ProgressLine::is_terminal(STDOUT_FILENO),
                               std::chrono::seconds(kProgressSeconds));
}

checkpoint::OnConvertProgress on_progress(runtime::ProgressLine& line) {
  return [&line](const checkpoint::ConvertProgress& p) {
    line.update({p.tensors_done, p.tensors_total, p.bytes_done, p.bytes_total});
  };
}

// Prints one line per file written, above the progress line.
checkpoint::OnFileWritten progress(const std::string& out, runtime::ProgressLine& line) {
  return [out, &line](const checkpoint::WrittenFile& file) {
    line.clear();
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
  runtime::ProgressLine line = progress_line("consolidating");
  checkpoint::consolidate_checkpoint(source, c.out, progress(c.out, line), on_progress(line));
  line.finish();
  std::cout << "consolidated " << source.path() << " (" << describe(source) << ") into " << c.out
            << " (full)" << std::endl;
  return 0;
}

int run_reshard(const CkptConfig& c) {
  STRATA_CHECK(c.world_size >= 1, ConfigError, "[ckpt] --world-size must be at least 1, got ",
               c.world_size);
  const StateReader source = StateReader::open(c.path);
  runtime::ProgressLine line = progress_line("resharding");
  checkpoint::reshard_checkpoint(source, c.out, c.world_size, progress(c.out, line), on_progress(line));
  line.finish();
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

int run_export(const CkptConfig& c) {
  if (c.format == "lightning") return run_export_lightning(c);
  STRATA_CHECK(c.format == "safetensors", ConfigError, "[ckpt] --format '", c.format,
               "' is not a format; choose safetensors or lightning");
  return run_export_safetensors(c);
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
        "Print a summary (kind, strategy, step, epoch, world size, tensors, parameters\n"
        "and bytes by entry and top-level module), then the layout, format\n"
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
        "With --format lightning, OUT is one file in Lightning's checkpoint layout that\n"
        "torch.load(OUT, weights_only=True) reads and LightningModule.load_from_checkpoint\n"
        "loads: state_dict (the module's tensors), epoch, global_step, optimizer_states,\n"
        "lr_schedulers, callbacks, hyper_parameters, pytorch-lightning_version.\n"
        "Examples: strata ckpt export ckpt/step-00000300 exported\n"
        "          strata ckpt export ckpt/step-00000300 step300.ckpt --format lightning");
    c.export_->add_option("path", c.path, "Checkpoint to read")->required();
    c.export_->add_option("out", c.out,
                          "Folder to write model.safetensors and config.json into (--format lightning: the file)")
        ->required();
    c.export_->add_option("--format", c.format, "safetensors (default: a folder) or lightning (one .ckpt file)")
        ->check(CLI::IsMember({"safetensors", "lightning"}));
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
