// `strata plot` as users run it: the built tool on metrics files in
// Lightning's CSVLogger layout and in `strata train`'s JSON lines, its SVG
// parsed as XML and its PNG decoded by tests/cli/read_plot.py (Python's
// xml.etree, zlib and a PNG reader written there), and its errors on
// hostile files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "support/tool.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::Outcome;
using ::strata::testing::run_strata;
using ::testing::HasSubstr;

class PlotTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "strata_plot_XXXXXX";
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string write(const std::string& name, const std::string& text) {
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }

  // What read_plot.py says about the picture at `file`.
  nlohmann::json read_picture(const std::string& file) {
    const char* python = std::getenv("STRATA_PYTHON");
    const char* source_dir = std::getenv("STRATA_SOURCE_DIR");
    const std::string script = (source_dir ? fs::path(source_dir) / "tests/cli" : fs::path(__FILE__).parent_path()) /
                               "read_plot.py";
    const std::string command = std::string(python && *python ? python : "python3") + " " + script + " '" + file +
                                "' 2>" + path("reader-stderr.txt");
    FILE* pipe = ::popen(command.c_str(), "r");
    if (pipe == nullptr) return {};
    std::string output;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, pipe)) > 0;) output.append(buf, n);
    if (::pclose(pipe) != 0) {
      std::ifstream err(path("reader-stderr.txt"));
      ADD_FAILURE() << "read_plot.py failed on " << file << ": " << err.rdbuf();
      return {};
    }
    return nlohmann::json::parse(output);
  }

  std::string dir_;
};

// Lightning's CSVLogger layout: sorted columns, training rows with the
// learning rate, validation rows with only val_loss, empty cells between.
std::string lightning_csv(int steps, int log_every, int val_every) {
  std::string csv = "epoch,lr-AdamW,step,train_loss,val_loss\n";
  for (int step = 0; step < steps; step += log_every) {
    const double lr = 3e-3 * std::min(1.0, step / 100.0);
    csv += std::to_string(step / 500) + "," + std::to_string(lr) + "," + std::to_string(step) + "," +
           std::to_string(4.0 * std::exp(-step / 300.0) + 1.0) + ",\n";
    if (step % val_every == val_every - log_every)
      csv += std::to_string(step / 500) + ",," + std::to_string(step) + ",," +
             std::to_string(4.0 * std::exp(-step / 300.0) + 1.2) + "\n";
  }
  return csv;
}

TEST_F(PlotTest, SvgOfALightningCsvParsesAsXmlWithOnePolylinePerSeries) {
  const std::string csv = write("metrics.csv", lightning_csv(1000, 10, 200));
  const Outcome o = run_strata({"plot", csv, "-o", path("loss.svg")});
  ASSERT_EQ(o.status, 0) << o.err;
  EXPECT_THAT(o.out, HasSubstr("strata plot: wrote " + path("loss.svg") + " from 105 rows of " + csv +
                               "; loss: train_loss, val_loss; learning rate: lr-AdamW"));
  const nlohmann::json svg = read_picture(path("loss.svg"));
  ASSERT_FALSE(svg.is_null());
  EXPECT_EQ(svg["width"], 1000);
  EXPECT_EQ(svg["height"], 720);
  EXPECT_EQ(svg["series"], nlohmann::json({{"train_loss", 100}, {"val_loss", 5}, {"lr-AdamW", 100}}));
  EXPECT_EQ(svg["dots"], 5);  // short series get a mark on every point
  const auto texts = svg["texts"].get<std::vector<std::string>>();
  for (const char* expected : {"loss", "learning rate", "step", "train_loss", "val_loss", "lr-AdamW", "0.003", "500"})
    EXPECT_NE(std::find(texts.begin(), texts.end(), expected), texts.end()) << expected;
}

