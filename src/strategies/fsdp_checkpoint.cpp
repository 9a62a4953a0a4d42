// FSDPStrategy's checkpoints: sharded (one file per rank) and full (one
// consolidated file, gathered parameter by parameter), both loadable at any
// world size and by the other strategies (checkpoint/sharded.h).
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <unordered_map>

#include "fsdp_impl.h"
#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/sharded.h"
#include "strata/checkpoint/single_file.h"
#include "strata/checkpoint/state.h"
#include "strata/core/error.h"

namespace strata::strategies {
namespace {

using checkpoint::shard_slice;

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < 10; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 10) out += " and " + std::to_string(names.size() - 10) + " more";
  return out;
}

// One tensor of a checkpoint as this rank contributes it.
struct Piece {
  std::string name;       // full name in the checkpoint ("model/wte.weight")
  at::Tensor local;       // what this rank writes (its slice, or the whole tensor on rank 0)
  std::vector<int64_t> shape;  // full shape
  c10::ScalarType dtype;
  // Sharded tensors: the parameter it is sharded like, and this rank's
  // padded piece (what a full save gathers).
  const FSDPStrategy::Impl::Param* param = nullptr;
  at::Tensor padded;
  bool sharded() const { return param != nullptr; }
};

// A tensor sharded like `p`, from this rank's padded piece.
Piece sharded_piece(std::string name, const FSDPStrategy::Impl& impl, const FSDPStrategy::Impl::Param& p,
                    const at::Tensor& padded) {
  checkpoint::FlatSlice slice = shard_slice(p.numel, impl.world, impl.rank);
  return {std::move(name), padded.detach().narrow(0, 0, slice.size()), p.shape, padded.scalar_type(), &p,
          padded.detach()};
}

// Everything this rank saves, and the metadata rank 0 writes.
struct FSDPSavePlan {
  std::vector<Piece> pieces;
  nlohmann::json entries = nlohmann::json::object();
};

FSDPSavePlan plan_save(const FSDPStrategy::Impl& impl, const State& state, const StateFilter& filter,
                       const std::string& plain_key) {
  auto stored = [&](const std::string& key, const std::string& name) {
    return checkpoint::entry_tensor_name(key, name, plain_key);
  };
  FSDPSavePlan plan;
  checkpoint::ParamNames names;
  for (const auto& p : impl.params) names[p.shard.unsafeGetTensorImpl()] = p.name;
  bool found_sharded = false;
  for (const auto& [key, value] : state) {
    STRATA_CHECK(key.find('/') == std::string::npos, ConfigError, "[checkpoint] state key '", key,
                 "' contains '/'; use another name");
    auto keep = [&, key = key](const std::string& name, const at::Tensor& t) {
      auto it = filter.find(key);
      return it == filter.end() || it->second(name, t);
    };
    auto whole = [&](const std::string& name, const at::Tensor& t) {
      plan.pieces.push_back({name, impl.rank == 0 ? t.detach().contiguous() : at::Tensor(), t.sizes().vec(),
                             t.scalar_type()});
    };
    if (value.is_module()) {
      plan.entries[key] = {{"kind", "module"}};
      if (key == plain_key) plan.entries[key]["prefix"] = "";
      bool sharded_module = value.module().get() == impl.root_module.get();
      found_sharded = found_sharded || sharded_module;
      if (sharded_module) {
        for (const auto& p : impl.params) {
          if (keep(p.name, p.shard)) plan.pieces.push_back(sharded_piece(stored(key, p.name), impl, p, p.shard));
        }
      }
      checkpoint::NamedTensors tensors = checkpoint::module_state(*value.module());
      for (const auto& [name, t] : tensors) {
        if (sharded_module && impl.param_index.count(name)) continue;  // a shard, planned above
        if (keep(name, t)) whole(stored(key, name), t);
      }
    } else if (value.is_optimizer()) {
      checkpoint::OptimizerState optim = checkpoint::optimizer_state(value.optimizer(), names);
      plan.entries[key] = {{"kind", "optimizer"}, {"state", optim.json}};
      for (const auto& [name, t] : optim.tensors) {
        if (!keep(name, t)) continue;
        const FSDPStrategy::Impl::Param* p = impl.param_of_state(name);  // sharded like its parameter
        if (p && t.numel() == p->chunk) {
          plan.pieces.push_back(sharded_piece(stored(key, name), impl, *p, t));
        } else {
          whole(stored(key, name), t);
        }
      }
    } else if (value.is_tensor()) {
      plan.entries[key] = {{"kind", "tensor"}};
      whole(key, value.tensor());
    } else {
      plan.entries[key] = {{"kind", "value"}, {"value", value.value()}};
    }
  }
  STRATA_CHECK(found_sharded, ConfigError,
               "[fsdp] save_checkpoint: the state holds no module set up by this strategy; put the module "
               "returned by setup_module in the state (e.g. {\"model\", model})");
  return plan;
}

