// One-file checkpoints and self-describing shard files.
//
// A full checkpoint may be one safetensors file instead of a directory
// (docs/checkpoints.md, "One-file checkpoints"): its metadata (the JSON a
// directory keeps in metadata.json) is the string under "strata" in the
// file's "__metadata__", and the tensors of its model entry carry the names
// a PyTorch user expects ("wte.weight", not "model/wte.weight"), so
// `safetensors.torch.load_file` gives that model's state_dict directly.
// Every other tensor keeps its "<key>/..." name.
//
// Each rank file of a sharded checkpoint says what it is: "__metadata__"
// holds "strata.shard" = {"rank", "world_size", "tensors": {name: {"shape":
// full shape, "offset": first flat element}}} for its sharded tensors, so
// reading one such file on its own is refused with a clear error instead of
// handing out flat slices as if they were whole tensors.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "strata/checkpoint/safetensors.h"

namespace strata::checkpoint {

/// "__metadata__" key of a one-file checkpoint's metadata (a JSON string).
inline constexpr const char* kFileMetadataKey = "strata";
/// "__metadata__" key of a shard file's description (a JSON string).
inline constexpr const char* kShardMetadataKey = "strata.shard";
/// The state key whose module keeps plain tensor names in a one-file
/// checkpoint when there are several modules.
inline constexpr const char* kPrimaryModuleKey = "model";

/// True when `path` names a one-file checkpoint: it ends in ".safetensors".
bool is_single_file_path(const std::string& path);

/// The module entry whose tensors keep their plain names in a one-file
/// checkpoint: "model" when it is among `module_keys`, the only key when
/// there is one, otherwise "" (every module keeps its "<key>/" prefix).
std::string primary_module(const std::vector<std::string>& module_keys);

/// The stored name of tensor `name` of state entry `key` when entry
/// `plain_key` keeps plain names ("" for none, as in every directory):
/// `name` for that entry, otherwise "<key>/<name>", or `key` for a tensor
/// entry (whose `name` is "").
std::string entry_tensor_name(const std::string& key, const std::string& name, const std::string& plain_key);

/// Starts writing a one-file checkpoint at `path` holding the tensors
/// `specs` (in this order), with `metadata` plus "format", "version" and
/// "layout": "file" stored under "__metadata__"["strata"]. Write the
/// tensors and close() it: the file appears under `path` only when
/// complete, replacing an earlier one atomically. Parent folders are
/// created. Throws CheckpointError when `path` is a directory, or does not
/// end in ".safetensors".
SafetensorsWriter begin_checkpoint_file(const std::string& path, std::vector<TensorSpec> specs,
                                        nlohmann::json metadata);

/// The "__metadata__" of rank `rank`'s file in a sharded checkpoint of
/// `world` ranks whose metadata "tensors" records are `records`
/// ({name: {"shape", "dtype", "sharded"}}): "strata.shard" describes every
/// sharded tensor the file holds (full shape, offset of its slice).
Metadata shard_file_metadata(int rank, int world, const nlohmann::json& records);

/// Checks that `file`, rank `rank`'s file of a sharded checkpoint of
/// `world` ranks, describes itself as such, when it carries a description
/// (files written before descriptions existed carry none): rank, world
/// size, and every listed tensor's full shape and offset against
/// `records`. Throws CheckpointError naming the file and the difference.
void check_shard_file_metadata(const SafetensorsFile& file, int rank, int world,
                               const nlohmann::json& records);

}  // namespace strata::checkpoint
