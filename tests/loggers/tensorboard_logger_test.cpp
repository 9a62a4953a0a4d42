// TensorBoardLogger: the event files it writes are read back by the
// `tensorboard` package's own readers (tests/loggers/read_tensorboard.py),
// its folders follow Lightning's layout, and CRC-32C gives the published
// check values.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "strata/core/error.h"
#include "strata/loggers/event_file.h"
#include "strata/loggers/tensorboard_logger.h"

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
        (source_dir ? fs::path(source_dir) / "tests/loggers" : fs::path(__FILE__).parent_path()) /
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

// Typed values and hostile strings: PyYAML reads hparams.yaml back as the
// same values (strings stay strings, "0.003" and "no" included).
TEST_F(TensorBoardLoggerTest, HparamsYamlReadsBackWithPyYaml) {
  TensorBoardLogger logger(root_);
  logger.log_hyperparams({{"lr", 0.003},
                          {"optimizer", "AdamW"},
                          {"max_steps", 300},
                          {"compile", false},
                          {"model", {{"n_layer", 2}, {"bias", true}, {"dims", {64, 128}}}},
                          {"none", nullptr},
                          {"text_lr", "0.003"},
                          {"note", "a: b # c"},
                          {"empty", ""},
                          {"answer", "no"},
                          {"date", "2024-01-02"},
                          {"quoted", "say \"hi\"\\\n\tbye it's"},
                          {"spaces", " lead and trail "},
                          {"lines", "a\n b \nc\n"},
                          {"unicode", "h\xc3\xa9llo \xe2\x80\xa8 \xf0\x9f\x98\x80"},
                          {"bad utf8", "x\xff"},
                          {"lead-dash", "-x"},
                          {"long", std::string(300, 'a') + " " + std::string(100, 'b')},
                          {"digits", std::string(100000, '7')}});
  logger.log_hyperparams({{"lr", 0.001}});  // merged: a later value wins
  logger.finalize("success");
  READ_BACK_OR_SKIP(out, logger.log_dir());
  EXPECT_EQ(out["hparams"], nlohmann::json({{"lr", 0.001},
                                            {"optimizer", "AdamW"},
                                            {"max_steps", 300},
                                            {"compile", false},
                                            {"model", {{"n_layer", 2}, {"bias", true}, {"dims", {64, 128}}}},
                                            {"none", nullptr},
                                            {"text_lr", "0.003"},
                                            {"note", "a: b # c"},
                                            {"empty", ""},
                                            {"answer", "no"},
                                            {"date", "2024-01-02"},
                                            {"quoted", "say \"hi\"\\\n\tbye it's"},
                                            {"spaces", " lead and trail "},
                                            {"lines", "a\n b \nc\n"},
                                            {"unicode", "h\xc3\xa9llo \xe2\x80\xa8 \xf0\x9f\x98\x80"},
                                            {"bad utf8", "x\xef\xbf\xbd"},
                                            {"lead-dash", "-x"},
                                            {"long", std::string(300, 'a') + " " + std::string(100, 'b')},
                                            {"digits", std::string(100000, '7')}}));
  // log_hyperparams opened the event file, as Lightning's does.
  EXPECT_EQ(out["files"].size(), 1u);
}

// What Lightning 2.6.6's TensorBoardLogger writes for save_hyperparameters
// (lr=0.003, optimizer="AdamW", compile=False, model={"n_layer": 2},
// betas=[0.9, 0.95], none=None), read with TensorBoard's own reader:
// session_start_info lr 0.003, optimizer "AdamW", compile 0 (a bool is a
// number), model/n_layer 2, betas "[0.9, 0.95]", none "None"; an
// experiment typing them FLOAT64 or STRING with the metric hp_metric; a
// session_end_info STATUS_SUCCESS; and the scalar hp_metric = -1 at step 0.
TEST_F(TensorBoardLoggerTest, HparamsReachTensorBoardsHparamsPluginAsLightningsDo) {
  TensorBoardLogger logger(root_);
  logger.log_hyperparams({{"lr", 0.003},
                          {"optimizer", "AdamW"},
                          {"compile", false},
                          {"model", {{"n_layer", 2}}},
                          {"betas", {0.9, 0.95}},
                          {"none", nullptr},
                          {"odd", "x\xff"}});
  logger.log_hyperparams({{"max_steps", 300}});  // the latest record holds them all
  logger.log_metrics({{"train_loss", 1.0}}, 1);
  logger.finalize("success");
  READ_BACK_OR_SKIP(out, logger.log_dir());
  EXPECT_EQ(out["hparams_plugin"], nlohmann::json({{"lr", 0.003},
                                                   {"optimizer", "AdamW"},
                                                   {"compile", 0.0},
                                                   {"model/n_layer", 2.0},
                                                   {"betas", "[0.9, 0.95]"},
                                                   {"none", "None"},
                                                   {"odd", "x\xef\xbf\xbd"},
                                                   {"max_steps", 300}}));
  EXPECT_EQ(out["hparams_experiment"]["hparams"], nlohmann::json({{"lr", "DATA_TYPE_FLOAT64"},
                                                                  {"optimizer", "DATA_TYPE_STRING"},
                                                                  {"compile", "DATA_TYPE_FLOAT64"},
                                                                  {"model/n_layer", "DATA_TYPE_FLOAT64"},
                                                                  {"betas", "DATA_TYPE_STRING"},
                                                                  {"none", "DATA_TYPE_STRING"},
                                                                  {"odd", "DATA_TYPE_STRING"},
                                                                  {"max_steps", "DATA_TYPE_FLOAT64"}}));
  EXPECT_EQ(out["hparams_experiment"]["metrics"], nlohmann::json({"hp_metric"}));
  EXPECT_EQ(out["hparams_session_end"], "STATUS_SUCCESS");
  // The HPARAMS tab (the plugin's /session_groups handler) lists the run
  // with these values and hp_metric.
  ASSERT_EQ(out["hparams_tab"].size(), 1u) << out.dump();
  EXPECT_EQ(out["hparams_tab"][0]["hparams"], out["hparams_plugin"]);
  EXPECT_EQ(out["hparams_tab"][0]["metrics"], nlohmann::json({{"hp_metric", -1.0}}));
  EXPECT_EQ(out["scalars"]["hp_metric"], nlohmann::json::parse("[[0, -1.0]]"));
  EXPECT_EQ(out["scalars"]["train_loss"], nlohmann::json::parse("[[1, 1.0]]"));
  EXPECT_EQ(out["scalars"].size(), 2u);
}

