// Lightning's API where a Lightning user reaches for it, with the values
// Lightning 2.6.6 gives on the same settings (measured in the venv):
// EarlyStopping.stopped_epoch, ModelCheckpoint.best_model_score (None
// before any score), CSVLogger(flush_logs_every_n_steps) and the model
// summary table printed at the start of fit.
#include <gtest/gtest.h>

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/embedding.h>

#include "strata/core/error.h"
#include "strata/loggers/csv_logger.h"
#include "strata/trainer/model_summary.h"
#include "trainer_util.h"

namespace {

using namespace strata::testing;
namespace fs = std::filesystem;

/// Logs "score" = vals[current_epoch] in validation (Lightning's twin:
/// validation_step logs vals[self.current_epoch]).
class Scored : public strata::TrainModule {
 public:
  explicit Scored(std::vector<double> vals) : vals_(std::move(vals)) {
    linear = register_module("linear", torch::nn::Linear(1, 1));
  }
  at::Tensor training_step(const strata::data::Batch& b, int64_t) override {
    return (linear->forward(b.input) - b.target).pow(2).mean() * 1e-3;
  }
  at::Tensor validation_step(const strata::data::Batch&, int64_t) override {
    log("score", vals_.at(static_cast<size_t>(current_epoch())));
    return {};
  }
  strata::OptimizerConfig configure_optimizers() override {
    return strata::OptimizerConfig(std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01)));
  }
  torch::nn::Linear linear{nullptr};

 private:
  std::vector<double> vals_;
};

// Lightning: EarlyStopping(monitor="score", patience=2) and
// ModelCheckpoint(monitor="score") over 8 epochs of 2 batches, scores
// 1.0, 0.9, 0.95, 0.97, ...: before fit stopped_epoch is 0 and
// best_model_score None; after it, stopped_epoch 3 at global_step 8 and
// best_model_score 0.9.
TEST(LightningApiTest, StoppedEpochAndBestModelScoreAreLightnings) {
  TempDir dir("api");
  auto es = std::make_shared<strata::trainer::EarlyStopping>(
      strata::trainer::EarlyStoppingOptions().with_monitor("score").with_patience(2));
  auto mc = std::make_shared<strata::trainer::ModelCheckpoint>(
      strata::trainer::ModelCheckpointOptions().with_monitor("score").with_dirpath(dir.path + "/ckpt"));
  EXPECT_EQ(es->stopped_epoch(), 0);
  EXPECT_FALSE(mc->best_model_score().has_value());
  strata::Trainer trainer(strata::TrainerOptions()
                              .with_max_epochs(8)
                              .with_enable_progress_bar(false)
                              .with_enable_model_summary(false)
                              .with_callback(es)
                              .with_callback(mc));
  auto data = strata::DataSource(index_dataset(12), strata::DataOptions().with_batch_size(6));
  trainer.fit(std::make_shared<Scored>(std::vector<double>{1.0, 0.9, 0.95, 0.97, 0.5, 0.4, 0.3, 0.2}), data, data);
  EXPECT_EQ(trainer.global_step(), 8);
  EXPECT_EQ(es->stopped_step(), 8);
  EXPECT_EQ(es->stopped_epoch(), 3);
  EXPECT_EQ(es->state_dict()["stopped_epoch"], 3);
  ASSERT_TRUE(mc->best_model_score().has_value());
  EXPECT_DOUBLE_EQ(*mc->best_model_score(), 0.9);

  // The state round-trips: a restored EarlyStopping knows where it stopped.
  strata::trainer::EarlyStopping restored(strata::trainer::EarlyStoppingOptions().with_monitor("score"));
  restored.load_state_dict(es->state_dict());
  EXPECT_EQ(restored.stopped_epoch(), 3);
  // A state saved before stopped_epoch existed still loads (as 0).
  nlohmann::json older = es->state_dict();
  older.erase("stopped_epoch");
  restored.load_state_dict(older);
  EXPECT_EQ(restored.stopped_epoch(), 0);
}

