// A Trainer checkpoint's state is untrusted input. A short run writes a
// real checkpoint; each case rewrites one field of its "trainer" value and
// resumes from it: the resume fails with the exact tagged CheckpointError
// (the checkpoint, the field, the value, what was expected), and neither
// the checkpoint folder nor a victim folder beside it changes. `strata ckpt
// inspect` and `verify` refuse the same states with the same message, except
// those only the run can judge (batches_done against the data's batch
// count, the configured schedulers, the files on disk), which they accept.
// Last, the removal itself: Strategy::remove_checkpoint refuses any path
// that is not an entry directly inside the folder it is given.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <map>

#include "strata/checkpoint/directory.h"
#include "strata/trainer/trainer_state.h"
#include "support/errors.h"
#include "support/tool.h"
#include "trainer_util.h"

namespace {

using namespace strata::testing;
using ::testing::HasSubstr;
namespace fs = std::filesystem;
using nlohmann::json;

double score_of(int64_t step) { return static_cast<double>((step * 7) % 11); }

/// Regression of y = x with a step scheduler; logs "score" per step and
/// for the epoch (so the checkpoint holds the epoch's running values).
class Scheduled : public strata::TrainModule {
 public:
  Scheduled() { linear = register_module("linear", torch::nn::Linear(1, 1)); }
  at::Tensor training_step(const strata::data::Batch& b, int64_t) override {
    log("score", at::scalar_tensor(score_of(global_step() + 1), at::kDouble),
        strata::LogOptions().with_on_step(true).with_on_epoch(true));
    return (linear->forward(b.input) - b.target).pow(2).mean() * 1e-3;
  }
  strata::OptimizerConfig configure_optimizers() override {
    auto opt = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01));
    return strata::OptimizerConfig(opt).with_scheduler(
        strata::trainer::SchedulerConfig(std::make_shared<strata::trainer::StepLR>(*opt, 2, 0.5)).with_interval("step"));
  }
  torch::nn::Linear linear{nullptr};
};

const std::string kMcKey = "ModelCheckpoint{monitor=score, mode=min, every_n_train_steps=1, every_n_epochs=-1}";
const std::string kEsKey = "EarlyStopping{monitor=score, mode=min}";

// Where a case's checkpoint lies: `ckpt` in the callback's folder `dir`,
// and `victim`, a folder beside it that must survive.
struct Paths {
  std::string root, dir, ckpt, victim;
};

/// A callback that runs `fn` when training starts (with the strategy up).
class AtTrainStart : public strata::trainer::Callback {
 public:
  explicit AtTrainStart(std::function<void(strata::Trainer&)> fn) : fn_(std::move(fn)) {}
  std::string state_key() const override { return "AtTrainStart"; }
  void on_train_start(strata::Trainer& trainer, strata::TrainModule&) override { fn_(trainer); }

 private:
  std::function<void(strata::Trainer&)> fn_;
};

// Trains 16 examples in batches of 2 (8 batches an epoch) with a top-2
// ModelCheckpoint (and last.ckpt), EarlyStopping and a Timer, for
// `max_steps`, resuming from `ckpt_path` when given.
void train(const Paths& p, int64_t max_steps, const std::string& ckpt_path = "",
           std::shared_ptr<strata::trainer::Callback> extra = nullptr) {
  strata::TrainerOptions o;
  o.with_enable_progress_bar(false)
      .with_max_epochs(2)
      .with_max_time(std::chrono::hours(1))
      .with_callback(std::make_shared<strata::trainer::ModelCheckpoint>(strata::trainer::ModelCheckpointOptions()
                                                                            .with_dirpath(p.dir)
                                                                            .with_monitor("score")
                                                                            .with_save_top_k(2)
                                                                            .with_save_last(true)
                                                                            .with_every_n_train_steps(1)))
      .with_callback(std::make_shared<strata::trainer::EarlyStopping>(
          strata::trainer::EarlyStoppingOptions().with_monitor("score").with_patience(100)))
      .with_collective_timeout(std::chrono::seconds(60));
  if (extra) o.with_callback(extra);
  if (max_steps > 0) o.with_max_steps(max_steps);
  strata::Trainer trainer(o);
  trainer.fit(std::make_shared<Scheduled>(),
              strata::DataSource(index_dataset(16), strata::DataOptions().with_batch_size(2)), std::nullopt,
              ckpt_path);
}

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Every entry under `root` with its bytes (links: "->target").
std::map<std::string, std::string> snapshot(const std::string& root) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    const std::string p = e.path().string();
    if (e.is_symlink()) out[p] = "->" + fs::read_symlink(e.path()).string();
    else if (e.is_regular_file()) out[p] = bytes_of(p);
    else out[p] = "<dir>";
  }
  return out;
}

