// `strata plot RUN [RUN...] [-o OUT.svg|OUT.png] [--smooth W] [--log-y]`:
// draws train and validation loss and the learning rate against step from
// one or more runs' metrics files (plot_metrics.cpp) on one chart, laid out
// once (plot_chart.cpp) and written as SVG (plot_svg.cpp) or PNG drawn by
// cairo (plot_png.cpp).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/plot.h"
#include "strata/core/error.h"

namespace strata::cli {
namespace {

// One colour per run (the chart's palette), so no more runs than colours.
constexpr std::size_t kMaxRuns = 8;

struct PlotConfig {
  std::vector<std::string> inputs;
  std::string output;
  PlotOptions options;
};

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Writes through a temporary file and a rename: a reader (an image viewer
// refreshing) sees the old picture or the new one.
void write_output(const std::string& path, const std::string& bytes) {
  const std::string temp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  STRATA_CHECK(fd >= 0, ConfigError, "[plot] cannot write ", path, ": ", detail::errno_string(errno),
               "; choose another -o");
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : ENOSPC;
      ::close(fd);
      ::unlink(temp.c_str());
      throw Error(detail::cat("[plot] writing ", path, " failed: ", detail::errno_string(err)));
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0 || ::rename(temp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(temp.c_str());
    throw Error(detail::cat("[plot] writing ", path, " failed: ", detail::errno_string(err)));
  }
}

std::string names(const std::vector<const Series*>& series) {
  std::string out;
  for (const Series* s : series) out += (out.empty() ? "" : ", ") + s->name.substr(0, 40);
  return out;
}

int run_plot(PlotConfig config) {
  STRATA_CHECK(config.inputs.size() <= kMaxRuns, ConfigError, "[plot] ", config.inputs.size(),
               " runs given; at most ", kMaxRuns, " fit on one chart (one colour each): plot fewer at a time");
  std::vector<PlotRun> runs;
  std::vector<std::string> files;
  for (const std::string& input : config.inputs) {
    files.push_back(find_metrics_file(input));
    runs.push_back(PlotRun{run_name(input, files.back()), {}});
  }
  // Two runs of one name (version_0 of two experiments given by a bare
  // folder name) would share a legend text: those are named by the path given.
  std::vector<bool> shared(runs.size(), false);
  for (std::size_t i = 0; i < runs.size(); ++i)
    for (std::size_t j = 0; j < runs.size(); ++j) shared[i] = shared[i] || (i != j && runs[i].name == runs[j].name);
  for (std::size_t i = 0; i < runs.size(); ++i)
    if (shared[i]) runs[i].name = config.inputs[i];
  // Several runs: the picture belongs to none of them, so it goes to the
  // current folder unless -o says otherwise.
  if (config.output.empty())
    config.output = runs.size() == 1 ? (std::filesystem::path(files[0]).parent_path() / "plot.png").string()
                                     : "plot.png";
  const bool svg = ends_with(config.output, ".svg");
  STRATA_CHECK(svg || ends_with(config.output, ".png"), ConfigError, "[plot] -o ", config.output,
               ": the name must end in .svg or .png (that picks the format)");
  std::vector<ChartSeries> chosen;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    runs[i].table = read_metrics(files[i]);
    chosen.push_back(choose_series(runs[i].table));
  }
  if (config.options.title.empty()) {
    for (const PlotRun& run : runs) config.options.title += (config.options.title.empty() ? "" : " vs ") + run.name;
  }
  write_output(config.output, svg ? render_svg(runs, config.options) : render_png(runs, config.options));

  std::cout << "strata plot: wrote " << config.output;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    std::cout << (runs.size() == 1 ? " from " : i == 0 ? "\n  " + runs[i].name + ": " : "  " + runs[i].name + ": ")
              << runs[i].table.rows << " rows of " << files[i];
    if (!chosen[i].loss.empty()) std::cout << "; loss: " << names(chosen[i].loss);
    if (!chosen[i].lr.empty()) std::cout << "; learning rate: " << names(chosen[i].lr);
    std::cout << "\n";
  }
  std::int64_t skipped = 0;
  for (const PlotRun& run : runs) skipped += run.table.skipped;
  if (skipped > 0)
    std::cout << "strata plot: skipped " << skipped << " NaN/inf value" << (skipped == 1 ? "" : "s")
              << " (not drawn)\n";
  if (config.options.log_y) {
    // Note [Log scale and values <= 0]: TensorBoard's log axis drops them
    // too; a warm-up that starts the learning rate at 0 is common, and
    // refusing the whole chart for it would make --log-y useless there.
    for (const LogSkip& s : log_skips(runs)) {
      std::cout << "strata plot: --log-y: left out " << s.count << " value" << (s.count == 1 ? "" : "s")
                << " <= 0 of " << s.metric.substr(0, 40);
      if (runs.size() > 1) std::cout << " (" << s.run << ")";
      char first[96];
      std::snprintf(first, sizeof first, ", the first %.6g at step %.15g\n", s.first_value, s.first_step);
      std::cout << first;
    }
  }
  return 0;
}

}  // namespace

Command make_plot_command() {
  auto config = std::make_shared<PlotConfig>();
  auto numbers = std::make_shared<NumericFlags>("plot");
  Command command;
  command.register_fn = [config, numbers](CLI::App& app) {
    CLI::App* sub = app.add_subcommand(
        "plot",
        "Draw train and validation loss and the learning rate against step.\n"
        "Reads a metrics.csv (Lightning's CSVLogger layout) or a metrics.jsonl (strata train\n"
        "--metrics-file, the JSON lines logger), or the run folder holding one. Loss panel: every\n"
        "column whose name holds 'loss'; learning-rate panel: every column starting with 'lr'.\n"
        "NaN and inf values are skipped and counted. Several runs share one chart, one colour\n"
        "each, the legend naming the run; the title is the run's folder name (or --title).\n"
        "--smooth is TensorBoard's smoothing slider (the same debiased moving average) for the\n"
        "loss panel: the raw values stay faint underneath. --log-y leaves out values <= 0 and\n"
        "says how many, as TensorBoard's log axis does.\n"
        "Example: strata plot lightning_logs/version_0 -o loss.svg\n"
        "         strata plot runs/a runs/b --smooth 0.6 --log-y -o compare.png");
    sub->add_option("RUN_DIR_OR_METRICS", config->inputs,
                    "Run folders, metrics.csv or metrics.jsonl files: 1 to 8 runs on one chart")
        ->required();
    sub->add_option("-o,--output", config->output,
                    "Picture to write: NAME.svg or NAME.png (default: plot.png beside the metrics file; "
                    "with several runs, plot.png in the current folder)");
    NumericFlags& n = *numbers;
    PlotOptions& o = config->options;
    n.add_integer(sub, "--width", "Picture width in pixels", 320, 4096, [&o](int64_t v) { o.width = int(v); },
                  "1000");
    n.add_integer(sub, "--height", "Picture height in pixels", 240, 4096, [&o](int64_t v) { o.height = int(v); },
                  "720");
    n.add_real(sub, "--smooth", "TensorBoard's smoothing weight for loss (0: none; 0.6 is TensorBoard's default)",
               Range{false, 0, 1, false, true}, [&o](double v) { o.smooth = v; }, "0");
    sub->add_flag("--log-y", o.log_y, "Log-scale y axes (values <= 0 are left out, and counted)");
    sub->add_option("--title", o.title,
                    "Line at the top (default: the run's folder name; with several runs, their names)");
    return sub;
  };
  command.run = [config, numbers] {
    numbers->apply();
    return run_plot(*config);
  };
  return command;
}

}  // namespace strata::cli
