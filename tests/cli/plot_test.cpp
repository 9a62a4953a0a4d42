// `strata plot` as users run it: the built tool on metrics files in
// Lightning's CSVLogger layout and in `strata train`'s JSON lines, its SVG
// parsed as XML and its PNG (drawn by cairo) decoded by tests/cli/read_plot.py
// (Python's xml.etree, zlib and a PNG reader written there), and its errors on
// hostile files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "support/tool.h"

namespace strata::cli {
namespace {

namespace fs = std::filesystem;
using ::strata::testing::Outcome;
using ::strata::testing::run_strata;
using ::testing::HasSubstr;

// Whether this build's `strata` draws PNG: cairo was found at configure
// time (CMakeLists.txt; else plot_no_png.cpp refuses PNG output).
#ifdef STRATA_TEST_NO_PNG
constexpr bool kPngBuilt = false;
#else
constexpr bool kPngBuilt = true;
#endif
#define SKIP_WITHOUT_PNG() \
  if (!kPngBuilt) GTEST_SKIP() << "strata was built without cairo: no PNG output"

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

  // What read_plot.py says about the picture at `file` (for a PNG, also how
  // many pixels have each colour in `colours`, "r,g,b").
  nlohmann::json read_picture(const std::string& file, const std::vector<std::string>& colours = {}) {
    const char* python = std::getenv("STRATA_PYTHON");
    const char* source_dir = std::getenv("STRATA_SOURCE_DIR");
    const std::string script = (source_dir ? fs::path(source_dir) / "tests/cli" : fs::path(__FILE__).parent_path()) /
                               "read_plot.py";
    std::string command = std::string(python && *python ? python : "python3") + " " + script + " '" + file + "'";
    for (const std::string& c : colours) command += " " + c;
    command += " 2>" + path("reader-stderr.txt");
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
  SKIP_WITHOUT_PNG();
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
  // Antialiased lines and text: edges blend into the page in many shades.
  EXPECT_GT(png["grey_shades"].get<int>(), 40);
  EXPECT_GT(png["colours"].get<int>(), 200);
}

TEST_F(PlotTest, ARunFolderIsSearchedAndThePictureLandsBesideItsMetrics) {
  SKIP_WITHOUT_PNG();
  fs::create_directories(path("lightning_logs/version_0"));
  write("lightning_logs/version_0/metrics.csv", lightning_csv(100, 10, 50));
  const Outcome o = run_strata({"plot", path("lightning_logs/version_0")});
  ASSERT_EQ(o.status, 0) << o.err;
  const nlohmann::json png = read_picture(path("lightning_logs/version_0/plot.png"));
  ASSERT_FALSE(png.is_null());
  EXPECT_EQ(png["width"], 1000);
}

// A build without cairo refuses PNG output, saying what to do, and writes
// nothing.
TEST_F(PlotTest, WithoutCairoPngIsRefusedSayingWhatToDo) {
  if (kPngBuilt) GTEST_SKIP() << "strata was built with cairo";
  const Outcome o = run_strata({"plot", write("metrics.csv", "step,train_loss\n1,2\n"), "-o", path("x.png")});
  EXPECT_EQ(o.status, 1);
  EXPECT_THAT(o.err, HasSubstr("built without cairo, which draws the PNG: write SVG instead (-o NAME.svg)"));
  EXPECT_FALSE(fs::exists(path("x.png")));
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
  EXPECT_THAT(o.out, HasSubstr("--smooth"));
  EXPECT_THAT(o.out, HasSubstr("[0, 1)"));
  EXPECT_THAT(o.out, HasSubstr("--log-y"));
  EXPECT_THAT(o.out, HasSubstr("1 to 8 runs on one chart"));
}

// Noisy, decaying values with a NaN in the middle (TensorBoard passes a
// non-finite value through without moving its average; the reader drops it).
std::string noisy_csv(int steps) {
  std::string csv = "step,train_loss,val_loss,lr\n";
  for (int step = 0; step < steps; ++step) {
    const double noise = 0.5 * std::sin(step * 1.7) * std::cos(step * 0.31);
    const std::string loss = step == 20 ? "nan" : std::to_string(3.0 * std::exp(-step / 40.0) + 0.5 + noise);
    csv += std::to_string(step) + "," + loss + "," + (step % 10 == 9 ? std::to_string(2.0 - step / 100.0) : "") +
           "," + std::to_string(1e-3 * (1 + step % 3)) + "\n";
  }
  return csv;
}

// TensorBoard's scalar smoothing, written out from its line chart's
// resmoothDataset (tensorboard/components/vz_line_chart2/line-chart.ts):
//   last = last * w + (1 - w) * value;  smoothed = last / (1 - w^(finite values so far))
std::vector<double> tensorboard_smoothing(const std::vector<double>& values, double w) {
  std::vector<double> out;
  double last = 0;
  double num_accum = 0;
  for (double v : values) {
    if (!std::isfinite(v)) {
      out.push_back(v);
      continue;
    }
    last = last * w + (1 - w) * v;
    num_accum += 1;
    out.push_back(last / (1 - std::pow(w, num_accum)));
  }
  return out;
}

TEST_F(PlotTest, SmoothingIsTensorBoardsDebiasedMovingAverageDrawnOverTheRawValues) {
  const std::string file = write("metrics.csv", noisy_csv(200));
  const Outcome o = run_strata({"plot", file, "-o", path("s.svg"), "--smooth", "0.6"});
  ASSERT_EQ(o.status, 0) << o.err;
  const nlohmann::json svg = read_picture(path("s.svg"));
  ASSERT_FALSE(svg.is_null());
  // The raw values as logged (the NaN row left out), drawn faint, and the
  // smoothed ones on top.
  const auto raw = svg["values"]["train_loss (raw)"].get<std::vector<double>>();
  const auto smoothed = svg["values"]["train_loss"].get<std::vector<double>>();
  ASSERT_EQ(raw.size(), 199u);
  ASSERT_EQ(smoothed.size(), 199u);
  EXPECT_NEAR(raw[0], 3.5, 1e-6);  // step 0: 3 e^0 + 0.5 + 0
  // By hand: the first smoothed value is the first value (debiased), the
  // second (0.6 * 0.4 v0 + 0.4 v1) / (1 - 0.36).
  EXPECT_DOUBLE_EQ(smoothed[0], raw[0]);
  EXPECT_NEAR(smoothed[1], (0.6 * 0.4 * raw[0] + 0.4 * raw[1]) / 0.64, 1e-12);
  const std::vector<double> expected = tensorboard_smoothing(raw, 0.6);
  for (std::size_t i = 0; i < raw.size(); ++i) EXPECT_NEAR(smoothed[i], expected[i], 1e-12) << i;
  // Validation loss is smoothed too (TensorBoard smooths every scalar)...
  const auto val_raw = svg["values"]["val_loss (raw)"].get<std::vector<double>>();
  EXPECT_EQ(svg["values"]["val_loss"].get<std::vector<double>>(), tensorboard_smoothing(val_raw, 0.6));
  // ...the learning rate is drawn as logged: a schedule is not noise.
  EXPECT_FALSE(svg["values"].contains("lr (raw)"));
  EXPECT_NEAR(svg["values"]["lr"][1].get<double>(), 2e-3, 1e-12);
  // The raw line is a faint tint of the smoothed line's colour, drawn first.
  EXPECT_EQ(svg["strokes"]["train_loss"], "#1f77b4");
  EXPECT_EQ(svg["strokes"]["train_loss (raw)"], "#b7d3e7");
  const auto texts = svg["texts"].get<std::vector<std::string>>();
  EXPECT_NE(std::find(texts.begin(), texts.end(), "200 rows; loss smoothed 0.6; 1 NaN/inf value skipped"),
            texts.end());

  // The PNG shows both: the faint raw tint and the full colour.
  if (kPngBuilt) {
    const Outcome p = run_strata({"plot", file, "-o", path("s.png"), "--smooth", "0.9"});
    ASSERT_EQ(p.status, 0) << p.err;
    const nlohmann::json png = read_picture(path("s.png"), {"183,211,231"});
    ASSERT_FALSE(png.is_null());
    EXPECT_GT(png["series_pixels"]["183,211,231"].get<int>(), 300);
    EXPECT_GT(png["series_pixels"]["31,119,180"].get<int>(), 300);
  }

  // --smooth 0 (the default) draws the values as logged, with no raw copy.
  const Outcome z = run_strata({"plot", file, "-o", path("z.svg"), "--smooth", "0"});
  ASSERT_EQ(z.status, 0) << z.err;
  const nlohmann::json plain = read_picture(path("z.svg"));
  EXPECT_EQ(plain["values"]["train_loss"].get<std::vector<double>>(), raw);
  EXPECT_FALSE(plain["values"].contains("train_loss (raw)"));
}

TEST_F(PlotTest, LogScaleMapsDecadesToEqualDistancesAndLeavesOutValuesAtOrBelowZero) {
  // Loss falling a decade a step; a warm-up learning rate that starts at 0.
  const std::string file = write("metrics.csv", "step,train_loss,lr\n0,1000,0\n1,100,1e-4\n2,10,1e-3\n"
                                                "3,1,1e-3\n4,0.1,1e-3\n");
  const Outcome o = run_strata({"plot", file, "-o", path("log.svg"), "--log-y"});
  ASSERT_EQ(o.status, 0) << o.err;
  EXPECT_THAT(o.out, HasSubstr("strata plot: --log-y: left out 1 value <= 0 of lr, the first 0 at step 0\n"));
  const nlohmann::json svg = read_picture(path("log.svg"));
  ASSERT_FALSE(svg.is_null());
  // Equal ratios, equal distances: each decade is the same number of pixels.
  const auto points = svg["points"]["train_loss"];
  ASSERT_EQ(points.size(), 5u);
  const double decade = points[1][1].get<double>() - points[0][1].get<double>();
  EXPECT_GT(decade, 50);  // down the page as the loss falls
  for (int i = 1; i < 4; ++i) EXPECT_NEAR(points[i + 1][1].get<double>() - points[i][1].get<double>(), decade, 0.15);
  // The tick labels are the decades, the same distance apart as the points.
  std::map<std::string, double> tick_y;
  for (const auto& t : svg["text_at"])  // the y axis's labels end 8 pixels left of the frame
    if (t[1].get<double>() == 84.0) tick_y[t[0].get<std::string>()] = t[2].get<double>();
  for (const char* tick : {"0.1", "1", "10", "100", "1000"}) ASSERT_TRUE(tick_y.count(tick)) << tick;
  EXPECT_NEAR(tick_y["1"] - tick_y["10"], decade, 0.15);
  EXPECT_NEAR(tick_y["0.1"] - tick_y["1000"], 4 * decade, 0.3);
  EXPECT_NEAR(tick_y["1"], points[3][1].get<double>(), 0.15);
  // The learning rate keeps its positive values.
  EXPECT_EQ(svg["values"]["lr"], nlohmann::json({1e-4, 1e-3, 1e-3, 1e-3}));
  const auto texts = svg["texts"].get<std::vector<std::string>>();
  EXPECT_NE(std::find(texts.begin(), texts.end(), "loss (log)"), texts.end());
  EXPECT_NE(std::find(texts.begin(), texts.end(), "5 rows; 1 value <= 0 left off the log scale"), texts.end());

  // Nothing above 0: an error naming the metric and the value.
  const Outcome bad = run_strata({"plot", write("neg.csv", "step,train_loss\n1,-0.5\n2,0\n"), "-o",
                                  path("neg.svg"), "--log-y"});
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.err, HasSubstr("[plot] --log-y: the metrics to plot have no value above 0 (train_loss of "));
  EXPECT_THAT(bad.err, HasSubstr(" is -0.5 at step 1); a log scale shows only positive values, so drop --log-y"));
  EXPECT_FALSE(fs::exists(path("neg.svg")));
}

TEST_F(PlotTest, SeveralRunsShareOneChartEachInItsColourWithALegendNamingTheRun) {
  fs::create_directories(path("runs/alpha"));
  fs::create_directories(path("runs/beta"));
  write("runs/alpha/metrics.csv", lightning_csv(400, 10, 100));
  std::string jsonl;
  for (int step = 1; step <= 300; ++step)
    jsonl += "{\"step\":" + std::to_string(step) + ",\"loss\":" + std::to_string(6.0 / std::sqrt(step)) + "}\n";
  write("runs/beta/metrics.jsonl", jsonl);
  const Outcome o = run_strata({"plot", path("runs/alpha"), path("runs/beta"), "-o", path("two.svg")});
  ASSERT_EQ(o.status, 0) << o.err;
  EXPECT_THAT(o.out, HasSubstr("strata plot: wrote " + path("two.svg") + "\n  alpha: 44 rows of " +
                               path("runs/alpha/metrics.csv") + "; loss: train_loss, val_loss; learning rate: "
                               "lr-AdamW\n  beta: 300 rows of " + path("runs/beta/metrics.jsonl") + "; loss: loss\n"));
  const nlohmann::json svg = read_picture(path("two.svg"));
  ASSERT_FALSE(svg.is_null());
  EXPECT_EQ(svg["series"], nlohmann::json({{"alpha: train_loss", 40},
                                           {"alpha: val_loss", 4},
                                           {"beta: loss", 300},
                                           {"alpha: lr-AdamW", 40}}));
  // One hue per run: alpha blue (its validation a darker blue), beta orange.
  EXPECT_EQ(svg["strokes"]["alpha: train_loss"], "#1f77b4");
  EXPECT_EQ(svg["strokes"]["beta: loss"], "#e67814");
  EXPECT_NE(svg["strokes"]["alpha: val_loss"], svg["strokes"]["alpha: train_loss"]);
  const auto texts = svg["texts"].get<std::vector<std::string>>();
  for (const char* expected : {"alpha vs beta", "alpha: train_loss", "alpha: val_loss", "beta: loss",
                               "alpha: lr-AdamW", "344 rows from 2 runs"})
    EXPECT_NE(std::find(texts.begin(), texts.end(), expected), texts.end()) << expected;

  // The PNG has both runs' colours; with several runs it lands in the
  // current folder unless -o says where.
  if (kPngBuilt) {
    const Outcome p = run_strata({"plot", path("runs/alpha"), path("runs/beta"), "-o", path("two.png"), "--title",
                                  "alpha & beta <lr 3e-3>"});
    ASSERT_EQ(p.status, 0) << p.err;
    const nlohmann::json png = read_picture(path("two.png"));
    ASSERT_FALSE(png.is_null());
    EXPECT_GT(png["series_pixels"]["31,119,180"].get<int>(), 300);
    EXPECT_GT(png["series_pixels"]["230,120,20"].get<int>(), 300);
  }

  // --title replaces the run names (escaped for XML in SVG).
  const Outcome t = run_strata({"plot", path("runs/alpha"), "-o", path("t.svg"), "--title", "alpha & <b>"});
  ASSERT_EQ(t.status, 0) << t.err;
  const auto titled = read_picture(path("t.svg"))["texts"].get<std::vector<std::string>>();
  EXPECT_NE(std::find(titled.begin(), titled.end(), "alpha & <b>"), titled.end());
}

TEST_F(PlotTest, TheTitleIsTheRunsFolderNameAndLightningVersionsKeepTheirParent) {
  fs::create_directories(path("gpt-small/lightning_logs/version_3"));
  write("gpt-small/lightning_logs/version_3/metrics.csv", lightning_csv(100, 10, 50));
  fs::create_directories(path("gpt-small/run7"));
  write("gpt-small/run7/metrics.csv", lightning_csv(100, 10, 50));
  const auto title_of = [&](const std::vector<std::string>& args) {
    std::vector<std::string> all = {"plot"};
    all.insert(all.end(), args.begin(), args.end());
    all.insert(all.end(), {"-o", path("title.svg")});
    const Outcome o = run_strata(all);
    EXPECT_EQ(o.status, 0) << o.err;
    const nlohmann::json svg = read_picture(path("title.svg"));
    return svg.is_null() ? std::string() : svg["texts"][0].get<std::string>();
  };
  EXPECT_EQ(title_of({path("gpt-small/lightning_logs/version_3")}), "lightning_logs/version_3");
  EXPECT_EQ(title_of({path("gpt-small/run7")}), "run7");
  EXPECT_EQ(title_of({path("gpt-small/run7/metrics.csv")}), "run7");
  EXPECT_EQ(title_of({path("gpt-small/run7") + "/"}), "run7");
  // Two runs of one name are told apart by the paths given.
  fs::create_directories(path("other/run7"));
  write("other/run7/metrics.csv", lightning_csv(100, 10, 50));
  EXPECT_EQ(title_of({path("gpt-small/run7"), path("other/run7"), "--width", "1600"}),
            path("gpt-small/run7") + " vs " + path("other/run7"));
}

TEST_F(PlotTest, HostilePlotFlagsGetErrorsNamingTheValueAndTheRange) {
  const std::string file = write("ok.csv", "step,train_loss\n1,2\n2,1\n");
  const auto error_of = [&](const std::vector<std::string>& flags) {
    std::vector<std::string> args = {"plot", file, "-o", path("x.svg")};
    args.insert(args.end(), flags.begin(), flags.end());
    const Outcome o = run_strata(args);
    EXPECT_EQ(o.status, 1);
    EXPECT_FALSE(fs::exists(path("x.svg")));
    return o.err;
  };
  EXPECT_EQ(error_of({"--smooth", "1"}),
            "strata: error: [plot] --smooth '1' is out of range: it must be a number in [0, 1)\n");
  EXPECT_EQ(error_of({"--smooth", "-0.1"}),
            "strata: error: [plot] --smooth '-0.1' is out of range: it must be a number in [0, 1)\n");
  EXPECT_THAT(error_of({"--smooth", "nan"}), HasSubstr("--smooth 'nan' is not a decimal number"));
  EXPECT_THAT(error_of({"--smooth", "0x1"}), HasSubstr("--smooth '0x1' is not a decimal number"));
  EXPECT_THAT(error_of({"--smooth", "1e-400"}), HasSubstr("--smooth '1e-400' is out of range"));
  EXPECT_THAT(error_of({"--smooth", ""}), HasSubstr("--smooth '' is not a decimal number"));
  std::vector<std::string> nine = {"plot"};
  for (int i = 0; i < 9; ++i) nine.push_back(file);
  const Outcome o = run_strata(nine);
  EXPECT_EQ(o.err, "strata: error: [plot] 9 runs given; at most 8 fit on one chart (one colour each): plot fewer "
                   "at a time\n");
}

}  // namespace
}  // namespace strata::cli
