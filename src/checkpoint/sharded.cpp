// Sharded checkpoints (include/strata/checkpoint/sharded.h): the shard
// arithmetic, StateReader over both layouts, and the streaming conversions
// behind `strata ckpt consolidate` and `strata ckpt reshard`.
//
// Note [Trust nothing in a sharded checkpoint]
// A sharded checkpoint is N files written by N processes plus metadata
// written by one of them. open() checks that they agree before any tensor
// is read: every rank file is present and intact, every sharded tensor is
// in every rank file as a 1-D slice of exactly the size the shard rule
// gives, every whole tensor is in rank 0's file with its full shape, and no
// file holds a tensor the metadata does not list. A file from another save
// or another world size is thus an error naming the file and the tensor,
// never a silently wrong model.
#include "strata/checkpoint/sharded.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <system_error>

#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/input.h"
#include "strata/checkpoint/single_file.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/core/error.h"
#include "strata/core/strings.h"

namespace strata::checkpoint {
namespace {

using ::strata::detail::cat;
namespace fs = std::filesystem;

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

}  // namespace

// ---- shard arithmetic -------------------------------------------------------------

int64_t shard_chunk(int64_t numel, int world) {
  STRATA_CHECK(world >= 1, ConfigError, "[checkpoint] world size must be at least 1, got ", world);
  STRATA_CHECK(numel >= 0, ConfigError, "[checkpoint] element count must be non-negative, got ",
               numel);
  return (numel + world - 1) / world;
}

FlatSlice shard_slice(int64_t numel, int world, int rank) {
  const int64_t chunk = shard_chunk(numel, world);
  STRATA_CHECK(rank >= 0 && rank < world, ConfigError, "[checkpoint] rank ", rank,
               " is not in [0, ", world, ")");
  FlatSlice slice;
  slice.begin = std::min(numel, rank * chunk);
  slice.end = std::min(numel, (rank + 1) * chunk);
  return slice;
}

std::string shard_file_name(int rank, int world) {
  char name[64];
  std::snprintf(name, sizeof(name), "shard-%05d-of-%05d.safetensors", rank, world);
  return name;
}

nlohmann::json tensor_record(at::IntArrayRef shape, c10::ScalarType dtype, bool sharded) {
  return {{"shape", shape.vec()}, {"dtype", dtype_name(dtype)}, {"sharded", sharded}};
}

at::Tensor shard_of(const at::Tensor& full, int world, int rank) {
  const FlatSlice slice = shard_slice(full.numel(), world, rank);
  return full.reshape({-1}).narrow(0, slice.begin, slice.size());
}

// ---- StateReader: opening ---------------------------------------------------------

StateReader StateReader::open(const std::string& path, const ReadOptions& options) {
  return open_impl(path, options, /*plain=*/false);
}

StateReader StateReader::open_impl(const std::string& path, const ReadOptions& options, bool plain) {
  StateReader reader;
  std::error_code ec;
  const fs::file_status link = fs::symlink_status(path, ec);
  // A directory, or a link to one (a user's choice), is a checkpoint
  // directory; anything else is one file (whose reader refuses links).
  if (plain || fs::is_regular_file(link) || (fs::is_symlink(link) && !fs::is_directory(fs::status(path, ec)))) {
    // A one-file checkpoint (single_file.cpp); its metadata is in the file.
    reader.path_ = path;
    reader.single_file_ = true;
    reader.open_single(options, plain);
  } else {
    CheckpointReader ckpt = CheckpointReader::open(path, options);
    reader.path_ = ckpt.path();
    reader.metadata_ = ckpt.metadata();
  }
  const nlohmann::json& meta = reader.metadata_;
  const std::string meta_path = reader.metadata_source();
  if (meta.contains("entries")) {
    STRATA_CHECK(meta["entries"].is_object(), CheckpointError, "[checkpoint] ", meta_path,
                 ": \"entries\" is ", meta["entries"].type_name(), ", expected an object");
    reader.entries_ = meta["entries"];
  }
  if (meta.contains("world_size")) {
    const auto& world = meta["world_size"];
    STRATA_CHECK(world.is_number_integer() && world.get<int64_t>() >= 1 &&
                     world.get<int64_t>() <= 99999,
                 CheckpointError, "[checkpoint] ", meta_path, ": \"world_size\" is ", world.dump(),
                 ", expected an integer from 1 to 99999");
    reader.world_size_ = world.get<int>();
  }
  std::string type = "full";
  if (meta.contains("state_dict_type")) {
    STRATA_CHECK(meta["state_dict_type"].is_string(), CheckpointError, "[checkpoint] ", meta_path,
                 ": \"state_dict_type\" is ", meta["state_dict_type"].dump(),
                 ", expected \"full\" or \"sharded\"");
    type = meta["state_dict_type"].get<std::string>();
  }
  if (reader.single_file_) {
    STRATA_CHECK(type == "full", CheckpointError, "[checkpoint] ", meta_path, ": \"state_dict_type\" is '",
                 type, "', but a one-file checkpoint holds a full state");
  } else if (type == "full") {
    reader.open_full(options);
  } else if (type == "sharded") {
    STRATA_CHECK(meta.contains("world_size"), CheckpointError, "[checkpoint] ", meta_path,
                 ": a sharded checkpoint needs \"world_size\" (the number of rank files)");
    reader.sharded_ = true;
    reader.open_sharded(options);
  } else {
    throw CheckpointError(cat("[checkpoint] ", meta_path, ": \"state_dict_type\" is '", type,
                              "', expected 'full' or 'sharded' (written by a newer strata?)"));
  }
  reader.check_entries();
  // Last, so the more specific checks above name a problem first: each
  // rank file's own description agrees with the metadata.
  for (int rank = 0; reader.sharded_ && rank < reader.world_size_; ++rank)
    check_shard_file_metadata(reader.files_[rank], rank, reader.world_size_, meta["tensors"]);
  return reader;
}

namespace {

// Fields of a value entry that count something; see checked_counter.
const char* const kCounterFields[] = {"step", "epoch", "position", "global_step"};

bool is_listed(const nlohmann::json& meta, const std::string& file) {
  for (const auto& f : meta["files"])
    if (f.is_string() && f.get_ref<const std::string&>() == file) return true;
  return false;
}

}  // namespace

// Note [Entries are checked on open]
// The strategies read "entries" and the values in them (the step, the
// loader's epoch and position) as they restore a state; a hostile value
// there would reach a training loop as a step of 2^63 or a negative epoch.
// So open() checks every entry's shape and every counter's range, and that
// each optimizer's JSON agrees with the tensors stored under its key,
// before anything is handed out.
void StateReader::check_entries() const {
  const std::string meta_path = metadata_source();
  // Only the model of a one-file checkpoint drops its prefix; checked
  // first, since every tensor name below depends on it.
  int plain_modules = 0;
  for (const auto& [key, entry] : entries_.items()) {
    if (!entry.is_object() || !entry.contains("prefix")) continue;
    STRATA_CHECK(entry.value("kind", nlohmann::json()) == "module" && single_file_ && entry["prefix"] == "" &&
                     ++plain_modules == 1,
                 CheckpointError, "[checkpoint] ", meta_path, ": entries['", key, "'].prefix is ",
                 entry["prefix"].dump().substr(0, 64),
                 "; only one module entry of a one-file checkpoint may have one, and it is \"\"");
  }
  for (const auto& [key, entry] : entries_.items()) {
    const std::string field = cat("entries['", key, "']");
    STRATA_CHECK(entry.is_object() && entry.contains("kind") && entry["kind"].is_string(),
                 CheckpointError, "[checkpoint] ", meta_path, ": ", field, " is ",
                 entry.dump().substr(0, 200), "; expected {\"kind\": ..., ...}");
    const std::string kind = entry["kind"].get<std::string>();
    if (kind == "value") {
      STRATA_CHECK(entry.contains("value"), CheckpointError, "[checkpoint] ", meta_path, ": ",
                   field, " has no \"value\"");
      const nlohmann::json& value = entry["value"];
      for (const char* counter : kCounterFields) {
        if (key == counter) checked_counter(value, meta_path, field + ".value");
        if (value.is_object() && value.contains(counter))
          checked_counter(value[counter], meta_path, cat(field, ".value.", counter));
      }
    } else if (kind == "optimizer") {
      STRATA_CHECK(entry.contains("state"), CheckpointError, "[checkpoint] ", meta_path, ": ",
                   field, " has no \"state\"");
      const std::vector<std::string> stored = names_under(key);
      validate_optimizer_state(entry["state"], stored, meta_path, field + ".state");
      // A state tensor has its parameter's shape (a transposed record in
      // either is caught here, whichever strategy loads it).
      for (const auto& [pname, pstate] : entry["state"]["state"].items()) {
        for (const auto& [mkey, mentry] : entries_.items()) {
          if (!mentry.is_object() || mentry.value("kind", "") != "module") continue;
          const std::string param = tensor_of(mkey, pname);
          if (!contains(param)) continue;
          for (const auto& t : pstate["tensors"]) {
            const std::string name = key + "/" + pname + "." + t.get<std::string>();
            STRATA_CHECK(shape(name) == shape(param), CheckpointError, "[checkpoint] ", path_,
                         ": tensor '", name, "' has shape ", shape_string(shape(name)),
                         " but its parameter '", param, "' has shape ", shape_string(shape(param)));
          }
        }
      }
    } else if (kind == "module" || kind == "tensor") {
      if (kind == "tensor")
        STRATA_CHECK(contains(key), CheckpointError, "[checkpoint] ", meta_path, ": ", field,
                     " is a tensor entry but the checkpoint holds no tensor '", key, "'");
    } else {
      throw CheckpointError(cat("[checkpoint] ", meta_path, ": ", field, ".kind is '", kind,
                                "'; expected module, optimizer, tensor or value"));
    }
  }
}

size_t StateReader::verify_checksums() const {
  size_t checked = 0;
  for (const SafetensorsFile& file : files_) {
    if (!file.has_checksums()) continue;
    for (const std::string& key : file.keys()) {
      file.verify(key);
      ++checked;
    }
  }
  return checked;
}

void StateReader::open_full(const ReadOptions& options) {
  const std::string file = path_ + "/" + kFullStateFile;
  std::error_code ec;
  STRATA_CHECK(fs::exists(fs::symlink_status(file, ec)), CheckpointError, "[checkpoint] ", path_,
               " has no ", kFullStateFile, " (written by another strategy's sharded layout?)");
  STRATA_CHECK(is_listed(metadata_, kFullStateFile), CheckpointError, "[checkpoint] ", path_, "/",
               kMetadataFile, ": \"files\" does not list ", kFullStateFile);
  files_.push_back(SafetensorsFile::open(file, options));
  for (const std::string& name : files_[0].keys()) {
    const TensorSpec& spec = files_[0].info(name).spec;
    records_[name] = Record{spec.shape, spec.dtype, /*sharded=*/false, spec.numel()};
    names_.push_back(name);
  }
}

void StateReader::open_sharded(const ReadOptions& options) {
  const std::string meta_path = path_ + "/" + kMetadataFile;
  const int world = world_size_;

  // The tensor records, validated (Note [Trust nothing in a sharded checkpoint]).
  STRATA_CHECK(metadata_.contains("tensors") && metadata_["tensors"].is_object(), CheckpointError,
               "[checkpoint] ", meta_path,
               ": a sharded checkpoint needs a \"tensors\" object (each tensor's shape, dtype and "
               "whether it is sharded)");
  for (const auto& item : metadata_["tensors"].items()) {
    // Not a structured binding: a lambda may not capture one in C++17.
    const std::string& name = item.key();
    const nlohmann::json& value = item.value();
    auto bad = [&](const std::string& why) {
      return CheckpointError(cat("[checkpoint] ", meta_path, ": \"tensors\" entry '", name, "' ",
                                 why));
    };
    if (!value.is_object() || !value.contains("shape") || !value.contains("dtype") ||
        !value.contains("sharded"))
      throw bad(cat("is ", value.dump(), "; expected {\"shape\": [...], \"dtype\": \"F32\", "
                    "\"sharded\": true|false}"));
    Record record;
    if (!value["shape"].is_array()) throw bad(cat("has shape ", value["shape"].dump()));
    // Bounded like a safetensors header's shapes: no dimension and no
    // product of the non-zero ones above 2^62, at most 64 dimensions.
    if (value["shape"].size() > 64) throw bad(cat("has ", value["shape"].size(), " dimensions"));
    uint64_t nonzero = 1;
    for (const auto& d : value["shape"]) {
      if (!d.is_number_integer() || d.get<int64_t>() < 0 ||
          (d.is_number_unsigned() && d.get<uint64_t>() > (uint64_t(1) << 62)))
        throw bad(cat("has shape ", value["shape"].dump(), "; expected non-negative sizes"));
      const uint64_t size = d.get<uint64_t>();
      if (size != 0 && nonzero > (uint64_t(1) << 62) / size)
        throw bad(cat("has shape ", value["shape"].dump(), ", too large to exist"));
      if (size != 0) nonzero *= size;
      record.shape.push_back(static_cast<int64_t>(size));
    }
    if (!value["dtype"].is_string()) throw bad(cat("has dtype ", value["dtype"].dump()));
    try {
      record.dtype = dtype_from_name(value["dtype"].get<std::string>());
    } catch (const CheckpointError&) {
      throw bad(cat("has unknown dtype ", value["dtype"].dump()));
    }
    if (!value["sharded"].is_boolean()) throw bad(cat("has sharded ", value["sharded"].dump()));
    record.sharded = value["sharded"].get<bool>();
    record.numel = numel_of(record.shape);
    records_[name] = std::move(record);
  }

  // Every rank's file, present and intact.
  for (int rank = 0; rank < world; ++rank) {
    const std::string file = shard_file_name(rank, world);
    std::error_code ec;
    STRATA_CHECK(fs::exists(fs::symlink_status(path_ + "/" + file, ec)), CheckpointError,
                 "[checkpoint] ", path_, ": ", file, " is missing (rank ", rank, " of ", world,
                 " did not save?)");
    STRATA_CHECK(is_listed(metadata_, file), CheckpointError, "[checkpoint] ", meta_path,
                 ": \"files\" does not list ", file, " (rank ", rank, " of ", world, ")");
    files_.push_back(SafetensorsFile::open(path_ + "/" + file, options));
  }

  // The files agree with the records, checked in file order so the first
  // problem reported is the first a reader would meet. Rank 0's file holds
  // every tensor: its order is the checkpoint's order.
  names_ = files_[0].keys();
  for (const auto& [name, value] : metadata_["tensors"].items())
    STRATA_CHECK(files_[0].contains(name), CheckpointError, "[checkpoint] ", path_, ": ",
                 shard_file_name(0, world), " lacks ", records_[name].sharded ? "sharded" : "whole",
                 " tensor '", name, "' (", kMetadataFile, " lists it; rank 0 of ", world,
                 " saved something else?)");
  for (int rank = 0; rank < world; ++rank) {
    const SafetensorsFile& file = files_[rank];
    const std::string file_name = shard_file_name(rank, world);
    for (const std::string& name : file.keys()) {
      auto it = records_.find(name);
      STRATA_CHECK(it != records_.end(), CheckpointError, "[checkpoint] ", path_, ": ", file_name,
                   " holds tensor '", name, "' that ", kMetadataFile,
                   " \"tensors\" does not list (a file from another save?)");
      STRATA_CHECK(it->second.sharded || rank == 0, CheckpointError, "[checkpoint] ", path_, ": ",
                   file_name, " holds whole tensor '", name,
                   "', which belongs only in rank 0's file (a file from another save?)");
    }
    for (const std::string& name : names_) {
      const Record& record = records_.at(name);
      if (!record.sharded && rank != 0) continue;
      STRATA_CHECK(file.contains(name), CheckpointError, "[checkpoint] ", path_, ": ", file_name,
                   " lacks sharded tensor '", name, "' (", kMetadataFile, " lists it; rank ", rank,
                   " of ", world, " saved something else?)");
      const TensorSpec& spec = file.info(name).spec;
      STRATA_CHECK(spec.dtype == record.dtype, CheckpointError, "[checkpoint] ", path_, ": ",
                   file_name, " holds tensor '", name, "' as ", dtype_name(spec.dtype), " but ",
                   kMetadataFile, " says ", dtype_name(record.dtype));
      if (record.sharded) {
        const FlatSlice slice = shard_slice(record.numel, world, rank);
        STRATA_CHECK(spec.shape.size() == 1 && spec.shape[0] == slice.size(), CheckpointError,
                     "[checkpoint] ", path_, ": ", file_name, " holds sharded tensor '", name,
                     "' with shape ", shape_string(spec.shape), " but rank ", rank, " of ", world,
                     " owns ", slice.size(), " elements ([", slice.begin, ", ", slice.end,
                     ") of ", record.numel, ", full shape ", shape_string(record.shape),
                     "); the file was written for another world size or another model");
      } else {
        STRATA_CHECK(spec.shape == record.shape, CheckpointError, "[checkpoint] ", path_, ": ",
                     file_name, " holds whole tensor '", name, "' with shape ",
                     shape_string(spec.shape), " but ", kMetadataFile, " says ",
                     shape_string(record.shape));
      }
    }
  }
}

// ---- StateReader: reading ---------------------------------------------------------

const StateReader::Record& StateReader::record(const std::string& name) const {
  auto it = records_.find(name);
  STRATA_CHECK(it != records_.end(), CheckpointError, "[checkpoint] ", path_,
               ": has no tensor named '", name, "' (it holds ", names_.size(), " tensors)");
  return it->second;
}

std::vector<int64_t> StateReader::shape(const std::string& name) const {
  return record(name).shape;
}

c10::ScalarType StateReader::dtype(const std::string& name) const { return record(name).dtype; }

bool StateReader::is_sharded(const std::string& name) const { return record(name).sharded; }

const nlohmann::json* StateReader::entry_prefix(const std::string& key) const {
  auto it = entries_.find(key);
  if (it == entries_.end() || !it->is_object() || !it->contains("prefix")) return nullptr;
  return &(*it)["prefix"];
}

std::string StateReader::tensor_of(const std::string& key, const std::string& name) const {
  if (entry_prefix(key)) return name;  // the model of a one-file checkpoint ("" checked on open)
  return name.empty() ? key : key + "/" + name;
}

std::vector<std::string> StateReader::names_under(const std::string& key) const {
  std::vector<std::string> out;
  if (entry_prefix(key)) {
    // Plain names: every name without a '/' that is not a tensor entry.
    for (const std::string& name : names_) {
      if (name.find('/') != std::string::npos) continue;
      auto entry = entries_.find(name);
      if (entry != entries_.end() && entry->is_object() && entry->value("kind", "") == "tensor") continue;
      out.push_back(name);
    }
    return out;
  }
  const std::string prefix = key + "/";
  for (const std::string& name : names_)
    if (name.rfind(prefix, 0) == 0) out.push_back(name.substr(prefix.size()));
  return out;
}

at::Tensor StateReader::full(const std::string& name) const {
  const Record& r = record(name);
  if (!r.sharded) return files_[0].load(name);
  return flat_slice(name, 0, r.numel).reshape(r.shape);
}

at::Tensor StateReader::flat_slice(const std::string& name, int64_t begin, int64_t end) const {
  const Record& r = record(name);
  STRATA_CHECK(0 <= begin && begin <= end && end <= r.numel, CheckpointError, "[checkpoint] ",
               path_, ": tensor '", name, "' has ", r.numel, " elements; elements [", begin, ", ",
               end, ") are out of range");
  if (!r.sharded) return files_[0].load_flat(name, begin, end);
  at::Tensor out = at::empty({end - begin}, at::TensorOptions().dtype(r.dtype));
  for (int rank = 0; rank < world_size_; ++rank) {
    const FlatSlice owned = shard_slice(r.numel, world_size_, rank);
    const int64_t lo = std::max(begin, owned.begin);
    const int64_t hi = std::min(end, owned.end);
    if (lo >= hi) continue;
    out.narrow(0, lo - begin, hi - lo)
        .copy_(files_[rank].load_flat(name, lo - owned.begin, hi - owned.begin));
  }
  return out;
}

}  // namespace strata::checkpoint