// A ModelCheckpoint without a monitor never has a score (Lightning: None),
// also after saving and after a restore.
TEST(LightningApiTest, BestModelScoreStaysEmptyWithoutAMonitor) {
  TempDir dir("api");
  auto mc = std::make_shared<strata::trainer::ModelCheckpoint>(
      strata::trainer::ModelCheckpointOptions().with_dirpath(dir.path + "/ckpt"));
  strata::Trainer trainer(
      strata::TrainerOptions().with_max_epochs(1).with_enable_progress_bar(false).with_enable_model_summary(false)
          .with_callback(mc));
  trainer.fit(std::make_shared<Scored>(std::vector<double>{1.0}),
              strata::DataSource(index_dataset(4), strata::DataOptions().with_batch_size(2)));
  EXPECT_FALSE(mc->best_model_path().empty());
  EXPECT_FALSE(mc->best_model_score().has_value());
  EXPECT_TRUE(mc->state_dict()["best_model_score"].is_null());
  mc->load_state_dict(mc->state_dict());
  EXPECT_FALSE(mc->best_model_score().has_value());
}

size_t data_rows(const std::string& csv) {
  std::ifstream in(csv);
  if (!in) return 0;
  size_t lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  return lines - 1;  // the header
}

// Lightning's CSVLogger(flush_logs_every_n_steps=3), logging steps 0..4:
// no file after steps 0 and 1, 3 rows after step 2 ((step + 1) % 3 == 0),
// still 3 after step 4, 5 after save(). With the default (100): no file
// after step 98, 100 rows after step 99.
TEST(LightningApiTest, CsvLoggerFlushesEveryNStepsAsLightnings) {
  TempDir dir("csvflush");
  strata::trainer::CSVLogger logger(dir.path, "run", std::nullopt, 3);
  std::vector<bool> exists;
  std::vector<size_t> rows;
  for (int64_t step = 0; step < 5; ++step) {
    logger.log_metrics({{"x", static_cast<double>(step)}}, step);
    exists.push_back(fs::exists(logger.metrics_file()));
    rows.push_back(data_rows(logger.metrics_file()));
  }
  EXPECT_EQ(exists, (std::vector<bool>{false, false, true, true, true}));
  EXPECT_EQ(rows, (std::vector<size_t>{0, 0, 3, 3, 3}));
  logger.save();
  EXPECT_EQ(data_rows(logger.metrics_file()), 5u);

  strata::trainer::CSVLogger defaults(dir.path, "default");
  for (int64_t step = 0; step < 99; ++step) defaults.log_metrics({{"x", 1.0}}, step);
  EXPECT_FALSE(fs::exists(defaults.metrics_file()));
  defaults.log_metrics({{"x", 1.0}}, 99);
  EXPECT_EQ(data_rows(defaults.metrics_file()), 100u);

  EXPECT_THROW({ strata::trainer::CSVLogger bad(dir.path, "bad", std::nullopt, 0); }, strata::ConfigError);
}

/// The module of Lightning's reference table below, in LibTorch.
struct Summarized : torch::nn::Module {
  Summarized() {
    net = register_module("net", torch::nn::Sequential(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 1)));
    head = register_module("head", torch::nn::Linear(1, 1));
    head->weight.set_requires_grad(false);
    register_buffer("buf", at::zeros({10}));
    emb = register_module("emb", torch::nn::Embedding(50000, 64));
    lin_bf = register_module("lin_bf", torch::nn::Linear(3, 3));
    lin_bf->to(at::kBFloat16);
    empty = register_module("empty", torch::nn::ReLU());
    empty->eval();
    register_parameter("scale", at::ones({5}));
  }
  torch::nn::Sequential net{nullptr};
  torch::nn::Linear head{nullptr}, lin_bf{nullptr};
  torch::nn::Embedding emb{nullptr};
  torch::nn::ReLU empty{nullptr};
};

