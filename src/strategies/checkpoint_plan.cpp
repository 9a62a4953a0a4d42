// write_plan: the one code path that writes a checkpoint, full or sharded
// (Note [Checkpoint planning]).
#include "checkpoint_plan.h"

#include <optional>

#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/sharded.h"
#include "strata/checkpoint/single_file.h"
#include "strata/core/error.h"

namespace strata::strategies {
namespace {

// Runs `work` on every rank and turns a failure on any rank into the same
// CheckpointError everywhere (instead of leaving the others at a barrier).
template <class Fn>
void on_every_rank(comm::Group& group, const std::string& tag, const std::string& what, Fn&& work) {
  std::string error;
  try {
    work();
  } catch (const std::exception& e) {
    error = e.what();
    if (error.empty()) error = "unknown error";
  }
  std::vector<std::string> errors = group.all_gather_object(error);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) {
      throw CheckpointError("[" + tag + "] " + what + " failed on rank " + std::to_string(r) + ": " + errors[r]);
    }
  }
}

void write_full(comm::Group& group, checkpoint::CheckpointWriter* writer, const std::string& path,
                const SavePlan& plan, const nlohmann::json& metadata, const WriteOptions& options) {
  const bool rank_zero = group.rank() == 0;
  // Rank 0 streams one file; sharded tensors are gathered one at a time,
  // so it never holds more than one extra tensor.
  std::vector<checkpoint::TensorSpec> specs;
  for (const PlannedTensor& t : plan.tensors) specs.push_back({t.name, t.dtype, t.shape});
  std::optional<checkpoint::SafetensorsWriter> file;
  on_every_rank(group, options.tag, "writing " + path, [&] {
    if (!rank_zero) return;
    file.emplace(writer != nullptr ? writer->open_file(checkpoint::kFullStateFile, specs)
                                   : checkpoint::begin_checkpoint_file(path, specs, metadata));
  });
  std::string failure;  // rank 0 keeps joining the gathers after a failed write, then reports it
  for (const PlannedTensor& t : plan.tensors) {
    at::Tensor value = t.sharded() ? t.gather() : t.local;
    if (t.sharded() && options.end_step) options.end_step();  // Note [Gathered tensors on a lazy device]
    if (!rank_zero || !failure.empty()) continue;
    try {
      file->write(t.name, value);
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  on_every_rank(group, options.tag, "writing " + path, [&] {
    if (!failure.empty()) throw CheckpointError(failure);
    if (rank_zero) file->close();
  });
}

void write_sharded(comm::Group& group, checkpoint::CheckpointWriter* writer, const std::string& path,
                   const std::string& staging, const SavePlan& plan, const nlohmann::json& records,
                   const WriteOptions& options) {
  auto write_mine = [&] {
    checkpoint::NamedTensors local;
    for (const PlannedTensor& t : plan.tensors) {
      if (t.local.defined()) local.emplace_back(t.name, t.local.contiguous());
    }
    std::string file = checkpoint::shard_file_name(group.rank(), group.size());
    // The file says what it is: rank, world size, each slice's full shape and offset.
    const checkpoint::Metadata description = checkpoint::shard_file_metadata(group.rank(), group.size(), records);
    if (writer != nullptr) {
      writer->write_file(file, local, description);
    } else {
      checkpoint::CheckpointWriter::join(path, staging).write_file(file, local, description);
    }
  };
  if (options.sequential) {
    // Local ranks take turns (hosts in parallel), to cap host memory.
    for (int turn = 0; turn < options.local_world_size; ++turn) {
      on_every_rank(group, options.tag, "writing the shard of local rank " + std::to_string(turn),
                    [&] { if (options.local_rank == turn) write_mine(); });
    }
  } else {
    on_every_rank(group, options.tag, "writing the shards", write_mine);
  }
}

// Note [One-file checkpoints]
// In one file the model (the module entry "model", or the only one) keeps
// the names a PyTorch user expects; every other tensor keeps "<key>/...".
// The plan is made in directory names; this renames it.
void name_for_one_file(SavePlan& plan) {
  std::vector<std::string> modules;
  for (const auto& [key, entry] : plan.entries.items())
    if (entry.value("kind", "") == "module") modules.push_back(key);
  const std::string plain = checkpoint::primary_module(modules);
  if (plain.empty()) return;
  plan.entries[plain]["prefix"] = "";
  const std::string prefix = plain + "/";
  for (PlannedTensor& t : plan.tensors)
    if (t.name.rfind(prefix, 0) == 0) t.name = t.name.substr(prefix.size());
}

}  // namespace

void SavePlan::add_whole(const std::string& name, const at::Tensor& tensor, bool is_rank_zero) {
  tensors.push_back({name, tensor.sizes().vec(), tensor.scalar_type(),
                     is_rank_zero ? tensor.detach().contiguous() : at::Tensor(), {}});
}

bool filter_keeps(const StateFilter& filter, const std::string& key, const std::string& name, const at::Tensor& t) {
  auto it = filter.find(key);
  return it == filter.end() || it->second(name, t);
}

void write_plan(comm::Group& group, const std::string& path, const SavePlan& plan_in, nlohmann::json metadata,
                const WriteOptions& options) {
  const bool rank_zero = group.rank() == 0;
  const bool one_file = checkpoint::is_single_file_path(path);
  // The same on every rank (the path was broadcast), so every rank refuses alike.
  STRATA_CHECK(!one_file || !options.sharded_layout, ConfigError, "[", options.tag, "] ", path,
               ": a sharded checkpoint is a directory (one file per rank); save it to a path without the "
               ".safetensors suffix, or use state_dict_type \"full\" for one file");
  SavePlan renamed;
  if (one_file) {
    renamed = plan_in;
    name_for_one_file(renamed);
  }
  const SavePlan& plan = one_file ? renamed : plan_in;
  metadata["entries"] = plan.entries;
  std::optional<checkpoint::CheckpointWriter> writer;
  std::string staging;
  on_every_rank(group, options.tag, "starting the save to " + path, [&] {
    if (rank_zero && !one_file) {
      writer.emplace(checkpoint::CheckpointWriter::begin(path));
      staging = writer->staging_dir();
    }
  });
  if (options.sharded_layout) {
    staging = group.broadcast_object(staging, 0);
    nlohmann::json records = nlohmann::json::object();
    for (const PlannedTensor& t : plan.tensors) records[t.name] = checkpoint::tensor_record(t.shape, t.dtype, t.sharded());
    metadata["tensors"] = records;
    write_sharded(group, writer ? &*writer : nullptr, path, staging, plan, records, options);
  } else {
    write_full(group, writer ? &*writer : nullptr, path, plan, metadata, options);
  }
  on_every_rank(group, options.tag, "committing " + path, [&] {
    if (rank_zero && !one_file) writer->commit(metadata);
  });
}

}  // namespace strata::strategies