// default_hp_metric=False (and no metrics): Lightning writes hparams.yaml
// and nothing for the HPARAMS tab.
TEST_F(TensorBoardLoggerTest, WithoutTheDefaultHpMetricOnlyTheYamlHoldsThem) {
  TensorBoardLogger logger(root_, "lightning_logs", std::nullopt, /*default_hp_metric=*/false);
  logger.log_hyperparams({{"lr", 0.003}});
  logger.log_metrics({{"train_loss", 1.0}}, 1);
  logger.finalize("success");
  READ_BACK_OR_SKIP(out, logger.log_dir());
  EXPECT_TRUE(out["hparams_plugin"].is_null());
  EXPECT_EQ(out["hparams_tab"], nlohmann::json::array());
  EXPECT_EQ(out["scalars"].size(), 1u);
  EXPECT_EQ(out["hparams"], nlohmann::json({{"lr", 0.003}}));
}

// `strata train --logger tensorboard` records its configuration as
// hyperparameters: TensorBoard's reader finds them in the HPARAMS tab's
// records, and hparams.yaml holds them typed.
TEST_F(TensorBoardLoggerTest, StrataTrainRecordsItsConfigurationAsHyperparameters) {
  const char* binary_dir = std::getenv("STRATA_BINARY_DIR");
  ASSERT_TRUE(binary_dir && *binary_dir) << "STRATA_BINARY_DIR is not set: run the suite through ctest";
  const std::string command = std::string(binary_dir) +
                              "/strata train --devices 1 --strategy single_device --model-size tiny --max-steps 2 "
                              "--batch-size 4 --lr 0.003 --sample-tokens 0 --val-every 0 --logger tensorboard "
                              "--log-dir " + root_ + "/runs > " + root_ + "/train.log 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  READ_BACK_OR_SKIP(out, root_ + "/runs/train/version_0");
  // What the HPARAMS tab lists (TensorBoard's own /session_groups handler).
  ASSERT_EQ(out["hparams_tab"].size(), 1u) << out.dump();
  const nlohmann::json& tab = out["hparams_tab"][0]["hparams"];
  EXPECT_EQ(tab, out["hparams_plugin"]);
  EXPECT_EQ(tab["lr"], 0.003);
  EXPECT_EQ(tab["batch_size"], 4.0);
  EXPECT_EQ(tab["max_steps"], 2.0);
  EXPECT_EQ(tab["strategy"], "single_device");
  EXPECT_EQ(tab["devices"], 1.0);
  EXPECT_EQ(tab["model_size"], "tiny");
  EXPECT_EQ(tab["model_config/n_layer"], 2.0);
  EXPECT_EQ(tab["model_config/n_embd"], 64.0);
  EXPECT_EQ(tab["model_config/tie_weights"], 1.0);
  EXPECT_EQ(out["hparams"]["lr"], 0.003);
  EXPECT_EQ(out["hparams"]["model_config"]["n_head"], 2);
  EXPECT_EQ(out["hparams"]["precision"], "32-true");
}

