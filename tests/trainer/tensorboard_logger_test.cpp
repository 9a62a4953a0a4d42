// TensorBoardLogger: the event files it writes are read back by the
// `tensorboard` package's own readers (tests/trainer/read_tensorboard.py),
// its folders follow Lightning's layout, and CRC-32C gives the published
// check values.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/trainer/event_file.h"
#include "strata/trainer/tensorboard_logger.h"

namespace strata::trainer {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

class TensorBoardLoggerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "strata_tb_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    root_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }

  // What read_tensorboard.py says about `run_dir`; skips the test when the
  // tensorboard package is missing.
  nlohmann::json read_back(const std::string& run_dir) {
    const char* python = std::getenv("STRATA_PYTHON");
    if (python == nullptr || *python == '\0') {
      ADD_FAILURE() << "STRATA_PYTHON is not set: run the suite through ctest or scripts/test.sh";
      return {};
    }
    const char* source_dir = std::getenv("STRATA_SOURCE_DIR");
    const std::string script =
        (source_dir ? fs::path(source_dir) / "tests/trainer" : fs::path(__FILE__).parent_path()) /
        "read_tensorboard.py";
    const std::string errors = root_ + "/reader-stderr.txt";
    const std::string command = std::string(python) + " " + script + " '" + run_dir + "' 2>" + errors;
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) {
      ADD_FAILURE() << "popen failed";
      return {};
    }
    std::string output;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) output.append(buf, n);
    const int status = ::pclose(pipe);
    std::ifstream error_file(errors);
    const std::string stderr_text((std::istreambuf_iterator<char>(error_file)), std::istreambuf_iterator<char>());
    if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
      skipped_ = "tensorboard is not installed in STRATA_PYTHON: " + stderr_text;
      return {};
    }
    if (status != 0) {
      ADD_FAILURE() << "read_tensorboard.py failed: " << stderr_text << output;
      return {};
    }
    return nlohmann::json::parse(output);
  }

  std::string root_;
  std::string skipped_;
};

#define READ_BACK_OR_SKIP(var, dir)          \
  const nlohmann::json var = read_back(dir); \
  if (!skipped_.empty()) GTEST_SKIP() << skipped_;  \
  ASSERT_FALSE(var.is_null())

// ---- CRC-32C and framing -----------------------------------------------------

TEST(Crc32cTest, GivesThePublishedCheckValues) {
  // The CRC catalogue's check value, and RFC 3720 (iSCSI) appendix B.4.
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  std::string zeros(32, '\0'), ones(32, '\xff'), up(32, '\0'), down(32, '\0');
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<char>(i);
    down[i] = static_cast<char>(31 - i);
  }
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c(up.data(), up.size()), 0x46DD794Eu);
  EXPECT_EQ(crc32c(down.data(), down.size()), 0x113FDB5Cu);
  // Continuing a CRC over a second piece equals one pass over both.
  EXPECT_EQ(crc32c("56789", 5, crc32c("1234", 4)), 0xE3069283u);
}

