// The file loggers write what readers of their formats read: a CSV run in
// Lightning's CSVLogger layout parsed back by Python's csv module (and
// hparams.yaml by PyYAML), JSON lines parsed line by line, versions
// numbered as Lightning numbers them.
#include <gtest/gtest.h>

#include <array>
#include <cstdio>
#include <sys/wait.h>

#include "strata/core/error.h"
#include "strata/loggers/csv_logger.h"
#include "strata/loggers/jsonl_logger.h"
#include "strata/loggers/make_logger.h"
#include "trainer/trainer_util.h"

namespace {

using namespace strata::testing;
namespace fs = std::filesystem;

std::string run_command(const std::string& command, int& code) {
  FILE* pipe = ::popen((command + " 2>&1").c_str(), "r");
  if (!pipe) {
    code = -1;
    return "popen failed";
  }
  std::string output;
  std::array<char, 4096> buffer;
  while (size_t n = std::fread(buffer.data(), 1, buffer.size(), pipe)) output.append(buffer.data(), n);
  const int status = ::pclose(pipe);
  code = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  return output;
}

/// Logs a known value per step and per epoch.
class Known : public strata::TrainModule {
 public:
  Known() { linear = register_module("linear", torch::nn::Linear(1, 1)); }
  at::Tensor training_step(const strata::data::Batch& b, int64_t idx) override {
    log("a", static_cast<double>(global_step()) + 0.25, strata::LogOptions().with_on_epoch(true));
    return (linear->forward(b.input) - b.target).pow(2).mean() * 1e-3;
  }
  at::Tensor validation_step(const strata::data::Batch& b, int64_t) override {
    log("val_x", b.input.mean());
    return {};
  }
  strata::OptimizerConfig configure_optimizers() override {
    return strata::OptimizerConfig(std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01)));
  }
  torch::nn::Linear linear{nullptr};
};

TEST(CSVLoggerTest, PythonsCsvModuleReadsTheRunBack) {
  const char* python = std::getenv("STRATA_PYTHON");
  ASSERT_TRUE(python && *python) << "STRATA_PYTHON is not set: run the suite through scripts/test.sh";
  TempDir dir("csv");
  auto logger = std::make_shared<strata::trainer::CSVLogger>(dir.path, "run");
  EXPECT_EQ(logger->log_dir(), dir.path + "/run/version_0");
  strata::Trainer trainer(strata::TrainerOptions()
                              .with_max_epochs(2)
                              .with_log_every_n_steps(1)
                              .with_enable_progress_bar(false)
                              .with_enable_checkpointing(false)
                              .with_logger(logger));
  auto module = std::make_shared<Known>();
  module->save_hyperparameters({{"lr", "0.01"}, {"note", "a: b, \"c\""}});
  auto data = strata::DataSource(index_dataset(8), strata::DataOptions().with_batch_size(4));  // 2 steps per epoch
  trainer.fit(module, data, data);

  int code = 0;
  const std::string out = run_command(std::string(python) + " " + std::getenv("STRATA_SOURCE_DIR") +
                                          "/tests/loggers/read_logs.py " + logger->log_dir(), code);
  ASSERT_EQ(code, 0) << out;
  nlohmann::json logs = nlohmann::json::parse(out);
  // Lightning sorts "step" in with the other names.
  EXPECT_EQ(logs["header"], nlohmann::json({"a_epoch", "a_step", "epoch", "step", "val_x"}));
  EXPECT_EQ(logs["hparams"], nlohmann::json({{"lr", "0.01"}, {"note", "a: b, \"c\""}}));
  // Per epoch: two step rows (steps 0 and 1 of the epoch), the validation
  // row and the training epoch row, at the epoch's last step.
  const nlohmann::json null;
  std::vector<std::vector<nlohmann::json>> want{
      // a_epoch, a_step, epoch, val_x, step
      {null, 0.25, 0.0, null, 0.0},   {null, 1.25, 0.0, null, 1.0}, {null, null, 0.0, 3.5, 1.0},
      {0.75, null, 0.0, null, 1.0},   {null, 2.25, 1.0, null, 2.0}, {null, 3.25, 1.0, null, 3.0},
      {null, null, 1.0, 3.5, 3.0},    {2.75, null, 1.0, null, 3.0}};
  ASSERT_EQ(logs["rows"].size(), want.size()) << logs.dump(1);
  const std::vector<std::string> columns{"a_epoch", "a_step", "epoch", "val_x", "step"};
  for (size_t r = 0; r < want.size(); ++r) {
    for (size_t c = 0; c < columns.size(); ++c) {
      EXPECT_EQ(logs["rows"][r][columns[c]], want[r][c]) << "row " << r << " column " << columns[c];
    }
  }
  // A second logger in the same place takes the next version.
  EXPECT_EQ(strata::trainer::CSVLogger(dir.path, "run").log_dir(), dir.path + "/run/version_1");
}

TEST(JSONLinesLoggerTest, WritesOneObjectPerCall) {
  TempDir dir("jsonl");
  auto logger = strata::trainer::make_logger("jsonl", dir.path, "run", 3);
  logger->log_metrics({{"loss", 0.5}, {"bad", std::nan("")}}, 7);
  logger->log_metrics({{"loss", 0.25}}, 8);
  logger->finalize("success");
  std::ifstream in(logger->log_dir() + "/metrics.jsonl");
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], nlohmann::json({{"step", 7}, {"loss", 0.5}, {"bad", nullptr}}));
  EXPECT_EQ(lines[1], nlohmann::json({{"step", 8}, {"loss", 0.25}}));
  EXPECT_EQ(logger->log_dir(), dir.path + "/run/version_3");
}

TEST(MakeLoggerTest, NamesTheKnownFormats) {
  try {
    strata::trainer::make_logger("xml", "runs");
    FAIL() << "no error";
  } catch (const strata::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown logger 'xml'; choose one of: csv, jsonl, tensorboard"), std::string::npos);
  }
  EXPECT_EQ(strata::trainer::make_logger("csv", "runs")->name(), "csv");
}

}  // namespace
