// ModelCheckpoint (trainer/callbacks/model_checkpoint.h): saves at
// intervals and keeps the top k by a monitored metric; rank 0's value
// decides (Note [Rank 0 decides] in callbacks/shared.h).
#include "strata/trainer/callbacks/model_checkpoint.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>

#include "shared.h"
#include "strata/core/error.h"
#include "strata/core/log.h"
#include "strata/strategies/strategy.h"
#include "strata/trainer/trainer.h"
#include "strata/trainer/trainer_state.h"

namespace strata::trainer {

namespace fs = std::filesystem;

using detail::available;
using detail::check_mode;

namespace {

std::string shortest(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof(buf), v);
  return std::string(buf, r.ptr);
}

}  // namespace

ModelCheckpoint::ModelCheckpoint(ModelCheckpointOptions options) : options_(std::move(options)) {
  check_mode(options_.mode, "ModelCheckpoint");
  STRATA_CHECK(options_.save_top_k >= -1, ConfigError, "[trainer] ModelCheckpoint save_top_k must be >= -1, got ",
               options_.save_top_k);
  STRATA_CHECK(options_.every_n_train_steps >= 0, ConfigError,
               "[trainer] ModelCheckpoint every_n_train_steps must be >= 0, got ", options_.every_n_train_steps);
  STRATA_CHECK(!options_.every_n_epochs || *options_.every_n_epochs >= 0, ConfigError,
               "[trainer] ModelCheckpoint every_n_epochs must be >= 0, got ", *options_.every_n_epochs);
  STRATA_CHECK(!options_.monitor.empty() || options_.save_top_k == -1 || options_.save_top_k <= 1, ConfigError,
               "[trainer] ModelCheckpoint save_top_k=", options_.save_top_k,
               " needs a monitor to rank the checkpoints; set monitor, or save_top_k to 1 (latest) or -1 (all)");
  STRATA_CHECK(options_.file_extension.find('/') == std::string::npos, ConfigError,
               "[trainer] ModelCheckpoint file_extension '", options_.file_extension, "' must not contain '/'");
  STRATA_CHECK(options_.filename.find('/') == std::string::npos, ConfigError,
               "[trainer] ModelCheckpoint filename '", options_.filename, "' must not contain '/'; use dirpath");
}

std::string ModelCheckpoint::state_key() const {
  return "ModelCheckpoint{monitor=" + options_.monitor + ", mode=" + options_.mode +
         ", every_n_train_steps=" + std::to_string(options_.every_n_train_steps) +
         ", every_n_epochs=" + std::to_string(options_.every_n_epochs.value_or(-1)) + "}";
}

bool ModelCheckpoint::better(double a, double b) const { return options_.mode == "min" ? a < b : a > b; }

std::string ModelCheckpoint::format_name(int64_t epoch, int64_t step, const Metrics& metrics) const {
  const std::string tmpl = options_.filename.empty() ? "{epoch}-{step}" : options_.filename;
  std::string out;
  for (size_t i = 0; i < tmpl.size();) {
    if (tmpl[i] != '{') {
      out += tmpl[i++];
      continue;
    }
    const size_t close = tmpl.find('}', i);
    STRATA_CHECK(close != std::string::npos, ConfigError, "[trainer] ModelCheckpoint filename '", tmpl,
                 "' has an unclosed '{'");
    std::string field = tmpl.substr(i + 1, close - i - 1), spec;
    if (size_t colon = field.find(':'); colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field = field.substr(0, colon);
    }
    std::string text;
    if (field == "epoch" || field == "step") {
      const int64_t v = field == "epoch" ? epoch : step;
      text = std::to_string(v);
      if (!spec.empty()) {
        STRATA_CHECK(spec.size() >= 2 && spec.size() <= 3 && spec.back() == 'd' &&
                         spec.find_first_not_of("0123456789") == spec.size() - 1,
                     ConfigError, "[trainer] ModelCheckpoint filename: format '", spec, "' of {", field,
                     "} is not supported; use d or 0Nd (e.g. 08d)");
        char buf[64];
        std::snprintf(buf, sizeof(buf), ("%" + spec).c_str(), static_cast<long long>(v));
        text = buf;
      }
    } else {
      auto it = metrics.find(field);
      const double v = it == metrics.end() ? 0.0 : it->second;  // Lightning writes 0 for a missing metric
      if (spec.empty()) {
        text = shortest(v);
      } else {
        // Python format specs of the forms ".Nf", ".Ne", ".Ng".
        STRATA_CHECK(spec.size() >= 3 && spec[0] == '.' && std::string("feg").find(spec.back()) != std::string::npos &&
                         spec.find_first_not_of("0123456789", 1) == spec.size() - 1 && spec.size() <= 4,
                     ConfigError, "[trainer] ModelCheckpoint filename: format '", spec, "' of {", field,
                     "} is not supported; use .Nf, .Ne or .Ng with N < 100");
        char buf[128];
        std::snprintf(buf, sizeof(buf), ("%" + spec).c_str(), v);
        text = buf;
      }
    }
    std::string name = field;
    for (char& c : name) if (c == '/') c = '_';
    out += options_.auto_insert_metric_name ? name + "=" + text : text;
    i = close + 1;
  }
  return out;
}

