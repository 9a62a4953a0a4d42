// The Trainer's loops on one process and a few ranks: epoch reduction of
// logged values across batches and ranks, limits and stopping rules,
// predict's order, and the errors bad input gets.
#include <gtest/gtest.h>

#include <cmath>

#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/sharded.h"
#include "support/multiprocess.h"
#include "support/worker.h"
#include "trainer_util.h"

namespace {

using namespace strata::testing;
namespace fs = std::filesystem;

/// Regression of y = x on index data; logs statistics of each batch.
class Probe : public strata::TrainModule {
 public:
  Probe() { linear = register_module("linear", torch::nn::Linear(1, 1)); }
  at::Tensor training_step(const strata::data::Batch& b, int64_t) override {
    at::Tensor x = b.input;
    log("x_mean", x.mean(), strata::LogOptions().with_on_epoch(true).with_sync_dist(sync));
    log("x_mean_local", x.mean(), strata::LogOptions().with_on_step(false).with_on_epoch(true));
    log("x_sum", x.sum(), strata::LogOptions().with_on_epoch(true).with_sync_dist(sync).with_reduce_fx("sum"));
    log("x_max", x.max(), strata::LogOptions().with_on_epoch(true).with_sync_dist(sync).with_reduce_fx("max"));
    at::Tensor loss = (linear->forward(x) - b.target).pow(2).mean() * 1e-3;
    if (nan_at_step > 0 && global_step() + 1 == nan_at_step) loss = loss * std::nan("");
    if (bad_return == "none") return {};
    if (bad_return == "vector") return loss.repeat({2});
    return loss;
  }
  at::Tensor predict_step(const strata::data::Batch& b, int64_t) override { return b.input * 2; }
  strata::OptimizerConfig configure_optimizers() override {
    if (no_optimizer) return {};
    return strata::OptimizerConfig(std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01)));
  }
  torch::nn::Linear linear{nullptr};
  bool sync = true;
  bool no_optimizer = false;
  int64_t nan_at_step = 0;
  std::string bad_return;
};

strata::TrainerOptions quiet() {
  return strata::TrainerOptions()
      .with_enable_progress_bar(false)
      .with_enable_checkpointing(false)
      .with_collective_timeout(std::chrono::seconds(60));
}

strata::DataSource indices(int64_t n, int64_t batch) {
  return strata::DataSource(index_dataset(n), strata::DataOptions().with_batch_size(batch));
}

TEST(TrainerTest, EpochMeanIsWeightedByBatchSize) {
  // 10 examples in batches of 4, 4, 2: the epoch mean of x is the mean of
  // the 10 values (4.5), not the mean of the batch means (5.17).
  strata::Trainer trainer(quiet().with_max_epochs(1));
  trainer.fit(std::make_shared<Probe>(), indices(10, 4));
  const auto& m = trainer.callback_metrics();
  EXPECT_DOUBLE_EQ(m.at("x_mean_epoch"), 4.5);
  EXPECT_DOUBLE_EQ(m.at("x_sum_epoch"), 45.0);
  EXPECT_DOUBLE_EQ(m.at("x_max_epoch"), 9.0);
  EXPECT_DOUBLE_EQ(m.at("x_mean_local"), 4.5);
  // The last step's value under the _step name.
  EXPECT_DOUBLE_EQ(m.at("x_mean_step"), 8.5);
  EXPECT_EQ(trainer.global_step(), 3);
}

STRATA_WORKER(epoch_reduction) {
  strata::Trainer trainer(quiet().with_max_epochs(1));
  trainer.fit(std::make_shared<Probe>(), indices(24, 8));
  write_json(args.at(0) + "." + std::getenv("RANK"), trainer.callback_metrics());
  return 0;
}

TEST(TrainerTest, SyncDistReducesEpochValuesOverEveryRanksExamples) {
  TempDir dir("reduce");
  const int world = 2;
  auto r = run_workers(world, "epoch_reduction", {dir.path + "/m"});
  ASSERT_TRUE(r.ok()) << r.launch.summary << "\n" << r.output;
  for (int rank = 0; rank < world; ++rank) {
    nlohmann::json m = read_json(dir.path + "/m." + std::to_string(rank));
    // Over all 24 examples 0..23, on every rank.
    EXPECT_DOUBLE_EQ(m["x_mean_epoch"].get<double>(), 11.5) << "rank " << rank;
    EXPECT_DOUBLE_EQ(m["x_sum_epoch"].get<double>(), 276.0) << "rank " << rank;
    EXPECT_DOUBLE_EQ(m["x_max_epoch"].get<double>(), 23.0) << "rank " << rank;
    // Unsynced: this rank's own examples (rank r takes r, r + 2, ...).
    EXPECT_DOUBLE_EQ(m["x_mean_local"].get<double>(), rank == 0 ? 11.0 : 12.0) << "rank " << rank;
  }
}

