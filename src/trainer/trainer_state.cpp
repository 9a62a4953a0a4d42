// The Trainer state's validator (trainer/trainer_state.h).
//
// Note [Checking a Trainer state]
// A Trainer state is checked whole before any of it is used: every field
// for presence, type and range, and no field unknown, so a renamed field
// ("lr_schedulerz") is an error rather than a default. Counts are integers
// in [0, kMaxTrainerCount] (EarlyStopping's and ModelCheckpoint's step
// markers also -1, "none"); the world size is in [1, kMaxTrainerWorldSize];
// scores are numbers or null (a NaN or infinite score is saved as null);
// every path ModelCheckpoint keeps (best_k_models, best_model_path,
// last_model_path) lies directly inside the state's own dirpath, since
// those are the paths it deletes when they leave the top k. The message
// names the checkpoint, the field as a path into the value
// ("loops.fit.batches_done", "callbacks[\"Timer\"].time_elapsed"), the value
// found and what was expected.
#include "strata/trainer/trainer_state.h"

#include <filesystem>
#include <initializer_list>

#include "strata/core/error.h"

namespace strata::trainer {

namespace fs = std::filesystem;

namespace {

using nlohmann::json;

constexpr size_t kMaxShown = 200;             // characters of a value in a message
constexpr size_t kMaxShownKey = 300;          // of a key (a callback's state_key, a path)
constexpr size_t kMaxPathChars = 4096;        // PATH_MAX
constexpr size_t kMaxListed = 100'000;        // best_k_models, base_lrs
constexpr size_t kMaxCallbacks = 1024;        // callback states, schedulers
constexpr size_t kMaxLoggedValues = 10'000;  // the epoch's logged values

std::string shown(const json& v, size_t max_chars = kMaxShown) {
  std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > max_chars) s = s.substr(0, max_chars - 3) + "...";
  return s;
}

// Where a value sits: the value's origin ("<path>: trainer state") and the
// field path inside it ("loops.fit").
struct Ctx {
  std::string origin;
  std::string prefix;

  std::string name(const std::string& field) const {
    if (prefix.empty()) return field;
    if (field.empty()) return prefix;
    return field[0] == '[' ? prefix + field : prefix + "." + field;
  }
  Ctx at(const std::string& field) const { return {origin, name(field)}; }
  std::string subject(const std::string& field) const {
    const std::string n = name(field);
    return "[trainer] " + origin + (n.empty() ? "" : " " + n);
  }
  [[noreturn]] void missing(const std::string& field, const std::string& expected) const {
    throw CheckpointError(subject(field) + " is missing; expected " + expected);
  }
  [[noreturn]] void wrong(const std::string& field, const json& value, const std::string& expected) const {
    throw CheckpointError(subject(field) + " is " + shown(value) + "; expected " + expected);
  }
};

std::string key_field(const std::string& key) { return "[" + shown(json(key), kMaxShownKey) + "]"; }

// `object` holds no field outside `known`.
void only_fields(const json& object, const Ctx& ctx, std::initializer_list<const char*> known) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    bool listed = false;
    for (const char* k : known) listed = listed || it.key() == k;
    if (listed) continue;
    std::string names;
    for (const char* k : known) names += (names.empty() ? "" : ", ") + std::string(k);
    throw CheckpointError(ctx.subject("") + " has an unknown field " + shown(json(it.key())) +
                          "; expected only the fields " + names);
  }
}

const json& field(const json& object, const char* name, const Ctx& ctx, const std::string& expected) {
  auto it = object.find(name);
  if (it == object.end()) ctx.missing(name, expected);
  return *it;
}

const json& object_field(const json& object, const char* name, const Ctx& ctx, const std::string& expected) {
  const json& v = field(object, name, ctx, expected);
  if (!v.is_object()) ctx.wrong(name, v, expected);
  return v;
}

int64_t integer_in(const json& v, const std::string& name, const Ctx& ctx, int64_t lo, int64_t hi) {
  bool ok = false;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    ok = u <= static_cast<uint64_t>(hi) && static_cast<int64_t>(u) >= lo;
  } else if (v.is_number_integer()) {
    ok = v.get<int64_t>() >= lo && v.get<int64_t>() <= hi;
  }
  if (!ok) ctx.wrong(name, v, "an integer from " + std::to_string(lo) + " to " + std::to_string(hi));
  return v.get<int64_t>();
}

int64_t integer_field(const json& object, const char* name, const Ctx& ctx, int64_t lo, int64_t hi) {
  return integer_in(field(object, name, ctx, "an integer from " + std::to_string(lo) + " to " + std::to_string(hi)),
                    name, ctx, lo, hi);
}

