// The Trainer starts its own workers: a program that no launcher started,
// asking for two devices, becomes rank 0 at its first Trainer call and
// re-runs itself as rank 1 (Note [The launching process is rank 0] in
// strategies/launchers/subprocess.h); the training the two do equals
// single-process training, and a worker's failure reaches rank 0 as a
// LaunchError.
//
// The program under test is this test binary started as a plain process
// (`--strata-worker=trainer_spawn DIR MODE`), so its re-run by the Trainer
// runs the same scenario, in place, as rank 1.
#include <gtest/gtest.h>
#include <unistd.h>

#include "strata/core/error.h"
#include "strata/runtime/env.h"
#include "support/tool.h"
#include "support/worker.h"
#include "trainer_util.h"

namespace {

using namespace strata::testing;

constexpr int64_t kSteps = 6;
constexpr int64_t kBatch = 12;  // global

/// LitGPT that counts its training steps and, in mode "fail" ("fail_c10"),
/// throws a std::runtime_error (a c10::Error, which carries a backtrace)
/// on rank 1 at its third step.
class CountingGPT : public LitGPT {
 public:
  explicit CountingGPT(std::string mode) : mode_(std::move(mode)) {}
  at::Tensor training_step(const strata::data::Batch& b, int64_t i) override {
    ++steps;
    if (trainer()->global_rank() == 1 && steps == 3) {
      if (mode_ == "fail") throw std::runtime_error("planted failure at step 3");
      TORCH_CHECK(mode_ != "fail_c10", "planted c10 failure at step ", steps);
    }
    return LitGPT::training_step(b, i);
  }
  int64_t steps = 0;

