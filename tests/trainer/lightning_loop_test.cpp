// The Trainer's loops give Lightning 2.6.6's answers (issue 25, "Where it
// differs from Lightning"): when validation runs, what current_epoch says
// after a stop, which checkpoints ModelCheckpoint keeps with which scores,
// what the CSV and logged_metrics hold, the sanity validation, the default
// checkpoint folder, fast_dev_run and overfit_batches. Most expected values
// are literals measured with Lightning on the same settings by
// tests/trainer/lightning_loop_values.py (its case names are in the
// comments); the module validates val_loss = 100 + global_step, so every
// score is known without the weights. Issue 41's items 1-3 (ModelCheckpoint's
// state in two files of one step, save_last at the end of a fit that saved
// nothing, the LearningRateMonitor's rows under gradient accumulation) are
// decided by Lightning itself while the test runs:
// tests/trainer/lightning_live_values.py fits the same runs and the test
// compares, down to metrics.csv row by row.
#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <set>
#include <sstream>

#include "strata/checkpoint/directory.h"
#include "strata/core/error.h"
#include "strata/loggers/csv_logger.h"
#include "strata/trainer/scheduler.h"
#include "support/tool.h"
#include "trainer_util.h"

namespace {

using namespace strata::testing;
namespace fs = std::filesystem;
using Steps = std::vector<int64_t>;
using Scores = std::map<std::string, double>;

/// lightning_loop_values.py's Probe: y = x on index data; validation logs
/// val_loss = val_value(global_step) (100 + global_step unless set).
class Probe : public strata::TrainModule {
 public:
  explicit Probe(std::function<double(int64_t)> val_value = [](int64_t step) { return 100.0 + step; })
      : val_value_(std::move(val_value)) {
    linear = register_module("linear", torch::nn::Linear(1, 1));
  }
  at::Tensor training_step(const strata::data::Batch& b, int64_t) override {
    seen.emplace_back("train", b.input.flatten());
    at::Tensor loss = (linear->forward(b.input) - b.target).pow(2).mean() * 1e-3;
    log("train_loss", loss, strata::LogOptions().with_on_step(true).with_on_epoch(true));
    return loss;
  }
  at::Tensor validation_step(const strata::data::Batch& b, int64_t) override {
    seen.emplace_back("val", b.input.flatten());
    (trainer()->sanity_checking() ? sanity_batches : val_batches) += 1;
    log("val_loss", at::scalar_tensor(val_value_(global_step()), at::kDouble));
    return {};
  }
  strata::OptimizerConfig configure_optimizers() override {
    return strata::OptimizerConfig(std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01)));
  }
  torch::nn::Linear linear{nullptr};
  std::vector<std::pair<std::string, at::Tensor>> seen;
  int64_t sanity_batches = 0;
  int64_t val_batches = 0;

 private:
  std::function<double(int64_t)> val_value_;
};

/// The global step at each validation's end (sanity ones counted apart).
class Record : public strata::trainer::Callback {
 public:
  std::string state_key() const override { return "Record"; }
  void on_validation_end(strata::Trainer& trainer, strata::TrainModule&) override {
    if (trainer.sanity_checking()) ++sanity;
    else validations.push_back(trainer.global_step());
  }
  Steps validations;
  int64_t sanity = 0;
};

// The script's trainer(): no logger, checkpointing or sanity validation unless a case asks.
strata::TrainerOptions options() {
  return strata::TrainerOptions()
      .with_enable_progress_bar(false)
      .with_enable_checkpointing(false)
      .with_num_sanity_val_steps(0);
}

strata::DataSource indices(int64_t n, int64_t batch) {
  return strata::DataSource(index_dataset(n), strata::DataOptions().with_batch_size(batch));
}

struct FitRun {
  std::unique_ptr<strata::Trainer> trainer;
  std::shared_ptr<Probe> module;
  std::shared_ptr<Record> record;
};

