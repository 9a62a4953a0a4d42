// One-file checkpoints and self-describing shard files
// (include/strata/checkpoint/single_file.h).
#include "strata/checkpoint/single_file.h"

#include <c10/util/accumulate.h>

#include <filesystem>
#include <system_error>

#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/input.h"
#include "strata/checkpoint/sharded.h"
#include "strata/core/error.h"

namespace strata::checkpoint {
namespace {

using ::strata::detail::cat;
namespace fs = std::filesystem;

constexpr const char* kSuffix = ".safetensors";

// The metadata strings are JSON inside a header that is itself bounded
// (header_json_limits); they get the same limits again when parsed.
nlohmann::json parse_metadata_string(const Metadata& metadata, const char* key, const std::string& where) {
  const JsonLimits limits = header_json_limits();
  return parse_json_limited(metadata.at(key), limits, where, cat("__metadata__[\"", key, "\"]"));
}

// `json[key]` when it is an integer, otherwise -1 (for messages and
// comparisons; never throws on a hostile type).
int64_t int_field(const nlohmann::json& json, const char* key) {
  if (!json.is_object() || !json.contains(key) || !json[key].is_number_integer()) return -1;
  return json[key].get<int64_t>();
}

}  // namespace

bool is_single_file_path(const std::string& path) {
  const std::string suffix = kSuffix;
  return path.size() > suffix.size() && path.compare(path.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string primary_module(const std::vector<std::string>& module_keys) {
  for (const std::string& key : module_keys)
    if (key == kPrimaryModuleKey) return key;
  return module_keys.size() == 1 ? module_keys[0] : "";
}

std::string entry_tensor_name(const std::string& key, const std::string& name, const std::string& primary) {
  if (!primary.empty() && key == primary) return name;
  return name.empty() ? key : key + "/" + name;
}

SafetensorsWriter begin_checkpoint_file(const std::string& path, std::vector<TensorSpec> specs,
                                        nlohmann::json metadata) {
  STRATA_CHECK(is_single_file_path(path), CheckpointError, "[checkpoint] ", path,
               ": a one-file checkpoint's name ends in ", kSuffix, "; any other path is a directory");
  std::error_code ec;
  STRATA_CHECK(!fs::is_directory(fs::symlink_status(path, ec)), CheckpointError, "[checkpoint] ", path,
               " is a directory; a one-file checkpoint is a file (remove the directory, or save to a "
               "path without the ", kSuffix, " suffix to write a checkpoint directory)");
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    STRATA_CHECK(!ec, CheckpointError, "[checkpoint] cannot create ", parent.string(), ": ", ec.message());
  }
  metadata["format"] = kCheckpointFormat;
  metadata["version"] = kCheckpointVersion;
  metadata["layout"] = "file";
  metadata["state_dict_type"] = "full";
  return SafetensorsWriter(path, std::move(specs), {{kFileMetadataKey, metadata.dump()}});
}

Metadata shard_file_metadata(int rank, int world, const nlohmann::json& records) {
  nlohmann::json tensors = nlohmann::json::object();
  for (const auto& [name, record] : records.items()) {
    if (!record.contains("sharded") || record["sharded"] != true) continue;
    const std::vector<int64_t> shape = record.at("shape").get<std::vector<int64_t>>();
    tensors[name] = {{"shape", shape},
                     {"offset", shard_slice(c10::multiply_integers(shape), world, rank).begin}};
  }
  nlohmann::json description = {{"rank", rank}, {"world_size", world}, {"tensors", tensors}};
  return {{kShardMetadataKey, description.dump()}};
}

void check_shard_file_metadata(const SafetensorsFile& file, int rank, int world, const nlohmann::json& records) {
  auto it = file.metadata().find(kShardMetadataKey);
  if (it == file.metadata().end()) return;  // written before shard files described themselves
  const nlohmann::json shard = parse_metadata_string(file.metadata(), kShardMetadataKey, file.path());
  auto bad = [&](const std::string& why) {
    return CheckpointError(cat("[checkpoint] ", file.path(), ": __metadata__[\"", kShardMetadataKey, "\"] ",
                               why, " (a file from another save?)"));
  };
  if (int_field(shard, "rank") != rank || int_field(shard, "world_size") != world)
    throw bad(cat("describes rank ", int_field(shard, "rank"), " of ", int_field(shard, "world_size"),
                  ", but the file is rank ", rank, " of ", world));
  if (!shard.contains("tensors") || !shard["tensors"].is_object()) throw bad("has no \"tensors\" object");
  for (const auto& [name, described] : shard["tensors"].items()) {
    if (!records.contains(name) || !records[name].contains("sharded") || records[name]["sharded"] != true)
      throw bad(cat("describes tensor '", name, "', which is not a sharded tensor of this checkpoint"));
    const nlohmann::json& shape = records[name]["shape"];
    const int64_t offset = shard_slice(c10::multiply_integers(shape.get<std::vector<int64_t>>()), world, rank).begin;
    if (!described.is_object() || described.value("shape", nlohmann::json()) != shape ||
        described.value("offset", nlohmann::json()) != offset)
      throw bad(cat("describes tensor '", name, "' as ", described.dump().substr(0, 200),
                    " but the checkpoint's metadata gives shape ", shape.dump(), " and offset ", offset));
  }
}

// ---- StateReader on a one-file checkpoint ----------------------------------------

std::string StateReader::metadata_source() const {
  if (single_file_) return cat(path_, " (__metadata__[\"", kFileMetadataKey, "\"])");
  return path_ + "/" + kMetadataFile;
}

StateReader StateReader::open_plain(const std::string& path, const ReadOptions& options) {
  std::error_code ec;
  STRATA_CHECK(!fs::is_directory(path, ec), CheckpointError, "[checkpoint] ", path,
               " is a directory; a plain state dict is one .safetensors file (load a checkpoint directory with "
               "Fabric::load)");
  return open_impl(path, options, /*plain=*/true);
}

void StateReader::open_single(const ReadOptions& options, bool plain) {
  SafetensorsFile file = SafetensorsFile::open(path_, options);  // regular file, no symlink (input.h)
  const Metadata& meta = file.metadata();
  if (meta.count(kShardMetadataKey)) {
    const nlohmann::json shard = parse_metadata_string(meta, kShardMetadataKey, path_);
    throw CheckpointError(cat(
        "[checkpoint] ", path_, " is one rank's file of a sharded checkpoint (rank ", int_field(shard, "rank"),
        " of ", int_field(shard, "world_size"),
        "); its tensors are flat slices, not whole tensors. Load the checkpoint folder that holds it, or "
        "write one file with `strata ckpt consolidate FOLDER OUT.safetensors`"));
  }
  if (plain && !meta.count(kFileMetadataKey)) {
    // A state dict: one module, "model", under its own names.
    metadata_ = {{"format", kCheckpointFormat},
                 {"version", kCheckpointVersion},
                 {"layout", "file"},
                 {"entries", {{kPrimaryModuleKey, {{"kind", "module"}, {"prefix", ""}}}}}};
  } else {
    STRATA_CHECK(meta.count(kFileMetadataKey), CheckpointError, "[checkpoint] ", path_,
               " has no strata metadata (__metadata__[\"", kFileMetadataKey,
               "\"]): it is a plain safetensors file, not a strata checkpoint. Load a plain state dict into "
               "a module with Fabric::load_raw (or StateReader::open_plain)");
    metadata_ = parse_metadata_string(meta, kFileMetadataKey, path_);
  }
  check_checkpoint_format(metadata_, metadata_source());
  STRATA_CHECK(metadata_.contains("layout") && metadata_["layout"] == "file", CheckpointError, "[checkpoint] ", metadata_source(),
               ": \"layout\" is ", metadata_.contains("layout") ? metadata_["layout"].dump() : "missing",
               ", expected \"file\"");
  files_.push_back(std::move(file));
  for (const std::string& name : files_[0].keys()) {
    const TensorSpec& spec = files_[0].info(name).spec;
    records_[name] = Record{spec.shape, spec.dtype, /*sharded=*/false, spec.numel()};
    names_.push_back(name);
  }
}

}  // namespace strata::checkpoint