void ModelCheckpoint::setup(Trainer& trainer, TrainModule&, const std::string&) {
  // Lightning's folder: dirpath, else the first logger's
  // <log_dir>/checkpoints, else <default_root_dir>/checkpoints; rank 0's,
  // since only rank 0 may have built a logger.
  std::string dir = options_.dirpath;
  if (dir.empty()) {
    const LoggerPtr logger = trainer.logger();
    dir = ((logger ? fs::path(logger->log_dir()) : fs::path(trainer.options().default_root_dir)) / "checkpoints")
              .string();
    dir = trainer.strategy().broadcast(dir, 0);
  }
  dirpath_ = dir;
  // fast_dev_run saves nothing, so it makes no folder either.
  if (trainer.state_fn() == "fit" && trainer.fast_dev_run() == 0 && trainer.strategy().local_rank() == 0) {
    std::error_code ec;
    fs::create_directories(dirpath_, ec);
    STRATA_CHECK(!ec, ConfigError, "[trainer] ModelCheckpoint cannot create its folder ", dirpath_, ": ",
                 ec.message());
  }
  defer_save_until_validation_ = false;
}

// Note [When ModelCheckpoint saves]
// Lightning 2.6's rules, decision for decision:
// - Nothing is saved under fast_dev_run, outside fit, in the sanity
//   validation, or twice at one global step.
// - every_n_train_steps saves after the batch that reaches the step. When
//   the monitored metric does not exist yet (a validation metric before the
//   first validation), the save waits for the next validation's end; so
//   does a save on the epoch's last batch when a validation follows it
//   and the checkpoints are not taken at the epoch's end, so that it is
//   ranked with that validation's score, not the previous one's.
// - The epoch-interval saves (every_n_epochs, by default 1 without
//   every_n_train_steps) happen at the training epoch's end when validation
//   runs once an epoch at its end (val_check_interval 1.0,
//   check_val_every_n_epoch 1) or there is no validation, and otherwise at
//   each validation's end.
// - A monitored metric missing at a save is an error once a validation has
//   run, and before that a warning; the ranking then skips that save (the
//   `last` checkpoint is still written).
// - "epoch" and "step" can be monitored: the current epoch and global step
//   unless the module logged metrics of those names.
bool ModelCheckpoint::skip_saving(Trainer& trainer) const {
  // Lightning counts step 0 as saved already.
  return trainer.fast_dev_run() > 0 || trainer.state_fn() != "fit" || trainer.sanity_checking() ||
         trainer.global_step() == std::max<int64_t>(last_saved_step_, 0);
}

bool ModelCheckpoint::save_on_train_epoch_end(const Trainer& trainer) const {
  const TrainerOptions& o = trainer.options();
  if (o.check_val_every_n_epoch != std::optional<int64_t>(1)) return false;
  if (trainer.num_val_batches() == 0) return true;
  return o.val_check_interval.value == 1.0;
}

