// A real client reads what strata writes: PyTorch, through the safetensors
// package, loads a checkpoint that `strata train --strategy fsdp` saved
// (consolidated to one file), with load_state_dict(strict=True), and its
// logits equal strata's on the same token ids (tests/fabric/torch_reader.py).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>

#include "support/commands.h"
#include "strata/checkpoint/safetensors.h"
#include "strata/checkpoint/sharded.h"
#include "strata/checkpoint/state_dict.h"
#include "strata/models/gpt.h"

namespace {

namespace fs = std::filesystem;

using strata::testing::CommandResult;
using strata::testing::env_or;
using strata::testing::run_command;

TEST(TorchReader, PyTorchLoadsAStrataCheckpointStrictlyAndComputesTheSameLogits) {
  const std::string python = env_or("STRATA_PYTHON", "");
  ASSERT_FALSE(python.empty()) << "STRATA_PYTHON is not set: run the suite through scripts/test.sh, whose "
                                  "scripts/install-deps.sh makes the Python environment with torch and safetensors";
  const fs::path dir = fs::temp_directory_path() / ("strata-torch-reader-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);

  const CommandResult trained =
      run_command(env_or("STRATA_BINARY_DIR", ".") + "/strata train --devices 2 --strategy fsdp --state-dict-type full "
          "--model-size tiny --max-steps 3 --batch-size 4 --sample-tokens 0 --ckpt-dir " + (dir / "ckpt").string());
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string checkpoint = (dir / "ckpt" / "step-00000003").string();

  // strata's logits from the checkpoint it wrote.
  strata::models::GPT model(strata::models::GPTConfig::preset("tiny"));
  const auto reader = strata::checkpoint::StateReader::open(checkpoint);
  ASSERT_FALSE(reader.sharded());
  strata::checkpoint::NamedTensors state;
  // strata train saves the Trainer's checkpoint: the GPT is the module's "model".
  for (const std::string& name : reader.names_under("module")) {
    if (name.rfind("model.", 0) == 0) state.emplace_back(name.substr(6), reader.full(reader.tensor_of("module", name)));
  }
  strata::checkpoint::load_module_state(*model, state, /*strict=*/true);
  at::Tensor idx = at::arange(2 * 40, at::kLong).mul_(37).remainder_(256).view({2, 40});
  at::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    logits = model->forward(idx);
  }
  const std::string logits_file = (dir / "strata_logits.safetensors").string();
  strata::checkpoint::write_safetensors(logits_file, {{"idx", idx}, {"logits", logits}});

  const std::string script = env_or("STRATA_SOURCE_DIR", ".") + "/tests/fabric/torch_reader.py";
  const CommandResult read = run_command(python + " " + script + " " + checkpoint + " " + logits_file);
  EXPECT_EQ(read.exit_code, 0) << read.output;
  EXPECT_NE(read.output.find("tensors loaded: " + std::to_string(state.size())), std::string::npos) << read.output;
  EXPECT_NE(read.output.find("max_abs_diff "), std::string::npos) << read.output;
  fs::remove_all(dir);
}

}  // namespace

// `strata ckpt export` of a sharded checkpoint: the model is rebuilt from the
// checkpoint alone (its saved configuration), and the example in
// docs/examples/load_exported_gpt.py loads the export into a PyTorch GPT
// with strict=True and computes the same logits.
TEST(TorchReader, TheExportedModelLoadsIntoPyTorchThroughTheDocumentedExample) {
  const std::string python = env_or("STRATA_PYTHON", "");
  ASSERT_FALSE(python.empty()) << "STRATA_PYTHON is not set: run the suite through scripts/test.sh";
  const fs::path dir = fs::temp_directory_path() / ("strata-export-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string strata = env_or("STRATA_BINARY_DIR", ".") + "/strata";
  const CommandResult trained =
      run_command(strata + " train --devices 2 --strategy fsdp --model-size tiny --seq-len 32 --max-steps 2 --batch-size 4 "
          "--sample-tokens 0 --ckpt-dir " + (dir / "ckpt").string());
  ASSERT_EQ(trained.exit_code, 0) << trained.output;
  const std::string checkpoint = (dir / "ckpt" / "step-00000002").string();
  const CommandResult exported = run_command(strata + " ckpt export " + checkpoint + " " + (dir / "export").string());
  ASSERT_EQ(exported.exit_code, 0) << exported.output;
  EXPECT_NE(exported.output.find("entry 'module'"), std::string::npos) << exported.output;

  // The configuration comes from the checkpoint, not from a preset: --seq-len 32 is in it
  // (the Trainer's checkpoint keeps it with the module's own values).
  const auto reader = strata::checkpoint::StateReader::open(checkpoint);
  ASSERT_TRUE(reader.sharded());
  const auto config = strata::models::GPTConfig::from_json(
      reader.entries()["trainer"]["value"]["module_extra"]["model_config"], checkpoint);
  EXPECT_EQ(config.block_size, 32);
  strata::models::GPT model(config);
  strata::checkpoint::NamedTensors state;
  for (const std::string& name : reader.names_under("module"))
    if (name.rfind("model.", 0) == 0) state.emplace_back(name.substr(6), reader.full(reader.tensor_of("module", name)));
  strata::checkpoint::load_module_state(*model, state, /*strict=*/true);
  at::Tensor idx = at::arange(2 * 32, at::kLong).mul_(41).remainder_(256).view({2, 32});
  at::Tensor logits;
  {
    torch::NoGradGuard no_grad;
    logits = model->forward(idx);
  }
  const std::string logits_file = (dir / "strata_logits.safetensors").string();
  strata::checkpoint::write_safetensors(logits_file, {{"idx", idx}, {"logits", logits}});

  const std::string script = env_or("STRATA_SOURCE_DIR", ".") + "/tests/fabric/check_export.py";
  const CommandResult read = run_command(python + " " + script + " " + (dir / "export").string() + " " + logits_file);
  EXPECT_EQ(read.exit_code, 0) << read.output;
  // PyTorch's state_dict lists the tied head too: one more than strata's.
  EXPECT_NE(read.output.find("tensors loaded: " + std::to_string(state.size() + 1)), std::string::npos) << read.output;
  fs::remove_all(dir);
}