bool boolean_field(const json& object, const char* name, const Ctx& ctx) {
  const json& v = field(object, name, ctx, "true or false");
  if (!v.is_boolean()) ctx.wrong(name, v, "true or false");
  return v.get<bool>();
}

void score_in(const json& v, const std::string& name, const Ctx& ctx) {
  if (!v.is_number() && !v.is_null()) ctx.wrong(name, v, "a number, or null for none");
}

const std::string& string_field(const json& object, const char* name, const Ctx& ctx, size_t max_chars) {
  const std::string expected = "a string of at most " + std::to_string(max_chars) + " characters";
  const json& v = field(object, name, ctx, expected);
  if (!v.is_string() || v.get_ref<const std::string&>().size() > max_chars) ctx.wrong(name, v, expected);
  return v.get_ref<const std::string&>();
}

// A path ModelCheckpoint may delete: "" (none) or directly inside `dirpath`.
void contained_path(const std::string& path, const json& shown_as, const std::string& name, const Ctx& ctx,
                    const std::string& dirpath, bool empty_ok) {
  if (empty_ok && path.empty()) return;
  if (path.size() <= kMaxPathChars && path.find('\0') == std::string::npos && is_direct_child(path, dirpath)) return;
  ctx.wrong(name, shown_as,
            std::string(empty_ok ? "\"\" or " : "") + "a checkpoint directly inside the callback's dirpath " +
                shown(json(dirpath)) + " (ModelCheckpoint deletes the checkpoints it ranks; none may lie elsewhere)");
}

void check_scheduler(const json& state, const Ctx& ctx) {
  if (!state.is_object()) ctx.wrong("", state, "an object with type, last_epoch and base_lrs");
  only_fields(state, ctx, {"type", "last_epoch", "base_lrs"});
  const std::string& type = string_field(state, "type", ctx, 100);
  if (type.empty()) ctx.wrong("type", state["type"], "a scheduler's type name (\"StepLR\")");
  integer_field(state, "last_epoch", ctx, 0, kMaxTrainerCount);
  const std::string lrs = "an array of at most " + std::to_string(kMaxListed) + " finite rates >= 0, one per param group";
  const json& base = field(state, "base_lrs", ctx, lrs);
  if (!base.is_array() || base.size() > kMaxListed) ctx.wrong("base_lrs", base, lrs);
  for (size_t i = 0; i < base.size(); ++i) {
    const json& v = base[i];
    if (!v.is_number() || !(v.get<double>() >= 0)) {
      ctx.wrong("base_lrs[" + std::to_string(i) + "]", v, "a finite number >= 0");
    }
  }
}

void check_model_checkpoint(const json& state, const Ctx& ctx) {
  if (!state.is_object()) ctx.wrong("", state, "an object (a ModelCheckpoint's state)");
  only_fields(state, ctx,
              {"monitor", "best_model_score", "best_model_path", "last_model_path", "best_k_models", "dirpath",
               "last_saved_step"});
  const std::string& monitor = string_field(state, "monitor", ctx, kMaxPathChars);
  const std::string& dirpath = string_field(state, "dirpath", ctx, kMaxPathChars);
  if (dirpath.empty() || dirpath.find('\0') != std::string::npos) {
    ctx.wrong("dirpath", state["dirpath"], "the callback's folder (a non-empty path)");
  }
  score_in(field(state, "best_model_score", ctx, "a number, or null for none"), "best_model_score", ctx);
  const std::string& best = string_field(state, "best_model_path", ctx, kMaxPathChars);
  contained_path(best, state["best_model_path"], "best_model_path", ctx, dirpath, true);
  const std::string& last = string_field(state, "last_model_path", ctx, kMaxPathChars);
  contained_path(last, state["last_model_path"], "last_model_path", ctx, dirpath, true);
  const std::string ranked = "an object of at most " + std::to_string(kMaxListed) + " checkpoint paths and their scores";
  const json& best_k = object_field(state, "best_k_models", ctx, ranked);
  if (best_k.size() > kMaxListed) ctx.wrong("best_k_models", best_k, ranked);
  for (auto it = best_k.begin(); it != best_k.end(); ++it) {
    const std::string name = "best_k_models" + key_field(it.key());
    contained_path(it.key(), json(it.key()), name, ctx, dirpath, false);
    score_in(it.value(), name, ctx);
  }
  if (monitor.empty() && !best_k.empty()) {
    ctx.wrong("best_k_models", best_k, "{} (without a monitor ModelCheckpoint ranks nothing)");
  }
  if (!best_k.empty() && !best_k.contains(best)) {
    ctx.wrong("best_model_path", state["best_model_path"], "one of the paths in best_k_models");
  }
  integer_field(state, "last_saved_step", ctx, -1, kMaxTrainerCount);
}