FitRun run(strata::TrainerOptions o, const strata::DataSource& train, const std::optional<strata::DataSource>& val,
        std::shared_ptr<Probe> module = std::make_shared<Probe>()) {
  FitRun r;
  r.record = std::make_shared<Record>();
  r.module = module;
  r.trainer = std::make_unique<strata::Trainer>(o.with_callback(r.record));
  r.trainer->fit(module, train, val);
  return r;
}

std::shared_ptr<strata::trainer::ModelCheckpoint> checkpoint(strata::trainer::ModelCheckpointOptions o) {
  return std::make_shared<strata::trainer::ModelCheckpoint>(o);
}

// best_k_models by file name.
Scores ranked(const strata::trainer::ModelCheckpoint& mc) {
  Scores out;
  for (const auto& [path, score] : mc.best_k_models()) out[fs::path(path).filename().string()] = score;
  return out;
}

std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::directory_iterator(dir)) out.insert(e.path().filename().string());
  return out;
}

std::vector<std::vector<std::string>> read_csv(const std::string& path) {
  std::vector<std::vector<std::string>> rows;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> row;
    std::stringstream cells(line);
    for (std::string cell; std::getline(cells, cell, ',');) row.push_back(cell);
    if (!line.empty() && line.back() == ',') row.push_back("");
    rows.push_back(row);
  }
  return rows;
}

std::set<std::string> names(const strata::trainer::Metrics& metrics) {
  std::set<std::string> out;
  for (const auto& [k, v] : metrics) out.insert(k);
  return out;
}

// Item 1 ("1_early_stop_epoch_end").
TEST(LightningLoopTest, EarlyStoppingAtAnEpochsEndReportsTheNextEpoch) {
  auto es = std::make_shared<strata::trainer::EarlyStopping>(
      strata::trainer::EarlyStoppingOptions().with_monitor("val_loss").with_patience(1));
  FitRun r = run(options().with_max_epochs(10).with_callback(es), indices(16, 4), indices(8, 4),
              std::make_shared<Probe>([](int64_t) { return 5.0; }));
  EXPECT_EQ(r.trainer->global_step(), 8);
  EXPECT_EQ(r.trainer->current_epoch(), 2);
  EXPECT_EQ(r.record->validations, Steps({4, 8}));
}

// Item 2 ("2_fraction_third_of_64"): after batches 21, 42, 63, not also 64.
TEST(LightningLoopTest, AFractionValidatesOnlyAtItsMultiples) {
  FitRun r = run(options().with_max_epochs(1).with_val_check_interval(1.0 / 3), indices(64, 1), indices(4, 4));
  EXPECT_EQ(r.record->validations, Steps({21, 42, 63}));
}

// Item 3 ("3_none_every_3_batches_accum2"): batches 3, 6, 9, 12 of the run.
TEST(LightningLoopTest, CheckValEveryNEpochNoneCountsBatchesAcrossEpochs) {
  FitRun r = run(options()
                  .with_max_epochs(2)
                  .with_val_check_interval(3)
                  .with_check_val_every_n_epoch(strata::kValidateAcrossEpochs)
                  .with_accumulate_grad_batches(2),
              indices(6, 1), indices(4, 4));
  EXPECT_EQ(r.record->validations, Steps({1, 3, 4, 6}));
  EXPECT_EQ(r.trainer->global_step(), 6);
  // 0 is not Lightning's None: it is refused with the way to say None.
  try {
    strata::Trainer t(options().with_check_val_every_n_epoch(0));
    ADD_FAILURE() << "check_val_every_n_epoch=0 was accepted";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("pass std::nullopt (strata::kValidateAcrossEpochs, Lightning's None)"),
              std::string::npos)
        << e.what();
  }
}

// Item 4 ("4_limit_train_0").
TEST(LightningLoopTest, LimitTrainBatchesZeroFinishesFitWithoutTraining) {
  FitRun r = run(options().with_max_epochs(3).with_limit_train_batches(0), indices(16, 4), indices(8, 4));
  EXPECT_EQ(r.trainer->global_step(), 0);
  EXPECT_EQ(r.trainer->current_epoch(), 0);
  EXPECT_TRUE(r.record->validations.empty());
  EXPECT_TRUE(r.module->seen.empty());
}