// Runs `write` on every rank and turns a failure on any rank into the same
// CheckpointError everywhere (instead of leaving the others at a barrier).
template <class Fn>
void on_every_rank(comm::Group& group, const std::string& what, Fn&& write) {
  std::string error;
  try {
    write();
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::vector<std::string> errors = group.all_gather_object(error);
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r].empty()) {
      throw CheckpointError("[fsdp] " + what + " failed on rank " + std::to_string(r) + ": " + errors[r]);
    }
  }
}

}  // namespace

void FSDPStrategy::save_checkpoint(const std::string& requested_path, const State& state,
                                   const nlohmann::json& storage_options, const StateFilter& filter) {
  STRATA_CHECK(storage_options.is_null() || storage_options.empty(), ConfigError,
               "[fsdp] storage_options are not supported (no CheckpointIO plugins); pass none");
  STRATA_CHECK(!state.empty(), ConfigError, "[fsdp] save_checkpoint got an empty state; nothing to save");
  STRATA_CHECK(impl_ != nullptr, ConfigError, "[fsdp] save_checkpoint before setup_module");
  // Every rank writes where rank 0 was told to.
  std::string path = group_.broadcast_object(requested_path, 0);
  // One file (PATH.safetensors, full state only): the model keeps its plain names.
  const bool one_file = checkpoint::is_single_file_path(path);
  STRATA_CHECK(!one_file || options_.state_dict_type == "full", ConfigError, "[fsdp] ", path,
               ": a sharded checkpoint is a directory (one file per rank); save it to a path without the "
               ".safetensors suffix, or use state_dict_type \"full\" for one file");
  std::string plain_key;
  if (one_file) {
    std::vector<std::string> modules;
    for (const auto& [key, value] : state)
      if (value.is_module()) modules.push_back(key);
    plain_key = checkpoint::primary_module(modules);
  }
  FSDPSavePlan plan = plan_save(*impl_, state, filter, plain_key);
  nlohmann::json metadata = {{"strategy", name()},
                             {"world_size", world_size()},
                             {"state_dict_type", options_.state_dict_type},
                             {"entries", plan.entries}};

  std::optional<checkpoint::CheckpointWriter> writer;
  std::string staging;
  on_every_rank(group_, "starting the save to " + path, [&] {
    if (is_global_zero() && !one_file) {
      writer.emplace(checkpoint::CheckpointWriter::begin(path));
      staging = writer->staging_dir();
    }
  });
  staging = group_.broadcast_object(staging, 0);

  if (options_.state_dict_type == "full") {
    // Rank 0 streams one file; parameters are gathered one at a time, so it
    // never holds more than one extra parameter.
    std::vector<checkpoint::TensorSpec> specs;
    for (const Piece& piece : plan.pieces) specs.push_back({piece.name, piece.dtype, piece.shape});
    std::optional<checkpoint::SafetensorsWriter> file;
    on_every_rank(group_, "writing " + path, [&] {
      if (is_global_zero())
        file.emplace(one_file ? checkpoint::begin_checkpoint_file(path, specs, metadata)
                              : writer->open_file(checkpoint::kFullStateFile, specs));
    });
    std::string failure;  // rank 0 keeps joining the gathers after a failed write, then reports it
    for (const Piece& piece : plan.pieces) {
      at::Tensor value = piece.sharded() ? impl_->gather_full(*piece.param, piece.padded) : piece.local;
      if (!is_global_zero() || !failure.empty()) continue;
      try {
        file->write(piece.name, value);
      } catch (const std::exception& e) {
        failure = e.what();
      }
    }
    on_every_rank(group_, "writing " + path, [&] {
      if (!failure.empty()) throw CheckpointError(failure);
      if (is_global_zero()) file->close();
    });
  } else {
    nlohmann::json tensors = nlohmann::json::object();
    for (const Piece& piece : plan.pieces) {
      tensors[piece.name] = checkpoint::tensor_record(piece.shape, piece.dtype, piece.sharded());
    }
    metadata["tensors"] = tensors;
    auto write_mine = [&] {
      checkpoint::NamedTensors local;
      for (const Piece& piece : plan.pieces) {
        if (piece.local.defined()) local.emplace_back(piece.name, piece.local.contiguous());
      }
      std::string file = checkpoint::shard_file_name(global_rank(), world_size());
      // The file says what it is: rank, world size, each slice's full shape and offset.
      checkpoint::Metadata description = checkpoint::shard_file_metadata(global_rank(), world_size(), tensors);
      if (is_global_zero()) {
        writer->write_file(file, local, description);
      } else {
        checkpoint::CheckpointWriter::join(path, staging).write_file(file, local, description);
      }
    };
    if (options_.sequential_save) {
      // Local ranks take turns (hosts in parallel), to cap host memory.
      for (int turn = 0; turn < env_.local_world_size; ++turn) {
        on_every_rank(group_, "writing the shard of local rank " + std::to_string(turn),
                      [&] { if (local_rank() == turn) write_mine(); });
      }
    } else {
      on_every_rank(group_, "writing the shards", write_mine);
    }
  }
  on_every_rank(group_, "committing " + path, [&] {
    if (is_global_zero() && !one_file) writer->commit(metadata);
  });
}

