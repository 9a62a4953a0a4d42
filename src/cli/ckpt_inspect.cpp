// `strata ckpt inspect`: a checkpoint's summary, entries and tensors, as
// text or JSON, bounded however the file was made (Note [Inspect output is
// bounded]).
#include <nlohmann/json.hpp>

#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "cli/ckpt.h"
#include "strata/checkpoint/single_file.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/core/strings.h"
#include "strata/trainer/trainer_state.h"

namespace strata::cli::ckpt_cmd {
namespace {

using checkpoint::StateReader;

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

// The summary, then the layout and metadata (Note [Inspect output is
// bounded]).
void print_summary(const StateReader& reader, const nlohmann::json& info) {
  const nlohmann::json& meta = reader.metadata();
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
}

// Entries one a line; a structured value (the Trainer state) key by key
// under its entry instead of one long JSON line.
void print_entries(const StateReader& reader) {
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
}

// The tensor table, columns padded to their widest cell, and the totals.
void print_tensors(const nlohmann::json& info) {
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
}

}  // namespace

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
  print_summary(reader, info);
  print_entries(reader);
  print_tensors(info);
  return 0;
}

}  // namespace strata::cli::ckpt_cmd