// Item 5 ("5_monitor_epoch", "5_monitor_step").
TEST(LightningLoopTest, ModelCheckpointMonitorsEpochAndStep) {
  for (const std::string monitor : {"epoch", "step"}) {
    TempDir dir("monitor-" + monitor);
    auto mc = checkpoint(strata::trainer::ModelCheckpointOptions().with_dirpath(dir.path).with_monitor(monitor)
                             .with_mode("max").with_save_top_k(2));
    run(options().with_max_epochs(4).with_callback(mc), indices(16, 4), std::nullopt);
    const Scores expected = monitor == "epoch" ? Scores{{"epoch=2-step=12.ckpt", 2.0}, {"epoch=3-step=16.ckpt", 3.0}}
                                               : Scores{{"epoch=2-step=12.ckpt", 12.0}, {"epoch=3-step=16.ckpt", 16.0}};
    EXPECT_EQ(ranked(*mc), expected) << monitor;
    EXPECT_EQ(fs::path(mc->best_model_path()).filename(), "epoch=3-step=16.ckpt") << monitor;
    EXPECT_EQ(mc->best_model_score(), monitor == "epoch" ? 3.0 : 16.0);
    EXPECT_EQ(files_in(dir.path), std::set<std::string>({"epoch=2-step=12.ckpt", "epoch=3-step=16.ckpt"}));
  }
}

// Items 6, 7 and 13's logged step ("6_csv"): 6 batches, accumulation 2,
// validation every 3 batches, every step logged. The validation after
// batch 3 (inside the second step's window) is filed under step 1, the one
// after batch 6 (which stepped) under step 2; logged_metrics has no epoch.
TEST(LightningLoopTest, CsvRowsAndLoggedMetricsAreLightnings) {
  TempDir dir("csv6");
  auto logger = std::make_shared<strata::trainer::CSVLogger>(dir.path, "csv6");
  FitRun r = run(options().with_max_epochs(1).with_val_check_interval(3).with_accumulate_grad_batches(2)
                  .with_log_every_n_steps(1).with_logger(logger),
              indices(6, 1), indices(4, 4));
  const auto rows = read_csv(logger->metrics_file());
  ASSERT_EQ(rows.size(), 7u);
  EXPECT_EQ(rows[0], std::vector<std::string>({"epoch", "step", "train_loss_epoch", "train_loss_step", "val_loss"}));
  // Which cells each row fills: (step, the filled metric column, val_loss's text when it is the one).
  const std::vector<std::pair<std::string, int>> shape = {{"0", 3}, {"1", 4}, {"1", 3}, {"2", 3}, {"2", 4}, {"2", 2}};
  for (size_t i = 0; i < shape.size(); ++i) {
    const auto& row = rows[i + 1];
    ASSERT_EQ(row.size(), 5u) << i;
    EXPECT_EQ(row[0], "0") << "row " << i;
    EXPECT_EQ(row[1], shape[i].first) << "row " << i;
    for (int c = 2; c < 5; ++c) EXPECT_EQ(row[c].empty(), c != shape[i].second) << "row " << i << " column " << c;
  }
  EXPECT_EQ(rows[2][4], "101");
  EXPECT_EQ(rows[5][4], "103");
  EXPECT_EQ(r.record->validations, Steps({1, 3}));
  EXPECT_EQ(names(r.trainer->logged_metrics()),
            std::set<std::string>({"train_loss_epoch", "train_loss_step", "val_loss"}));
}

// Item 7 without a logger ("7_logged_metrics_no_logger").
TEST(LightningLoopTest, LoggedMetricsHaveNoEpochWithoutALogger) {
  FitRun r = run(options().with_max_epochs(1), indices(8, 4), indices(4, 4));
  EXPECT_EQ(names(r.trainer->logged_metrics()),
            std::set<std::string>({"train_loss_epoch", "train_loss_step", "val_loss"}));
}