namespace {

// This rank's padded piece of `name`, a tensor of the checkpoint sharded
// like parameter `p` (a parameter, or its optimizer state).
at::Tensor my_piece(const checkpoint::StateReader& reader, const std::string& name, const FSDPStrategy::Impl& impl,
                    const FSDPStrategy::Impl::Param& p) {
  std::vector<int64_t> shape = reader.shape(name);
  STRATA_CHECK(shape == p.shape, CheckpointError, "[checkpoint] ", reader.path(), ": '", name, "' has shape ",
               c10::IntArrayRef(shape), " in the checkpoint but ", c10::IntArrayRef(p.shape),
               " in the model (a checkpoint of another model?)");
  checkpoint::FlatSlice slice = shard_slice(p.numel, impl.world, impl.rank);
  at::Tensor piece = at::zeros({p.chunk}, at::TensorOptions().dtype(reader.dtype(name)));
  piece.narrow(0, 0, slice.size()).copy_(reader.flat_slice(name, slice.begin, slice.end));
  return piece;
}

}  // namespace

void FSDPStrategy::load_module_entry(const checkpoint::StateReader& reader, const std::string& key,
                                     torch::nn::Module& module, bool strict, const std::string& source) {
  if (!impl_ || &module != impl_->root_module.get()) {
    Strategy::load_module_entry(reader, key, module, strict, source);
    return;
  }
  std::vector<std::string> missing, unexpected;
  std::unordered_map<std::string, bool> known;
  torch::NoGradGuard no_grad;
  for (const auto& p : impl_->params) {
    known[p.name] = true;
    std::string name = reader.tensor_of(key, p.name);
    if (!reader.contains(name)) {
      missing.push_back(p.name);
      continue;
    }
    STRATA_CHECK(reader.dtype(name) == p.shard.scalar_type(), CheckpointError, "[checkpoint] ", reader.path(),
                 ": '", name, "' is ", reader.dtype(name), " in the checkpoint but ", p.shard.scalar_type(),
                 " in the model");
    p.shard.detach().copy_(my_piece(reader, name, *impl_, p));
  }
  for (const auto& item : module.named_buffers()) {
    known[item.key()] = true;
    std::string name = reader.tensor_of(key, item.key());
    if (!reader.contains(name)) {
      missing.push_back(item.key());
      continue;
    }
    at::Tensor stored = reader.full(name);
    STRATA_CHECK(stored.sizes() == item.value().sizes(), CheckpointError, "[checkpoint] ", reader.path(), ": '",
                 name, "' has shape ", stored.sizes(), " in the checkpoint but ", item.value().sizes(),
                 " in the model");
    item.value().copy_(stored);
  }
  for (const std::string& name : reader.names_under(key)) {
    if (!known.count(name)) unexpected.push_back(name);
  }
  if (strict && (!missing.empty() || !unexpected.empty())) {
    throw CheckpointError("[checkpoint] " + source + " does not match the model: missing " +
                          (missing.empty() ? "none" : join(missing)) + "; unexpected " +
                          (unexpected.empty() ? "none" : join(unexpected)) +
                          ". Load with strict=false to load what matches");
  }
}

checkpoint::NamedTensors FSDPStrategy::read_optimizer_tensors(const checkpoint::StateReader& reader,
                                                              const std::string& key) {
  if (!impl_) return Strategy::read_optimizer_tensors(reader, key);
  checkpoint::NamedTensors tensors;
  for (const std::string& name : reader.names_under(key)) {
    std::string full_name = reader.tensor_of(key, name);
    if (const Impl::Param* p = impl_->param_of_state(name)) {  // sharded like its parameter
      tensors.emplace_back(name, my_piece(reader, full_name, *impl_, *p));
    } else {
      tensors.emplace_back(name, reader.full(full_name));
    }
  }
  return tensors;
}

}  // namespace strata::strategies
