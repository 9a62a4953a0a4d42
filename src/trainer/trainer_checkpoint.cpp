// The Trainer's checkpoint: what it holds, saving it through the strategy,
// finding "last" and "best", and restoring a run from it.
//
// Note [The Trainer's checkpoint]
// A strategy checkpoint directory (docs/checkpoints.md) with the entries
//   "module"       the TrainModule (FSDP: sharded, or full, as configured)
//   "optimizer_<i>" each optimizer of configure_optimizers
//   "rng"          the CPU generator (dropout draws continue identically)
//   "rng_cuda"     only when training on a GPU: the generator of this
//                  rank's GPU (rank 0's is saved, as for "rng"); a CPU
//                  run writes exactly the entries it wrote before, and
//                  ignores this one when resuming from a GPU checkpoint
//   "trainer"      a value: {"format", "epoch", "global_step",
//                  "loops": {"fit": {"batches_done", "epoch_done",
//                  "world_size", "results"}}, "lr_schedulers": [...],
//                  "callbacks": {state_key: state}, "module_extra",
//                  "hparams"}
// Checkpoints are taken between optimizer steps, so "batches_done" is the
// loader position to continue from; it counts global batches (each rank
// takes batch_size / world_size examples of each), so it means the same
// examples at another world size. "epoch_done": the epoch's end hooks ran;
// a resumed run starts the next epoch. "results": the epoch's running
// logged values (Note [Epoch values in checkpoints] in results.h).
//
// Note [Resuming from untrusted state]
// restore() validates the whole value first (validate_trainer_state, Note
// [Checking a Trainer state] in trainer_state.cpp), so a malformed field is
// a CheckpointError naming the checkpoint and the field before anything is
// changed; then the checks that need this run: the scheduler count, each
// part's own load (its type, its param groups, the ModelCheckpoint folder),
// and, when the first epoch starts and its batch count is known,
// batches_done against it (FitLoop::checked_resume_position in
// loops/fit_loop.cpp): a position past the epoch's end is an error, never
// clamped, since it means the checkpoint is of other data or damaged.
#include <torch/optim/optimizer.h>

#include <filesystem>

#include "strata/checkpoint/atomic.h"
#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/trainer/callbacks.h"
#include "strata/trainer/trainer.h"
#include "strata/trainer/trainer_state.h"
#include "loops/fit_loop.h"
#include "results.h"
#include "trainer_impl.h"