TEST(TrainerTest, LimitsAndStepRulesEndTheRunWhereTheySay) {
  {
    strata::Trainer trainer(quiet().with_max_epochs(3).with_limit_train_batches(2));
    trainer.fit(std::make_shared<Probe>(), indices(40, 4));
    EXPECT_EQ(trainer.global_step(), 6);
    EXPECT_EQ(trainer.current_epoch(), 3);
  }
  {
    strata::Trainer trainer(quiet().with_max_steps(7));
    trainer.fit(std::make_shared<Probe>(), indices(16, 4));  // 4 steps per epoch
    EXPECT_EQ(trainer.global_step(), 7);
    // Lightning counts the epoch stopped inside (lightning_loop_test.cpp).
    EXPECT_EQ(trainer.current_epoch(), 2);
  }
  {
    // 10 batches, 3 per step: steps end after batches 3, 6, 9 and 10.
    strata::Trainer trainer(quiet().with_max_epochs(1).with_accumulate_grad_batches(3));
    trainer.fit(std::make_shared<Probe>(), indices(10, 1));
    EXPECT_EQ(trainer.global_step(), 4);
  }
  {
    // max_time 0: the Timer stops after the first batch.
    strata::Trainer trainer(quiet().with_max_epochs(5).with_max_time(std::chrono::milliseconds(0)));
    trainer.fit(std::make_shared<Probe>(), indices(16, 4));
    EXPECT_EQ(trainer.global_step(), 1);
  }
}

STRATA_WORKER(predict_order) {
  strata::Trainer trainer(quiet());
  at::Tensor out = trainer.predict(std::make_shared<Probe>(), indices(10, 3 * std::stoi(std::getenv("WORLD_SIZE"))));
  if (trainer.is_global_zero()) strata::checkpoint::write_safetensors(args.at(0), {{"out", out}});
  else if (out.defined()) return 3;
  return 0;
}

TEST(TrainerTest, PredictReturnsRowsInDatasetOrderOnRankZero) {
  at::Tensor expected = at::arange(10, at::kFloat).unsqueeze(1) * 2;
  strata::Trainer single(quiet());
  EXPECT_TRUE(at::equal(single.predict(std::make_shared<Probe>(), indices(10, 4)), expected));
  for (int world : {2, 3}) {  // 10 examples do not split evenly: padding is dropped
    TempDir dir("predict");
    auto r = run_workers(world, "predict_order", {dir.path + "/out"});
    ASSERT_TRUE(r.ok()) << r.launch.summary << "\n" << r.output;
    at::Tensor got = strata::checkpoint::SafetensorsFile::open(dir.path + "/out").load("out");
    EXPECT_TRUE(at::equal(got, expected)) << "world " << world << ": " << got;
  }
}

