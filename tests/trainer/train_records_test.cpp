// One `strata train` run's records agree (issue 25, "Records that
// disagree"): the --metrics-file lines, the CSV, jsonl and TensorBoard loggers,
// the progress lines and the final line hold the same train_loss for each
// step and the same val_loss for each validation, once, at the step it was
// taken, the last one included. The loggers' steps are
// Lightning's step index (the global step after the step, minus 1); the
// metrics file's "step" is the global step.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include "support/tool.h"
#include "trainer_util.h"

namespace {

using namespace strata::testing;
namespace fs = std::filesystem;
using ByStep = std::map<int64_t, double>;

// The one folder under `dir` (a version folder).
std::string only_child(const std::string& dir) {
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(dir)) found.push_back(e.path().string());
  EXPECT_EQ(found.size(), 1u) << dir;
  return found.empty() ? "" : found.front();
}

// metrics.csv's column `name` by step (rows where it is filled).
ByStep csv_column(const std::string& file, const std::string& name) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  std::vector<std::string> header;
  std::stringstream h(line);
  for (std::string cell; std::getline(h, cell, ',');) header.push_back(cell);
  const size_t step_col = std::find(header.begin(), header.end(), "step") - header.begin();
  const size_t col = std::find(header.begin(), header.end(), name) - header.begin();
  ByStep out;
  while (std::getline(in, line)) {
    std::vector<std::string> row;
    std::stringstream cells(line);
    for (std::string cell; std::getline(cells, cell, ',');) row.push_back(cell);
    row.resize(header.size());
    if (col < row.size() && !row[col].empty()) {
      EXPECT_EQ(out.count(std::stoll(row[step_col])), 0u) << name << " twice at step " << row[step_col];
      out[std::stoll(row[step_col])] = std::stod(row[col]);
    }
  }
  return out;
}

void expect_close(double a, double b, double relative, const std::string& what) {
  EXPECT_LE(std::abs(a - b), relative * std::max(std::abs(b), 1e-12)) << what << ": " << a << " vs " << b;
}

TEST(TrainRecordsTest, EveryRecordOfOneRunHoldsTheSameValuesAtTheSameSteps) {
  if (!fs::exists(strata_binary())) GTEST_SKIP() << "the strata tool is not built (" << strata_binary() << ")";
  if (project_python().empty()) GTEST_SKIP() << "STRATA_PYTHON is not set (run through ctest)";
  TempDir dir("records");
  const std::string jsonl = dir.path + "/metrics.jsonl";
  // 2 workers, accumulation 2, validation every 5 steps: the last one at the last step.
  Outcome run = run_strata({"train", "--model-size", "tiny", "--seq-len", "16", "--batch-size", "4", "--grad-accum",
                            "2", "--max-steps", "10", "--val-every", "5", "--val-batches", "1", "--log-every", "1",
                            "--logger", "csv,tensorboard,jsonl", "--log-dir", dir.path + "/runs", "--metrics-file", jsonl,
                            "--sample-tokens", "0", "--devices", "2"});
  ASSERT_EQ(run.status, 0) << run.out << run.err;

  // The metrics file: one line a step, val_loss only at steps 5 and 10.
  ByStep loss, val;
  std::ifstream lines(jsonl);
  for (std::string line; std::getline(lines, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    const int64_t step = j.at("step").get<int64_t>();
    EXPECT_EQ(loss.count(step), 0u) << "two lines for step " << step;
    loss[step] = j.at("loss").get<double>();
    if (j.contains("val_loss")) val[step] = j["val_loss"].get<double>();
  }
  ASSERT_EQ(loss.size(), 10u);
  EXPECT_EQ(loss.begin()->first, 1);
  ASSERT_EQ(val.size(), 2u) << "val_loss on the lines of steps 5 and 10 only";
  EXPECT_EQ(val.begin()->first, 5);
  EXPECT_EQ(val.rbegin()->first, 10);

  // CSV: the same doubles, at step index - 1.
  const std::string version = only_child(dir.path + "/runs/train");
  const ByStep csv_loss = csv_column(version + "/metrics.csv", "train_loss");
  const ByStep csv_val = csv_column(version + "/metrics.csv", "val_loss");
  ASSERT_EQ(csv_loss.size(), loss.size());
  for (const auto& [step, value] : loss) {
    ASSERT_EQ(csv_loss.count(step - 1), 1u) << step;
    EXPECT_EQ(csv_loss.at(step - 1), value) << "train_loss of step " << step;
  }
  ASSERT_EQ(csv_val.size(), val.size());
  for (const auto& [step, value] : val) EXPECT_EQ(csv_val.at(step - 1), value) << "val_loss of step " << step;

  // The jsonl logger's rows: the same doubles at the same step index.
  ByStep logger_loss, logger_val;
  std::ifstream rows(version + "/metrics.jsonl");
  for (std::string line; std::getline(rows, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("train_loss")) logger_loss[j["step"].get<int64_t>() + 1] = j["train_loss"].get<double>();
    if (j.contains("val_loss")) logger_val[j["step"].get<int64_t>() + 1] = j["val_loss"].get<double>();
  }
  EXPECT_EQ(logger_loss, loss);
  EXPECT_EQ(logger_val, val);

  // TensorBoard, read by its own reader: float32 of the same values.
  Outcome tb = run_python("tests/loggers/read_tensorboard.py", {version});
  if (tb.status == 77) GTEST_SKIP() << "tensorboard is not installed: " << tb.err;
  ASSERT_EQ(tb.status, 0) << tb.err;
  const nlohmann::json scalars = nlohmann::json::parse(tb.out)["scalars"];
  for (const auto& [tag, want] : std::map<std::string, ByStep>{{"train_loss", loss}, {"val_loss", val}}) {
    ASSERT_TRUE(scalars.contains(tag)) << tb.out;
    ASSERT_EQ(scalars[tag].size(), want.size()) << tag;
    for (const auto& point : scalars[tag]) {
      const int64_t step = point[0].get<int64_t>() + 1;
      ASSERT_EQ(want.count(step), 1u) << tag << " at step index " << point[0];
      expect_close(point[1].get<double>(), want.at(step), 1e-6, tag + " of step " + std::to_string(step));
    }
  }

  // The progress lines (a pipe: plain lines every --log-every steps) and
  // the validation lines, at their 4 decimals.
  for (const auto& [step, value] : loss) {
    std::smatch m;
    const std::regex line("\\| step " + std::to_string(step) + "/10 \\| loss ([0-9.]+)");
    ASSERT_TRUE(std::regex_search(run.out, m, line)) << "no progress line for step " << step << "\n" << run.out;
    EXPECT_NEAR(std::stod(m[1]), value, 0.51e-4) << "step " << step;
  }
  for (const auto& [step, value] : val) {
    std::smatch m;
    const std::regex line("validation at step " + std::to_string(step) + ": val_loss ([0-9.]+)");
    ASSERT_TRUE(std::regex_search(run.out, m, line)) << run.out;
    EXPECT_NEAR(std::stod(m[1]), value, 0.51e-4) << "step " << step;
  }

  // The final line: step 10's train_loss and val_loss (6 significant digits).
  std::smatch m;
  ASSERT_TRUE(std::regex_search(run.out, m, std::regex("done: 10 steps, final loss ([0-9.e+-]+), validation loss "
                                                       "([0-9.e+-]+)")))
      << run.out;
  expect_close(std::stod(m[1]), loss.at(10), 1e-5, "final loss");
  expect_close(std::stod(m[2]), val.at(10), 1e-5, "final validation loss");
}

}  // namespace