void check_early_stopping(const json& state, const Ctx& ctx) {
  if (!state.is_object()) ctx.wrong("", state, "an object (an EarlyStopping's state)");
  only_fields(state, ctx, {"wait_count", "best_score", "stopped_step", "stopped_epoch"});
  integer_field(state, "wait_count", ctx, 0, kMaxTrainerCount);
  score_in(field(state, "best_score", ctx, "a number, or null for none"), "best_score", ctx);
  integer_field(state, "stopped_step", ctx, -1, kMaxTrainerCount);
  // stopped_epoch is absent from checkpoints written before it existed.
  if (state.contains("stopped_epoch")) integer_field(state, "stopped_epoch", ctx, 0, kMaxTrainerCount);
}

void check_timer(const json& state, const Ctx& ctx) {
  if (!state.is_object()) ctx.wrong("", state, "an object (a Timer's state)");
  only_fields(state, ctx, {"time_elapsed"});
  const std::string expected = "seconds from 0 to " + shown(json(kMaxTrainerSeconds));
  const json& v = field(state, "time_elapsed", ctx, expected);
  if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() <= kMaxTrainerSeconds)) {
    ctx.wrong("time_elapsed", v, expected);
  }
}

void check_results(const json& results, const Ctx& ctx) {
  const std::string expected =
      "an object of at most " + std::to_string(kMaxLoggedValues) + " logged values (the epoch's running values)";
  if (!results.is_object() || results.size() > kMaxLoggedValues) ctx.wrong("", results, expected);
  for (auto it = results.begin(); it != results.end(); ++it) {
    const Ctx e = ctx.at(key_field(it.key()));
    if (it.key().empty() || it.key().size() > kMaxPathChars) ctx.wrong(key_field(it.key()), json(it.key()), "a metric name");
    const json& s = it.value();
    if (!s.is_object()) e.wrong("", s, "an object with on_step, sync_dist, prog_bar, logger, reduce, total, weight");
    only_fields(s, e, {"on_step", "sync_dist", "prog_bar", "logger", "reduce", "total", "weight"});
    for (const char* flag : {"on_step", "sync_dist", "prog_bar", "logger"}) boolean_field(s, flag, e);
    const json& reduce = field(s, "reduce", e, "one of \"mean\", \"sum\", \"max\", \"min\"");
    if (!(reduce == "mean" || reduce == "avg" || reduce == "sum" || reduce == "max" || reduce == "min")) {
      e.wrong("reduce", reduce, "one of \"mean\", \"sum\", \"max\", \"min\"");
    }
    const json& total = field(s, "total", e, "a number");
    if (!total.is_number()) e.wrong("total", total, "a number");
    const json& weight = field(s, "weight", e, "a number >= 0");
    if (!weight.is_number() || !(weight.get<double>() >= 0)) e.wrong("weight", weight, "a number >= 0");
  }
}

bool starts_with(const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; }

}  // namespace

bool is_direct_child(const std::string& path, const std::string& folder) {
  if (path.empty() || folder.empty()) return false;
  const fs::path p(path);
  for (const fs::path& part : p) {
    if (part == "..") return false;
  }
  const fs::path child = p.lexically_normal();
  const fs::path name = child.filename();
  if (name.empty() || name == "." || name == "..") return false;
  fs::path dir = fs::path(folder).lexically_normal();
  if (dir.filename().empty() && dir != dir.root_path()) dir = dir.parent_path();  // "ckpt/" is "ckpt"
  if (dir == ".") dir = "";  // "./x" normalises to "x", whose parent is ""
  return child.parent_path() == dir;
}

void validate_scheduler_state(const json& state, const std::string& where) { check_scheduler(state, {where, ""}); }
void validate_model_checkpoint_state(const json& state, const std::string& where) {
  check_model_checkpoint(state, {where, ""});
}
void validate_early_stopping_state(const json& state, const std::string& where) {
  check_early_stopping(state, {where, ""});
}
void validate_timer_state(const json& state, const std::string& where) { check_timer(state, {where, ""}); }
void validate_epoch_results(const json& results, const std::string& where) { check_results(results, {where, ""}); }