struct Case {
  std::string name;
  std::function<void(json& value, const Paths& p)> edit;
  std::function<std::string(const Paths& p)> message;
  bool inspect_refuses = true;  // false: only the run can judge it
};

std::string head(const Paths& p) { return "[trainer] " + p.ckpt + ": trainer state "; }
std::string mc_field(const std::string& field) { return "callbacks[" + json(kMcKey).dump() + "]." + field; }

std::vector<Case> cases() {
  const std::string counts = "; expected an integer from 0 to 10000000000";
  return {
      {"BatchesDoneOfATrillion", [](json& v, const Paths&) { v["loops"]["fit"]["batches_done"] = 1'000'000'000'000; },
       [=](const Paths& p) { return head(p) + "loops.fit.batches_done is 1000000000000" + counts; }},
      {"BatchesDonePastTheEpoch", [](json& v, const Paths&) { v["loops"]["fit"]["batches_done"] = 9; },
       [](const Paths& p) {
         return head(p) + "loops.fit.batches_done is 9; expected an integer from 0 to 8, the batches of an epoch of "
                          "this training data (after limit_train_batches): the checkpoint was written for other data, "
                          "or is damaged; resume from a checkpoint of this run";
       },
       false},
      {"FormatFive", [](json& v, const Paths&) { v["format"] = 5; },
       [](const Paths& p) {
         return head(p) + "format is 5; expected \"strata-trainer\" (the 'trainer' entry of a Trainer checkpoint)";
       }},
      {"LoopsAString", [](json& v, const Paths&) { v["loops"] = "x"; },
       [](const Paths& p) { return head(p) + "loops is \"x\"; expected an object with the loop 'fit'"; }},
      {"LrSchedulersRenamed",
       [](json& v, const Paths&) {
         v["lr_schedulerz"] = v["lr_schedulers"];
         v.erase("lr_schedulers");
       },
       [](const Paths& p) {
         return "[trainer] " + p.ckpt + ": trainer state has an unknown field \"lr_schedulerz\"; expected only the "
                "fields format, version, epoch, global_step, loops, lr_schedulers, callbacks, module_extra, hparams";
       }},
      {"SchedulerFieldRenamed",
       [](json& v, const Paths&) {
         v["lr_schedulers"][0]["last_epok"] = v["lr_schedulers"][0]["last_epoch"];
         v["lr_schedulers"][0].erase("last_epoch");
       },
       [](const Paths& p) {
         return head(p) + "lr_schedulers[0] has an unknown field \"last_epok\"; expected only the fields type, "
                          "last_epoch, base_lrs";
       }},
      {"SchedulerMissing", [](json& v, const Paths&) { v["lr_schedulers"] = json::array(); },
       [](const Paths& p) {
         return head(p) + "lr_schedulers holds 0 scheduler state(s); expected 1, one per scheduler "
                          "configure_optimizers made";
       },
       false},
      {"SchedulerOfAnotherType", [](json& v, const Paths&) { v["lr_schedulers"][0]["type"] = "CosineAnnealingLR"; },
       [](const Paths& p) {
         return head(p) + "lr_schedulers[0]: StepLR state type is \"CosineAnnealingLR\"; expected \"StepLR\", the "
                          "scheduler configure_optimizers made";
       },
       false},
      {"SchedulerStepNegative", [](json& v, const Paths&) { v["lr_schedulers"][0]["last_epoch"] = -1; },
       [=](const Paths& p) { return head(p) + "lr_schedulers[0].last_epoch is -1" + counts; }},
      {"SchedulerRateNegative", [](json& v, const Paths&) { v["lr_schedulers"][0]["base_lrs"][0] = -0.5; },
       [](const Paths& p) { return head(p) + "lr_schedulers[0].base_lrs[0] is -0.5; expected a finite number >= 0"; }},
      {"SchedulerRatesOfAnotherOptimizer", [](json& v, const Paths&) { v["lr_schedulers"][0]["base_lrs"] = {0.1, 0.2}; },
       [](const Paths& p) {
         return head(p) + "lr_schedulers[0]: StepLR state base_lrs lists 2 rate(s); expected one per param group of "
                          "its optimizer (1)";
       },
       false},
      {"EarlyStoppingWaitCountMinusFive", [](json& v, const Paths&) { v["callbacks"][kEsKey]["wait_count"] = -5; },
       [=](const Paths& p) {
         return head(p) + "callbacks[" + json(kEsKey).dump() + "].wait_count is -5" + counts;
       }},
      {"EarlyStoppingBestAString", [](json& v, const Paths&) { v["callbacks"][kEsKey]["best_score"] = "low"; },
       [](const Paths& p) {
         return head(p) + "callbacks[" + json(kEsKey).dump() + "].best_score is \"low\"; expected a number, or null "
                          "for none";
       }},
      {"WorldSizeZero", [](json& v, const Paths&) { v["loops"]["fit"]["world_size"] = 0; },
       [](const Paths& p) { return head(p) + "loops.fit.world_size is 0; expected an integer from 1 to 1048576"; }},
      // A negative or fractional top-level epoch or step is refused by the
      // checkpoint reader already (Note [Entries are checked on open]).
      {"EpochNegative", [](json& v, const Paths&) { v["epoch"] = -1; },
       [](const Paths& p) {
         return "[checkpoint] " + p.ckpt + "/metadata.json: entries['trainer'].value.epoch is -1; expected an "
                "integer from 0 to 9007199254740991";
       }},
      {"GlobalStepFractional", [](json& v, const Paths&) { v["global_step"] = 2.5; },
       [](const Paths& p) {
         return "[checkpoint] " + p.ckpt + "/metadata.json: entries['trainer'].value.global_step is 2.5; expected "
                "an integer from 0 to 9007199254740991";
       }},
      {"EpochOfAHundredBillion", [](json& v, const Paths&) { v["epoch"] = 100'000'000'000; },
       [=](const Paths& p) { return head(p) + "epoch is 100000000000" + counts; }},
      {"GlobalStepMissing", [](json& v, const Paths&) { v.erase("global_step"); },
       [=](const Paths& p) { return head(p) + "global_step is missing" + counts; }},
      {"VersionOfANewerStrata", [](json& v, const Paths&) { v["version"] = 2; },
       [](const Paths& p) {
         return head(p) + "version is 2; expected an integer from 1 to 1 (a newer strata wrote this checkpoint: "
                          "resume it with that version)";
       }},
      {"EpochDoneAString", [](json& v, const Paths&) { v["loops"]["fit"]["epoch_done"] = "no"; },
       [](const Paths& p) { return head(p) + "loops.fit.epoch_done is \"no\"; expected true or false"; }},
      {"ResultsWeightNegative", [](json& v, const Paths&) { v["loops"]["fit"]["results"]["score"]["weight"] = -3; },
       [](const Paths& p) {
         return head(p) + "loops.fit.results[\"score\"].weight is -3; expected a number >= 0";
       }},
      {"ResultsReduceUnknown", [](json& v, const Paths&) { v["loops"]["fit"]["results"]["score"]["reduce"] = "median"; },
       [](const Paths& p) {
         return head(p) + "loops.fit.results[\"score\"].reduce is \"median\"; expected one of \"mean\", \"sum\", "
                          "\"max\", \"min\"";
       }},
      {"TimerElapsedNegative", [](json& v, const Paths&) { v["callbacks"]["Timer"]["time_elapsed"] = -1; },
       [](const Paths& p) {
         return head(p) + "callbacks[\"Timer\"].time_elapsed is -1; expected seconds from 0 to 10000000000.0";
       }},
      {"LastSavedStepMinusTwo", [](json& v, const Paths&) { v["callbacks"][kMcKey]["last_saved_step"] = -2; },
       [](const Paths& p) {
         return head(p) + mc_field("last_saved_step") + " is -2; expected an integer from -1 to 10000000000";
       }},
      {"BestModelScoreAString", [](json& v, const Paths&) { v["callbacks"][kMcKey]["best_model_score"] = "x"; },
       [](const Paths& p) {
         return head(p) + mc_field("best_model_score") + " is \"x\"; expected a number, or null for none";
       }},
      {"MonitorOfAnotherMetric", [](json& v, const Paths&) { v["callbacks"][kMcKey]["monitor"] = "loss"; },
       [](const Paths& p) {
         return head(p) + "callbacks[" + json(kMcKey).dump() +
                "]: ModelCheckpoint state monitor is \"loss\"; expected \"score\", the monitor its state_key names";
       },
       false},
      {"HparamsNotAnObject", [](json& v, const Paths&) { v["hparams"] = json::array({"lr", 5}); },
       [](const Paths& p) {
         return head(p) + "hparams is [\"lr\",5]; expected an object (the module's hyperparameters by name)";
       }},
      {"ModuleExtraAnArray", [](json& v, const Paths&) { v["module_extra"] = json::array(); },
       [](const Paths& p) {
         return head(p) + "module_extra is []; expected an object (what the module's on_save_checkpoint added)";
       }},
      {"CallbacksAnArray", [](json& v, const Paths&) { v["callbacks"] = json::array(); },
       [](const Paths& p) {
         return head(p) + "callbacks is []; expected an object of at most 1024 callback states by state_key";
       }},
      // The paths ModelCheckpoint deletes when they leave its top k.
      {"BestKModelOutsideTheFolder", [](json& v, const Paths& p) { v["callbacks"][kMcKey]["best_k_models"][p.victim] = 0.5; },
       [](const Paths& p) {
         return head(p) + mc_field("best_k_models[" + json(p.victim).dump() + "]") + " is " + json(p.victim).dump() +
                "; expected a checkpoint directly inside the callback's dirpath " + json(p.dir).dump() +
                " (ModelCheckpoint deletes the checkpoints it ranks; none may lie elsewhere)";
       }},
      {"BestKModelThroughDotDot",
       [](json& v, const Paths& p) { v["callbacks"][kMcKey]["best_k_models"][p.dir + "/../victim"] = 0.5; },
       [](const Paths& p) {
         const std::string up = json(p.dir + "/../victim").dump();
         return head(p) + mc_field("best_k_models[" + up + "]") + " is " + up +
                "; expected a checkpoint directly inside the callback's dirpath " + json(p.dir).dump() +
                " (ModelCheckpoint deletes the checkpoints it ranks; none may lie elsewhere)";
       }},
      {"BestKModelALinkToAnotherFolder",
       [](json& v, const Paths& p) { v["callbacks"][kMcKey]["best_k_models"][p.dir + "/link"] = 0.5; },
       [](const Paths& p) {
         return head(p) + "callbacks[" + json(kMcKey).dump() + "]: ModelCheckpoint state best_k_models[" +
                json(p.dir + "/link").dump() + "] is '" + p.dir + "/link', a symbolic link; expected a checkpoint "
                "ModelCheckpoint wrote in its folder '" + p.dir + "' (the checkpoint is refused; nothing was deleted)";
       },
       false},
      {"BestModelPathOutsideTheFolder",
       [](json& v, const Paths& p) { v["callbacks"][kMcKey]["best_model_path"] = p.victim; },
       [](const Paths& p) {
         return head(p) + mc_field("best_model_path") + " is " + json(p.victim).dump() +
                "; expected \"\" or a checkpoint directly inside the callback's dirpath " + json(p.dir).dump() +
                " (ModelCheckpoint deletes the checkpoints it ranks; none may lie elsewhere)";
       }},
  };
}

const Case& case_named(const std::string& name) {
  static const std::vector<Case> all = cases();
  for (const Case& c : all) {
    if (c.name == name) return c;
  }
  throw std::runtime_error("no case " + name);
}

std::vector<std::string> case_names() {
  std::vector<std::string> out;
  for (const Case& c : cases()) out.push_back(c.name);
  return out;
}

class HostileTrainerStateTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    tmp_ = std::make_unique<TempDir>("hostile-state");
    p_.root = tmp_->path;
    p_.dir = p_.root + "/ckpt";
    p_.victim = p_.root + "/victim";
    // Three steps: scores 7, 3, 10; the top 2 are steps 1 and 2, last.ckpt step 3.
    train(p_, 3);
    p_.ckpt = p_.dir + "/last.ckpt";
    ASSERT_TRUE(fs::exists(p_.ckpt));
    fs::create_directories(p_.victim);
    std::ofstream(p_.victim + "/keep.txt") << "must survive";
    fs::create_directory_symlink(p_.victim, p_.dir + "/link");
    const Case& c = case_named(GetParam());
    const std::string meta = p_.ckpt + "/" + strata::checkpoint::kMetadataFile;
    json metadata = read_json(meta);
    json& value = metadata["entries"]["trainer"]["value"];
    strata::trainer::validate_trainer_state(value, p_.ckpt);  // as saved: valid
    c.edit(value, p_);
    write_json(meta, metadata);
  }

  std::unique_ptr<TempDir> tmp_;
  Paths p_;
};

