// Conversions between checkpoint layouts and world sizes (`strata ckpt
// consolidate`, `reshard`, `export`; include/strata/checkpoint/sharded.h).
// Each streams: one whole tensor, or one target slice, in memory at a time.
#include <c10/util/accumulate.h>

#include <filesystem>
#include <optional>
#include <system_error>
#include <unordered_map>

#include "strata/checkpoint/convert.h"
#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/sharded.h"
#include "strata/checkpoint/single_file.h"
#include "strata/core/error.h"

namespace strata::checkpoint {
namespace {

namespace fs = std::filesystem;

// Metadata fields a conversion sets itself rather than copying from the source.
const char* const kDerivedFields[] = {"format",     "version",         "files",   "tensors",
                                      "world_size", "state_dict_type", "layout",  "consolidated_from",
                                      "resharded_from"};

// The source's metadata without the fields a conversion derives, and with
// every entry's tensors under their directory-layout names ("<key>/...").
nlohmann::json carried_metadata(const StateReader& source) {
  nlohmann::json out = source.metadata();
  for (const char* field : kDerivedFields) out.erase(field);
  if (out.contains("entries"))
    for (auto& [key, entry] : out["entries"].items()) entry.erase("prefix");
  return out;
}

// Conversions write only to a new place: never over the source, never over
// a user's files or an earlier checkpoint.
void check_new_output(const std::string& out) {
  std::error_code ec;
  if (!fs::exists(fs::symlink_status(out, ec))) return;
  STRATA_CHECK(!is_single_file_path(out), CheckpointError, "[checkpoint] ", out,
               " already exists; choose a new path for the checkpoint");
  STRATA_CHECK(fs::is_directory(out, ec), CheckpointError, "[checkpoint] ", out,
               " already exists and is not a directory; choose a new path for the checkpoint");
  STRATA_CHECK(fs::is_empty(out, ec), CheckpointError, "[checkpoint] ", out,
               " already exists and is not empty; refusing to write over it (choose a new path, "
               "or delete it first)");
}

// One tensor of a source: its stored name, its directory-layout name, and
// the kind of the entry it belongs to ("" when no entry claims it).
struct SourceTensor {
  std::string stored;
  std::string key;
  std::string name;  // within its entry ("" for a tensor entry)
  std::string kind;
  std::string canonical() const { return key.empty() ? stored : (name.empty() ? key : key + "/" + name); }
};

std::vector<SourceTensor> source_tensors(const StateReader& source) {
  std::unordered_map<std::string, SourceTensor> claimed;
  for (const auto& [key, entry] : source.entries().items()) {
    const std::string kind = entry.value("kind", "");
    if (kind == "module" || kind == "optimizer") {
      for (const std::string& name : source.names_under(key))
        claimed[source.tensor_of(key, name)] = {source.tensor_of(key, name), key, name, kind};
    } else if (kind == "tensor") {
      claimed[source.tensor_of(key)] = {source.tensor_of(key), key, "", kind};
    }
  }
  std::vector<SourceTensor> out;
  for (const std::string& stored : source.tensor_names()) {
    auto it = claimed.find(stored);
    out.push_back(it != claimed.end() ? it->second : SourceTensor{stored, "", "", ""});
  }
  return out;
}

// Counts what a conversion has written and reports it (convert.h).
class Progress {
 public:
  Progress(const OnConvertProgress& report, size_t tensors_total, uint64_t bytes_total) : report_(report) {
    count_.tensors_total = tensors_total;
    count_.bytes_total = bytes_total;
  }
  void wrote(uint64_t bytes) {
    count_.tensors_done += 1;
    count_.bytes_done += bytes;
    if (report_) report_(count_);
  }

