// fit(ckpt_path="last") continues a run exactly: a run stopped mid-epoch
// (max_steps, saved every 5 steps) or at an epoch's end, then resumed by a
// new Trainer, takes the same batches, losses and parameters as one run
// that never stopped: bit for bit at the same world size, within the
// distributed-vs-single tolerance at another one (FSDP's sharded
// checkpoints resharded on load). The epoch's logged mean ("train_loss"
// with on_epoch) counts the batches before the stop too.
#include <gtest/gtest.h>

#include "support/multiprocess.h"
#include "support/worker.h"
#include "trainer_util.h"

namespace {

using namespace strata::testing;

struct Result {
  std::vector<double> losses;
  std::vector<double> epoch_losses;  // train_loss_epoch at each epoch's end
  strata::checkpoint::NamedTensors params;
  int64_t global_step = 0;
};

// phase: "full" (2 epochs), "mid" (stop after 5 steps), "epoch" (stop after
// epoch 0), "resume" (2 epochs from "last").
Result run_phase(const std::string& spec, const std::string& phase, const std::string& dir) {
  auto recorder = std::make_shared<LossRecorder>();
  strata::trainer::ModelCheckpointOptions mc;
  mc.with_dirpath(dir).with_save_last(true);
  if (phase != "epoch") mc.with_every_n_train_steps(5);
  strata::TrainerOptions o;
  o.with_strategy(strategy_for(spec))
      .with_max_epochs(phase == "epoch" ? 1 : 2)
      .with_enable_progress_bar(false)
      .with_callback(recorder)
      .with_callback(std::make_shared<strata::trainer::ModelCheckpoint>(mc))
      .with_collective_timeout(std::chrono::seconds(60));
  if (phase == "mid") o.with_max_steps(5);
  strata::Trainer trainer(o);
  // A resumed run starts from other weights and generator state: the
  // checkpoint must restore both.
  at::manual_seed(phase == "resume" ? 999 : 1234);
  auto module = std::make_shared<LitGPT>();
  strata::DataSource data(gpt_dataset(), strata::DataOptions().with_batch_size(12).with_shuffle(true));
  trainer.fit(module, data, std::nullopt, phase == "resume" ? "last" : "");
  Result r;
  r.losses = recorder->losses;
  r.epoch_losses = recorder->epoch_losses;
  r.params = full_state(*module, trainer.strategy(), "model.");
  r.global_step = trainer.global_step();
  return r;
}

void write_result(const std::string& out, const Result& r) {
  write_json(out + ".json", {{"losses", r.losses}, {"epoch_losses", r.epoch_losses}, {"global_step", r.global_step}});
  strata::checkpoint::write_safetensors(out + ".params", r.params);
}

Result read_result(const std::string& out) {
  Result r;
  nlohmann::json j = read_json(out + ".json");
  r.losses = j["losses"].get<std::vector<double>>();
  r.epoch_losses = j["epoch_losses"].get<std::vector<double>>();
  r.global_step = j["global_step"].get<int64_t>();
  r.params = strata::checkpoint::SafetensorsFile::open(out + ".params").load_all();
  return r;
}

STRATA_WORKER(trainer_resume_phase) {
  // args: out, spec, phase, checkpoint dir
  Result r = run_phase(args.at(1), args.at(2), args.at(3));
  if (std::string(std::getenv("RANK")) == "0") write_result(args.at(0), r);
  return 0;
}

void expect_continues(const Result& resumed, const Result& full, size_t skipped, double tol) {
  EXPECT_EQ(resumed.global_step, full.global_step);
  ASSERT_EQ(resumed.losses.size() + skipped, full.losses.size());
  for (size_t i = 0; i < resumed.losses.size(); ++i) {
    if (tol == 0) EXPECT_EQ(resumed.losses[i], full.losses[skipped + i]) << "batch " << skipped + i + 1;
    else EXPECT_NEAR(resumed.losses[i], full.losses[skipped + i], tol) << "batch " << skipped + i + 1;
  }
  // The resumed run ends the epochs it ran in, the first perhaps begun
  // before the stop: each epoch's mean covers all of that epoch's batches
  // (sums in another order at most: 1e-12 relative).
  ASSERT_FALSE(resumed.epoch_losses.empty());
  ASSERT_LE(resumed.epoch_losses.size(), full.epoch_losses.size());
  const size_t first_epoch = full.epoch_losses.size() - resumed.epoch_losses.size();
  for (size_t i = 0; i < resumed.epoch_losses.size(); ++i) {
    const double want = full.epoch_losses[first_epoch + i];
    EXPECT_NEAR(resumed.epoch_losses[i], want, tol == 0 ? 1e-12 * std::abs(want) : tol)
        << "train_loss_epoch of epoch " << first_epoch + i;
  }
  std::map<std::string, at::Tensor> got(resumed.params.begin(), resumed.params.end());
  ASSERT_EQ(got.size(), full.params.size());
  for (const auto& [name, want] : full.params) {
    if (tol == 0) EXPECT_TRUE(at::equal(got.at(name), want)) << name << " differs";
    else EXPECT_TRUE(at::allclose(got.at(name), want, tol, tol / 10)) << name << " differs";
  }
}

TEST(TrainerResumeTest, SingleProcessContinuesBitForBitMidEpochAndAtEpochEnd) {
  TempDir full_dir("resume-full");
  Result full = run_phase("single", "full", full_dir.path);
  ASSERT_EQ(full.global_step, 16);
  for (const std::string stop : {"mid", "epoch"}) {
    TempDir dir("resume-" + stop);
    Result first = run_phase("single", stop, dir.path);
    EXPECT_EQ(first.global_step, stop == "mid" ? 5 : 8);
    Result resumed = run_phase("single", "resume", dir.path);
    expect_continues(resumed, full, first.losses.size(), 0.0);
  }
}

// spec, world of the first part, world of the resumed part, where it stops.
class TrainerResumeWorldsTest : public ::testing::TestWithParam<std::tuple<std::string, int, int, std::string>> {};

TEST_P(TrainerResumeWorldsTest, ResumedRunMatchesUninterruptedRun) {
  auto [spec, world, resume_world, stop] = GetParam();
  TempDir dir("resume-w");
  const std::string out = dir.path + "/result";
  auto run = [&](int nproc, const std::string& phase, const std::string& ckpt_dir) {
    auto r = run_workers(nproc, "trainer_resume_phase", {out, spec, phase, ckpt_dir});
    EXPECT_TRUE(r.ok()) << r.launch.summary << "\n" << r.output;
    return read_result(out);
  };
  Result full = run(world, "full", dir.path + "/full");
  Result first = run(world, stop, dir.path + "/ckpt");
  EXPECT_EQ(first.global_step, stop == "mid" ? 5 : 8);
  Result resumed = run(resume_world, "resume", dir.path + "/ckpt");
  expect_continues(resumed, full, first.losses.size(), world == resume_world ? 0.0 : 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Worlds, TrainerResumeWorldsTest,
                         ::testing::Values(std::make_tuple("ddp", 2, 2, "mid"), std::make_tuple("fsdp", 2, 2, "epoch"),
                                           std::make_tuple("ddp", 2, 3, "epoch"), std::make_tuple("fsdp", 3, 2, "mid")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::to_string(std::get<1>(info.param)) + "to" +
                                  std::to_string(std::get<2>(info.param)) + "_" + std::get<3>(info.param);
                         });

}  // namespace