TEST(Crc32cTest, MaskRotatesAndAddsTheTfRecordConstant) {
  const std::uint32_t crc = 0xE3069283u;
  EXPECT_EQ(masked_crc32c("123456789", 9), ((crc >> 15) | (crc << 17)) + 0xA282EAD8u);
  const std::string record = tf_record("abc");
  ASSERT_EQ(record.size(), 8u + 4u + 3u + 4u);
  EXPECT_EQ(record.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  EXPECT_EQ(record.substr(12, 3), "abc");
}

TEST(EventFileTest, TagsMustBeShortPrintableUtf8) {
  EXPECT_NO_THROW(check_tag("val/loss"));
  EXPECT_NO_THROW(check_tag("\xc3\xa9poque"));  // "époque"
  const auto message = [](const std::string& tag) {
    try {
      check_tag(tag);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_EQ(message(""), "[tensorboard] a metric name is empty; give every logged value a name");
  EXPECT_THAT(message(std::string(1025, 'a')), HasSubstr("is 1025 bytes long; the limit is 1024 bytes"));
  EXPECT_THAT(message("loss\xff"), HasSubstr("metric name 'loss\\xff' is not valid UTF-8 (byte 4)"));
  EXPECT_THAT(message("\xc0\xaf"), HasSubstr("is not valid UTF-8 (byte 0)"));  // overlong '/'
  EXPECT_THAT(message("a\nb"), HasSubstr("metric name 'a\\x0ab' holds a control character (byte 1)"));
}

TEST(EventFileTest, HostNamesBecomeSafeFileNameParts) {
  EXPECT_EQ(sanitize_host("node-1.example"), "node-1.example");
  EXPECT_EQ(sanitize_host("a/b c"), "a_b_c");
  EXPECT_EQ(sanitize_host(""), "localhost");
  EXPECT_EQ(sanitize_host(".."), "_.");
  EXPECT_EQ(sanitize_host(std::string(300, 'h')).size(), 64u);
}

// ---- the logger, read back by tensorboard ------------------------------------

TEST_F(TensorBoardLoggerTest, ScalarsReadBackWithTensorBoardsEventAccumulator) {
  TensorBoardLogger logger(root_);
  EXPECT_EQ(logger.log_dir(), root_ + "/lightning_logs/version_0");
  EXPECT_FALSE(fs::exists(logger.log_dir()));  // nothing before the first write
  std::vector<double> losses;
  for (int step = 0; step < 50; ++step) {
    const double loss = 4.0 * std::exp(-0.05 * step) + 0.01 * step;
    losses.push_back(loss);
    Metrics metrics{{"train_loss", loss}, {"lr-AdamW", 3e-3 * (1.0 - step / 50.0)}};
    if (step % 10 == 9) metrics["val_loss"] = loss + 0.25;
    logger.log_metrics(metrics, step);
    if (step % 7 == 0) logger.save();
  }
  logger.log_metrics({{"odd", std::nan("")}, {"big", std::numeric_limits<double>::infinity()}}, 50);
  logger.finalize("success");
  EXPECT_EQ(logger.event_file(), "");  // closed

  READ_BACK_OR_SKIP(out, logger.log_dir());
  ASSERT_EQ(out["files"].size(), 1u);
  const std::string file = out["files"][0];
  EXPECT_THAT(file, MatchesRegex("events\\.out\\.tfevents\\.[0-9]{10}\\.[A-Za-z0-9._-]+\\.[0-9]+\\.[0-9]+"));
  EXPECT_EQ(out["records"][file], 1 + 51);  // file_version, then one event per log_metrics
  EXPECT_EQ(out["first_events"][file]["what"], "file_version");
  EXPECT_EQ(out["first_events"][file]["file_version"], "brain.Event:2");

  const nlohmann::json& scalars = out["scalars"];
  ASSERT_EQ(scalars.size(), 5u) << scalars.dump();
  ASSERT_EQ(scalars["train_loss"].size(), 50u);
  for (int step = 0; step < 50; ++step) {
    EXPECT_EQ(scalars["train_loss"][step][0], step);
    // TensorBoard keeps scalars as float32: exactly the value rounded to float.
    EXPECT_EQ(scalars["train_loss"][step][1].get<double>(), double(float(losses[step]))) << "step " << step;
    EXPECT_EQ(scalars["lr-AdamW"][step][1].get<double>(), double(float(3e-3 * (1.0 - step / 50.0))));
  }
  ASSERT_EQ(scalars["val_loss"].size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(scalars["val_loss"][i][0], 10 * i + 9);
    EXPECT_EQ(scalars["val_loss"][i][1].get<double>(), double(float(losses[10 * i + 9] + 0.25)));
  }
  EXPECT_EQ(scalars["odd"], nlohmann::json::parse(R"([[50, "nan"]])"));
  EXPECT_EQ(scalars["big"], nlohmann::json::parse(R"([[50, "inf"]])"));
}

TEST_F(TensorBoardLoggerTest, SavedRecordsAreReadableBeforeFinalize) {
  TensorBoardLogger logger(root_, "exp");
  logger.log_metrics({{"train_loss", 2.5}}, 1);
  logger.log_metrics({{"train_loss", 2.0}}, 2);
  logger.save();  // a reader (TensorBoard, live) sees both while training goes on
  READ_BACK_OR_SKIP(out, logger.log_dir());
  EXPECT_EQ(out["scalars"]["train_loss"], nlohmann::json::parse("[[1, 2.5], [2, 2.0]]"));
  logger.finalize("success");
}

TEST_F(TensorBoardLoggerTest, LoggingAfterFinalizeOpensASecondFileThatReadsOn) {
  TensorBoardLogger logger(root_, "exp", 3);
  logger.log_metrics({{"loss", 1.0}}, 10);
  logger.finalize("success");
  logger.log_metrics({{"loss", 0.5}}, 20);
  logger.finalize("success");
  READ_BACK_OR_SKIP(out, root_ + "/exp/version_3");
  ASSERT_EQ(out["files"].size(), 2u);
  for (const auto& file : out["files"]) EXPECT_EQ(out["first_events"][file.get<std::string>()]["file_version"], "brain.Event:2");
  EXPECT_EQ(out["scalars"]["loss"], nlohmann::json::parse("[[10, 1.0], [20, 0.5]]"));
}

TEST_F(TensorBoardLoggerTest, HparamsYamlReadsBackWithPyYaml) {
  TensorBoardLogger logger(root_);
  logger.log_hyperparams({{"lr", "0.003"},
                          {"optimizer", "AdamW"},
                          {"strategy", "fsdp"},
                          {"max_steps", "300"},
                          {"note", "a: b # c"},
                          {"empty", ""},
                          {"answer", "no"},
                          {"date", "2024-01-02"},
                          {"quoted", "say \"hi\"\\\n\tbye"},
                          {"bad utf8", "x\xff"},
                          {"lead-dash", "-x"}});
  logger.log_hyperparams({{"lr", "0.001"}});  // merged: a later value wins
  logger.finalize("success");
  READ_BACK_OR_SKIP(out, logger.log_dir());
  EXPECT_EQ(out["hparams"], nlohmann::json({{"lr", 0.001},
                                            {"optimizer", "AdamW"},
                                            {"strategy", "fsdp"},
                                            {"max_steps", 300},
                                            {"note", "a: b # c"},
                                            {"empty", ""},
                                            {"answer", "no"},
                                            {"date", "2024-01-02"},
                                            {"quoted", "say \"hi\"\\\n\tbye"},
                                            {"bad utf8", "x\xef\xbf\xbd"},
                                            {"lead-dash", "-x"}}));
  EXPECT_EQ(out["files"].size(), 1u);  // log_hyperparams opened the event file, as Lightning's does
}

TEST_F(TensorBoardLoggerTest, HparamsReachTensorBoardsHparamsPlugin) {
  TensorBoardLogger logger(root_);
  logger.log_hyperparams({{"lr", "0.003"}, {"optimizer", "AdamW"}, {"compile", "false"}, {"odd", "x\xff"}});
  logger.log_hyperparams({{"max_steps", "300"}});  // the latest record holds them all
  logger.log_metrics({{"train_loss", 1.0}}, 1);
  logger.finalize("success");
  READ_BACK_OR_SKIP(out, logger.log_dir());
  EXPECT_EQ(out["hparams_plugin"], nlohmann::json({{"lr", 0.003},
                                                   {"optimizer", "AdamW"},
                                                   {"compile", false},
                                                   {"odd", "x\xef\xbf\xbd"},
                                                   {"max_steps", 300}}));
  EXPECT_EQ(out["scalars"]["train_loss"], nlohmann::json::parse("[[1, 1.0]]"));
  EXPECT_EQ(out["scalars"].size(), 1u);  // the hparams records add no scalar
}

// ---- folders and bad arguments -----------------------------------------------

TEST_F(TensorBoardLoggerTest, VersionsFollowLightningsNumbering) {
  fs::create_directories(root_ + "/lightning_logs/version_0");
  fs::create_directories(root_ + "/lightning_logs/version_7");
  fs::create_directories(root_ + "/lightning_logs/version_x");
  std::ofstream(root_ + "/lightning_logs/version_9");  // a file, not a run
  EXPECT_EQ(TensorBoardLogger(root_).version(), 8);
  EXPECT_EQ(TensorBoardLogger(root_, "lightning_logs", 2).log_dir(), root_ + "/lightning_logs/version_2");
  EXPECT_EQ(TensorBoardLogger(root_, "").log_dir(), root_ + "/version_0");
  EXPECT_EQ(TensorBoardLogger(root_, "other").version(), 0);

  TensorBoardLogger first(root_, "runs");
  first.log_metrics({{"loss", 1.0}}, 0);
  first.finalize("success");
  EXPECT_TRUE(fs::is_directory(root_ + "/runs/version_0"));
  EXPECT_EQ(TensorBoardLogger(root_, "runs").version(), 1);
}

TEST_F(TensorBoardLoggerTest, BadArgumentsAreNamed) {
  const auto message = [](auto make) {
    try {
      make();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_THAT(message([&] { TensorBoardLogger(root_, "a/b"); }),
              HasSubstr("[tensorboard] name 'a/b' must be a plain folder name"));
  EXPECT_THAT(message([&] { TensorBoardLogger(root_, ".."); }), HasSubstr("name '..' must be a plain folder name"));
  EXPECT_THAT(message([&] { TensorBoardLogger(root_, std::string(256, 'n')); }), HasSubstr("at most 255 bytes"));
  EXPECT_THAT(message([&] { TensorBoardLogger(root_, "x", -1); }),
              HasSubstr("[tensorboard] version -1 is negative"));
  EXPECT_THAT(message([&] { TensorBoardLogger(""); }), HasSubstr("[tensorboard] root_dir is empty"));

  // A bad metric name writes nothing, not even the good names beside it.
  TensorBoardLogger logger(root_);
  EXPECT_THAT(message([&] { logger.log_metrics({{"good", 1.0}, {"bad\x01", 2.0}}, 0); }),
              HasSubstr("holds a control character"));
  EXPECT_FALSE(fs::exists(logger.log_dir()));

  // A file where the run folder should be.
  std::ofstream(root_ + "/blocked");
  TensorBoardLogger blocked(root_ + "/blocked", "x");
  try {
    blocked.log_metrics({{"loss", 1.0}}, 0);
    FAIL() << "wrote under a file";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("[tensorboard] cannot create the log folder " + root_ + "/blocked/x/version_0"));
  }
}

}  // namespace
}  // namespace strata::trainer
