// The Trainer's results do not depend on the world size or the strategy:
// at 1, 2, 3 and 4 ranks, on ddp and fsdp, every step's global batch holds
// the same examples as a single process's, the logged per-step and epoch
// means are the means over those examples, and training ends at the same
// parameters, also when the last batch of each epoch (and of validation)
// splits unevenly, down to ranks with no example at all
// (Note [Unequal shares] in data/distributed_sampler.h).
//
// The model is a small linear regression trained with SGD: a problem whose
// result rounding cannot move far, so any difference beyond float rounding
// is a difference in data or reduction.
#include <gtest/gtest.h>

#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>

#include "support/multiprocess.h"
#include "support/worker.h"
#include "trainer_util.h"

namespace {

using namespace strata::testing;

constexpr int64_t kTrain = 51;  // 4 batches of 12, then 3 examples: ranks 0-2 one each at 4 ranks, rank 3 none
constexpr int64_t kVal = 29;    // 2 batches of 12, then 5
constexpr int64_t kBatch = 12;  // global, divisible by 1..4
constexpr int64_t kEpochs = 3;

// Example i: input [i]; the module derives features and target from it.
std::shared_ptr<strata::data::TensorDataset> examples(int64_t n, int64_t offset) {
  at::Tensor x = at::arange(offset, offset + n, at::kLong).unsqueeze(1);
  return std::make_shared<strata::data::TensorDataset>(x, x.clone());
}

class Regression : public strata::TrainModule {
 public:
  Regression() { linear = register_module("linear", torch::nn::Linear(3, 1)); }
  at::Tensor loss_of(const strata::data::Batch& b) {
    at::Tensor x = b.input.to(at::kFloat) / 60.0;
    at::Tensor features = at::cat({x, x * x, at::cos(3.0 * x)}, 1);
    at::Tensor y = 2.0 * x - x * x + 0.5;
    return (linear->forward(features) - y).pow(2).mean();
  }
  at::Tensor training_step(const strata::data::Batch& b, int64_t) override {
    at::Tensor loss = loss_of(b);
    log("train_loss", loss, strata::LogOptions().with_on_step(true).with_on_epoch(true).with_sync_dist(true));
    return loss;
  }
  at::Tensor validation_step(const strata::data::Batch& b, int64_t) override {
    log("val_loss", loss_of(b), strata::LogOptions().with_sync_dist(true));
    return {};
  }
  strata::OptimizerConfig configure_optimizers() override {
    return strata::OptimizerConfig(
        std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.3).momentum(0.5)));
  }
  torch::nn::Linear linear{nullptr};
};

// What one run saw and logged: per (epoch, batch) this rank's real
// example ids; per step the synced step loss and the weighted mean of
// last_loss_weighted over ranks; per epoch the epoch and validation means.
class Recorder : public strata::trainer::Callback {
 public:
  std::string state_key() const override { return "Recorder"; }
  void on_train_batch_end(strata::Trainer& trainer, strata::TrainModule&, const at::Tensor&,
                          const strata::data::Batch& batch, int64_t idx) override {
    std::vector<int64_t>& ids = seen[std::to_string(trainer.current_epoch()) + "/" + std::to_string(idx)];
    for (int64_t i = 0; i < batch.examples(); ++i) ids.push_back(batch.input[i][0].item<int64_t>());
    step_losses.push_back(trainer.callback_metrics().at("train_loss_step"));
    global_losses.push_back(
        trainer.strategy().all_reduce(at::scalar_tensor(trainer.last_loss_weighted(), at::kDouble)).item<double>());
  }
  void on_train_epoch_end(strata::Trainer& trainer, strata::TrainModule&) override {
    epoch_losses.push_back(trainer.callback_metrics().at("train_loss_epoch"));
  }
  void on_validation_end(strata::Trainer& trainer, strata::TrainModule&) override {
    val_losses.push_back(trainer.callback_metrics().at("val_loss"));
  }
  std::map<std::string, std::vector<int64_t>> seen;
  std::vector<double> step_losses, global_losses, epoch_losses, val_losses;
};

struct RunRecord {
  std::map<std::string, std::vector<int64_t>> seen;  // merged over ranks, sorted
  nlohmann::json losses;
  std::vector<double> params;
};

