// `strata plot`: metrics files (Lightning's CSVLogger metrics.csv, or the
// JSON lines `strata train --metrics-file` and the JSONL logger write) read
// into series, and drawn as a chart of loss and learning rate against step,
// one or several runs on one chart, optionally smoothed as TensorBoard
// smooths and on a log-scale y axis, to SVG (text) or PNG (drawn by cairo).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::cli {

/// One metric: its values against step, in file order.
struct Series {
  std::string name;
  std::vector<double> steps;
  std::vector<double> values;
};

/// What read_metrics found in a file.
struct MetricsTable {
  std::string path;                 ///< the file read
  std::vector<std::string> columns; ///< every metric name, in first-seen order ("step" excluded)
  std::vector<Series> series;       ///< one per column, same order
  std::int64_t rows = 0;            ///< data lines read
  std::int64_t skipped = 0;         ///< NaN/inf values (and rows with a non-finite step) left out
};

/// Limits on a metrics file.
struct MetricsLimits {
  std::uint64_t max_bytes = 512ull << 20;  ///< the whole file
  std::size_t max_line = 1 << 16;          ///< one line, in bytes
  std::size_t max_columns = 4096;          ///< metric names
  int max_depth = 16;                      ///< JSON nesting in one line
};

/// The metrics file `path` names: the file itself, or metrics.csv then
/// metrics.jsonl inside a folder. Throws ConfigError naming the path when
/// there is none.
std::string find_metrics_file(const std::string& path);

/// Reads a metrics file: CSV (a header naming `step` and the metrics, then
/// rows with empty cells for missing values) when its name ends in .csv,
/// JSON lines (one object per line with "step" and numbers) when it ends
/// in .jsonl or .json, else by its first character. Throws ConfigError
/// "[plot] FILE line N: ..." for a bad number, a ragged row, a line past
/// the limit, a file past the limit or a missing `step`.
MetricsTable read_metrics(const std::string& file, const MetricsLimits& limits = {});

/// How the chart looks.
struct PlotOptions {
  int width = 1000;
  int height = 720;
  std::string title;   ///< the top line (the run's name, say)
  double smooth = 0;   ///< TensorBoard's smoothing weight in [0, 1); 0 draws the values as logged
  bool log_y = false;  ///< log-scale y axes; values <= 0 are left out (see LogSkip)
};

/// One run on the chart: the name its legend entries carry and its metrics.
struct PlotRun {
  std::string name;
  MetricsTable table;
};

/// The name of the run whose metrics file is `metrics_file`, given on the
/// command line as `input`: the folder holding the file; for Lightning's
/// `version_N` folders, "PARENT/version_N" (a bare version number says
/// little). The path itself when it has no folder name.
std::string run_name(const std::string& input, const std::string& metrics_file);

/// TensorBoard's scalar smoothing (its line chart's resmoothDataset): an
/// exponential moving average started at 0 and debiased, in file order,
///   last = last * weight + (1 - weight) * value;  smoothed = last / (1 - weight^n)
/// with n the count of finite values so far. Non-finite values pass through
/// unchanged and do not move the average; a series whose values are all
/// equal is returned as it is. `weight` must be in [0, 1).
std::vector<double> smooth_values(const std::vector<double>& values, double weight);

/// Values a log-scale axis could not show: for one metric of one run, how
/// many were <= 0, and the first of them.
struct LogSkip {
  std::string run;
  std::string metric;
  std::int64_t count = 0;
  double first_step = 0, first_value = 0;
};
/// What `--log-y` leaves out of the series the chart of `runs` shows.
std::vector<LogSkip> log_skips(const std::vector<PlotRun>& runs);

/// The series a chart shows: every column whose name holds "loss" on the
/// first panel (train first, then validation, then the rest), every column
/// starting with "lr" on the second. Throws ConfigError naming the columns
/// there are when neither kind has a finite value.
struct ChartSeries {
  std::vector<const Series*> loss;
  std::vector<const Series*> lr;
};
ChartSeries choose_series(const MetricsTable& table);

/// The chart of `runs` (one or more) as an SVG document. Throws ConfigError
/// when, with log_y, no series keeps a value above 0.
std::string render_svg(const std::vector<PlotRun>& runs, const PlotOptions& options);
/// The chart as a PNG file (8-bit RGB), drawn by cairo with antialiased
/// lines and text in DejaVu Sans Mono.
std::string render_png(const std::vector<PlotRun>& runs, const PlotOptions& options);

}  // namespace strata::cli
