// `strata train`, the main job, run as users run it: resuming from a
// checkpoint continues the same run, several workers train like one, and
// bad flags get clear messages.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "strata/checkpoint/directory.h"
#include "strata/checkpoint/safetensors.h"

namespace {

namespace fs = std::filesystem;

struct CommandResult {
  int exit_code;
  std::string output;
};

std::string strata_binary() {
  const char* dir = std::getenv("STRATA_BINARY_DIR");
  return std::string(dir ? dir : ".") + "/strata";
}

// Runs the strata tool with `args` (no shell metacharacters in them).
CommandResult run_strata(const std::string& args) {
  std::string command = strata_binary() + " " + args + " 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  std::string output;
  std::array<char, 4096> buffer;
  while (size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), n);
  int status = ::pclose(pipe);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), output};
}

std::vector<double> losses(const std::string& metrics_file) {
  std::vector<double> out;
  std::ifstream in(metrics_file);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return out;
}

class TrainCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("strata-train-" + std::to_string(::getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  static std::string common() {
    return "train --model-size tiny --batch-size 8 --lr 3e-3 --sample-tokens 0 --log-every 5 --seed 3";
  }
  fs::path dir_;
};

TEST_F(TrainCliTest, ResumingAtStepTenEqualsAnUninterruptedRun) {
  // The metrics file's folder does not exist yet: train creates it.
  CommandResult full = run_strata(common() + " --devices 2 --max-steps 20 --ckpt-dir " + path("full") +
                                  " --metrics-file " + path("logs/full.jsonl"));
  ASSERT_EQ(full.exit_code, 0) << full.output;
  CommandResult first = run_strata(common() + " --devices 2 --max-steps 10 --ckpt-dir " + path("part"));
  ASSERT_EQ(first.exit_code, 0) << first.output;
  CommandResult second = run_strata(common() + " --devices 2 --max-steps 20 --ckpt-dir " + path("part") +
                          " --resume latest --metrics-file " + path("part.jsonl"));
  ASSERT_EQ(second.exit_code, 0) << second.output;
  EXPECT_NE(second.output.find("resumed from"), std::string::npos) << second.output;

  std::vector<double> a = losses(path("logs/full.jsonl")), b = losses(path("part.jsonl"));
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 10u);
  for (size_t i = 0; i < 10; ++i) EXPECT_DOUBLE_EQ(b[i], a[10 + i]) << "step " << 11 + i;
  EXPECT_LT(a.back(), a.front()) << "the loss did not fall";

  auto x = strata::checkpoint::CheckpointReader::open(path("full/step-00000020")).open_file("state.safetensors");
  auto y = strata::checkpoint::CheckpointReader::open(path("part/step-00000020")).open_file("state.safetensors");
  ASSERT_EQ(x.keys(), y.keys());
  for (const std::string& key : x.keys()) EXPECT_TRUE(x.load(key).equal(y.load(key))) << key;
}

TEST_F(TrainCliTest, TwoWorkersTrainLikeOneProcessWithTheSameGlobalBatch) {
  CommandResult one = run_strata(common() + " --devices 1 --max-steps 12 --metrics-file " + path("one.jsonl"));
  ASSERT_EQ(one.exit_code, 0) << one.output;
  CommandResult two = run_strata(common() + " --devices 2 --grad-accum 2 --max-steps 12 --metrics-file " + path("two.jsonl"));
  ASSERT_EQ(two.exit_code, 0) << two.output;
  std::vector<double> a = losses(path("one.jsonl")), b = losses(path("two.jsonl"));
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4) << "step " << i + 1;
}

TEST_F(TrainCliTest, BadFlagsGetMessagesThatSayWhatToDo) {
  CommandResult batch = run_strata("train --model-size tiny --devices 2 --batch-size 7");
  EXPECT_NE(batch.exit_code, 0);
  EXPECT_NE(batch.output.find("--batch-size 7 must be divisible"), std::string::npos) << batch.output;
  CommandResult size = run_strata("train --model-size huge");
  EXPECT_NE(size.exit_code, 0);
  EXPECT_NE(size.output.find("unknown model preset 'huge'"), std::string::npos) << size.output;
  CommandResult resume = run_strata("train --resume latest");
  EXPECT_NE(resume.exit_code, 0);
  EXPECT_NE(resume.output.find("--resume latest needs --ckpt-dir"), std::string::npos) << resume.output;
  CommandResult missing = run_strata(common() + " --devices 1 --max-steps 1 --data " + path("no-such-file"));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("no-such-file"), std::string::npos) << missing.output;
}

TEST_F(TrainCliTest, HelpDocumentsEveryFlag) {
  CommandResult help = run_strata("train --help");
  EXPECT_EQ(help.exit_code, 0);
  for (const char* flag : {"--strategy", "--devices", "--num-nodes", "--precision", "--max-steps", "--batch-size",
                           "--grad-accum", "--lr", "--seed", "--ckpt-dir", "--ckpt-every", "--resume",
                           "--metrics-file", "--model-size", "--data"}) {
    EXPECT_NE(help.output.find(flag), std::string::npos) << flag << " missing from:\n" << help.output;
  }
}

}  // namespace