Metrics ModelCheckpoint::candidates(const Trainer& trainer) const {
  Metrics out = trainer.callback_metrics();
  out.emplace("epoch", static_cast<double>(trainer.current_epoch()));
  out.emplace("step", static_cast<double>(trainer.global_step()));
  return out;
}

void ModelCheckpoint::on_train_batch_end(Trainer& trainer, TrainModule&, const at::Tensor&, const data::Batch&,
                                         int64_t) {
  const int64_t n = options_.every_n_train_steps;
  if (n < 1 || trainer.global_step() % n != 0) return;
  const Metrics metrics = candidates(trainer);
  if (!options_.monitor.empty()) {
    // Rank 0's view decides (Note [Rank 0 decides]).
    const bool missing = trainer.strategy().broadcast(metrics.find(options_.monitor) == metrics.end(), 0);
    if (missing) {
      defer_save_until_validation_ = true;
      return;
    }
    if (!save_on_train_epoch_end(trainer) && trainer.is_last_batch() && trainer.validates_this_epoch()) {
      defer_save_until_validation_ = true;
      return;
    }
  }
  if (skip_saving(trainer)) return;
  save_top_k_checkpoint(trainer, metrics);
  save_last_checkpoint(trainer, metrics);
}

void ModelCheckpoint::on_train_epoch_end(Trainer& trainer, TrainModule&) {
  if (skip_saving(trainer) || !save_on_train_epoch_end(trainer)) return;
  const Metrics metrics = candidates(trainer);
  const int64_t every = options_.every_n_epochs.value_or(options_.every_n_train_steps > 0 ? 0 : 1);
  if (every >= 1 && (trainer.current_epoch() + 1) % every == 0) save_top_k_checkpoint(trainer, metrics);
  if (last_saved_step_ == trainer.global_step()) save_last_checkpoint(trainer, metrics);
}

void ModelCheckpoint::on_validation_end(Trainer& trainer, TrainModule&) {
  if (skip_saving(trainer) || save_on_train_epoch_end(trainer)) return;
  const Metrics metrics = candidates(trainer);
  if (defer_save_until_validation_) {
    save_top_k_checkpoint(trainer, metrics);
    save_last_checkpoint(trainer, metrics);
    defer_save_until_validation_ = false;
    return;
  }
  const int64_t every = options_.every_n_epochs.value_or(options_.every_n_train_steps > 0 ? 0 : 1);
  if (every >= 1 && (trainer.current_epoch() + 1) % every == 0) save_top_k_checkpoint(trainer, metrics);
  if (last_saved_step_ == trainer.global_step()) save_last_checkpoint(trainer, metrics);
}

// Note [Stopping on a signal] (runtime/stop_signal.cpp): the step the ranks
// stopped after is saved as a periodic save of this callback would save it
// (an unmonitored checkpoint under its name), and as `last`; a monitored
// ranking gets nothing (no validation ran for that step), but `last` does.
// As Lightning's, the end of training also writes `last` when save_last is
// set and this callback has saved nothing (save_top_k 0, or a monitored metric
// that never appeared), so last_model_path names a file after every fit.
void ModelCheckpoint::on_train_end(Trainer& trainer, TrainModule&) {
  if (trainer.stop_signal() != 0 && !skip_saving(trainer)) {
    const Metrics metrics = candidates(trainer);
    if (options_.monitor.empty()) save_top_k_checkpoint(trainer, metrics);
    save_last_checkpoint(trainer, metrics);
  }
  if (options_.save_last && !saved_any_) save_last_checkpoint(trainer, candidates(trainer));
}

// The step is recorded before the file is written, as the ranking and
// last_model_path are: it is part of the state the file holds, so two
// files written at one step (a ranked one, then `last`) hold the same
// state (Lightning keeps no such field; it compares equal there too).
void ModelCheckpoint::write(Trainer& trainer, const std::string& path) {
  const int64_t previous = last_saved_step_;
  last_saved_step_ = trainer.global_step();
  try {
    trainer.save_checkpoint(path);
  } catch (...) {
    last_saved_step_ = previous;
    throw;
  }
  saved_any_ = true;
}