TEST_F(PlotTest, PngOfStrataTrainJsonLinesDecodesToTheRequestedSize) {
  // What `strata train --metrics-file` writes, plus the NaN Python's json
  // writes and a null (a missing value).
  std::string jsonl;
  for (int step = 1; step <= 300; ++step) {
    const std::string loss = step == 150 ? "NaN" : step == 151 ? "null" : std::to_string(5.0 / std::sqrt(step));
    jsonl += "{\"step\":" + std::to_string(step) + ",\"loss\":" + loss +
             ",\"lr\":0.003,\"epoch\":0,\"tokens_per_s\":1234.5,\"elapsed_s\":" + std::to_string(step * 0.1) + "}\n";
  }
  const std::string file = write("metrics.jsonl", jsonl);
  const Outcome o = run_strata({"plot", file, "-o", path("out.png"), "--width", "800", "--height", "500"});
  ASSERT_EQ(o.status, 0) << o.err;
  EXPECT_THAT(o.out, HasSubstr("from 300 rows of " + file + "; loss: loss; learning rate: lr\n"));
  EXPECT_THAT(o.out, HasSubstr("strata plot: skipped 1 NaN/inf value (not drawn)"));
  const nlohmann::json png = read_picture(path("out.png"));
  ASSERT_FALSE(png.is_null());
  EXPECT_EQ(png["width"], 800);
  EXPECT_EQ(png["height"], 500);
  EXPECT_EQ(png["color_type"], 2);
  EXPECT_GT(png["pixels"]["255,255,255"].get<int>(), 800 * 500 / 2);  // a white page...
  EXPECT_GT(png["series_pixels"]["31,119,180"].get<int>(), 500);  // ...with the series drawn in blue on it
}

TEST_F(PlotTest, ARunFolderIsSearchedAndThePictureLandsBesideItsMetrics) {
  fs::create_directories(path("lightning_logs/version_0"));
  write("lightning_logs/version_0/metrics.csv", lightning_csv(100, 10, 50));
  const Outcome o = run_strata({"plot", path("lightning_logs/version_0")});
  ASSERT_EQ(o.status, 0) << o.err;
  const nlohmann::json png = read_picture(path("lightning_logs/version_0/plot.png"));
  ASSERT_FALSE(png.is_null());
  EXPECT_EQ(png["width"], 1000);
}

TEST_F(PlotTest, LongRunsAreThinnedToAFewPointsPerPixelColumn) {
  std::string csv = "step,train_loss\n";
  for (int step = 0; step < 100000; ++step) csv += std::to_string(step) + "," + std::to_string(1.0 + (step % 7)) + "\n";
  const std::string file = write("metrics.csv", csv);
  const Outcome o = run_strata({"plot", file, "-o", path("long.svg")});
  ASSERT_EQ(o.status, 0) << o.err;
  const nlohmann::json svg = read_picture(path("long.svg"));
  ASSERT_FALSE(svg.is_null());
  const int points = svg["series"]["train_loss"];
  EXPECT_GT(points, 1000);  // the shape is kept: a low and a high point per column
  EXPECT_LE(points, 2 * 1000);
  EXPECT_EQ(svg["series"].size(), 1u);  // no lr column: one panel
}