// Trains on `strategy`; every rank writes `out`.rank<R>.json.
void train(const std::string& out, std::shared_ptr<strata::strategies::Strategy> strategy, int rank, uint64_t seed) {
  auto recorder = std::make_shared<Recorder>();
  strata::TrainerOptions options;
  options.with_strategy(std::move(strategy))
      .with_max_epochs(kEpochs)
      .with_enable_checkpointing(false)
      .with_enable_progress_bar(false)
      .with_log_every_n_steps(1)
      .with_collective_timeout(std::chrono::seconds(60))
      .with_callback(recorder);
  strata::Trainer trainer(options);
  at::manual_seed(3);
  auto module = std::make_shared<Regression>();
  trainer.fit(module,
              strata::DataSource(examples(kTrain, 0), strata::DataOptions().with_batch_size(kBatch).with_shuffle(true).with_seed(seed)),
              strata::DataSource(examples(kVal, 20), strata::DataOptions().with_batch_size(kBatch)));
  nlohmann::json j{{"seen", recorder->seen},
                   {"losses",
                    {{"step", recorder->step_losses},
                     {"global", recorder->global_losses},
                     {"epoch", recorder->epoch_losses},
                     {"val", recorder->val_losses}}}};
  std::vector<double> params;
  for (const auto& [name, t] : full_state(*module, trainer.strategy(), "linear.")) {
    at::Tensor flat = t.to(at::kDouble).flatten().contiguous();
    params.insert(params.end(), flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
  }
  j["params"] = params;
  std::ofstream(out + ".rank" + std::to_string(rank) + ".json") << j.dump();
}

STRATA_WORKER(world_size_fit) {
  const char* rank = std::getenv("RANK");
  train(args.at(0), strategy_for(args.at(1)), rank ? std::atoi(rank) : 0, std::stoull(args.at(2)));
  return 0;
}

RunRecord read(const std::string& out, int world) {
  RunRecord run;
  for (int r = 0; r < world; ++r) {
    const std::string path = out + ".rank" + std::to_string(r) + ".json";
    nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
    for (auto it = j["seen"].begin(); it != j["seen"].end(); ++it) {
      std::vector<int64_t>& ids = run.seen[it.key()];
      for (const auto& id : it.value()) ids.push_back(id.get<int64_t>());
    }
    if (r == 0) {
      run.losses = j["losses"];
      run.params = j["params"].get<std::vector<double>>();
    }
    std::filesystem::remove(path);
  }
  for (auto& [key, ids] : run.seen) std::sort(ids.begin(), ids.end());
  return run;
}

void expect_close(const nlohmann::json& got, const nlohmann::json& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    // fp32 sums in another order (per-rank means, then their weighted mean)
    // differ in the last bits; 15 SGD steps on a convex problem keep them there.
    const double want_i = want[i].get<double>();
    EXPECT_NEAR(got[i].get<double>(), want_i, 2e-6 * std::max(1.0, std::abs(want_i))) << what << " " << i;
  }
}

class TrainerWorldSizeTest : public ::testing::TestWithParam<std::tuple<std::string, int, uint64_t>> {};

TEST_P(TrainerWorldSizeTest, SameExamplesLossesAndParametersAsOneProcess) {
  auto [spec, world, seed] = GetParam();
  TempDir dir("world");
  const std::string out = dir.path + "/run";
  train(out + "-single", strategy_for("single"), 0, seed);
  RunRecord reference = read(out + "-single", 1);
  // 5 batches per epoch, the last of 3 examples.
  ASSERT_EQ(reference.seen.size(), static_cast<size_t>(5 * kEpochs));
  ASSERT_EQ(reference.seen.at("0/4").size(), 3u);
  ASSERT_GT(reference.losses["step"].front().get<double>(), 2 * reference.losses["step"].back().get<double>())
      << "the reference did not train";

  auto workers = run_workers(world, "world_size_fit", {out, spec, std::to_string(seed)});
  ASSERT_TRUE(workers.ok()) << workers.launch.summary << "\n" << workers.output;
  RunRecord split = read(out, world);

  // The same examples in every global batch of every epoch.
  EXPECT_EQ(split.seen, reference.seen);
  // The logged means are the global batch's means (the last batch's shares
  // are unequal), the epoch means and validation too.
  for (const char* key : {"step", "global", "epoch", "val"}) {
    expect_close(split.losses[key], reference.losses[key], std::string(key) + " loss");
  }
  // The single-process step losses agree with themselves both ways.
  expect_close(reference.losses["global"], reference.losses["step"], "single-process global vs step");
  // Gradients weighted by the shares: the same parameters at the end.
  ASSERT_EQ(split.params.size(), reference.params.size());
  for (size_t i = 0; i < split.params.size(); ++i) {
    EXPECT_NEAR(split.params[i], reference.params[i], 2e-6) << "parameter " << i;
  }
}

// Every strategy at 2, 3 and 4 ranks, each with a few shuffle seeds.
INSTANTIATE_TEST_SUITE_P(Strategies, TrainerWorldSizeTest,
                         ::testing::Combine(::testing::Values(std::string("ddp"), std::string("fsdp")),
                                            ::testing::Values(2, 3, 4), ::testing::Values(5u, 11u, 23u)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_world" + std::to_string(std::get<1>(info.param)) +
                                  "_seed" + std::to_string(std::get<2>(info.param));
                         });

}  // namespace