// Lightning 2.6.6's ModelSummary(max_depth=1) of the same module in Python
// (nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)), a Linear(1, 1)
// with its weight frozen, a buffer, nn.Embedding(50000, 64), a bf16
// Linear(3, 3), an nn.ReLU in eval mode, a root nn.Parameter(torch.ones(5))),
// formatted by its _format_summary_table without the FLOPs column and line:
//   arrays = [a for a in s._get_summary_data() if a[0] != "FLOPs"]
//   _format_summary_table(s.total_parameters, s.trainable_parameters,
//                         s.model_size, s.total_training_modes, 0, *arrays)
const char* const kLightningTable =
    "  | Name         | Type       | Params | Mode \n"
    "----------------------------------------------------\n"
    "0 | net          | Sequential | 49     | train\n"
    "1 | head         | Linear     | 2      | train\n"
    "2 | emb          | Embedding  | 3.2 M  | train\n"
    "3 | lin_bf       | Linear     | 12     | train\n"
    "4 | empty        | ReLU       | 0      | eval \n"
    "  | other params | n/a        | 5      | n/a  \n"
    "----------------------------------------------------\n"
    "3.2 M     Trainable params\n"
    "1         Non-trainable params\n"
    "3.2 M     Total params\n"
    "12.800    Total estimated model params size (MB)\n"
    "7         Modules in train mode\n"
    "1         Modules in eval mode";

TEST(ModelSummaryTest, TableIsLightnings) {
  Summarized module;
  const strata::trainer::ModelSummary s = strata::trainer::summarize(module);
  EXPECT_EQ(s.table(), kLightningTable);
  EXPECT_EQ(s.total_parameters, 3200068);
  EXPECT_EQ(s.trainable_parameters, 3200067);
  ASSERT_EQ(s.layers.size(), 5u);
  EXPECT_EQ(s.layers[1].trainable, 1);  // head: its bias
  // Lightning: 16-bit true precisions count 2 bytes a parameter, mixed 4.
  EXPECT_NEAR(strata::trainer::summarize(module, "bf16-true").size_mb, 6.400136, 1e-9);
  EXPECT_NEAR(strata::trainer::summarize(module, "bf16-mixed").size_mb, 12.800272, 1e-9);
}

// Lightning's get_human_readable_count docstring values, and its rounding.
TEST(ModelSummaryTest, CountsReadAsLightnings) {
  using strata::trainer::human_readable_count;
  EXPECT_EQ(human_readable_count(0), "0  ");
  EXPECT_EQ(human_readable_count(123), "123  ");
  EXPECT_EQ(human_readable_count(1234), "1.2 K");
  EXPECT_EQ(human_readable_count(2000000), "2.0 M");
  EXPECT_EQ(human_readable_count(3000000000LL), "3.0 B");
  EXPECT_EQ(human_readable_count(400000000000000LL), "400 T");
  EXPECT_EQ(human_readable_count(5000000000000000LL), "5,000 T");
  EXPECT_EQ(human_readable_count(999950), "999 K");
}

// fit prints the table (on global rank 0) unless enable_model_summary is off.
TEST(ModelSummaryTest, FitPrintsItUnlessDisabled) {
  for (bool enabled : {true, false}) {
    ::testing::internal::CaptureStderr();
    strata::Trainer trainer(strata::TrainerOptions()
                                .with_max_steps(1)
                                .with_enable_progress_bar(false)
                                .with_enable_checkpointing(false)
                                .with_enable_model_summary(enabled));
    trainer.fit(std::make_shared<Scored>(std::vector<double>{1.0}),
                strata::DataSource(index_dataset(4), strata::DataOptions().with_batch_size(2)));
    const std::string err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(err.find("0 | linear | Linear | 2      | train") != std::string::npos, enabled) << err;
    EXPECT_EQ(err.find("2         Total params") != std::string::npos, enabled) << err;
  }
}

}  // namespace
