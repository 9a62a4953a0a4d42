// `strata ckpt export --format lightning`: a `strata train` checkpoint
// becomes one file that Lightning's tools open. torch.load(weights_only=True)
// reads it, and Lightning 2.6.6's load_from_checkpoint builds a Python
// LightningModule holding strata's GPT (tests/trainer/load_lightning_export.py)
// whose logits equal strata's; its optimizer state loads into
// torch.optim.AdamW. A damaged source is refused before anything is written.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "support/commands.h"
#include "strata/checkpoint/safetensors.h"
#include "strata/checkpoint/sharded.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/models/gpt.h"
#include "trainer_util.h"

namespace {

namespace fs = std::filesystem;
using strata::testing::TempDir;

using strata::testing::CommandResult;
using strata::testing::env_or;
using strata::testing::run_command;

class LightningExportTest : public ::testing::Test {
 protected:
  void SetUp() override {
    python_ = env_or("STRATA_PYTHON", "");
    ASSERT_FALSE(python_.empty()) << "STRATA_PYTHON is not set: run the suite through scripts/test.sh";
    strata_ = env_or("STRATA_BINARY_DIR", ".") + "/strata";
  }
  // A sharded FSDP checkpoint of 3 steps of the tiny GPT with --lr 0.003.
  std::string train(const std::string& dir) {
    const CommandResult trained =
        run_command(strata_ + " train --devices 2 --strategy fsdp --model-size tiny --seq-len 32 --max-steps 3 "
                      "--batch-size 4 --lr 0.003 --sample-tokens 0 --val-every 0 --ckpt-dir " + dir + "/ckpt");
    EXPECT_EQ(trained.exit_code, 0) << trained.output;
    return dir + "/ckpt/step-00000003";
  }
  std::string python_;
  std::string strata_;
};

TEST_F(LightningExportTest, LightningsLoadFromCheckpointBuildsTheGptWithStratasLogits) {
  TempDir dir("lightning-export");
  const std::string checkpoint = train(dir.path);
  const std::string out = dir.path + "/step3.ckpt";
  const CommandResult exported = run_command(strata_ + " ckpt export " + checkpoint + " " + out + " --format lightning");
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_NE(exported.output.find("Lightning checkpoint"), std::string::npos) << exported.output;

  // strata's logits and optimizer state from the checkpoint it wrote.
  const auto reader = strata::checkpoint::StateReader::open(checkpoint);
  ASSERT_TRUE(reader.sharded());
  const auto config = strata::models::GPTConfig::from_json(
      reader.entries()["trainer"]["value"]["module_extra"]["model_config"], checkpoint);
  strata::models::GPT model(config);
  strata::checkpoint::NamedTensors state;
  for (const std::string& name : reader.names_under("module"))
    if (name.rfind("model.", 0) == 0) state.emplace_back(name.substr(6), reader.full(reader.tensor_of("module", name)));
  strata::checkpoint::load_module_state(*model, state, /*strict=*/true);
  at::Tensor idx = at::arange(2 * 32, at::kLong).mul_(29).remainder_(256).view({2, 32});
  at::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    logits = model->forward(idx);
  }
  const at::Tensor exp_avg = reader.full(reader.tensor_of("optimizer_0", "model.wte.weight.exp_avg"));
  const std::string reference = dir.path + "/strata_reference.safetensors";
  strata::checkpoint::write_safetensors(reference, {{"idx", idx}, {"logits", logits}, {"exp_avg", exp_avg}});

  const CommandResult read = run_command(python_ + " " + env_or("STRATA_SOURCE_DIR", ".") +
                                 "/tests/trainer/load_lightning_export.py " + out + " " + reference);
  if (read.exit_code == 77) GTEST_SKIP() << read.output;
  ASSERT_EQ(read.exit_code, 0) << read.output;
  const nlohmann::json r = nlohmann::json::parse(read.output.substr(read.output.rfind("\n{") + 1));
  // Lightning's keys (what a Lightning 2.6.6 checkpoint holds, loops and
  // hparams_name aside).
  EXPECT_EQ(r["keys"], nlohmann::json({"callbacks", "epoch", "global_step", "hyper_parameters", "lr_schedulers",
                                       "optimizer_states", "pytorch-lightning_version", "state_dict"}));
  EXPECT_EQ(r["epoch"], 0);
  EXPECT_EQ(r["global_step"], 3);
  EXPECT_EQ(r["version"], "2.6.6");
  // strata train's configuration, typed, became the module's init arguments.
  EXPECT_EQ(r["hyper_parameters"]["lr"], 0.003);
  EXPECT_EQ(r["hyper_parameters"]["model_config"]["block_size"], 32);
  EXPECT_EQ(r["hyper_parameters"]["strategy"], "fsdp");
  EXPECT_EQ(r["model_hparams"]["lr"], 0.003);
  // PyTorch's state_dict lists the tied head too, on the embedding's storage.
  EXPECT_EQ(r["state_dict_size"], state.size() + 1);
  EXPECT_EQ(r["tied_storage"], true);
  EXPECT_LE(r["max_abs_diff"].get<double>(), 1e-5);
  EXPECT_EQ(r["optimizer"]["lr"], 0.003);
  EXPECT_EQ(r["optimizer"]["betas"], nlohmann::json({0.9, 0.999}));
  EXPECT_EQ(r["optimizer"]["params"], state.size());
  EXPECT_EQ(r["optimizer"]["step"], 3.0);
  EXPECT_EQ(r["optimizer"]["exp_avg_equal"], true);
}

// The source is checked as resuming checks it: a Trainer state with a
// negative step is refused, naming the field, and no file appears. An
// existing directory at OUT is not replaced.
TEST_F(LightningExportTest, ADamagedSourceOrAFolderAtOutWritesNothing) {
  TempDir dir("lightning-export-bad");
  const std::string checkpoint = train(dir.path);
  const std::string metadata = checkpoint + "/metadata.json";
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(metadata));
  meta["entries"]["trainer"]["value"]["global_step"] = -1;
  {
    fs::permissions(metadata, fs::perms::owner_write, fs::perm_options::add);
    std::ofstream(metadata, std::ios::trunc) << meta.dump();
  }
  const std::string out = dir.path + "/bad.ckpt";
  const CommandResult bad = run_command(strata_ + " ckpt export " + checkpoint + " " + out + " --format lightning");
  EXPECT_NE(bad.exit_code, 0) << bad.output;
  EXPECT_NE(bad.output.find("global_step is -1"), std::string::npos) << bad.output;
  EXPECT_FALSE(fs::exists(out));

  meta["entries"]["trainer"]["value"]["global_step"] = 3;
  std::ofstream(metadata, std::ios::trunc) << meta.dump();
  fs::create_directories(dir.path + "/folder.ckpt/inside");
  const CommandResult folder =
      run_command(strata_ + " ckpt export " + checkpoint + " " + dir.path + "/folder.ckpt --format lightning");
  EXPECT_NE(folder.exit_code, 0) << folder.output;
  EXPECT_TRUE(fs::is_directory(dir.path + "/folder.ckpt/inside"));
  for (const auto& entry : fs::directory_iterator(dir.path))
    EXPECT_EQ(entry.path().filename().string().find(".tmp"), std::string::npos) << entry.path();
}

}  // namespace