// A CSV file's numeric columns by step: {column: {step: value}}; empty
// cells left out (the learning rate and the step's row are separate rows).
std::map<std::string, std::map<int64_t, double>> read_csv_columns(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::vector<std::string> header;
  std::map<std::string, std::map<int64_t, double>> out;
  auto split = [](const std::string& text) {
    std::vector<std::string> cells;
    std::string cell;
    std::istringstream s(text);
    while (std::getline(s, cell, ',')) cells.push_back(cell);
    if (!text.empty() && text.back() == ',') cells.emplace_back();
    return cells;
  };
  if (!std::getline(in, line)) return out;
  header = split(line);
  const auto step_col = std::find(header.begin(), header.end(), "step") - header.begin();
  while (std::getline(in, line)) {
    std::vector<std::string> cells = split(line);
    if (cells.size() < header.size()) cells.resize(header.size());  // trailing empty cells
    if (cells.size() != header.size()) {
      ADD_FAILURE() << path << ": row '" << line << "' has " << cells.size() << " cells, the header " << header.size();
      continue;
    }
    const int64_t step = std::stoll(cells[step_col]);
    for (size_t i = 0; i < cells.size(); ++i)
      if (!cells[i].empty() && header[i] != "step") out[header[i]][step] = std::stod(cells[i]);
  }
  return out;
}

// `strata train --logger csv,tensorboard` logs the learning rate
// (LearningRateMonitor, on by default), each step's throughput and MFU
// through the Trainer, so TensorBoard's reader, the CSV and the metrics
// file hold the same values at the same steps.
TEST_F(TensorBoardLoggerTest, StrataTrainLogsLearningRateThroughputAndMfu) {
  const char* binary_dir = std::getenv("STRATA_BINARY_DIR");
  ASSERT_TRUE(binary_dir && *binary_dir) << "STRATA_BINARY_DIR is not set: run the suite through ctest";
  constexpr int64_t kSteps = 4, kBatch = 4, kSeqLen = 32;
  const std::string command = std::string(binary_dir) +
                              "/strata train --devices 1 --strategy single_device --model-size tiny --max-steps 4 "
                              "--batch-size 4 --seq-len 32 --lr 0.003 --sample-tokens 0 --val-every 0 --log-every 1 "
                              "--logger csv,tensorboard --log-dir " + root_ + "/runs --metrics-file " + root_ +
                              "/metrics.jsonl > " + root_ + "/train.log 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const std::string run = root_ + "/runs/train/version_0";

  // The metrics file: one line per step, the values the loggers got.
  std::map<int64_t, nlohmann::json> lines;
  std::ifstream jsonl(root_ + "/metrics.jsonl");
  for (std::string line; std::getline(jsonl, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    lines[j["step"].get<int64_t>() - 1] = j;  // the loggers' step index is the step before
  }
  ASSERT_EQ(lines.size(), size_t(kSteps));

  // The CSV: every step has lr-AdamW, tokens_per_s, samples_per_s, mfu,
  // equal to the metrics file's (both are shortest round-trip decimals).
  const auto csv = read_csv_columns(run + "/metrics.csv");
  for (const char* column : {"lr-AdamW", "tokens_per_s", "samples_per_s", "mfu", "train_loss"}) {
    ASSERT_TRUE(csv.count(column)) << column;
    EXPECT_EQ(csv.at(column).size(), size_t(kSteps)) << column;
  }
  for (int64_t step = 0; step < kSteps; ++step) {
    ASSERT_TRUE(csv.at("tokens_per_s").count(step)) << step;
    EXPECT_EQ(csv.at("lr-AdamW").at(step), 0.003);
    EXPECT_EQ(csv.at("tokens_per_s").at(step), lines[step]["tokens_per_s"].get<double>()) << step;
    EXPECT_EQ(csv.at("samples_per_s").at(step), lines[step]["samples_per_s"].get<double>()) << step;
    EXPECT_EQ(csv.at("mfu").at(step), lines[step]["mfu"].get<double>()) << step;
    EXPECT_GT(csv.at("tokens_per_s").at(step), 0.0);
    EXPECT_GT(csv.at("mfu").at(step), 0.0);
    // Tokens are samples times the sequence length, from the same step time.
    EXPECT_NEAR(csv.at("tokens_per_s").at(step) / csv.at("samples_per_s").at(step), double(kSeqLen), 1e-9);
    // MFU is the model's FLOP/s over a rate fixed at start-up: in proportion
    // to tokens/s, with the same factor at every step.
    EXPECT_NEAR(csv.at("mfu").at(step) / csv.at("tokens_per_s").at(step),
                csv.at("mfu").at(0) / csv.at("tokens_per_s").at(0),
                1e-9 * csv.at("mfu").at(0) / csv.at("tokens_per_s").at(0));
  }

  // TensorBoard's own reader: the same scalars at the same steps (as float32).
  READ_BACK_OR_SKIP(out, run);
  const nlohmann::json& scalars = out["scalars"];
  for (const char* tag : {"lr-AdamW", "tokens_per_s", "samples_per_s", "mfu"}) {
    ASSERT_TRUE(scalars.contains(tag)) << tag << " in " << out.dump();
    ASSERT_EQ(scalars[tag].size(), size_t(kSteps)) << tag;
    for (int64_t step = 0; step < kSteps; ++step) {
      EXPECT_EQ(scalars[tag][step][0].get<int64_t>(), step) << tag;
      EXPECT_EQ(scalars[tag][step][1].get<double>(), double(float(csv.at(tag).at(step)))) << tag << " step " << step;
    }
  }
  EXPECT_EQ(out["hparams"]["batch_size"], kBatch);
  EXPECT_EQ(out["hparams"]["seq_len"], kSeqLen);
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