template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TrainerTest, BadInputGetsErrorsNamingWhatIsWrong) {
  auto fit = [](std::shared_ptr<Probe> p, strata::TrainerOptions o = quiet().with_max_epochs(1)) {
    strata::Trainer trainer(o);
    trainer.fit(p, indices(8, 4));
  };
  auto p = std::make_shared<Probe>();
  p->no_optimizer = true;
  EXPECT_NE(error_of([&] { fit(p); }).find("configure_optimizers() returned no optimizer"), std::string::npos);
  p = std::make_shared<Probe>();
  p->bad_return = "none";
  EXPECT_NE(error_of([&] { fit(p); }).find("training_step returned no loss (an undefined tensor) at epoch 0, batch 0"),
            std::string::npos);
  p = std::make_shared<Probe>();
  p->bad_return = "vector";
  EXPECT_NE(error_of([&] { fit(p); }).find("training_step must return a scalar loss, got shape [2]"),
            std::string::npos);
  auto mc = std::make_shared<strata::trainer::ModelCheckpoint>(
      strata::trainer::ModelCheckpointOptions().with_monitor("val_nope"));
  TempDir dir("bad");
  // An error once a validation has run (before, Lightning warns and skips
  // the ranking: lightning_loop_test.cpp).
  std::string e = error_of([&] {
    strata::Trainer trainer(quiet().with_max_epochs(1).with_default_root_dir(dir.path).with_callback(mc));
    trainer.fit(std::make_shared<Probe>(), indices(8, 4), indices(4, 4));
  });
  EXPECT_NE(e.find("monitors 'val_nope', which was never logged; the metrics it can monitor are: epoch, step, x_max, "
                   "x_max_epoch, x_max_step, x_mean, x_mean_epoch, x_mean_local, x_mean_step, x_sum, x_sum_epoch, "
                   "x_sum_step"),
            std::string::npos)
      << e;
  auto es = std::make_shared<strata::trainer::EarlyStopping>(strata::trainer::EarlyStoppingOptions().with_monitor("acc"));
  e = error_of([&] { fit(std::make_shared<Probe>(), quiet().with_max_epochs(1).with_callback(es)); });
  EXPECT_NE(e.find("EarlyStopping monitors 'acc', which was never logged"), std::string::npos) << e;
  e = error_of([&] {
    strata::Trainer trainer(quiet());
    trainer.fit(std::make_shared<Probe>(), indices(8, 4), std::nullopt, dir.path + "/no-such-checkpoint");
  });
  EXPECT_NE(e.find("ckpt_path '" + dir.path + "/no-such-checkpoint' does not exist"), std::string::npos) << e;
  EXPECT_NE(error_of([] { strata::Trainer t(quiet().with_gradient_clip_algorithm("norm2")); })
                .find("gradient_clip_algorithm must be 'norm' or 'value', got 'norm2'"),
            std::string::npos);
  EXPECT_NE(error_of([] { strata::Trainer t(quiet().with_limit_train_batches(1.5)); })
                .find("limit_train_batches as a fraction must be in [0, 1], got 1.5"),
            std::string::npos);
}

TEST(TrainerTest, NanLossStopsAtItsStepAndLeavesTheLastCheckpointUntouched) {
  TempDir dir("nan");
  auto mc = std::make_shared<strata::trainer::ModelCheckpoint>(
      strata::trainer::ModelCheckpointOptions().with_dirpath(dir.path).with_every_n_train_steps(1).with_save_last(true));
  auto p = std::make_shared<Probe>();
  p->nan_at_step = 4;
  strata::Trainer trainer(quiet().with_max_epochs(3).with_callback(mc));
  std::string e = error_of([&] { trainer.fit(p, indices(16, 4)); });
  EXPECT_NE(e.find("the loss is NaN at step 4 (epoch 0, batch 3)"), std::string::npos) << e;
  EXPECT_EQ(trainer.global_step(), 3);
  // last.ckpt holds step 3, whole and finite; no later checkpoint exists.
  const std::string last = dir.path + "/last.ckpt";
  ASSERT_TRUE(strata::checkpoint::is_complete(last));
  auto reader = strata::checkpoint::StateReader::open(last);
  reader.verify_checksums();
  EXPECT_EQ(reader.entries()["trainer"]["value"]["global_step"], 3);
  EXPECT_TRUE(at::isfinite(reader.full("module/linear.weight")).all().item<bool>());
  EXPECT_FALSE(fs::exists(dir.path + "/epoch=0-step=4.ckpt"));
  EXPECT_TRUE(fs::exists(dir.path + "/epoch=0-step=3.ckpt"));
}

TEST(TrainerTest, ValidateAndTestReturnEpochMetrics) {
  struct Eval : Probe {
    at::Tensor validation_step(const strata::data::Batch& b, int64_t) override {
      log("v", b.input.mean());
      return {};
    }
    at::Tensor test_step(const strata::data::Batch& b, int64_t) override {
      log("t", b.input.sum(), strata::LogOptions().with_reduce_fx("sum"));
      return {};
    }
  };
  auto module = std::make_shared<Eval>();
  strata::Trainer trainer(quiet());
  EXPECT_DOUBLE_EQ(trainer.validate(module, indices(10, 4)).at("v"), 4.5);
  EXPECT_DOUBLE_EQ(trainer.test(module, indices(10, 4)).at("t"), 45.0);
  std::string e = error_of([&] { strata::Trainer t(quiet()); t.test(std::make_shared<Probe>(), indices(4, 2)); });
  EXPECT_NE(e.find("test() needs the module to override test_step"), std::string::npos) << e;
}