TEST_F(PlotTest, HostileFilesGetErrorsNamingTheLine) {
  const auto error_of = [&](const std::string& name, const std::string& text) {
    const std::string file = write(name, text);
    const Outcome o = run_strata({"plot", file, "-o", path("x.svg")});
    EXPECT_EQ(o.status, 1) << name;
    EXPECT_FALSE(fs::exists(path("x.svg"))) << name;
    return o.err;
  };
  EXPECT_EQ(error_of("a.csv", "step,train_loss\n1,2.5\n2,abc\n"),
            "strata: error: [plot] " + path("a.csv") + " line 3, column 'train_loss': 'abc' is not a number\n");
  EXPECT_EQ(error_of("b.csv", "step,train_loss\n1,2.5,7\n"),
            "strata: error: [plot] " + path("b.csv") + " line 2: 3 cells, but the header names 2 columns\n");
  EXPECT_THAT(error_of("c.csv", "epoch,train_loss\n1,2\n"),
              HasSubstr("line 1: the header names no 'step' column (2 columns, starting 'epoch')"));
  EXPECT_THAT(error_of("d.csv", ""), HasSubstr(path("d.csv") + " is empty; expected a header line naming 'step'"));
  EXPECT_THAT(error_of("e.csv", "step,train_loss\n" + std::string(70000, '1') + "\n"),
              HasSubstr(path("e.csv") + " line 2 is longer than 65536 bytes"));
  EXPECT_THAT(error_of("f.csv", "step,train_loss\n0x10,2\n"), HasSubstr("line 2: step '0x10' is not a number"));
  EXPECT_THAT(error_of("g.csv", "step,\"train_loss\n"), HasSubstr("line 1: a quoted cell is not closed"));
  EXPECT_THAT(error_of("h.jsonl", "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": \n"),
              HasSubstr(path("h.jsonl") + " line 2 is not valid JSON"));
  EXPECT_THAT(error_of("i.jsonl", "[1, 2]\n"), HasSubstr("line 1: expected a JSON object"));
  EXPECT_THAT(error_of("j.jsonl", "{\"loss\": 2}\n"), HasSubstr("line 1: the object has no \"step\""));
  EXPECT_THAT(error_of("k.jsonl", std::string(40, '[') + "\n"), HasSubstr("line 1: JSON nested deeper than 16 levels"));
  EXPECT_THAT(error_of("l.csv", "step,tokens_per_s\n1,5\n"),
              HasSubstr("has no value to plot: no column named *loss* or lr* with a finite value (columns: "
                        "tokens_per_s)"));
  EXPECT_THAT(error_of("m.csv", "step,train_loss\n1,nan\n2,inf\n"), HasSubstr("has no value to plot"));

  fs::create_directories(path("empty_run"));
  Outcome o = run_strata({"plot", path("empty_run")});
  EXPECT_EQ(o.status, 1);
  EXPECT_THAT(o.err, HasSubstr("the folder " + path("empty_run") + " holds neither metrics.csv nor metrics.jsonl"));
  o = run_strata({"plot", path("missing.csv")});
  EXPECT_THAT(o.err, HasSubstr(path("missing.csv") + " does not exist"));
  o = run_strata({"plot", write("ok.csv", "step,train_loss\n1,2\n"), "-o", path("x.jpg")});
  EXPECT_THAT(o.err, HasSubstr("-o " + path("x.jpg") + ": the name must end in .svg or .png"));
  o = run_strata({"plot", path("ok.csv"), "--width", "10"});
  EXPECT_EQ(o.err, "strata: error: [plot] --width '10' is out of range: it must be an integer in 320..4096\n");
  o = run_strata({"plot", path("ok.csv"), "--height", "1e3"});
  EXPECT_EQ(o.err, "strata: error: [plot] --height '1e3' is not a decimal integer: it must be an integer in "
                   "240..4096\n");
}

TEST_F(PlotTest, NonFiniteValuesAreSkippedAndCounted) {
  const std::string file = write("metrics.csv", "step,train_loss,val_loss\n1,2.0,\n2,NaN,\n3,inf,-Infinity\n4,1.5,1.7\n"
                                                "5,1e999,\n");
  const Outcome o = run_strata({"plot", file, "-o", path("n.svg")});
  ASSERT_EQ(o.status, 0) << o.err;
  EXPECT_THAT(o.out, HasSubstr("strata plot: skipped 4 NaN/inf values (not drawn)"));
  const nlohmann::json svg = read_picture(path("n.svg"));
  ASSERT_FALSE(svg.is_null());
  EXPECT_EQ(svg["series"], nlohmann::json({{"train_loss", 2}, {"val_loss", 1}}));
}

TEST_F(PlotTest, HelpNamesTheInputsAndTheFormats) {
  const Outcome o = run_strata({"plot", "--help"});
  EXPECT_EQ(o.status, 0);
  EXPECT_THAT(o.out, HasSubstr("RUN_DIR_OR_METRICS"));
  EXPECT_THAT(o.out, HasSubstr("NAME.svg or NAME.png"));
  EXPECT_THAT(o.out, HasSubstr("metrics.csv (Lightning's CSVLogger layout)"));
}

}  // namespace
}  // namespace strata::cli