// Item 9 ("9_step_ckpt_before_validation"): the saves at steps 2 and 4
// wait for the first validation (step 5), which saves and ranks; step 10's
// save on the epoch's last batch waits for the validation after it.
TEST(LightningLoopTest, AStepCheckpointBeforeTheFirstValidationWaitsForIt) {
  TempDir dir("ck9");
  auto mc = checkpoint(strata::trainer::ModelCheckpointOptions().with_dirpath(dir.path).with_monitor("val_loss")
                           .with_every_n_train_steps(2).with_save_last(true).with_save_top_k(-1));
  FitRun r = run(options().with_max_epochs(1).with_val_check_interval(5).with_callback(mc), indices(10, 1),
              indices(4, 4));
  EXPECT_EQ(ranked(*mc), (Scores{{"epoch=0-step=5.ckpt", 105.0},
                                 {"epoch=0-step=6.ckpt", 105.0},
                                 {"epoch=0-step=8.ckpt", 105.0},
                                 {"epoch=0-step=10.ckpt", 110.0}}));
  EXPECT_EQ(files_in(dir.path), std::set<std::string>({"epoch=0-step=10.ckpt", "epoch=0-step=5.ckpt",
                                                       "epoch=0-step=6.ckpt", "epoch=0-step=8.ckpt", "last.ckpt"}));
  EXPECT_EQ(r.record->validations, Steps({5, 10}));
}

// Item 10: a save on an epoch's last batch. With validation more often
// than once an epoch it waits for the validation after the batch
// ("10_save_on_last_batch_waits"); with validation once at each epoch's
// end ModelCheckpoint saves at the epoch's end, and Lightning ranks the
// step save with the score it has ("10_save_on_last_batch"), after losing
// the first one, which had none.
TEST(LightningLoopTest, ASaveOnAnEpochsLastBatchIsRankedAsLightningRanksIt) {
  {
    TempDir dir("ck10b");
    auto mc = checkpoint(strata::trainer::ModelCheckpointOptions().with_dirpath(dir.path).with_monitor("val_loss")
                             .with_every_n_train_steps(4).with_save_top_k(-1));
    FitRun r = run(options().with_max_epochs(2).with_val_check_interval(2).with_callback(mc), indices(4, 1),
                indices(4, 4));
    EXPECT_EQ(ranked(*mc), (Scores{{"epoch=0-step=4.ckpt", 104.0}, {"epoch=1-step=8.ckpt", 108.0}}));
    EXPECT_EQ(mc->best_model_score(), 104.0);
    EXPECT_EQ(r.record->validations, Steps({2, 4, 6, 8}));
  }
  {
    TempDir dir("ck10");
    auto mc = checkpoint(strata::trainer::ModelCheckpointOptions().with_dirpath(dir.path).with_monitor("val_loss")
                             .with_every_n_train_steps(4).with_save_top_k(-1));
    FitRun r = run(options().with_max_epochs(3).with_callback(mc), indices(4, 1), indices(4, 4));
    EXPECT_EQ(ranked(*mc), (Scores{{"epoch=1-step=8.ckpt", 104.0}, {"epoch=2-step=12.ckpt", 108.0}}));
    EXPECT_EQ(mc->best_model_score(), 104.0);
    EXPECT_EQ(r.record->validations, Steps({4, 8, 12}));
  }
  {
    // "10_monitor_missing_without_validation": never logged and no
    // validation to log it: a warning, nothing saved, no error.
    TempDir dir("ck10c");
    auto mc = checkpoint(strata::trainer::ModelCheckpointOptions().with_dirpath(dir.path + "/ck").with_monitor("val_nope"));
    FitRun r = run(options().with_max_epochs(2).with_callback(mc), indices(8, 4), std::nullopt);
    EXPECT_EQ(r.trainer->global_step(), 4);
    EXPECT_TRUE(files_in(dir.path + "/ck").empty());
  }
}

// Item 11 ("11_interval_6_of_20"): 6 into 20 batches validates after
// batches 6, 12, 18 of each epoch, not also after the 20th.
TEST(LightningLoopTest, AnIntervalThatDoesNotDivideTheEpochAddsNoValidationAtItsEnd) {
  FitRun r = run(options().with_max_epochs(2).with_val_check_interval(6), indices(20, 1), indices(4, 4));
  EXPECT_EQ(r.record->validations, Steps({6, 12, 18, 26, 32, 38}));
}