TEST(TrainerTest, StepSchedulerSetsTheRatesTheLearningRateMonitorLogs) {
  struct Sched : Probe {
    strata::OptimizerConfig configure_optimizers() override {
      auto opt = std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.8));
      return strata::OptimizerConfig(opt).with_scheduler(
          strata::trainer::SchedulerConfig(std::make_shared<strata::trainer::StepLR>(*opt, 2, 0.5)).with_interval("step"));
    }
  };
  struct Capture : strata::trainer::Logger {
    std::string name() const override { return "capture"; }
    std::string log_dir() const override { return ""; }
    void log_metrics(const strata::trainer::Metrics& m, int64_t step) override { rows.emplace_back(step, m); }
    void log_hyperparams(const strata::trainer::Hyperparams&) override {}
    void save() override {}
    void finalize(const std::string& s) override { status = s; }
    std::vector<std::pair<int64_t, strata::trainer::Metrics>> rows;
    std::string status;
  };
  auto capture = std::make_shared<Capture>();
  strata::Trainer trainer(quiet().with_max_epochs(1).with_log_every_n_steps(1).with_logger(capture).with_callback(
      std::make_shared<strata::trainer::LearningRateMonitor>()));
  trainer.fit(std::make_shared<Sched>(), indices(12, 2));  // 6 steps
  std::vector<double> lrs;
  for (const auto& [step, m] : capture->rows) {
    if (m.count("lr-SGD")) lrs.push_back(m.at("lr-SGD"));
  }
  // The rate each step used: 0.8, 0.8, 0.4, 0.4, 0.2, 0.2.
  EXPECT_EQ(lrs, (std::vector<double>{0.8, 0.8, 0.4, 0.4, 0.2, 0.2}));
  EXPECT_EQ(capture->status, "success");
  EXPECT_DOUBLE_EQ(trainer.optimizers().front()->param_groups()[0].options().get_lr(), 0.1);
}

// Note [Warm-up and decay]: the rates, by hand, of a warm-up of 4 steps
// and a decay from 1 to 0.1 ending at step 12; a scheduler restored from
// the state of one at step 7 sets the rates it would.
TEST(TrainerTest, WarmupDecaySchedulesWarmUpThenDecayToTheirFloorAndResumeExactly) {
  torch::nn::Linear layer(2, 2);
  using Decay = strata::trainer::WarmupDecayLR::Decay;
  auto rates = [&](Decay decay) {
    torch::optim::SGD opt(layer->parameters(), torch::optim::SGDOptions(1.0));
    strata::trainer::WarmupDecayLR s(opt, decay, 4, 12, 0.1);
    std::vector<double> out;
    for (int step = 0; step < 14; ++step) {
      out.push_back(s.get_last_lr()[0]);
      s.step();
    }
    return out;
  };
  const std::vector<double> cosine = rates(Decay::kCosine), linear = rates(Decay::kLinear);
  const std::vector<double> constant = rates(Decay::kConstant);
  for (int step = 0; step < 4; ++step) {
    EXPECT_DOUBLE_EQ(cosine[step], (step + 1) / 4.0) << step;
    EXPECT_DOUBLE_EQ(linear[step], (step + 1) / 4.0) << step;
    EXPECT_DOUBLE_EQ(constant[step], (step + 1) / 4.0) << step;
  }
  // Step 4 starts the decay at the base rate; step 8 is half way (0.55 for
  // both); step 6 a quarter: cos(pi/4) for the cosine.
  EXPECT_DOUBLE_EQ(cosine[4], 1.0);
  EXPECT_DOUBLE_EQ(cosine[6], 0.1 + 0.9 * (1 + std::sqrt(0.5)) / 2);
  EXPECT_DOUBLE_EQ(cosine[8], 0.55);
  EXPECT_DOUBLE_EQ(linear[6], 0.1 + 0.9 * 0.75);
  EXPECT_DOUBLE_EQ(linear[8], 0.55);
  for (int step = 12; step < 14; ++step) {
    EXPECT_DOUBLE_EQ(cosine[step], 0.1) << step;
    EXPECT_DOUBLE_EQ(linear[step], 0.1) << step;
  }
  for (int step = 4; step < 14; ++step) EXPECT_DOUBLE_EQ(constant[step], 1.0) << step;

  torch::optim::SGD a(layer->parameters(), torch::optim::SGDOptions(1.0));
  strata::trainer::WarmupDecayLR first(a, Decay::kCosine, 4, 12, 0.1);
  for (int i = 0; i < 7; ++i) first.step();
  torch::optim::SGD b(layer->parameters(), torch::optim::SGDOptions(1.0));
  strata::trainer::WarmupDecayLR second(b, Decay::kCosine, 4, 12, 0.1);
  second.load_state_dict(first.state_dict());
  EXPECT_EQ(second.last_epoch(), 7);
  EXPECT_DOUBLE_EQ(second.get_last_lr()[0], cosine[7]);
  torch::optim::SGD c(layer->parameters(), torch::optim::SGDOptions(1.0));
  strata::trainer::WarmupDecayLR other(c, Decay::kLinear, 4, 12, 0.1);
  EXPECT_NE(error_of([&] { other.load_state_dict(first.state_dict()); })
                .find("WarmupLinearLR state type is \"WarmupCosineLR\""),
            std::string::npos);

  EXPECT_NE(error_of([&] { strata::trainer::WarmupDecayLR(c, Decay::kCosine, -1, 12, 0.1); })
                .find("warmup_steps must be >= 0, got -1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { strata::trainer::WarmupDecayLR(c, Decay::kCosine, 12, 12, 0.1); })
                .find("decay_steps must be greater than warmup_steps (12)"),
            std::string::npos);
  torch::optim::SGD fresh(layer->parameters(), torch::optim::SGDOptions(1.0));
  EXPECT_NE(error_of([&] { strata::trainer::WarmupDecayLR(fresh, Decay::kLinear, 0, 12, 2.0); })
                .find("min_lr 2 is above the base learning rate 1"),
            std::string::npos);
}

TEST(TrainerTest, ProgressBarPrintsPlainLinesWhenNotOnATerminal) {
  testing::internal::CaptureStdout();
  {
    strata::Trainer trainer(quiet().with_max_epochs(1).with_log_every_n_steps(2).with_callback(
        std::make_shared<strata::trainer::ProgressBar>(false)));
    trainer.fit(std::make_shared<Probe>(), indices(16, 4));
  }
  std::string out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("epoch 0/0 | batch 2/4 | step 2 | loss "), std::string::npos) << out;
  EXPECT_NE(out.find("epoch 0/0 | batch 4/4 | step 4 | loss "), std::string::npos) << out;
  EXPECT_EQ(out.find('\r'), std::string::npos);
  testing::internal::CaptureStdout();
  {
    strata::Trainer trainer(quiet().with_max_epochs(1).with_callback(std::make_shared<strata::trainer::ProgressBar>(true)));
    trainer.fit(std::make_shared<Probe>(), indices(16, 4));
  }
  out = testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("\repoch 0/0 | batch 1/4 | step 1"), std::string::npos) << out;
  EXPECT_NE(out.find("\033[K"), std::string::npos);
}

}  // namespace