 private:
  const OnConvertProgress& report_;
  ConvertProgress count_;
};

std::vector<std::string> module_keys(const StateReader& source) {
  std::vector<std::string> keys;
  for (const auto& [key, entry] : source.entries().items())
    if (entry.value("kind", "") == "module") keys.push_back(key);
  return keys;
}

// consolidate_checkpoint into one file (single_file.h).
void consolidate_to_file(const StateReader& source, const std::string& out, const OnFileWritten& on_file,
                         const OnConvertProgress& on_progress) {
  const std::vector<SourceTensor> tensors = source_tensors(source);
  const std::string primary = primary_module(module_keys(source));
  nlohmann::json metadata = carried_metadata(source);
  if (!primary.empty()) metadata["entries"][primary]["prefix"] = "";
  metadata["world_size"] = source.world_size();
  metadata["consolidated_from"] = source.world_size();
  std::vector<TensorSpec> specs;
  WrittenFile written{fs::path(out).filename().string(), tensors.size(), 0};
  for (const SourceTensor& t : tensors) {
    const std::string name = t.key.empty() ? t.stored : entry_tensor_name(t.key, t.name, primary);
    STRATA_CHECK(t.key == primary || t.kind != "tensor" || name.find('/') != std::string::npos ||
                     !source.contains(source.tensor_of(primary, name)),
                 CheckpointError, "[checkpoint] tensor entry '", t.key, "' has the name of a parameter of module '",
                 primary, "'; a one-file checkpoint cannot hold both; write a directory instead");
    specs.push_back(TensorSpec{name, source.dtype(t.stored), source.shape(t.stored)});
    written.bytes += specs.back().nbytes();
  }
  SafetensorsWriter file = begin_checkpoint_file(out, specs, metadata);
  Progress progress(on_progress, tensors.size(), written.bytes);
  for (size_t i = 0; i < tensors.size(); ++i) {
    file.write(specs[i].name, source.full(tensors[i].stored));
    progress.wrote(specs[i].nbytes());
  }
  file.close();
  if (on_file) on_file(written);
}

}  // namespace

void consolidate_checkpoint(const StateReader& source, const std::string& out, const OnFileWritten& on_file) {
  consolidate_checkpoint(source, out, on_file, OnConvertProgress());
}

void consolidate_checkpoint(const StateReader& source, const std::string& out, const OnFileWritten& on_file,
                            const OnConvertProgress& on_progress) {
  check_new_output(out);
  if (is_single_file_path(out)) return consolidate_to_file(source, out, on_file, on_progress);
  const std::vector<SourceTensor> tensors = source_tensors(source);
  std::vector<TensorSpec> specs;
  WrittenFile written{kFullStateFile, tensors.size(), 0};
  for (const SourceTensor& t : tensors) {
    specs.push_back(TensorSpec{t.canonical(), source.dtype(t.stored), source.shape(t.stored)});
    written.bytes += specs.back().nbytes();
  }
  CheckpointWriter writer = CheckpointWriter::begin(out);
  SafetensorsWriter file = writer.open_file(kFullStateFile, specs);
  Progress progress(on_progress, tensors.size(), written.bytes);
  for (size_t i = 0; i < tensors.size(); ++i) {
    file.write(specs[i].name, source.full(tensors[i].stored));
    progress.wrote(specs[i].nbytes());
  }
  file.close();
  if (on_file) on_file(written);

  nlohmann::json metadata = carried_metadata(source);
  metadata["state_dict_type"] = "full";
  metadata["world_size"] = source.world_size();
  metadata["consolidated_from"] = source.world_size();
  writer.commit(metadata);
}

void reshard_checkpoint(const StateReader& source, const std::string& out, int world,
                        const OnFileWritten& on_file) {
  reshard_checkpoint(source, out, world, on_file, OnConvertProgress());
}

void reshard_checkpoint(const StateReader& source, const std::string& out, int world, const OnFileWritten& on_file,
                        const OnConvertProgress& on_progress) {
  STRATA_CHECK(world >= 1 && world <= 99999, ConfigError,
               "[checkpoint] the target world size must be from 1 to 99999 (shard file names have "
               "5 digits), got ", world);
  STRATA_CHECK(!is_single_file_path(out), ConfigError, "[checkpoint] ", out,
               ": a sharded checkpoint is a directory (one file per rank); choose a path without the "
               ".safetensors suffix");
  check_new_output(out);
  // Note [Resharding a full checkpoint]
  // A sharded source says which tensors are sharded. A full one does not,
  // and its names cannot tell a module's buffers from its parameters, so
  // every tensor of a module or optimizer entry is sharded and only tensor
  // entries stay whole. Readers do not care: StateReader reassembles any
  // tensor, and the fully-sharded strategy takes each tensor's slice.
  const std::vector<SourceTensor> tensors = source_tensors(source);
  std::vector<bool> sharded;
  for (const SourceTensor& t : tensors)
    sharded.push_back(source.sharded() ? source.is_sharded(t.stored) : t.kind == "module" || t.kind == "optimizer");

  CheckpointWriter writer = CheckpointWriter::begin(out);
  nlohmann::json records = nlohmann::json::object();
  // In all: every sharded tensor once per rank file (its slices add up to
  // it), every whole tensor once.
  size_t records_total = 0;
  uint64_t bytes_total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    records[tensors[i].canonical()] =
        tensor_record(source.shape(tensors[i].stored), source.dtype(tensors[i].stored), sharded[i]);
    records_total += sharded[i] ? static_cast<size_t>(world) : 1;
    bytes_total += TensorSpec{tensors[i].stored, source.dtype(tensors[i].stored), source.shape(tensors[i].stored)}.nbytes();
  }
  Progress progress(on_progress, records_total, bytes_total);
  for (int rank = 0; rank < world; ++rank) {
    // What this rank's file holds: each sharded tensor's slice, and on
    // rank 0 the whole tensors (index into `tensors`, slice; whole: empty).
    struct Part {
      size_t index;
      std::optional<FlatSlice> slice;
    };
    std::vector<Part> parts;
    std::vector<TensorSpec> specs;
    WrittenFile written{shard_file_name(rank, world), 0, 0};
    for (size_t i = 0; i < tensors.size(); ++i) {
      const std::string& stored = tensors[i].stored;
      if (sharded[i]) {
        const FlatSlice slice = shard_slice(c10::multiply_integers(source.shape(stored)), world, rank);
        specs.push_back(TensorSpec{tensors[i].canonical(), source.dtype(stored), {slice.size()}});
        parts.push_back({i, slice});
      } else if (rank == 0) {
        specs.push_back(TensorSpec{tensors[i].canonical(), source.dtype(stored), source.shape(stored)});
        parts.push_back({i, std::nullopt});
      } else {
        continue;
      }
      written.bytes += specs.back().nbytes();
    }
    written.tensors = specs.size();
    std::vector<uint64_t> part_bytes;
    for (const TensorSpec& spec : specs) part_bytes.push_back(spec.nbytes());
    SafetensorsWriter file = writer.open_file(written.name, std::move(specs), shard_file_metadata(rank, world, records));
    for (size_t p = 0; p < parts.size(); ++p) {
      const Part& part = parts[p];
      const SourceTensor& t = tensors[part.index];
      file.write(t.canonical(), part.slice ? source.flat_slice(t.stored, part.slice->begin, part.slice->end)
                                           : source.full(t.stored));
      progress.wrote(part_bytes[p]);
    }
    file.close();
    if (on_file) on_file(written);
  }