// Item 12 ("12_max_steps_7_of_4", "12_max_steps_3_of_4", "12_early_stop_mid_epoch").
TEST(LightningLoopTest, AStopInsideAnEpochCountsThatEpoch) {
  {
    FitRun r = run(options().with_max_epochs(10).with_max_steps(7), indices(16, 4), std::nullopt);
    EXPECT_EQ(r.trainer->global_step(), 7);
    EXPECT_EQ(r.trainer->current_epoch(), 2);
  }
  {
    FitRun r = run(options().with_max_epochs(10).with_max_steps(3), indices(16, 4), std::nullopt);
    EXPECT_EQ(r.trainer->global_step(), 3);
    EXPECT_EQ(r.trainer->current_epoch(), 1);
  }
  {
    auto es = std::make_shared<strata::trainer::EarlyStopping>(
        strata::trainer::EarlyStoppingOptions().with_monitor("val_loss").with_patience(2));
    FitRun r = run(options().with_max_epochs(10).with_val_check_interval(2).with_callback(es), indices(4, 1),
                indices(4, 4), std::make_shared<Probe>([](int64_t) { return 5.0; }));
    EXPECT_EQ(r.trainer->global_step(), 6);
    EXPECT_EQ(r.trainer->current_epoch(), 2);
    EXPECT_EQ(r.record->validations, Steps({2, 4, 6}));
  }
}

/// Sets should_stop after the batch that reaches `step` (as a Timer would).
class StopAtStep : public strata::trainer::Callback {
 public:
  explicit StopAtStep(int64_t step) : step_(step) {}
  std::string state_key() const override { return "StopAtStep"; }
  void on_train_batch_end(strata::Trainer& trainer, strata::TrainModule&, const at::Tensor&,
                          const strata::data::Batch&, int64_t) override {
    if (trainer.global_step() == step_) trainer.should_stop = true;
  }

 private:
  int64_t step_;
};

// "12_should_stop_in_a_batch": the batch that set should_stop is followed
// by a validation; "12_early_stop_every_2_epochs": EarlyStopping does not
// check the epochs that did not validate.
TEST(LightningLoopTest, AStopSetInABatchValidatesAndEarlyStoppingWaitsForValidations) {
  {
    FitRun r = run(options().with_max_epochs(3).with_callback(std::make_shared<StopAtStep>(3)), indices(8, 1),
                   indices(4, 4));
    EXPECT_EQ(r.trainer->global_step(), 3);
    EXPECT_EQ(r.trainer->current_epoch(), 1);
    EXPECT_EQ(r.record->validations, Steps({3}));
  }
  {
    auto es = std::make_shared<strata::trainer::EarlyStopping>(
        strata::trainer::EarlyStoppingOptions().with_monitor("val_loss").with_patience(1));
    FitRun r = run(options().with_max_epochs(10).with_check_val_every_n_epoch(2).with_callback(es), indices(4, 2),
                   indices(4, 4), std::make_shared<Probe>([](int64_t) { return 5.0; }));
    EXPECT_EQ(r.trainer->global_step(), 8);
    EXPECT_EQ(r.trainer->current_epoch(), 4);
    EXPECT_EQ(r.record->validations, Steps({4, 8}));
  }
}

