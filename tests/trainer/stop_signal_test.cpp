// Note [Stopping on a signal] in the Trainer: a SIGTERM that reaches one
// rank inside step 5 stops every rank after that same step; ModelCheckpoint
// saves it (its periodic name and `last`), the loggers close as
// "interrupted", fit throws Interrupted (exit code 143), and a run resumed
// from `last` ends bit for bit where a run that never stopped does.
#include <gtest/gtest.h>

#include <signal.h>

#include <filesystem>

#include "strata/core/interrupted.h"
#include "strata/loggers/csv_logger.h"
#include "support/multiprocess.h"
#include "support/worker.h"
#include "trainer_util.h"

namespace {

using namespace strata::testing;
namespace fs = std::filesystem;

// Raises `signal` on the ranks in `ranks` at the end of optimizer step `step`'s batch.
class RaiseAt : public strata::trainer::Callback {
 public:
  RaiseAt(int64_t step, int signal, int rank) : step_(step), signal_(signal), rank_(rank) {}
  std::string state_key() const override { return "RaiseAt"; }
  void on_train_batch_start(strata::Trainer& trainer, strata::TrainModule&, const strata::data::Batch&,
                            int64_t) override {
    if (trainer.global_step() + 1 == step_ && trainer.global_rank() == rank_) ::raise(signal_);
  }

