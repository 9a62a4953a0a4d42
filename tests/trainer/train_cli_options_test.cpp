// `strata train`'s flags become TrainerOptions in one function
// (cli::trainer_options, Note [strata train is a Trainer user]): each flag
// lands in its field, the strategy object carries the FSDP flags, and the
// callbacks and logger are the ones the flags ask for.
#include <gtest/gtest.h>

#include "cli/gpt_job.h"
#include "cli/train_job.h"
#include "strata/strategies/fsdp.h"
#include "strata/strategies/xla.h"
#include "strata/trainer/callbacks.h"
#include "support/errors.h"
#include "trainer_util.h"

namespace {

using strata::cli::TrainConfig;
using strata::cli::trainer_options;

template <class T>
std::vector<std::shared_ptr<T>> callbacks_of(const strata::TrainerOptions& options) {
  std::vector<std::shared_ptr<T>> out;
  for (const auto& c : options.callbacks) {
    if (auto typed = std::dynamic_pointer_cast<T>(c)) out.push_back(typed);
  }
  return out;
}

TEST(TrainCliOptionsTest, TheDefaultFlagsMapToTheirFields) {
  TrainConfig config;
  const strata::TrainerOptions o = trainer_options(config, /*rank_zero=*/true);
  EXPECT_EQ(o.accelerator, "cpu");
  EXPECT_EQ(o.devices, 2);
  EXPECT_EQ(o.num_nodes, 1);
  ASSERT_TRUE(std::holds_alternative<std::string>(o.strategy));
  EXPECT_EQ(std::get<std::string>(o.strategy), "ddp");
  EXPECT_EQ(o.precision.value_or(""), "32-true");
  EXPECT_EQ(o.max_steps, 300);
  EXPECT_FALSE(o.max_epochs.has_value());
  EXPECT_EQ(o.accumulate_grad_batches, 1);
  EXPECT_EQ(o.log_every_n_steps, 10);
  EXPECT_FALSE(o.enable_checkpointing) << "strata train names its own checkpoints";
  ASSERT_TRUE(o.gradient_clip_val.has_value());
  EXPECT_EQ(*o.gradient_clip_val, 1.0);
  // --val-every's default: every 50 optimizer steps, counted across epochs
  // (Lightning's check_val_every_n_epoch=None counts batches: 50 x 1).
  EXPECT_FALSE(o.val_check_interval.fraction);
  EXPECT_EQ(o.val_check_interval.value, 50);
  EXPECT_FALSE(o.check_val_every_n_epoch.has_value());
  EXPECT_EQ(o.limit_val_batches.value, 10);
  EXPECT_EQ(callbacks_of<strata::cli::MetricsFile>(o).size(), 1u);
  EXPECT_EQ(callbacks_of<strata::cli::FinalSave>(o).size(), 1u);
  EXPECT_TRUE(callbacks_of<strata::trainer::ModelCheckpoint>(o).empty());
  EXPECT_TRUE(callbacks_of<strata::trainer::EarlyStopping>(o).empty());
  EXPECT_TRUE(callbacks_of<strata::trainer::LearningRateMonitor>(o).empty()) << "no logger to log to";
  EXPECT_TRUE(o.loggers.empty());
}

TEST(TrainCliOptionsTest, EachFlagLandsInItsField) {
  TrainConfig config;
  config.devices = 3;
  config.num_nodes = 2;
  config.strategy = "single_device";
  config.precision = "bf16-mixed";
  config.max_steps = 17;
  config.max_epochs = 4;
  config.grad_accum = 2;
  config.log_every = 7;
  config.grad_clip = 0;  // off
  config.val_every = 0;  // no validation
  const strata::TrainerOptions o = trainer_options(config, true);
  EXPECT_EQ(o.devices, 3);
  EXPECT_EQ(o.num_nodes, 2);
  EXPECT_EQ(std::get<std::string>(o.strategy), "single_device");
  EXPECT_EQ(o.precision.value_or(""), "bf16-mixed");
  EXPECT_EQ(o.max_steps, 17);
  EXPECT_EQ(o.max_epochs.value_or(-2), 4);
  EXPECT_EQ(o.accumulate_grad_batches, 2);
  EXPECT_EQ(o.log_every_n_steps, 7);
  EXPECT_FALSE(o.gradient_clip_val.has_value());
  // Lightning's defaults stay: validation at each epoch's end, were any data given.
  EXPECT_TRUE(o.val_check_interval.fraction);
  EXPECT_EQ(o.check_val_every_n_epoch, std::optional<int64_t>(1));

  config.val_every = 25;
  config.val_batches = 3;
  const strata::TrainerOptions v = trainer_options(config, true);
  EXPECT_EQ(v.val_check_interval.value, 50) << "25 steps of 2 accumulated batches";
  EXPECT_FALSE(v.check_val_every_n_epoch.has_value());
  EXPECT_EQ(v.limit_val_batches.value, 3);
}

TEST(TrainCliOptionsTest, TheFsdpFlagsBuildTheStrategyObject) {
  TrainConfig config;
  config.strategy = "fsdp";
  config.activation_checkpointing = true;
  config.sequential_save = true;
  config.state_dict_type = "full";
  const strata::TrainerOptions o = trainer_options(config, true);
  ASSERT_TRUE(std::holds_alternative<std::shared_ptr<strata::strategies::Strategy>>(o.strategy));
  auto fsdp = std::dynamic_pointer_cast<strata::strategies::FSDPStrategy>(
      std::get<std::shared_ptr<strata::strategies::Strategy>>(o.strategy));
  ASSERT_NE(fsdp, nullptr);
  EXPECT_EQ(fsdp->options().state_dict_type, strata::strategies::StateDictType::kFull);
  EXPECT_TRUE(fsdp->options().sequential_save);
  EXPECT_EQ(fsdp->options().activation_checkpointing_policy.size(), 1u);
}

// Note [The FSDP flags under xla_fsdp]: XLAFSDPStrategy's parameters, from
// the same flags, and its default layout is sharded, as the seed's.
TEST(TrainCliOptionsTest, TheFsdpFlagsBuildTheXlaFsdpStrategyObjectWithTheSeedsDefaults) {
  if (!strata::testing::start_xla()) GTEST_SKIP() << "no PJRT plugin for the xla device";
  TrainConfig config;
  config.accelerator = "xla";
  config.strategy = "xla_fsdp";
  config.validate();
  EXPECT_EQ(config.checkpoint_layout(), "sharded");
  auto made = [](const TrainConfig& c) {
    const strata::TrainerOptions o = trainer_options(c, true);
    EXPECT_TRUE(std::holds_alternative<std::shared_ptr<strata::strategies::Strategy>>(o.strategy));
    return std::dynamic_pointer_cast<strata::strategies::XlaFSDPStrategy>(
        std::get<std::shared_ptr<strata::strategies::Strategy>>(o.strategy));
  };
  auto defaults = made(config);
  ASSERT_NE(defaults, nullptr);
  EXPECT_EQ(defaults->options().state_dict_type, strata::strategies::StateDictType::kSharded);
  EXPECT_FALSE(defaults->options().sequential_save);
  EXPECT_TRUE(defaults->options().activation_checkpointing_policy.empty());

  config.wrap_policy = "MLPBlock";
  config.activation_checkpointing = true;
  config.sequential_save = true;
  config.state_dict_type = "full";
  config.validate();
  auto all = made(config);
  ASSERT_NE(all, nullptr);
  EXPECT_EQ(all->options().state_dict_type, strata::strategies::StateDictType::kFull);
  EXPECT_TRUE(all->options().sequential_save);
  EXPECT_EQ(all->options().activation_checkpointing_policy.size(), 1u);
  EXPECT_EQ(strata::cli::describe_strategy(config, "xla_fsdp"),
            "xla_fsdp (units: MLPBlock, activation checkpointing, full checkpoints saved sequentially)");
}

TEST(TrainCliOptionsTest, CheckpointFlagsAddTheirCallbacks) {
  TrainConfig config;
  config.ckpt_dir = "ckpts";
  config.ckpt_every = 5;
  config.save_top_k = 2;
  config.early_stopping = 3;
  const strata::TrainerOptions o = trainer_options(config, true);
  auto checkpoints = callbacks_of<strata::trainer::ModelCheckpoint>(o);
  ASSERT_EQ(checkpoints.size(), 2u);
  EXPECT_EQ(checkpoints[0]->options().dirpath, "ckpts");
  EXPECT_EQ(checkpoints[0]->options().every_n_train_steps, 5);
  EXPECT_EQ(checkpoints[0]->options().save_top_k, -1);
  EXPECT_EQ(checkpoints[1]->options().dirpath, (std::filesystem::path("ckpts") / "best").string());
  EXPECT_EQ(checkpoints[1]->options().monitor, "val_loss");
  EXPECT_EQ(checkpoints[1]->options().save_top_k, 2);
  auto stopping = callbacks_of<strata::trainer::EarlyStopping>(o);
  ASSERT_EQ(stopping.size(), 1u);
  EXPECT_EQ(stopping[0]->options().monitor, "val_loss");
  EXPECT_EQ(stopping[0]->options().patience, 3);
}

TEST(TrainCliOptionsTest, OnlyRankZeroGetsTheLogger) {
  strata::testing::TempDir dir("train-options-logger");
  TrainConfig config;
  config.logger = "csv";
  config.log_dir = dir.path;
  EXPECT_EQ(trainer_options(config, true).loggers.size(), 1u);
  EXPECT_TRUE(trainer_options(config, false).loggers.empty());
  // The learning rate is logged with any logger, and every rank has the
  // callback (only rank 0 logs), so the ranks' callback lists match.
  EXPECT_EQ(callbacks_of<strata::trainer::LearningRateMonitor>(trainer_options(config, true)).size(), 1u);
  EXPECT_EQ(callbacks_of<strata::trainer::LearningRateMonitor>(trainer_options(config, false)).size(), 1u);
}

TEST(TrainCliOptionsTest, TheWorldSizeCheckNamesTheWorld) {
  TrainConfig config;
  config.batch_size = 12;
  config.grad_accum = 2;
  config.check_world(3);  // 12 = 3 x 2 x 2
  const std::string message = strata::testing::error_message([&] { config.check_world(5); });
  EXPECT_NE(message.find("--batch-size 12 must be divisible by the world size (5"), std::string::npos) << message;
}

}  // namespace