TEST_P(HostileTrainerStateTest, ResumeRefusesItWithTheTaggedMessageAndTouchesNothing) {
  const auto before = snapshot(p_.root);
  const std::string message = error_message<strata::CheckpointError>([&] { train(p_, 0, p_.ckpt); });
  EXPECT_EQ(message, case_named(GetParam()).message(p_));
  EXPECT_EQ(snapshot(p_.root), before) << "a refused resume must change nothing, inside the folder or beside it";
  EXPECT_TRUE(fs::exists(p_.victim + "/keep.txt"));
}

TEST_P(HostileTrainerStateTest, InspectAndVerifyRefuseWhatNeedsNoRun) {
  if (!fs::exists(strata_binary())) GTEST_SKIP() << "the strata tool is not built (" << strata_binary() << ")";
  const Case& c = case_named(GetParam());
  const auto before = snapshot(p_.root);
  for (const char* command : {"inspect", "verify"}) {
    const Outcome o = run_strata({"ckpt", command, p_.ckpt});
    if (c.inspect_refuses) {
      EXPECT_EQ(o.status, 1) << command << ": " << o.out << o.err;
      EXPECT_EQ(o.err, "strata: error: " + c.message(p_) + "\n") << command;
    } else {
      EXPECT_EQ(o.status, 0) << command << " judges only the checkpoint: " << o.err;
    }
  }
  EXPECT_EQ(snapshot(p_.root), before);
}