  nlohmann::json metadata = carried_metadata(source);
  metadata["state_dict_type"] = "sharded";
  metadata["world_size"] = world;
  metadata["tensors"] = records;
  metadata["resharded_from"] = source.world_size();
  writer.commit(metadata);
}

void export_module(const StateReader& source, const std::string& key, const std::string& out,
                   const std::vector<std::pair<std::string, std::string>>& aliases, const std::string& sub_prefix) {
  export_module(source, key, out, aliases, sub_prefix, OnConvertProgress());
}

void export_module(const StateReader& source, const std::string& key, const std::string& out,
                   const std::vector<std::pair<std::string, std::string>>& aliases, const std::string& sub_prefix,
                   const OnConvertProgress& on_progress) {
  STRATA_CHECK(source.entries().contains(key) && source.entries()[key].value("kind", "") == "module",
               CheckpointError, "[checkpoint] ", source.path(), " has no module entry '", key,
               "'; its entries: ", source.entries().dump().substr(0, 300));
  std::vector<std::pair<std::string, std::string>> names;  // (name in the file, stored name)
  for (const std::string& name : source.names_under(key))
    if (name.rfind(sub_prefix, 0) == 0) names.emplace_back(name.substr(sub_prefix.size()), source.tensor_of(key, name));
  for (const auto& [alias, original] : aliases) {
    STRATA_CHECK(source.contains(source.tensor_of(key, sub_prefix + original)), CheckpointError, "[checkpoint] ",
                 source.path(), ": cannot write '", alias, "' as a copy of '", original, "': module '", key,
                 "' has no tensor '", original, "'");
    bool taken = false;
    for (const auto& [name, stored] : names) taken = taken || name == alias;
    if (!taken) names.emplace_back(alias, source.tensor_of(key, sub_prefix + original));
  }
  std::vector<TensorSpec> specs;
  std::vector<uint64_t> bytes;
  uint64_t bytes_total = 0;
  for (const auto& [name, stored] : names) {
    specs.push_back(TensorSpec{name, source.dtype(stored), source.shape(stored)});
    bytes.push_back(specs.back().nbytes());
    bytes_total += bytes.back();
  }
  SafetensorsWriter file(out, std::move(specs), {{"format", "pt"}});
  Progress progress(on_progress, names.size(), bytes_total);
  for (size_t i = 0; i < names.size(); ++i) {
    file.write(names[i].first, source.full(names[i].second));
    progress.wrote(bytes[i]);
  }
  file.close();
}

}  // namespace strata::checkpoint
