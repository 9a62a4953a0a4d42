// The Trainer's checkpoint value (the "trainer" entry, Note [The Trainer's
// checkpoint] in src/trainer/trainer_checkpoint.cpp) read as untrusted
// input. A checkpoint may come from anywhere, so every field is checked for
// its type and range before anything acts on it, by one validator that
// Trainer::restore, `strata ckpt inspect` and `strata ckpt verify`, and the
// metadata fuzz target all run. The parts (callback states, scheduler
// states, the epoch's logged values) have validators of their own, which
// their load_state_dict run too, so each check is written once.
//
// Depends on nothing but JSON and the error types, so the fuzz build and
// the checkpoint suite compile it without the rest of the Trainer.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace strata::trainer {

/// The "format" of a Trainer state, and the newest "version" this build reads.
inline constexpr const char* kTrainerStateFormat = "strata-trainer";
inline constexpr int64_t kTrainerStateVersion = 1;
/// The largest count a Trainer state may hold (epoch, global step, batches
/// done, scheduler steps, EarlyStopping's wait, saved steps): 10^10, a
/// thousand times the longest training runs, far below where an int64 or
/// a double stops counting exactly.
inline constexpr int64_t kMaxTrainerCount = 10'000'000'000;
/// The largest world size a Trainer state may name.
inline constexpr int64_t kMaxTrainerWorldSize = int64_t(1) << 20;
/// The largest seconds of training time a Timer state may hold (10^10 s).
inline constexpr double kMaxTrainerSeconds = 1e10;

/// Checks every field of a Trainer state (`value`, the "trainer" entry's
/// value of the checkpoint at `path`): its type, its range, and that no
/// field is missing or unknown (a renamed field is both). Callback states
/// of the built-in callbacks (keys "ModelCheckpoint{...}",
/// "EarlyStopping{...}", "Timer") are checked as their load_state_dict
/// would; other callbacks' states, "module_extra" and "hparams" only for
/// their container type. Checks that need the run (batches_done against
/// the epoch's batch count, scheduler and param-group counts, the callback
/// folder) are made when resuming. Throws CheckpointError "[trainer]
/// <path>: trainer state <field> is <value>; expected <what>".
void validate_trainer_state(const nlohmann::json& value, const std::string& path);

/// Runs validate_trainer_state on the "trainer" entry of a checkpoint's
/// `entries` (metadata "entries") when that entry is a value object with a
/// "format" field, which every Trainer checkpoint has; a checkpoint with no
/// such entry (a Fabric job's) is left alone. Used by `strata ckpt inspect`,
/// `strata ckpt verify` and the metadata fuzz target.
void validate_trainer_entry(const nlohmann::json& entries, const std::string& path);

/// The parts' validators. `where` names the value in messages ("<path>:
/// trainer state lr_schedulers[0]", or "StepLR state" from a load that
/// has no path); each throws CheckpointError "[trainer] <where>.<field> is
/// <value>; expected <what>".
void validate_scheduler_state(const nlohmann::json& state, const std::string& where);
void validate_model_checkpoint_state(const nlohmann::json& state, const std::string& where);
void validate_early_stopping_state(const nlohmann::json& state, const std::string& where);
void validate_timer_state(const nlohmann::json& state, const std::string& where);
/// The epoch's running logged values (Note [Epoch values in checkpoints]).
void validate_epoch_results(const nlohmann::json& results, const std::string& where);

/// Whether `path` names an entry directly inside `folder`, compared
/// lexically after normalising both ("a/./b" is "a/b", a trailing '/' of the
/// folder does not count): no ".." anywhere in `path`, a file name other
/// than "." and "..", and `folder` as its parent. Nothing is read from
/// the file system.
bool is_direct_child(const std::string& path, const std::string& folder);

}  // namespace strata::trainer
