// Resuming with every ModelCheckpoint option: save_top_k 1 (latest), k > 1
// and -1 (all), save_last, monitor modes min and max, every_n_train_steps.
// A run trains, stops (mid-epoch or at an epoch's end), and a new Trainer
// resumes it from ckpt_path="last" at 1 and 2 workers (real worker
// processes). The resumed run continues at the step after the checkpoint,
// and ends with the ModelCheckpoint state (best_k_models ranking,
// best_model_path and score, last_model_path) and the files on disk of a run
// that never stopped. Each resume restores the callback's state through
// ModelCheckpoint::load_state_dict (its ranking of the same folder), which
// used to iterate a destroyed temporary (a SIGSEGV on every resume of
// `strata train --save-top-k`); the last test resumes that command itself.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "strata/checkpoint/directory.h"
#include "support/multiprocess.h"
#include "support/tool.h"
#include "support/worker.h"
#include "trainer_util.h"

namespace {

using namespace strata::testing;
namespace fs = std::filesystem;
using strata::trainer::ModelCheckpoint;
using strata::trainer::ModelCheckpointOptions;

// The monitored value of step s (1-based): distinct for 11 steps in a row,
// in no monotonic order, so the top k changes as the run goes on.
double score_of(int64_t step) { return static_cast<double>((step * 7) % 11); }

/// Regression of y = x that logs "score" = score_of(the step it completes).
class Scored : public strata::TrainModule {
 public:
  Scored() { linear = register_module("linear", torch::nn::Linear(1, 1)); }
  at::Tensor training_step(const strata::data::Batch& b, int64_t) override {
    log("score", at::scalar_tensor(score_of(global_step() + 1), at::kDouble),
        strata::LogOptions().with_on_step(true).with_on_epoch(false));
    return (linear->forward(b.input) - b.target).pow(2).mean() * 1e-3;
  }
  strata::OptimizerConfig configure_optimizers() override {
    return strata::OptimizerConfig(std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01)));
  }
  torch::nn::Linear linear{nullptr};
};

/// The global step a resumed run starts from (its restored position).
class StartStep : public strata::trainer::Callback {
 public:
  std::string state_key() const override { return "StartStep"; }
  void on_train_start(strata::Trainer& trainer, strata::TrainModule&) override { step = trainer.global_step(); }
  int64_t step = -1;
};

struct Case {
  std::string name;
  ModelCheckpointOptions options;  // dirpath set by the run
  int64_t stop_steps;              // the first run's max_steps; 0: it stops after epoch 0
};

// 16 examples in batches of 2: 8 steps an epoch, 2 epochs, 16 steps.
constexpr int64_t kSteps = 16;

std::vector<Case> cases() {
  auto mc = [] { return ModelCheckpointOptions(); };
  return {
      {"TopOneLatestAtEpochEnds", mc().with_save_top_k(1), 0},
      {"TopOneLatestEveryFourSteps", mc().with_save_top_k(1).with_every_n_train_steps(4), 6},
      {"TopThreeByMinEveryStep", mc().with_monitor("score").with_mode("min").with_save_top_k(3)
                                     .with_every_n_train_steps(1), 5},
      {"TopOneByMaxEveryStep", mc().with_monitor("score").with_mode("max").with_save_top_k(1)
                                   .with_every_n_train_steps(1), 5},
      {"AllByMaxEveryTwoSteps", mc().with_monitor("score").with_mode("max").with_save_top_k(-1)
                                    .with_every_n_train_steps(2), 6},
      {"AllLatestEveryThreeSteps", mc().with_save_top_k(-1).with_every_n_train_steps(3), 7},
      {"TopTwoByMinWithLastEveryStep", mc().with_monitor("score").with_mode("min").with_save_top_k(2)
                                           .with_save_last(true).with_every_n_train_steps(1), 5},
  };
}

const Case& case_named(const std::string& name) {
  static const std::vector<Case> all = cases();
  for (const Case& c : all) {
    if (c.name == name) return c;
  }
  throw std::runtime_error("no case " + name);
}

nlohmann::json score_json(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); }
std::string file_name(const std::string& path) { return path.empty() ? "" : fs::path(path).filename().string(); }

// What a run ends with, by file name (the runs use different folders).
nlohmann::json run_case(const std::string& spec, const Case& c, const std::string& phase, const std::string& dir) {
  auto start = std::make_shared<StartStep>();
  ModelCheckpointOptions options = c.options;
  auto mc = std::make_shared<ModelCheckpoint>(options.with_dirpath(dir));
  strata::TrainerOptions o;
  o.with_strategy(strategy_for(spec))
      .with_enable_progress_bar(false)
      .with_max_epochs(phase == "first" && c.stop_steps == 0 ? 1 : 2)
      .with_callback(start)
      .with_callback(mc)
      .with_collective_timeout(std::chrono::seconds(60));
  if (phase == "first" && c.stop_steps > 0) o.with_max_steps(c.stop_steps);
  strata::Trainer trainer(o);
  trainer.fit(std::make_shared<Scored>(), strata::DataSource(index_dataset(16), strata::DataOptions().with_batch_size(2)),
              std::nullopt, phase == "resume" ? "last" : "");
  nlohmann::json best_k = nlohmann::json::object();
  for (const auto& [path, v] : mc->best_k_models()) best_k[file_name(path)] = score_json(v);
  return {{"best_k_models", best_k},
          {"best_model_path", file_name(mc->best_model_path())},
          {"best_model_score", mc->best_model_score() ? score_json(*mc->best_model_score()) : nlohmann::json(nullptr)},
          {"last_model_path", file_name(mc->last_model_path())},
          {"global_step", trainer.global_step()},
          {"start_step", start->step}};
}