namespace strata {

namespace fs = std::filesystem;
using trainer::detail::warn;

namespace {

constexpr const char* kFormat = trainer::kTrainerStateFormat;
constexpr int64_t kVersion = trainer::kTrainerStateVersion;

// Runs `load` (a part's load_state_dict), naming the checkpoint `path` and
// the part `what` in the CheckpointError it throws.
template <class Fn>
void naming_checkpoint(const std::string& path, const std::string& what, Fn&& load) {
  try {
    load();
  } catch (const CheckpointError& e) {
    std::string message = e.what();
    const std::string tag = "[trainer] ";
    if (message.rfind(tag, 0) == 0) message = message.substr(tag.size());
    throw CheckpointError(tag + path + ": trainer state " + what + ": " + message);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError("[trainer] " + path + ": trainer state " + what + " is malformed: " + e.what());
  }
}

// The trainer value of a checkpoint, or null when it has none.
nlohmann::json trainer_value(const std::string& path) {
  checkpoint::CheckpointReader reader = checkpoint::CheckpointReader::open(path);
  const nlohmann::json& meta = reader.metadata();
  auto entries = meta.find("entries");
  if (entries == meta.end() || !entries->is_object()) return nullptr;
  auto entry = entries->find("trainer");
  if (entry == entries->end() || !entry->is_object()) return nullptr;
  auto value = entry->find("value");
  return value == entry->end() ? nlohmann::json() : *value;
}

// The entry that holds the generator of `device`, for a device other than
// the CPU ("rng_cuda").
std::string device_rng_key(c10::Device device) {
  return "rng_" + c10::DeviceTypeName(device.type(), /*lower_case=*/true);
}

bool has_entry(const std::string& path, const std::string& key) {
  checkpoint::CheckpointReader reader = checkpoint::CheckpointReader::open(path);
  const nlohmann::json& meta = reader.metadata();
  auto entries = meta.find("entries");
  return entries != meta.end() && entries->is_object() && entries->contains(key);
}

}  // namespace

void Trainer::save_checkpoint(const std::string& filepath) {
  STRATA_CHECK(module_ != nullptr, ConfigError, "[trainer] save_checkpoint before fit: there is no module to save");
  if (thread_ranks_ && strategies::detail::current_thread_rank() == nullptr) {
    // Called between calls: every rank saves its part, on its thread.
    launch(module_, [&](Trainer& rank, const std::shared_ptr<TrainModule>&) { rank.save_checkpoint(filepath); });
    return;
  }
  nlohmann::json callbacks = nlohmann::json::object();
  for (const auto& c : callbacks_) {
    nlohmann::json state = c->state_dict();
    if (!state.is_null()) callbacks[c->state_key()] = state;
  }
  nlohmann::json schedulers = nlohmann::json::array();
  for (const auto& s : schedulers_) schedulers.push_back(s.scheduler->state_dict());
  nlohmann::json extra = nlohmann::json::object();
  module_->on_save_checkpoint(extra);
  trainer::detail::TrainingEpochLoop& epoch_loop = fit_loop_->epoch_loop();
  nlohmann::json results = epoch_loop.results().epoch_state(*strategy_);  // a collective
  nlohmann::json value = {
      {"format", kFormat},
      {"version", kVersion},
      {"epoch", fit_loop_->epoch()},
      {"global_step", epoch_loop.global_step()},
      {"loops",
       {{"fit",
         {{"batches_done", epoch_loop.batch_idx()},
          {"epoch_done", epoch_loop.epoch_done()},
          {"world_size", world_size()},
          {"results", results}}}}},
      {"lr_schedulers", schedulers},
      {"callbacks", callbacks},
      {"module_extra", extra},
      {"hparams", module_->hparams()}};
  strategies::State state{{"module", strategies::ModulePtr(module_)},
                          {"trainer", value},
                          {"rng", checkpoint::cpu_rng_state()}};
  const c10::Device device = strategy_->root_device();
  if (!device.is_cpu()) state.emplace(device_rng_key(device), checkpoint::device_rng_state(device));
  for (size_t i = 0; i < optimizers_.size(); ++i) {
    state.emplace("optimizer_" + std::to_string(i), strategies::StateValue(*optimizers_[i]));
  }
  strategy_->save_checkpoint(filepath, state);
}

// Note [ckpt_path]
// A path must be a complete checkpoint. "last" is the checkpoint with the
// highest global step among the complete ones in the ModelCheckpoint's
// folder ("last.ckpt" wins a tie); none there: a warning, and the run
// starts fresh (Lightning's behaviour). "best" is that callback's best
// model, or, in a new process, the best model recorded in the "last"
// checkpoint's callback state.
std::string Trainer::resolve_ckpt_path(const std::string& ckpt_path) {
  if (ckpt_path != "last" && ckpt_path != "best") {
    std::error_code ec;
    STRATA_CHECK(fs::exists(ckpt_path, ec), ConfigError, "[trainer] ckpt_path '", ckpt_path,
                 "' does not exist; pass a checkpoint directory, \"last\" or \"best\"");
    STRATA_CHECK(checkpoint::is_complete(ckpt_path), ConfigError, "[trainer] ckpt_path '", ckpt_path,
                 "' is not a complete checkpoint (no completion marker: its save did not finish, or it is not "
                 "a strata checkpoint)");
    return ckpt_path;
  }
  std::shared_ptr<trainer::ModelCheckpoint> mc = checkpoint_callback();
  STRATA_CHECK(mc != nullptr, ConfigError, "[trainer] ckpt_path=\"", ckpt_path,
               "\" needs a ModelCheckpoint callback (enable_checkpointing, or pass one) to know where to look");
  if (ckpt_path == "best" && !mc->best_model_path().empty()) return mc->best_model_path();
  std::string last;
  int64_t last_step = -1;
  std::error_code ec;
  if (fs::is_directory(mc->dirpath(), ec)) {
    for (const auto& entry : fs::directory_iterator(mc->dirpath(), ec)) {
      const std::string path = entry.path().string();
      const std::string name = entry.path().filename().string();
      const std::string& ext = mc->options().file_extension;
      if (name.size() <= ext.size() || name.compare(name.size() - ext.size(), ext.size(), ext) != 0) continue;
      if (name.find(".tmp-") != std::string::npos || name.find(".old-") != std::string::npos) continue;
      if (!checkpoint::is_complete(path)) continue;
      nlohmann::json value;
      try {
        value = trainer_value(path);
      } catch (const CheckpointError& e) {
        warn(*this, "skipping " + path + ": " + e.what());
        continue;
      }
      if (!value.is_object() || !value.contains("global_step") || !value["global_step"].is_number_integer()) continue;
      const int64_t step = value["global_step"].get<int64_t>();
      const bool is_last = name == "last" + ext;
      if (step > last_step || (step == last_step && is_last)) {
        last_step = step;
        last = path;
      }
    }
  }
  if (ckpt_path == "last") {
    if (last.empty()) {
      warn(*this, "ckpt_path=\"last\" is set, but there is no complete checkpoint in " + mc->dirpath() +
                      "; starting from scratch");
    }
    return last;
  }
  // "best" in a new process: the best path recorded in the newest checkpoint.
  std::string best;
  if (!last.empty()) {
    const nlohmann::json value = trainer_value(last);
    trainer::validate_trainer_state(value, last);
    const nlohmann::json& callbacks = value["callbacks"];
    if (auto it = callbacks.find(mc->state_key()); it != callbacks.end()) {
      best = (*it)["best_model_path"].get<std::string>();  // validated: inside the state's folder
    }
  }
  STRATA_CHECK(!best.empty() && checkpoint::is_complete(best), ConfigError,
               "[trainer] ckpt_path=\"best\": no best checkpoint is known in ", mc->dirpath(),
               " (ModelCheckpoint keeps one only with a monitor); pass a path or \"last\"");
  return best;
}

void Trainer::restore(const std::string& path, bool training) {
  strategies::State state{{"module", strategies::ModulePtr(module_)}};
  const c10::Device device = strategy_->root_device();
  if (training) {
    state.emplace("trainer", strategies::StateValue(nlohmann::json()));
    state.emplace("rng", strategies::StateValue(checkpoint::cpu_rng_state()));
    if (!device.is_cpu() && has_entry(path, device_rng_key(device))) {
      state.emplace(device_rng_key(device), strategies::StateValue(checkpoint::device_rng_state(device)));
    }
    for (size_t i = 0; i < optimizers_.size(); ++i) {
      state.emplace("optimizer_" + std::to_string(i), strategies::StateValue(*optimizers_[i]));
    }
  }
  nlohmann::json remainder = strategy_->load_checkpoint(path, state, /*strict=*/true);
  if (!training) return;
  // Note [Resuming from untrusted state]
  const nlohmann::json& value = state.at("trainer").value();
  trainer::validate_trainer_state(value, path);
  const int64_t epoch = value["epoch"].get<int64_t>();
  const int64_t step = value["global_step"].get<int64_t>();
  const nlohmann::json& fit = value["loops"]["fit"];
  const int64_t done = fit["batches_done"].get<int64_t>();
  const bool epoch_done = fit["epoch_done"].get<bool>();
  const int64_t saved_world = fit["world_size"].get<int64_t>();
  STRATA_CHECK(epoch_done || done == 0 || fit_loop_->train_is_dataset() || saved_world == world_size(),
               ConfigError,
               "[trainer] ", path, " stopped inside an epoch on ", saved_world, " ranks; continuing it on ",
               world_size(), " needs training data given as a dataset (DataSource(dataset, options)), whose "
               "batches mean the same examples at any world size");

  const nlohmann::json& schedulers = value["lr_schedulers"];
  STRATA_CHECK(schedulers.size() == schedulers_.size(), CheckpointError, "[trainer] ", path,
               ": trainer state lr_schedulers holds ", schedulers.size(), " scheduler state(s); expected ",
               schedulers_.size(), ", one per scheduler configure_optimizers made");
  for (size_t i = 0; i < schedulers_.size(); ++i) {
    naming_checkpoint(path, "lr_schedulers[" + std::to_string(i) + "]",
                      [&] { schedulers_[i].scheduler->load_state_dict(schedulers[i]); });
  }
  const nlohmann::json& callbacks = value["callbacks"];
  for (const auto& c : callbacks_) {
    auto it = callbacks.find(c->state_key());
    if (it == callbacks.end()) continue;
    naming_checkpoint(path, "callbacks[" + nlohmann::json(c->state_key()).dump() + "]",
                      [&] { c->load_state_dict(*it); });
  }
  module_->on_load_checkpoint(value["module_extra"]);
  checkpoint::set_cpu_rng_state(state.at("rng").tensor(), path + " entry 'rng'");
  if (auto it = state.find(device_rng_key(device)); !device.is_cpu() && it != state.end()) {
    checkpoint::set_device_rng_state(device, it->second.tensor(), path + " entry '" + it->first + "'");
  }
  resume_path_ = path;
  // Checkpoints from before "results" existed resume with the epoch's
  // values restarted.
  fit_loop_->restore(epoch_done ? epoch + 1 : epoch, step, epoch_done ? 0 : done,
                     epoch_done || !fit.contains("results") ? nlohmann::json() : fit["results"]);
  if (is_global_zero()) {
    log::info("[trainer] restored ", path, ": epoch ", epoch, ", global step ", step,
              epoch_done ? " (epoch complete)" : ", batch " + std::to_string(done) + " of the epoch");
  }
  (void)remainder;
}

}  // namespace strata