 private:
  int64_t step_;
  int signal_;
  int rank_;
};

struct Outcome {
  std::vector<double> losses;
  strata::checkpoint::NamedTensors params;
  int64_t global_step = 0;
  int exit_code = 0;    // Interrupted's, 0 when fit returned
  int stop_signal = 0;  // Trainer::stop_signal()
};

// phase: "full" (2 epochs), "stop" (SIGTERM on rank `rank` in step 5),
// "resume" (2 epochs from "last").
Outcome run_phase(const std::string& spec, const std::string& phase, const std::string& dir, int rank) {
  auto recorder = std::make_shared<LossRecorder>();
  strata::TrainerOptions o;
  o.with_strategy(strategy_for(spec))
      .with_max_epochs(2)
      .with_enable_progress_bar(false)
      .with_callback(recorder)
      .with_callback(std::make_shared<strata::trainer::ModelCheckpoint>(
          strata::trainer::ModelCheckpointOptions().with_dirpath(dir).with_save_last(true).with_every_n_train_steps(100)))
      .with_collective_timeout(std::chrono::seconds(60));
  if (phase == "stop") o.with_callback(std::make_shared<RaiseAt>(5, SIGTERM, rank));
  strata::Trainer trainer(o);
  at::manual_seed(phase == "resume" ? 999 : 1234);
  auto module = std::make_shared<LitGPT>();
  strata::DataSource data(gpt_dataset(), strata::DataOptions().with_batch_size(12).with_shuffle(true));
  Outcome r;
  try {
    trainer.fit(module, data, std::nullopt, phase == "resume" ? "last" : "");
  } catch (const strata::Interrupted& e) {
    r.exit_code = e.exit_code();
  }
  r.losses = recorder->losses;
  r.params = full_state(*module, trainer.strategy(), "model.");
  r.global_step = trainer.global_step();
  r.stop_signal = trainer.stop_signal();
  return r;
}

void expect_continues(const Outcome& resumed, const Outcome& full, size_t skipped) {
  EXPECT_EQ(resumed.global_step, full.global_step);
  ASSERT_EQ(resumed.losses.size() + skipped, full.losses.size());
  for (size_t i = 0; i < resumed.losses.size(); ++i) EXPECT_EQ(resumed.losses[i], full.losses[skipped + i]) << i;
  std::map<std::string, at::Tensor> got(resumed.params.begin(), resumed.params.end());
  ASSERT_EQ(got.size(), full.params.size());
  for (const auto& [name, want] : full.params) EXPECT_TRUE(at::equal(got.at(name), want)) << name << " differs";
}

STRATA_WORKER(trainer_stop_phase) {
  // args: out, spec, phase, checkpoint dir, the rank the signal reaches
  Outcome r = run_phase(args.at(1), args.at(2), args.at(3), std::stoi(args.at(4)));
  if (std::string(std::getenv("RANK")) == "0") {
    write_json(args.at(0) + ".json", {{"losses", r.losses}, {"global_step", r.global_step},
                                      {"exit_code", r.exit_code}, {"stop_signal", r.stop_signal}});
    strata::checkpoint::write_safetensors(args.at(0) + ".params", r.params);
  }
  return r.exit_code;  // every rank ends as the signalled one does
}

Outcome read_outcome(const std::string& out) {
  Outcome r;
  nlohmann::json j = read_json(out + ".json");
  r.losses = j["losses"].get<std::vector<double>>();
  r.global_step = j["global_step"].get<int64_t>();
  r.exit_code = j["exit_code"].get<int>();
  r.stop_signal = j["stop_signal"].get<int>();
  r.params = strata::checkpoint::SafetensorsFile::open(out + ".params").load_all();
  return r;
}

TEST(TrainerStopSignalTest, OneProcessSavesTheStepItStoppedAfterAndResumesExactly) {
  TempDir full_dir("stop-full"), dir("stop");
  Outcome full = run_phase("single", "full", full_dir.path, 0);
  Outcome stopped = run_phase("single", "stop", dir.path, 0);
  EXPECT_EQ(stopped.exit_code, 143);
  EXPECT_EQ(stopped.stop_signal, SIGTERM);
  EXPECT_EQ(stopped.global_step, 5);
  std::string listing;
  for (const auto& e : fs::directory_iterator(dir.path)) listing += e.path().filename().string() + " ";
  // Named at on_train_end, where current_epoch() counts the stopped epoch
  // as ended (Lightning's count), as every save from that hook is.
  EXPECT_TRUE(fs::exists(dir.path + "/epoch=1-step=5.ckpt")) << "the periodic name of the stopped step: " << listing;
  EXPECT_TRUE(fs::exists(dir.path + "/last.ckpt"));
  Outcome resumed = run_phase("single", "resume", dir.path, 0);
  EXPECT_EQ(resumed.exit_code, 0);
  expect_continues(resumed, full, stopped.losses.size());
}

TEST(TrainerStopSignalTest, ASignalOnOneRankStopsEveryRankAfterTheSameStep) {
  TempDir dir("stop-ranks");
  const std::string out = dir.path + "/result";
  auto run = [&](const std::string& phase, const std::string& ckpt, bool expect_ok) {
    auto r = run_workers(2, "trainer_stop_phase", {out, "ddp", phase, ckpt, "1"});
    if (expect_ok) EXPECT_TRUE(r.ok()) << r.launch.summary << "\n" << r.output;
    else EXPECT_EQ(r.launch.exit_code, 143) << r.launch.summary << "\n" << r.output;
    return read_outcome(out);
  };
  Outcome full = run("full", dir.path + "/full", true);
  Outcome stopped = run("stop", dir.path + "/ckpt", false);
  // Rank 0 got no signal, and stopped with rank 1 after step 5.
  EXPECT_EQ(stopped.global_step, 5);
  EXPECT_EQ(stopped.exit_code, 143);
  EXPECT_EQ(stopped.stop_signal, SIGTERM);
  EXPECT_TRUE(fs::exists(dir.path + "/ckpt/last.ckpt"));
  Outcome resumed = run("resume", dir.path + "/ckpt", true);
  expect_continues(resumed, full, stopped.losses.size());
}

TEST(TrainerStopSignalTest, LoggersCloseAsInterruptedAndTheStopCanBeTurnedOff) {
  TempDir dir("stop-logs");
  auto recorder = std::make_shared<LossRecorder>();
  auto logger = std::make_shared<strata::trainer::CSVLogger>(dir.path, "run");
  strata::TrainerOptions o;
  o.with_strategy("single_device")
      .with_max_steps(8)
      .with_enable_progress_bar(false)
      .with_enable_checkpointing(false)
      .with_log_every_n_steps(1)
      .with_logger(logger)
      .with_callback(std::make_shared<RaiseAt>(3, SIGUSR1, 0));
  strata::Trainer trainer(o);
  auto module = std::make_shared<LitGPT>();
  strata::DataSource data(gpt_dataset(), strata::DataOptions().with_batch_size(12));
  try {
    trainer.fit(module, data);
    ADD_FAILURE() << "fit returned after SIGUSR1";
  } catch (const strata::Interrupted& e) {
    EXPECT_EQ(e.signal(), SIGUSR1);
    EXPECT_EQ(e.exit_code(), 138);
    EXPECT_NE(std::string(e.what()).find("stopped by SIGUSR1 after step 3"), std::string::npos) << e.what();
  }
  EXPECT_EQ(trainer.global_step(), 3);
  // The rows up to the stop reached the file.
  std::ifstream csv(logger->metrics_file());
  int rows = -1;
  for (std::string line; std::getline(csv, line);) ++rows;
  EXPECT_EQ(rows, 4) << "steps 1-3 and the stopped epoch's row";

  // stop_on_signals=false: the program's own handler sees the signal and fit runs on.
  static volatile sig_atomic_t seen = 0;
  struct sigaction mine {}, previous {};
  mine.sa_handler = [](int) { seen = 1; };
  sigemptyset(&mine.sa_mask);
  ::sigaction(SIGUSR1, &mine, &previous);
  strata::TrainerOptions off;
  off.with_strategy("single_device")
      .with_max_steps(6)
      .with_enable_progress_bar(false)
      .with_enable_checkpointing(false)
      .with_stop_on_signals(false)
      .with_callback(std::make_shared<RaiseAt>(3, SIGUSR1, 0));
  strata::Trainer other(off);
  other.fit(std::make_shared<LitGPT>(), data);
  ::sigaction(SIGUSR1, &previous, nullptr);
  EXPECT_EQ(seen, 1);
  EXPECT_EQ(other.global_step(), 6);
  EXPECT_EQ(other.stop_signal(), 0);
}

}  // namespace
