// Writing sharded checkpoints in one process for tests, the way the ranks
// of a fully-sharded job do: the first "rank" begins the save, each rank
// writes its own shard file into the staging directory, the first commits.
#pragma once

#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/sharded.h"

namespace strata::checkpoint::testing {

/// The tensors rank `rank` of `world` stores for the full tensors
/// `tensors`: each tensor's slice (shard_of), and on rank 0 also the
/// tensors named in `whole`, with their full shape.
/// SGD optimizer state (as optimizer_state() writes it) for one param group
/// over `params`, each with a momentum buffer.
inline nlohmann::json sgd_state(const std::vector<std::string>& params) {
  nlohmann::json state = nlohmann::json::object();
  for (const std::string& p : params) state[p] = {{"tensors", {"momentum_buffer"}}};
  return {{"type", "sgd"},
          {"param_groups",
           {{{"params", params},
             {"options",
              {{"lr", 0.1}, {"momentum", 0.9}, {"dampening", 0.0}, {"weight_decay", 0.0}, {"nesterov", false}}}}}},
          {"state", state}};
}

inline NamedTensors rank_file_tensors(const NamedTensors& tensors,
                                      const std::set<std::string>& whole, int world, int rank) {
  NamedTensors out;
  for (const auto& [name, tensor] : tensors) {
    if (!whole.count(name))
      out.emplace_back(name, shard_of(tensor, world, rank));
    else if (rank == 0)
      out.emplace_back(name, tensor);
  }
  return out;
}

/// metadata.json fields of a sharded checkpoint of `tensors` for `world`
/// ranks: "state_dict_type", "world_size", "tensors", plus `extra`.
inline nlohmann::json sharded_metadata(const NamedTensors& tensors,
                                       const std::set<std::string>& whole, int world,
                                       nlohmann::json extra = nlohmann::json::object()) {
  nlohmann::json records = nlohmann::json::object();
  for (const auto& [name, tensor] : tensors)
    records[name] = tensor_record(tensor.sizes(), tensor.scalar_type(), !whole.count(name));
  extra["state_dict_type"] = "sharded";
  extra["world_size"] = world;
  extra["tensors"] = records;
  return extra;
}

/// Writes a sharded checkpoint of `tensors` for `world` ranks at `path`,
/// one rank file at a time through the library, as the ranks would.
inline void write_sharded_by_rank(const std::string& path, int world, const NamedTensors& tensors,
                                  const std::set<std::string>& whole,
                                  nlohmann::json extra = nlohmann::json::object()) {
  CheckpointWriter first = CheckpointWriter::begin(path);
  for (int rank = 0; rank < world; ++rank) {
    CheckpointWriter writer = CheckpointWriter::join(path, first.staging_dir());
    writer.write_file(shard_file_name(rank, world), rank_file_tensors(tensors, whole, world, rank));
  }
  first.commit(sharded_metadata(tensors, whole, world, std::move(extra)));
}

}  // namespace strata::checkpoint::testing