void validate_trainer_state(const json& value, const std::string& path) {
  const Ctx ctx{path + ": trainer state", ""};
  if (!value.is_object()) ctx.wrong("", value, "an object (the 'trainer' entry of a Trainer checkpoint)");
  only_fields(value, ctx,
              {"format", "version", "epoch", "global_step", "loops", "lr_schedulers", "callbacks", "module_extra",
               "hparams"});
  const std::string format = "\"" + std::string(kTrainerStateFormat) + "\" (the 'trainer' entry of a Trainer checkpoint)";
  const json& f = field(value, "format", ctx, format);
  if (f != kTrainerStateFormat) ctx.wrong("format", f, format);
  const json& version = field(value, "version", ctx, "an integer from 1 to " + std::to_string(kTrainerStateVersion));
  const bool newer = version.is_number_unsigned()
                         ? version.get<uint64_t>() > static_cast<uint64_t>(kTrainerStateVersion)
                         : version.is_number_integer() && version.get<int64_t>() > kTrainerStateVersion;
  if (newer) {
    ctx.wrong("version", version,
              "an integer from 1 to " + std::to_string(kTrainerStateVersion) +
                  " (a newer strata wrote this checkpoint: resume it with that version)");
  }
  integer_in(version, "version", ctx, 1, kTrainerStateVersion);
  integer_field(value, "epoch", ctx, 0, kMaxTrainerCount);
  integer_field(value, "global_step", ctx, 0, kMaxTrainerCount);

  const json& loops = object_field(value, "loops", ctx, "an object with the loop 'fit'");
  only_fields(loops, ctx.at("loops"), {"fit"});
  const Ctx loops_ctx = ctx.at("loops");
  const json& fit = object_field(loops, "fit", loops_ctx, "an object with batches_done, epoch_done, world_size");
  const Ctx fit_ctx = loops_ctx.at("fit");
  only_fields(fit, fit_ctx, {"batches_done", "epoch_done", "world_size", "results"});
  integer_field(fit, "batches_done", fit_ctx, 0, kMaxTrainerCount);
  boolean_field(fit, "epoch_done", fit_ctx);
  integer_field(fit, "world_size", fit_ctx, 1, kMaxTrainerWorldSize);
  if (auto it = fit.find("results"); it != fit.end()) check_results(*it, fit_ctx.at("results"));  // absent: older

  const std::string schedulers_expected =
      "an array of at most " + std::to_string(kMaxCallbacks) + " scheduler states (one per scheduler)";
  const json& schedulers = field(value, "lr_schedulers", ctx, schedulers_expected);
  if (!schedulers.is_array() || schedulers.size() > kMaxCallbacks) ctx.wrong("lr_schedulers", schedulers, schedulers_expected);
  for (size_t i = 0; i < schedulers.size(); ++i) {
    check_scheduler(schedulers[i], ctx.at("lr_schedulers[" + std::to_string(i) + "]"));
  }

  const std::string callbacks_expected =
      "an object of at most " + std::to_string(kMaxCallbacks) + " callback states by state_key";
  const json& callbacks = object_field(value, "callbacks", ctx, callbacks_expected);
  if (callbacks.size() > kMaxCallbacks) ctx.wrong("callbacks", callbacks, callbacks_expected);
  for (auto it = callbacks.begin(); it != callbacks.end(); ++it) {
    const Ctx c = ctx.at("callbacks" + key_field(it.key()));
    if (starts_with(it.key(), "ModelCheckpoint{")) check_model_checkpoint(it.value(), c);
    else if (starts_with(it.key(), "EarlyStopping{")) check_early_stopping(it.value(), c);
    else if (it.key() == "Timer") check_timer(it.value(), c);
    // Other callbacks' states are theirs to check (Callback::load_state_dict).
  }

  object_field(value, "module_extra", ctx, "an object (what the module's on_save_checkpoint added)");
  // Any JSON under the names (numbers, strings, lists, maps: what
  // save_hyperparameters took); the metadata reader bounds its depth.
  object_field(value, "hparams", ctx, "an object (the module's hyperparameters by name)");
}

void validate_trainer_entry(const json& entries, const std::string& path) {
  if (!entries.is_object()) return;
  auto it = entries.find("trainer");
  if (it == entries.end() || !it->is_object()) return;
  auto kind = it->find("kind");
  auto value = it->find("value");
  if (kind == it->end() || *kind != "value" || value == it->end()) return;
  if (!value->is_object() || !value->contains("format")) return;  // not a Trainer's (a Fabric job's own value)
  validate_trainer_state(*value, path);
}

}  // namespace strata::trainer
