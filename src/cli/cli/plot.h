// `strata plot`: a metrics file (Lightning's CSVLogger metrics.csv, or the
// JSON lines `strata train --metrics-file` and the JSONL logger write) read
// into series, and drawn as a chart of loss and learning rate against step,
// to SVG (text) or PNG (a small rasteriser and zlib).
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
  std::string title;  ///< the top line (the file name, say)
};

/// The series a chart shows: every column whose name holds "loss" on the
/// first panel (train first, then validation, then the rest), every column
/// starting with "lr" on the second. Throws ConfigError naming the columns
/// there are when neither kind has a finite value.
struct ChartSeries {
  std::vector<const Series*> loss;
  std::vector<const Series*> lr;
};
ChartSeries choose_series(const MetricsTable& table);

/// The chart as an SVG document.
std::string render_svg(const MetricsTable& table, const PlotOptions& options);
/// The chart as a PNG file (8-bit RGB).
std::string render_png(const MetricsTable& table, const PlotOptions& options);

}  // namespace strata::cli