// Item 13 ("13_sanity"): two sanity batches before training, neither
// logged nor saved on; the default ModelCheckpoint writes into the
// logger's version folder.
TEST(LightningLoopTest, SanityValidationAndTheLoggersCheckpointFolder) {
  TempDir dir("csv13");
  auto logger = std::make_shared<strata::trainer::CSVLogger>(dir.path, "csv13");
  FitRun r = run(options().with_max_epochs(1).with_num_sanity_val_steps(2).with_logger(logger)
                  .with_enable_checkpointing(true).with_log_every_n_steps(1),
              indices(8, 4), indices(16, 4));
  EXPECT_EQ(r.module->sanity_batches, 2);
  EXPECT_EQ(r.module->val_batches, 4);
  EXPECT_EQ(r.record->sanity, 1);
  EXPECT_EQ(r.record->validations, Steps({2}));
  const auto rows = read_csv(logger->metrics_file());
  ASSERT_EQ(rows.size(), 5u);
  EXPECT_EQ(rows[0], std::vector<std::string>({"epoch", "step", "train_loss_epoch", "train_loss_step", "val_loss"}));
  EXPECT_EQ(rows[3][1], "1");
  EXPECT_EQ(rows[3][4], "102");
  for (const auto& row : rows) EXPECT_NE(row.back(), "100") << "a sanity value was logged";
  const std::string folder = dir.path + "/csv13/version_0/checkpoints";
  EXPECT_EQ(r.trainer->checkpoint_callback()->dirpath(), folder);
  EXPECT_EQ(files_in(folder), std::set<std::string>({"epoch=0-step=2.ckpt"}));
  EXPECT_FALSE(fs::exists(fs::path(r.trainer->options().default_root_dir) / "checkpoints" / "epoch=0-step=2.ckpt"));
}

// Item 15 ("15_fast_dev_run_2").
TEST(LightningLoopTest, FastDevRunRunsNBatchesAndWritesNothing) {
  TempDir dir("fdr");
  auto logger = std::make_shared<strata::trainer::CSVLogger>(dir.path, "csv15");
  FitRun r = run(options().with_max_epochs(5).with_fast_dev_run(2).with_logger(logger).with_enable_checkpointing(true)
                  .with_num_sanity_val_steps(2).with_default_root_dir(dir.path),
              indices(10, 1), indices(4, 1));
  EXPECT_EQ(r.trainer->global_step(), 2);
  EXPECT_EQ(r.trainer->current_epoch(), 1);
  EXPECT_EQ(r.module->val_batches, 2);
  EXPECT_EQ(r.module->sanity_batches, 0);
  EXPECT_EQ(r.record->validations, Steps({2}));
  EXPECT_FALSE(fs::exists(dir.path + "/csv15"));
  EXPECT_FALSE(fs::exists(dir.path + "/checkpoints"));
}

// Item 15 ("15_overfit_batches_2"): the first 2 batches of each loader,
// unshuffled, every epoch.
TEST(LightningLoopTest, OverfitBatchesTrainsAndValidatesOnTheFirstBatches) {
  at::Tensor x = at::arange(20, at::kFloat).unsqueeze(1);
  auto train = std::make_shared<strata::data::TensorDataset>(x, x.clone());
  auto val = std::make_shared<strata::data::TensorDataset>(x + 100, x.clone());
  FitRun r = run(options().with_max_epochs(2).with_overfit_batches(2),
              strata::DataSource(train, strata::DataOptions().with_batch_size(2).with_shuffle(true)),
              strata::DataSource(val, strata::DataOptions().with_batch_size(2)));
  EXPECT_EQ(r.trainer->global_step(), 4);
  EXPECT_EQ(r.trainer->current_epoch(), 2);
  EXPECT_EQ(r.record->validations, Steps({2, 4}));
  std::vector<std::pair<std::string, std::vector<float>>> seen;
  for (const auto& [what, t] : r.module->seen) {
    seen.emplace_back(what, std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + t.numel()));
  }
  using Seen = std::vector<std::pair<std::string, std::vector<float>>>;
  const Seen epoch = {{"train", {0, 1}}, {"train", {2, 3}}, {"val", {100, 101}}, {"val", {102, 103}}};
  Seen both = epoch;
  both.insert(both.end(), epoch.begin(), epoch.end());
  EXPECT_EQ(seen, both);
}

// ---- issue 41's items 1-3, decided by Lightning as the test runs ------------

// ModelCheckpoint's state inside the checkpoint folder `ckpt`.
nlohmann::json model_checkpoint_state(const std::string& ckpt) {
  const nlohmann::json callbacks =
      read_json(ckpt + "/" + strata::checkpoint::kMetadataFile)["entries"]["trainer"]["value"]["callbacks"];
  for (const auto& [key, value] : callbacks.items()) {
    if (key.rfind("ModelCheckpoint", 0) == 0) return value;
  }
  return nullptr;
}