namespace {

// One strategy field, a name or an object; the Trainer's precision reaches
// an object it is handed, as Fabric's does (Lightning's rule).
TEST(TrainerTest, PrecisionReachesAStrategyObjectAndNamesBuildStrategies) {
  using strata::strategies::DDPStrategy;
  using strata::strategies::Precision;
  auto ddp = std::make_shared<DDPStrategy>();
  strata::Trainer bf16(strata::TrainerOptions().with_precision("bf16-mixed").with_strategy(ddp));
  EXPECT_EQ(&bf16.strategy(), ddp.get());
  EXPECT_EQ(ddp->precision().name(), "bf16-mixed");
  EXPECT_TRUE(ddp->precision().autocast());

  // Without a Trainer precision the object keeps its own; with one, the
  // Trainer's wins.
  auto own = std::make_shared<DDPStrategy>(strata::strategies::cpu_accelerator(), Precision::parse("bf16-mixed"));
  strata::Trainer keeps(strata::TrainerOptions().with_strategy(own));
  EXPECT_EQ(own->precision().name(), "bf16-mixed");
  auto overridden = std::make_shared<DDPStrategy>(strata::strategies::cpu_accelerator(), Precision::parse("bf16-mixed"));
  strata::Trainer wins(strata::TrainerOptions().with_precision("32-true").with_strategy(overridden));
  EXPECT_EQ(overridden->precision().name(), "32-true");

  // A name builds the strategy with the Trainer's precision; the last
  // with_strategy call wins, whichever form it takes.
  strata::Trainer named(strata::TrainerOptions().with_strategy(ddp).with_strategy("single_device")
                            .with_precision("bf16-mixed"));
  EXPECT_EQ(named.strategy().name(), "single_device");
  EXPECT_EQ(named.strategy().precision().name(), "bf16-mixed");
  strata::Trainer plain(strata::TrainerOptions().with_strategy("single_device"));
  EXPECT_EQ(plain.strategy().precision().name(), "32-true");

  std::string error = error_of([] {
    strata::Trainer t(strata::TrainerOptions().with_strategy(std::shared_ptr<strata::strategies::Strategy>()));
  });
  EXPECT_NE(error.find("[trainer] with_strategy got a null strategy object"), std::string::npos) << error;
}

}  // namespace