void ModelCheckpoint::save_top_k_checkpoint(Trainer& trainer, const Metrics& metrics) {
  if (options_.save_top_k == 0) return;
  strategies::Strategy& strategy = trainer.strategy();
  // Rank 0's name: the template may hold metrics each rank has its own of.
  const std::string file =
      strategy.broadcast(format_name(trainer.current_epoch(), trainer.global_step(), metrics), 0);
  const std::string path = (fs::path(dirpath_) / (file + options_.file_extension)).string();
  if (options_.monitor.empty()) {
    // Keep the latest (save_top_k 1) or all (-1). As with the ranking
    // below, the checkpoint's own state already names it, so a run
    // resumed from it removes it when the next one is saved.
    const std::string previous = best_model_path_;
    best_model_path_ = path;
    write(trainer, path);
    if (options_.save_top_k == 1 && !previous.empty() && previous != path) {
      strategy.remove_checkpoint(previous, dirpath_);
    }
    return;
  }
  auto it = metrics.find(options_.monitor);
  const bool found = strategy.broadcast(it != metrics.end(), 0);
  if (!found) {
    STRATA_CHECK(!trainer.validation_has_run(), ConfigError, "[trainer] ModelCheckpoint monitors '",
                 options_.monitor, "', which was never logged; the metrics it can monitor are: ", available(metrics),
                 ". Log it with log(\"", options_.monitor, "\", value) in a step, or monitor one of those");
    if (trainer.is_global_zero() && !warned_missing_) {
      log::warning_all_ranks("[trainer] ModelCheckpoint monitors '", options_.monitor,
                             "', which is not logged yet (no validation has run); this save is not ranked");
    }
    warned_missing_ = true;
    return;
  }
  double current = strategy.broadcast(it != metrics.end() ? it->second : 0.0, 0);
  if (std::isnan(current)) current = options_.mode == "min" ? std::numeric_limits<double>::infinity()
                                                            : -std::numeric_limits<double>::infinity();
  const size_t k = static_cast<size_t>(options_.save_top_k);
  std::string worst;
  for (const auto& [p, v] : best_k_) {
    if (worst.empty() || better(best_k_[worst], v)) worst = p;
  }
  bool should = options_.save_top_k == -1 || best_k_.size() < k || better(current, best_k_[worst]);
  should = strategy.reduce_boolean_decision(should, /*all=*/true);  // Note [Rank 0 decides]
  if (!should) return;
  // The ranking is updated first, so the checkpoint's own state
  // (callbacks) already counts it.
  best_k_[path] = current;
  std::string evicted;
  if (options_.save_top_k != -1 && best_k_.size() > k) {
    for (const auto& [p, v] : best_k_) {
      if (evicted.empty() || better(best_k_[evicted], v)) evicted = p;
    }
    best_k_.erase(evicted);
  }
  best_model_path_.clear();
  for (const auto& [p, v] : best_k_) {
    if (best_model_path_.empty() || better(v, best_k_[best_model_path_])) best_model_path_ = p;
  }
  best_model_score_ = best_k_[best_model_path_];
  write(trainer, path);
  if (!evicted.empty() && evicted != path) strategy.remove_checkpoint(evicted, dirpath_);  // on every host
}

void ModelCheckpoint::save_last_checkpoint(Trainer& trainer, const Metrics&) {
  if (!options_.save_last) return;
  last_model_path_ = (fs::path(dirpath_) / ("last" + options_.file_extension)).string();
  write(trainer, last_model_path_);
}

namespace {
// JSON has no infinity (a NaN metric ranks as the worst, +-inf): null.
nlohmann::json score_json(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }
// A validated score (validate_model_checkpoint_state): a number or null.
double score_of(const nlohmann::json& j, double if_null) { return j.is_number() ? j.get<double>() : if_null; }
}  // namespace

nlohmann::json ModelCheckpoint::state_dict() const {
  nlohmann::json best_k = nlohmann::json::object();
  for (const auto& [path, v] : best_k_) best_k[path] = score_json(v);
  return {{"monitor", options_.monitor},
          {"best_model_score", best_model_score_ ? score_json(*best_model_score_) : nlohmann::json(nullptr)},
          {"best_model_path", best_model_path_}, {"last_model_path", last_model_path_},
          {"best_k_models", best_k},             {"dirpath", dirpath_},
          {"last_saved_step", last_saved_step_}};
}