std::set<std::string> string_set(const nlohmann::json& list) {
  std::set<std::string> out;
  for (const auto& item : list) out.insert(item.get<std::string>());
  return out;
}

// Item 1 ("same_step_same_state"): the ranked file and last.ckpt written at
// one step (the third epoch's end, save_last, top -1) hold the same
// ModelCheckpoint state when Lightning's two files do.
void expect_same_step_same_state(const nlohmann::json& lightning) {
  TempDir dir("same-step");
  auto mc = checkpoint(
      strata::trainer::ModelCheckpointOptions().with_dirpath(dir.path).with_save_last(true).with_save_top_k(-1));
  run(options().with_max_epochs(3).with_callback(mc), indices(40, 4), std::nullopt);
  EXPECT_EQ(files_in(dir.path), string_set(lightning["files"]));
  const nlohmann::json ranked_state = model_checkpoint_state(dir.path + "/epoch=2-step=30.ckpt");
  const nlohmann::json last_state = model_checkpoint_state(dir.path + "/last.ckpt");
  ASSERT_FALSE(ranked_state.is_null());
  EXPECT_EQ(ranked_state == last_state, lightning["equal"].get<bool>()) << ranked_state.dump() << "\n"
                                                                        << last_state.dump();
}

// Item 2 ("save_last_top_0", "save_last_monitor_missing"): with save_last, a
// fit that saved nothing (save_top_k 0, or a monitored metric that never
// appeared) leaves the files Lightning's leaves, and last_model_path names
// the same file.
void expect_save_last_at_the_end(const nlohmann::json& top_0, const nlohmann::json& monitor_missing) {
  {
    TempDir dir("save-last-top-0");
    auto mc = checkpoint(
        strata::trainer::ModelCheckpointOptions().with_dirpath(dir.path).with_save_last(true).with_save_top_k(0));
    FitRun r = run(options().with_max_epochs(2).with_callback(mc), indices(8, 4), std::nullopt);
    EXPECT_EQ(r.trainer->global_step(), top_0["global_step"].get<int64_t>());
    EXPECT_EQ(files_in(dir.path), string_set(top_0["files"]));
    EXPECT_EQ(fs::path(mc->last_model_path()).filename(), top_0["last"].get<std::string>());
  }
  {
    TempDir dir("save-last-monitor-missing");
    auto mc = checkpoint(strata::trainer::ModelCheckpointOptions().with_dirpath(dir.path).with_monitor("val_nope")
                             .with_save_last(true).with_save_top_k(1));
    run(options().with_max_epochs(2).with_callback(mc), indices(8, 4), std::nullopt);
    EXPECT_EQ(files_in(dir.path), string_set(monitor_missing["files"]));
    EXPECT_EQ(fs::path(mc->last_model_path()).filename(), monitor_missing["last"].get<std::string>());
  }
}

/// lightning_live_values.py's Probe with `lr`: w = 0.5, b = 0, so both
/// sides log the same losses, and a StepLR(1, 0.5) stepped each "step" or
/// "epoch" (`interval`).
class ScheduledProbe : public Probe {
 public:
  ScheduledProbe(double lr, std::string interval) : lr_(lr), interval_(std::move(interval)) {
    torch::NoGradGuard no_grad;
    linear->weight.fill_(0.5);
    linear->bias.zero_();
  }
  strata::OptimizerConfig configure_optimizers() override {
    auto optimizer = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(lr_));
    return strata::OptimizerConfig(optimizer).with_scheduler(
        strata::trainer::SchedulerConfig(std::make_shared<strata::trainer::StepLR>(*optimizer, 1, 0.5))
            .with_interval(interval_));
  }

 private:
  double lr_;
  std::string interval_;
};

