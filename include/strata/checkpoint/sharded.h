// Sharded checkpoints (one safetensors file per rank), the reader that
// loads a checkpoint of either layout at any world size, and the
// conversions between layouts and world sizes (`strata ckpt`).
//
// How a tensor is sharded (the fully-sharded strategy's rule): flattened
// row-major, zero-padded to world * chunk elements with
// chunk = ceil(numel / world); rank r owns the flat elements
// [r * chunk, min((r + 1) * chunk, numel)), possibly none. Optimizer state
// tensors are sharded like their parameter; buffers and user tensors are
// kept whole.
//
// The sharded layout (docs/checkpoints.md, "Sharded checkpoints"):
//   PATH/shard-RRRRR-of-NNNNN.safetensors  one per rank: every sharded
//                                          tensor under its full name as a
//                                          1-D slice (rank 0 also holds the
//                                          whole tensors, full shape)
//   PATH/metadata.json                     "state_dict_type": "sharded",
//                                          "world_size", "strategy",
//                                          "entries" (as the full layout),
//                                          "tensors": {name: tensor_record}
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "strata/checkpoint/safetensors.h"

namespace strata::checkpoint {

/// The one tensor file of a full (consolidated) checkpoint.
inline constexpr const char* kFullStateFile = "state.safetensors";

/// A range [begin, end) of a tensor's flattened elements.
struct FlatSlice {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

/// ceil(numel / world): the padded shard length every rank holds in memory.
/// Throws ConfigError when numel < 0 or world < 1.
int64_t shard_chunk(int64_t numel, int world);

/// The flat elements rank `rank` of `world` owns (clipped to numel; may be
/// empty). Throws ConfigError when rank is not in [0, world).
FlatSlice shard_slice(int64_t numel, int world, int rank);

/// "shard-00001-of-00004.safetensors" for rank 1 of 4.
std::string shard_file_name(int rank, int world);

/// Value of metadata "tensors"[name] for a tensor of this full shape and
/// dtype: {"shape": [...], "dtype": "F32", "sharded": true}. Throws
/// CheckpointError for a dtype safetensors cannot hold.
nlohmann::json tensor_record(at::IntArrayRef shape, c10::ScalarType dtype, bool sharded);

/// The slice of `full` that rank `rank` of `world` owns, as a 1-D tensor
/// (a view of `full` when it is contiguous).
at::Tensor shard_of(const at::Tensor& full, int world, int rank);

/// Reads a checkpoint of either layout (full: state.safetensors; sharded:
/// shard files) tensor by tensor, reassembling or re-slicing shards on
/// demand, so a checkpoint saved at one world size loads at any other.
/// Files are opened once and kept. Copies share the open files.
class StateReader {
 public:
  /// Opens `path`: a checkpoint directory (CheckpointReader::open rules),
  /// or a one-file checkpoint (single_file.h; a regular file, whose
  /// "__metadata__" must hold strata's metadata: a shard file read on its
  /// own, or a plain state dict, is refused saying what it is). Throws CheckpointError
  /// when a rank file listed by the world size is missing ("<path>:
  /// shard-00001-of-00002.safetensors is missing (rank 1 of 2 did not
  /// save?)"), when a shard file lacks a sharded tensor or holds one whose
  /// size differs from its slice, when "tensors" disagrees with the files,
  /// when a file is damaged (SafetensorsFile::open), or when a full
  /// checkpoint has no state.safetensors.
  ///
  /// It also checks "entries" (each an object with a known "kind"; a value
  /// entry has a "value", where counters, "step", "epoch", "position" and
  /// "global_step" at its top or one level down, are integers from 0 to
  /// 2^53-1; an optimizer entry's "state" passes validate_optimizer_state
  /// against the tensors stored under its key, whose shapes must equal the
  /// parameter's in any module entry), that every file it opens is listed in
  /// "files", and every "tensors" record's shape (input.h). `options` say
  /// whether tensors are verified against their checksums when read.
  static StateReader open(const std::string& path, const ReadOptions& options = {});

  /// Opens a plain safetensors file (a state_dict written by
  /// safetensors.torch.save_file, or `strata ckpt export`'s model file) as
  /// a one-file checkpoint with one module entry, "model", holding every
  /// tensor under its own name. A strata checkpoint file opens as open()
  /// does; a shard file is refused the same way.
  static StateReader open_plain(const std::string& path, const ReadOptions& options = {});

  /// Reads every tensor of every file once and compares it with its
  /// checksum; returns the number of tensors checked (0 for a checkpoint
  /// written before checksums). Throws CheckpointError naming the file and
  /// the first tensor that differs.
  size_t verify_checksums() const;
  /// The files opened (state.safetensors, or one per rank).
  const std::vector<SafetensorsFile>& files() const { return files_; }

  /// The directory read (see CheckpointReader::path).
  const std::string& path() const { return path_; }
  /// The whole metadata.json object.
  const nlohmann::json& metadata() const { return metadata_; }
  /// True for the sharded layout, false for the full one.
  bool sharded() const { return sharded_; }
  /// Metadata "world_size": the world that saved it (1 if absent).
  int world_size() const { return world_size_; }
  /// Metadata "entries" ({} if absent).
  const nlohmann::json& entries() const { return entries_; }