STRATA_WORKER(model_checkpoint_resume_case) {
  // args: out, case, phase, checkpoint dir
  nlohmann::json r = run_case("ddp", case_named(args.at(1)), args.at(2), args.at(3));
  write_json(args.at(0) + "." + std::getenv("RANK"), r);
  return 0;
}

std::set<std::string> files_in(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// The global step of the newest checkpoint in `dir` (what "last" takes).
int64_t newest_step(const std::string& dir) {
  int64_t newest = -1;
  for (const std::string& name : files_in(dir)) {
    const nlohmann::json meta = read_json(dir + "/" + name + "/" + strata::checkpoint::kMetadataFile);
    newest = std::max<int64_t>(newest, meta["entries"]["trainer"]["value"]["global_step"].get<int64_t>());
  }
  return newest;
}

class ModelCheckpointResumeTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(ModelCheckpointResumeTest, ResumedRunKeepsTheRankingAndFilesOfAnUninterruptedRun) {
  const auto [name, world] = GetParam();
  const Case& c = case_named(name);
  TempDir dir("mc-resume");
  // The reference: one process, never stopped.
  const nlohmann::json full = run_case("single", c, "full", dir.path + "/full");
  EXPECT_EQ(full["global_step"], kSteps);

  const std::string ckpt = dir.path + "/ckpt";
  const std::string out = dir.path + "/result";
  auto run = [&](const std::string& phase) {
    if (world == 1) return run_case("single", c, phase, ckpt);
    auto r = run_workers(world, "model_checkpoint_resume_case", {out, name, phase, ckpt});
    EXPECT_TRUE(r.ok()) << r.launch.summary << "\n" << r.output;
    // Every rank keeps the same state (Note [Rank 0 decides]).
    const nlohmann::json rank0 = read_json(out + ".0");
    for (int rank = 1; rank < world; ++rank) EXPECT_EQ(read_json(out + "." + std::to_string(rank)), rank0);
    return rank0;
  };
  const nlohmann::json first = run("first");
  EXPECT_EQ(first["global_step"], c.stop_steps > 0 ? c.stop_steps : kSteps / 2);
  const int64_t saved = newest_step(ckpt);
  ASSERT_GT(saved, 0) << "the first run saved nothing";

  const nlohmann::json resumed = run("resume");
  EXPECT_EQ(resumed["start_step"], saved) << "the resumed run continues after the newest checkpoint";
  EXPECT_EQ(resumed["global_step"], kSteps);
  for (const char* field : {"best_k_models", "best_model_path", "best_model_score", "last_model_path"}) {
    EXPECT_EQ(resumed[field], full[field]) << field;
  }
  EXPECT_EQ(files_in(ckpt), files_in(dir.path + "/full")) << "the checkpoints on disk";
}

INSTANTIATE_TEST_SUITE_P(Options, ModelCheckpointResumeTest,
                         ::testing::Combine(::testing::Values("TopOneLatestAtEpochEnds", "TopOneLatestEveryFourSteps",
                                                              "TopThreeByMinEveryStep", "TopOneByMaxEveryStep",
                                                              "AllByMaxEveryTwoSteps", "AllLatestEveryThreeSteps",
                                                              "TopTwoByMinWithLastEveryStep"),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "Workers";
                         });

// The uninterrupted runs themselves hold what the options promise (so the
// comparison above is against a right answer): scores of steps 1..16 are
// 7 3 10 6 2 9 5 1 8 4 0 7 3 10 6 2.
TEST(ModelCheckpointResumeTest, UninterruptedRunsKeepWhatEachOptionPromises) {
  auto ranked = [](const nlohmann::json& r) {
    std::map<std::string, double> out;
    for (const auto& [k, v] : r["best_k_models"].items()) out[k] = v.get<double>();
    return out;
  };
  TempDir dir("mc-options");
  nlohmann::json r = run_case("single", case_named("TopOneLatestAtEpochEnds"), "full", dir.path + "/a");
  EXPECT_EQ(r["best_model_path"], "epoch=1-step=16.ckpt");
  EXPECT_EQ(files_in(dir.path + "/a"), std::set<std::string>({"epoch=1-step=16.ckpt"}));
  r = run_case("single", case_named("TopThreeByMinEveryStep"), "full", dir.path + "/b");
  // Step 16 ties step 5's 2 and does not displace it (strictly better only).
  EXPECT_EQ(ranked(r), (std::map<std::string, double>{
                           {"epoch=0-step=5.ckpt", 2}, {"epoch=0-step=8.ckpt", 1}, {"epoch=1-step=11.ckpt", 0}}));
  EXPECT_EQ(r["best_model_path"], "epoch=1-step=11.ckpt");
  EXPECT_EQ(r["best_model_score"], 0.0);
  r = run_case("single", case_named("TopOneByMaxEveryStep"), "full", dir.path + "/c");
  EXPECT_EQ(ranked(r), (std::map<std::string, double>{{"epoch=0-step=3.ckpt", 10}}));
  r = run_case("single", case_named("AllByMaxEveryTwoSteps"), "full", dir.path + "/d");
  EXPECT_EQ(ranked(r).size(), 8u);
  r = run_case("single", case_named("AllLatestEveryThreeSteps"), "full", dir.path + "/e");
  EXPECT_EQ(files_in(dir.path + "/e"),
            std::set<std::string>({"epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt", "epoch=1-step=9.ckpt",
                                   "epoch=1-step=12.ckpt", "epoch=1-step=15.ckpt"}));
  r = run_case("single", case_named("TopTwoByMinWithLastEveryStep"), "full", dir.path + "/f");
  EXPECT_EQ(ranked(r), (std::map<std::string, double>{{"epoch=0-step=8.ckpt", 1}, {"epoch=1-step=11.ckpt", 0}}));
  EXPECT_EQ(r["last_model_path"], "last.ckpt");
  EXPECT_EQ(files_in(dir.path + "/f"),
            std::set<std::string>({"epoch=0-step=8.ckpt", "epoch=1-step=11.ckpt", "last.ckpt"}));
}

// The command of the report: `strata train --save-top-k 1` in its own
// --ckpt-dir, then `--resume latest`, at 1 and 2 devices. Saves every 3
// steps and validates every 2, so the checkpoint resumed from (step 4, the
// final save after step 4's validation) holds the best ranking as it stands
// on disk; the resumed run validates at step 6 and keeps one best.
class StrataTrainSaveTopKTest : public ::testing::TestWithParam<int> {};

TEST_P(StrataTrainSaveTopKTest, ResumeLatestContinuesTheRunAndItsRanking) {
  if (!fs::exists(strata_binary())) GTEST_SKIP() << "the strata tool is not built (" << strata_binary() << ")";
  const int devices = GetParam();
  TempDir dir("train-topk");
  const std::string ckpt = dir.path + "/ckpt";
  auto train = [&](int steps, bool resume) {
    std::vector<std::string> args = {"train", "--model-size", "tiny", "--seq-len", "16", "--batch-size", "4",
                                     "--max-steps", std::to_string(steps), "--val-every", "2", "--val-batches", "1",
                                     "--ckpt-dir", ckpt, "--ckpt-every", "3", "--save-top-k", "1",
                                     "--sample-tokens", "0", "--devices", std::to_string(devices)};
    if (resume) args.insert(args.end(), {"--resume", "latest"});
    return run_strata(args);
  };
  Outcome first = train(4, false);
  ASSERT_EQ(first.status, 0) << first.out << first.err;
  ASSERT_TRUE(fs::exists(ckpt + "/step-00000004"));
  const nlohmann::json saved = read_json(ckpt + "/step-00000004/" + strata::checkpoint::kMetadataFile);
  const std::string best_key = "ModelCheckpoint{monitor=val_loss, mode=min, every_n_train_steps=0, every_n_epochs=-1}";
  const nlohmann::json best_state = saved["entries"]["trainer"]["value"]["callbacks"][best_key];
  ASSERT_EQ(best_state["best_k_models"].size(), 1u);
  EXPECT_EQ(files_in(ckpt + "/best"), std::set<std::string>({file_name(best_state["best_model_path"].get<std::string>())}));

  Outcome resumed = train(6, true);
  ASSERT_EQ(resumed.status, 0) << "exit " << resumed.status << "\n" << resumed.out << resumed.err;
  EXPECT_NE(resumed.out.find("resumed from " + ckpt + "/step-00000004 at step 4"), std::string::npos) << resumed.out;
  EXPECT_TRUE(fs::exists(ckpt + "/step-00000006"));
  // One best checkpoint: the first run's, or step 6's if its validation did
  // better (the names carry the loss, rounded to 4 places).
  const std::set<std::string> best = files_in(ckpt + "/best");
  ASSERT_EQ(best.size(), 1u) << "save_top_k 1 keeps one";
  const std::string name = *best.begin();
  const double loss = std::stod(name.substr(name.rfind('-') + 1));
  EXPECT_LE(loss, best_state["best_model_score"].get<double>() + 1e-4) << name;
  if (name != file_name(best_state["best_model_path"].get<std::string>())) EXPECT_EQ(name.rfind("step-00000006-", 0), 0u);
}

INSTANTIATE_TEST_SUITE_P(Devices, StrataTrainSaveTopKTest, ::testing::Values(1, 2),
                         [](const auto& info) { return std::to_string(info.param) + "Devices"; });

}  // namespace
