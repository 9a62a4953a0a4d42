// ModelCheckpoint keeps exactly the top k by a metric across ranks, and
// EarlyStopping stops every rank at the same step, though each rank logs
// its own (unsynced) values: rank 0's decide. Both at 2 and 3 ranks.
#include <gtest/gtest.h>

#include <set>

#include "support/multiprocess.h"
#include "support/worker.h"
#include "trainer_util.h"

namespace {

using namespace strata::testing;
namespace fs = std::filesystem;

/// A one-weight regression on index data whose validation logs a chosen
/// value per epoch: `values[epoch] + 100 * rank` (unsynced, so ranks
/// disagree unless rank 0 decides).
class Scripted : public strata::TrainModule {
 public:
  explicit Scripted(std::vector<double> values) : values_(std::move(values)) {
    linear = register_module("linear", torch::nn::Linear(1, 1));
  }
  at::Tensor training_step(const strata::data::Batch& b, int64_t) override {
    return (linear->forward(b.input) - b.target).pow(2).mean() * 1e-3;
  }
  at::Tensor validation_step(const strata::data::Batch&, int64_t) override {
    const int rank = trainer()->global_rank();
    log("score", values_.at(static_cast<size_t>(current_epoch())) + 100.0 * rank);
    return {};
  }
  strata::OptimizerConfig configure_optimizers() override {
    return strata::OptimizerConfig(std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01)));
  }
  torch::nn::Linear linear{nullptr};

 private:
  std::vector<double> values_;
};

const std::vector<double> kScores{5, 3, 4, 1, 2, 6};

STRATA_WORKER(top_k) {
  // args: dir, out
  auto mc = std::make_shared<strata::trainer::ModelCheckpoint>(strata::trainer::ModelCheckpointOptions()
                                                                   .with_dirpath(args.at(0))
                                                                   .with_monitor("score")
                                                                   .with_save_top_k(2)
                                                                   .with_filename("{epoch}-{score:.1f}"));
  strata::Trainer trainer(strata::TrainerOptions()
                              .with_max_epochs(static_cast<int64_t>(kScores.size()))
                              .with_enable_progress_bar(false)
                              .with_callback(mc)
                              .with_collective_timeout(std::chrono::seconds(60)));
  auto data = strata::DataSource(index_dataset(12), strata::DataOptions().with_batch_size(6));
  trainer.fit(std::make_shared<Scripted>(kScores), data, data);
  // Every rank reports what it believes is kept.
  nlohmann::json kept = nlohmann::json::object();
  for (const auto& [path, score] : mc->best_k_models()) kept[fs::path(path).filename().string()] = score;
  write_json(args.at(1) + "." + std::getenv("RANK"),
             {{"kept", kept}, {"best", fs::path(mc->best_model_path()).filename().string()}});
  return 0;
}

class TopKTest : public ::testing::TestWithParam<int> {};

TEST_P(TopKTest, KeepsExactlyTheTopKFilesByRankZerosMetric) {
  const int world = GetParam();
  TempDir dir("topk");
  const std::string ckpt = dir.path + "/ckpt";
  auto r = run_workers(world, "top_k", {ckpt, dir.path + "/out"});
  ASSERT_TRUE(r.ok()) << r.launch.summary << "\n" << r.output;
  // Rank 0's scores 5 3 4 1 2 6 by epoch: the two lowest are epochs 3 and 4.
  // Each epoch has 12 / 6 = 2 steps, so epoch e ends at step 2(e+1).
  std::set<std::string> files;
  for (const auto& entry : fs::directory_iterator(ckpt)) files.insert(entry.path().filename().string());
  EXPECT_EQ(files, (std::set<std::string>{"epoch=3-score=1.0.ckpt", "epoch=4-score=2.0.ckpt"}));
  for (int rank = 0; rank < world; ++rank) {
    nlohmann::json seen = read_json(dir.path + "/out." + std::to_string(rank));
    EXPECT_EQ(seen["best"], "epoch=3-score=1.0.ckpt") << "rank " << rank;
    EXPECT_EQ(seen["kept"].size(), 2u) << "rank " << rank;
    EXPECT_EQ(seen["kept"]["epoch=4-score=2.0.ckpt"], 2.0) << "rank " << rank;
  }
  // The files are complete checkpoints of those epochs.
  for (const std::string& f : files) EXPECT_TRUE(strata::checkpoint::is_complete(ckpt + "/" + f)) << f;
}

INSTANTIATE_TEST_SUITE_P(Ranks, TopKTest, ::testing::Values(2, 3));

STRATA_WORKER(early_stop) {
  // Rank 0: 3, 2, 2.5, 2.6, 2.7, ... stops after 2 checks without
  // improvement (epoch 3). Other ranks see +100 * rank, the same pattern;
  // a rank deciding alone on a different pattern would stop elsewhere, so
  // give rank 1 and 2 steadily improving values instead.
  std::vector<double> values{3, 2, 2.5, 2.6, 2.7, 2.8, 2.9, 3.0};
  const int rank = std::stoi(std::getenv("RANK"));
  if (rank > 0) values = {9, 8, 7, 6, 5, 4, 3, 2};
  struct Values : Scripted {
    using Scripted::Scripted;
    at::Tensor validation_step(const strata::data::Batch&, int64_t) override {
      log("score", vals.at(static_cast<size_t>(current_epoch())));
      return {};
    }
    std::vector<double> vals;
  };
  auto module = std::make_shared<Values>(values);
  module->vals = values;
  auto es = std::make_shared<strata::trainer::EarlyStopping>(
      strata::trainer::EarlyStoppingOptions().with_monitor("score").with_patience(2));
  strata::Trainer trainer(strata::TrainerOptions()
                              .with_max_epochs(8)
                              .with_enable_progress_bar(false)
                              .with_enable_checkpointing(false)
                              .with_callback(es)
                              .with_collective_timeout(std::chrono::seconds(60)));
  auto data = strata::DataSource(index_dataset(12), strata::DataOptions().with_batch_size(6));
  trainer.fit(module, data, data);
  write_json(args.at(0) + "." + std::to_string(rank),
             {{"global_step", trainer.global_step()}, {"epoch", trainer.current_epoch()},
              {"stopped_step", es->stopped_step()}});
  return 0;
}

TEST(EarlyStoppingTest, StopsEveryRankAtTheSameStep) {
  TempDir dir("es");
  const int world = 3;
  auto r = run_workers(world, "early_stop", {dir.path + "/out"});
  ASSERT_TRUE(r.ok()) << r.launch.summary << "\n" << r.output;
  for (int rank = 0; rank < world; ++rank) {
    nlohmann::json seen = read_json(dir.path + "/out." + std::to_string(rank));
    // Checks after epochs 0..3; the one after epoch 3 (step 8) stops.
    EXPECT_EQ(seen["global_step"], 8) << "rank " << rank;
    EXPECT_EQ(seen["stopped_step"], 8) << "rank " << rank;
  }
}

}  // namespace