// Item 3: the LearningRateMonitor with accumulate_grad_batches=2 (2
// epochs, validation at each epoch's end) in the run the script describes
// (logging_interval, the scheduler's interval, training batches an epoch,
// log_every_n_steps, the step after which a callback sets should_stop):
// strata's metrics.csv equals
// Lightning's for the same run row by row, the same header, the same cells
// filled, the same numbers (the losses to float32's last bits). Lightning
// writes a whole number as "103.0", strata as "103": cells compare as numbers.
void expect_lr_monitor_rows(const std::string& run_name, const nlohmann::json& lightning) {
  SCOPED_TRACE(run_name);
  TempDir dir(run_name);
  auto logger = std::make_shared<strata::trainer::CSVLogger>(dir.path, run_name);
  strata::TrainerOptions o =
      options().with_max_epochs(2).with_accumulate_grad_batches(2)
          .with_log_every_n_steps(lightning["log_every_n_steps"].get<int64_t>()).with_logger(logger)
          .with_callback(std::make_shared<strata::trainer::LearningRateMonitor>(lightning["interval"].get<std::string>()));
  if (!lightning["stop_at_step"].is_null()) {
    o.with_callback(std::make_shared<StopAtStep>(lightning["stop_at_step"].get<int64_t>()));
  }
  run(o, indices(lightning["batches"].get<int64_t>(), 1), indices(4, 4),
      std::make_shared<ScheduledProbe>(0.1, lightning["scheduler"].get<std::string>()));
  const nlohmann::json& lightning_rows = lightning["rows"];
  const auto rows = read_csv(logger->metrics_file());
  std::string written;
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) written += (c ? "," : "") + row[c];
    written += "\n";
  }
  ASSERT_EQ(rows.size(), lightning_rows.size()) << "strata wrote:\n" << written << "Lightning:\n" << lightning_rows.dump();
  const auto header = lightning_rows[0].get<std::vector<std::string>>();
  ASSERT_EQ(rows[0], header);
  for (size_t r = 1; r < rows.size(); ++r) {
    const auto expected = lightning_rows[r].get<std::vector<std::string>>();
    ASSERT_EQ(rows[r].size(), expected.size()) << "row " << r << "\n" << written;
    for (size_t c = 0; c < expected.size(); ++c) {
      const std::string where = "row " + std::to_string(r) + " column " + header[c] + "\n" + written;
      ASSERT_EQ(rows[r][c].empty(), expected[c].empty()) << where;
      if (expected[c].empty()) continue;
      const double got = std::stod(rows[r][c]), want = std::stod(expected[c]);
      if (header[c].rfind("train_loss", 0) == 0) {
        EXPECT_NEAR(got, want, 1e-6 * std::abs(want)) << where;
      } else {
        EXPECT_EQ(got, want) << where;
      }
    }
  }
}

// Issue 41, items 1-3: one run of lightning_live_values.py (Lightning 2.6.6
// from the project's Python) answers all three, and strata fits the same runs.
TEST(LightningLoopTest, CheckpointStateSaveLastAndLearningRateRowsAreWhatLightningDoesOnTheSameRuns) {
  if (strata::testing::project_python().empty()) GTEST_SKIP() << "STRATA_PYTHON is not set: no Lightning to run";
  TempDir dir("lightning-live");
  const strata::testing::Outcome lightning =
      strata::testing::run_python("tests/trainer/lightning_live_values.py", {dir.path});
  if (lightning.status == 77) GTEST_SKIP() << lightning.err;
  ASSERT_EQ(lightning.status, 0) << lightning.err;
  const nlohmann::json answers = nlohmann::json::parse(lightning.out);
  {
    SCOPED_TRACE("item 1: two checkpoints of one step");
    expect_same_step_same_state(answers["same_step_same_state"]);
  }
  {
    SCOPED_TRACE("item 2: save_last when nothing was saved");
    expect_save_last_at_the_end(answers["save_last_top_0"], answers["save_last_monitor_missing"]);
  }
  SCOPED_TRACE("item 3: LearningRateMonitor under accumulation");
  ASSERT_EQ(answers["lr_monitor"].size(), 4u);
  for (const auto& [run_name, lightning_run] : answers["lr_monitor"].items()) expect_lr_monitor_rows(run_name, lightning_run);
}

}  // namespace