 private:
  std::string mode_;
};

strata::TrainerOptions options(int devices) {
  return strata::TrainerOptions()
      .with_devices(devices)
      .with_strategy(devices > 1 ? "ddp" : "single_device")
      .with_max_steps(kSteps)
      .with_enable_checkpointing(false)
      .with_enable_progress_bar(false)
      .with_seed(1234)
      .with_collective_timeout(std::chrono::seconds(60));
}

strata::DataSource data() {
  return strata::DataSource(gpt_dataset(), strata::DataOptions().with_batch_size(kBatch).with_shuffle(true));
}

// args: DIR MODE ("train", "fail" or "fail_c10"). Rank 0, the launching
// process, writes the trained parameters and launcher.json; rank 1
// worker.json.
STRATA_WORKER(trainer_spawn) {
  const std::string dir = args.at(0);
  const std::string mode = args.at(1);
  const bool launched = strata::runtime::Environment::from_env().launched();
  strata::Trainer trainer(options(2));
  at::manual_seed(1234);
  auto module = std::make_shared<CountingGPT>(mode);
  nlohmann::json seen{{"launched", launched}};
  try {
    trainer.fit(module, data());
  } catch (const strata::LaunchError& e) {
    seen["launch_error"] = e.what();
    if (e.outcome()) {
      seen["failed_rank"] = e.outcome()->failed_rank;
      seen["exit_code"] = e.outcome()->exit_code;
    }
  }
  seen["steps"] = module->steps;
  seen["global_step"] = trainer.global_step();
  auto loss = trainer.callback_metrics().find("train_loss");
  if (loss != trainer.callback_metrics().end()) seen["train_loss"] = loss->second;
  seen["world"] = trainer.world_size();
  seen["rank"] = trainer.global_rank();
  if (seen.contains("launch_error")) {
    write_json(dir + "/launcher.json", seen);
    return 0;
  }
  const auto params = full_state(*module, trainer.strategy(), "model.");
  if (trainer.is_global_zero()) strata::checkpoint::write_safetensors(dir + "/params.safetensors", params);
  write_json(dir + (launched ? "/worker.json" : "/launcher.json"), seen);
  return 0;
}

Outcome run_scenario(const std::string& dir, const std::string& mode) {
  char self[4096];
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  EXPECT_GT(n, 0);
  self[n > 0 ? n : 0] = '\0';
  return finish(start_program({self, "--strata-worker=trainer_spawn", dir, mode}));
}

TEST(TrainerSpawnTest, TwoDevicesWithoutALauncherStartTwoWorkersThatTrainAsOneProcess) {
  TempDir dir("spawn");
  Outcome outcome = run_scenario(dir.path, "train");
  ASSERT_EQ(outcome.status, 0) << outcome.out << outcome.err;

  // The launching process trained as rank 0 of 2; the copy it started as rank 1.
  nlohmann::json launcher = read_json(dir.path + "/launcher.json");
  EXPECT_FALSE(launcher["launched"].get<bool>());
  EXPECT_FALSE(launcher.contains("launch_error")) << launcher.dump();
  EXPECT_EQ(launcher["rank"].get<int>(), 0);
  EXPECT_EQ(launcher["world"].get<int>(), 2);
  EXPECT_EQ(launcher["steps"].get<int64_t>(), kSteps);
  EXPECT_EQ(launcher["global_step"].get<int64_t>(), kSteps);

  nlohmann::json worker = read_json(dir.path + "/worker.json");
  EXPECT_TRUE(worker["launched"].get<bool>());
  EXPECT_EQ(worker["rank"].get<int>(), 1);
  EXPECT_EQ(worker["world"].get<int>(), 2);
  EXPECT_EQ(worker["global_step"].get<int64_t>(), kSteps);
  EXPECT_EQ(worker["steps"].get<int64_t>(), kSteps);
  // Each rank logs the loss of its own batch.
  ASSERT_TRUE(worker.contains("train_loss")) << worker.dump();
  ASSERT_TRUE(launcher.contains("train_loss")) << launcher.dump();

  // The same fit in this process alone.
  strata::Trainer single(options(1));
  at::manual_seed(1234);
  auto module = std::make_shared<CountingGPT>("train");
  single.fit(module, data());
  ASSERT_EQ(module->steps, kSteps);
  auto expected = full_state(*module, single.strategy(), "model.");

  auto trained = strata::checkpoint::SafetensorsFile::open(dir.path + "/params.safetensors").load_all();
  std::map<std::string, at::Tensor> by_name(trained.begin(), trained.end());
  ASSERT_EQ(by_name.size(), expected.size());
  for (const auto& [name, want] : expected) {
    ASSERT_TRUE(by_name.count(name)) << "no " << name;
    // Sums over two ranks in another order: last-bit differences, as in
    // equivalence_test.cpp.
    EXPECT_TRUE(at::allclose(by_name[name], want, 1e-4, 1e-5))
        << name << " differs by " << (by_name[name] - want).abs().max().item<double>();
  }
  // And the run trained: the weights left their initial values.
  at::manual_seed(1234);
  LitGPT initial;
  double moved = 0;
  for (const auto& item : initial.named_parameters()) {
    const std::string key = item.key().substr(std::string("model.").size());
    moved = std::max(moved, (by_name[key] - item.value()).abs().max().item<double>());
  }
  EXPECT_GT(moved, 1e-3);
}

TEST(TrainerSpawnTest, AWorkerFailureReachesRankZeroAsALaunchError) {
  TempDir dir("spawn-fail");
  Outcome outcome = run_scenario(dir.path, "fail");
  ASSERT_EQ(outcome.status, 0) << outcome.out << outcome.err;
  nlohmann::json launcher = read_json(dir.path + "/launcher.json");
  ASSERT_TRUE(launcher.contains("launch_error")) << launcher.dump();
  const std::string message = launcher["launch_error"].get<std::string>();
  EXPECT_EQ(message, "[trainer] the workers failed: rank 1 exited with code 1; last error: error: planted failure "
                     "at step 3");
  // The outcome travels as data (Note [Launch outcomes]).
  ASSERT_TRUE(launcher.contains("failed_rank")) << launcher.dump();
  EXPECT_EQ(launcher["failed_rank"].get<int>(), 1);
  EXPECT_NE(launcher["exit_code"].get<int>(), 0);
  EXPECT_LT(launcher["steps"].get<int64_t>(), kSteps) << "rank 0 finished the fit without rank 1";
  EXPECT_FALSE(std::filesystem::exists(dir.path + "/worker.json")) << "the failed rank finished the fit";
  // The worker's own error text reaches the output for the user.
  EXPECT_NE((outcome.out + outcome.err).find("planted failure at step 3"), std::string::npos)
      << outcome.out << outcome.err;
}

TEST(TrainerSpawnTest, AWorkersC10ErrorIsSummarisedByItsMessageNotItsBacktrace) {
  TempDir dir("spawn-fail-c10");
  Outcome outcome = run_scenario(dir.path, "fail_c10");
  ASSERT_EQ(outcome.status, 0) << outcome.out << outcome.err;
  nlohmann::json launcher = read_json(dir.path + "/launcher.json");
  ASSERT_TRUE(launcher.contains("launch_error")) << launcher.dump();
  EXPECT_EQ(launcher["launch_error"].get<std::string>(),
            "[trainer] the workers failed: rank 1 exited with code 1; last error: error: planted c10 failure at "
            "step 3");
}

}  // namespace