// Note [Restored paths stay in the folder]
// A ModelCheckpoint deletes the checkpoints that leave its top k (and,
// without a monitor, the previous latest one), by the paths its state
// holds; after a resume those paths come from the checkpoint, which may
// come from anywhere. So a restored state is refused, whole, with a
// CheckpointError (not dropped with a warning: a state of this folder that
// strata wrote never fails these checks, so one that does is damaged or
// hostile, and a ranking with entries silently missing would keep the
// wrong files) unless every path in it is an entry directly inside this
// callback's folder: lexically (validate_model_checkpoint_state: no "..",
// the folder as parent), and on disk, where the path exists, not a
// symbolic link and inside the folder once links are resolved.
// Strategy::remove_checkpoint checks the same again before it deletes.
void ModelCheckpoint::check_restored_path(const std::string& path, const std::string& field) const {
  if (path.empty()) return;
  std::error_code ec;
  const fs::file_status status = fs::symlink_status(path, ec);
  if (ec || !fs::exists(status)) return;  // nothing there to delete
  STRATA_CHECK(!fs::is_symlink(status), CheckpointError, "[trainer] ModelCheckpoint state ", field, " is '", path,
               "', a symbolic link; expected a checkpoint ModelCheckpoint wrote in its folder '", dirpath_,
               "' (the checkpoint is refused; nothing was deleted)");
  const fs::path resolved = fs::weakly_canonical(path, ec);
  std::error_code ec_dir;
  const fs::path folder = fs::weakly_canonical(dirpath_, ec_dir);
  STRATA_CHECK(!ec && !ec_dir && resolved.parent_path() == folder, CheckpointError, "[trainer] ModelCheckpoint state ",
               field, " is '", path, "', which resolves to '", resolved.string(), "' outside its folder '", dirpath_,
               "'; expected a checkpoint ModelCheckpoint wrote there (the checkpoint is refused; nothing was deleted)");
}

void ModelCheckpoint::load_state_dict(const nlohmann::json& state) {
  validate_model_checkpoint_state(state, "ModelCheckpoint state");
  // Only a checkpoint of the same folder continues the same ranking.
  if (state["dirpath"].get_ref<const std::string&>() != dirpath_) return;
  STRATA_CHECK(state["monitor"] == options_.monitor, CheckpointError, "[trainer] ModelCheckpoint state monitor is ",
               state["monitor"].dump(), "; expected \"", options_.monitor, "\", the monitor its state_key names");
  // Note: `ranked` refers into `state`, which outlives the loop; a range-for
  // over state.value("best_k_models", ...).items() iterated a temporary
  // destroyed before the first iteration (a crash on every resume).
  const nlohmann::json& ranked = state["best_k_models"];
  for (auto it = ranked.begin(); it != ranked.end(); ++it) {
    check_restored_path(it.key(), "best_k_models[" + nlohmann::json(it.key()).dump() + "]");
  }
  const std::string& best = state["best_model_path"].get_ref<const std::string&>();
  const std::string& last = state["last_model_path"].get_ref<const std::string&>();
  check_restored_path(best, "best_model_path");
  check_restored_path(last, "last_model_path");
  const double worst = options_.mode == "min" ? std::numeric_limits<double>::infinity()
                                              : -std::numeric_limits<double>::infinity();
  std::map<std::string, double> best_k;
  for (auto it = ranked.begin(); it != ranked.end(); ++it) best_k[it.key()] = score_of(it.value(), worst);
  best_k_ = std::move(best_k);
  best_model_path_ = best;
  // null: no score yet, or a non-finite one (kept as the worst) when a
  // checkpoint was ranked.
  best_model_score_.reset();
  if (!options_.monitor.empty() && (state["best_model_score"].is_number() || !best_k_.empty())) {
    best_model_score_ = score_of(state["best_model_score"], worst);
  }
  last_model_path_ = last;
  last_saved_step_ = state["last_saved_step"].get<int64_t>();
}

}  // namespace strata::trainer