  /// Every tensor's full name, in a stable order (the order rank 0's file,
  /// or state.safetensors, stores them).
  std::vector<std::string> tensor_names() const { return names_; }
  /// True when the checkpoint holds a tensor `name`.
  bool contains(const std::string& name) const { return records_.count(name) != 0; }
  /// The full shape of `name`. CheckpointError naming path and name if absent.
  std::vector<int64_t> shape(const std::string& name) const;
  /// The dtype of `name`. CheckpointError naming path and name if absent.
  c10::ScalarType dtype(const std::string& name) const;
  /// True when `name` is stored sharded (always false in a full checkpoint).
  bool is_sharded(const std::string& name) const;
  /// The names of entry `key`'s tensors without their prefix ("<key>/",
  /// or none for the model of a one-file checkpoint), in a stable order.
  std::vector<std::string> names_under(const std::string& key) const;
  /// The stored name of tensor `name` of entry `key`: "<key>/<name>", or
  /// `name` alone for the model of a one-file checkpoint; for a tensor
  /// entry (`name` empty) the key itself.
  std::string tensor_of(const std::string& key, const std::string& name = "") const;
  /// True for a one-file checkpoint (PATH.safetensors).
  bool single_file() const { return single_file_; }

  /// The whole tensor (assembled from the shards when sharded), a new CPU
  /// tensor. CheckpointError naming path and name if absent.
  at::Tensor full(const std::string& name) const;
  /// Flat elements [begin, end) of the tensor (1-D result), read only from
  /// the shard files that overlap, and only the bytes needed. Throws
  /// CheckpointError when the range is not within [0, numel].
  at::Tensor flat_slice(const std::string& name, int64_t begin, int64_t end) const;

 private:
  struct Record {
    std::vector<int64_t> shape;
    c10::ScalarType dtype = c10::ScalarType::Float;
    bool sharded = false;
    int64_t numel = 0;
  };
  const Record& record(const std::string& name) const;
  void open_full(const ReadOptions& options);
  void open_sharded(const ReadOptions& options);
  static StateReader open_impl(const std::string& path, const ReadOptions& options, bool plain);
  void open_single(const ReadOptions& options, bool plain);
  std::string metadata_source() const;
  const nlohmann::json* entry_prefix(const std::string& key) const;
  void check_entries() const;

  std::string path_;
  nlohmann::json metadata_;
  nlohmann::json entries_ = nlohmann::json::object();
  bool sharded_ = false;
  bool single_file_ = false;
  int world_size_ = 1;
  std::vector<SafetensorsFile> files_;  // full: {state.safetensors}; sharded: one per rank
  std::vector<std::string> names_;
  std::unordered_map<std::string, Record> records_;
};

/// A file written by consolidate_checkpoint or reshard_checkpoint.
struct WrittenFile {
  std::string name;     ///< file name inside the checkpoint directory
  size_t tensors = 0;   ///< tensors it holds
  uint64_t bytes = 0;   ///< bytes of tensor data it holds
};
/// Called after each file is written, for progress reports.
using OnFileWritten = std::function<void(const WrittenFile&)>;

/// Writes `source` as a full checkpoint at `out`: a one-file checkpoint when
/// `out` ends in ".safetensors" (single_file.h), otherwise a directory with
/// state.safetensors with
/// every tensor whole, metadata as the source's with "state_dict_type":
/// "full", "world_size" and "consolidated_from" the source's world size
/// (so Strategy::load_checkpoint and every tool read it). Streams: one
/// whole tensor in memory at a time. Atomic (CheckpointWriter). Throws
/// CheckpointError when `out` exists and is not an empty directory.
void consolidate_checkpoint(const StateReader& source, const std::string& out,
                            const OnFileWritten& on_file = {});

/// Writes `source` (either layout) as a sharded checkpoint for `world`
/// ranks at `out`. Tensors sharded in the source stay sharded; from a full
/// source, the tensors of module and optimizer entries are sharded and the
/// others (tensor entries) kept whole. Streams: one target slice in memory
/// at a time. Atomic. Throws ConfigError when world < 1, CheckpointError
/// when `out` exists and is not an empty directory.
void reshard_checkpoint(const StateReader& source, const std::string& out, int world,
                        const OnFileWritten& on_file = {});

/// Writes module entry `key` of `source` as a plain safetensors file at
/// `out`: every tensor whole, under the module's own names ("wte.weight"),
/// "__metadata__" {"format": "pt"}, so PyTorch's load_state_dict takes it
/// as it is. Each (alias, original) of `aliases` also stores a copy of
/// `original` under `alias` unless the module has one (a tied head, which
/// PyTorch's state_dict lists under both names). Atomic. Throws
/// CheckpointError when there is no such module entry or original. With a
/// `sub_prefix` ("model."), only the tensors under it are written, without
/// it: the submodule a larger saved module holds.
void export_module(const StateReader& source, const std::string& key, const std::string& out,
                   const std::vector<std::pair<std::string, std::string>>& aliases = {},
                   const std::string& sub_prefix = "");

}  // namespace strata::checkpoint