INSTANTIATE_TEST_SUITE_P(Fields, HostileTrainerStateTest, ::testing::ValuesIn(case_names()),
                         [](const auto& info) { return info.param; });

TEST(HostileTrainerStateTest, TheUntamperedCheckpointResumesToTheEnd) {
  TempDir tmp("hostile-state-ok");
  Paths p{tmp.path, tmp.path + "/ckpt", tmp.path + "/ckpt/last.ckpt", tmp.path + "/victim"};
  train(p, 3);
  train(p, 0, p.ckpt);
  const json value =
      read_json(p.ckpt + "/" + strata::checkpoint::kMetadataFile)["entries"]["trainer"]["value"];
  EXPECT_EQ(value["global_step"], 16);
}

TEST(HostileTrainerStateTest, RemoveCheckpointRefusesAnyPathNotDirectlyInsideItsFolder) {
  TempDir tmp("hostile-remove");
  Paths p{tmp.path, tmp.path + "/ckpt", "", tmp.path + "/victim"};
  fs::create_directories(p.victim + "/sub");
  std::ofstream(p.victim + "/sub/keep.txt") << "must survive";
  fs::create_directories(p.dir + "/own.ckpt");
  fs::create_directory_symlink(p.victim, p.dir + "/link");
  std::map<std::string, std::string> refusals;
  auto probe = std::make_shared<AtTrainStart>([&](strata::Trainer& trainer) {
    for (const std::string& path : {p.victim, p.dir + "/../victim", p.dir + "/link", p.dir, p.dir + "/.",
                                    p.victim + "/sub"}) {
      refusals[path] = error_message<strata::CheckpointError>(
          [&] { trainer.strategy().remove_checkpoint(path, p.dir); });
    }
    trainer.strategy().remove_checkpoint(p.dir + "/own.ckpt", p.dir);  // inside: removed
  });
  strata::TrainerOptions o;
  o.with_enable_progress_bar(false).with_enable_checkpointing(false).with_max_steps(1).with_callback(probe);
  strata::Trainer trainer(o);
  trainer.fit(std::make_shared<Scheduled>(),
              strata::DataSource(index_dataset(4), strata::DataOptions().with_batch_size(2)));
  const std::string outside = "': it is not an entry directly inside the folder '" + p.dir +
                              "' it was asked to delete in; nothing was removed";
  EXPECT_EQ(refusals[p.victim], "[checkpoint] remove_checkpoint refuses '" + p.victim + outside);
  EXPECT_EQ(refusals[p.dir + "/../victim"], "[checkpoint] remove_checkpoint refuses '" + p.dir + "/../victim" + outside);
  EXPECT_EQ(refusals[p.dir], "[checkpoint] remove_checkpoint refuses '" + p.dir + outside);
  EXPECT_EQ(refusals[p.dir + "/."], "[checkpoint] remove_checkpoint refuses '" + p.dir + "/." + outside);
  EXPECT_EQ(refusals[p.victim + "/sub"], "[checkpoint] remove_checkpoint refuses '" + p.victim + "/sub" + outside);
  EXPECT_EQ(refusals[p.dir + "/link"], "[checkpoint] remove_checkpoint('" + p.dir + "/link') in '" + p.dir +
                                           "': it is a symbolic link, not a checkpoint strata wrote; nothing was "
                                           "removed");
  EXPECT_TRUE(fs::exists(p.victim + "/sub/keep.txt"));
  EXPECT_TRUE(fs::is_symlink(p.dir + "/link"));
  EXPECT_FALSE(fs::exists(p.dir + "/own.ckpt"));
}

}  // namespace
