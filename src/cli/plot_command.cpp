// `strata plot RUN_DIR_OR_METRICS [-o OUT.svg|OUT.png]`: draws train and
// validation loss and the learning rate against step from a metrics file
// (plot_metrics.cpp), laid out once (plot_chart.cpp) and written as SVG
// (plot_svg.cpp) or PNG (plot_raster.cpp).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/plot.h"
#include "strata/core/error.h"

namespace strata::cli {
namespace {

struct PlotConfig {
  std::string input;
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
  const std::string file = find_metrics_file(config.input);
  if (config.output.empty()) config.output = (std::filesystem::path(file).parent_path() / "plot.png").string();
  const bool svg = ends_with(config.output, ".svg");
  STRATA_CHECK(svg || ends_with(config.output, ".png"), ConfigError, "[plot] -o ", config.output,
               ": the name must end in .svg or .png (that picks the format)");
  const MetricsTable table = read_metrics(file);
  const ChartSeries chosen = choose_series(table);
  if (config.options.title.empty()) config.options.title = file;
  write_output(config.output, svg ? render_svg(table, config.options) : render_png(table, config.options));

  std::cout << "strata plot: wrote " << config.output << " from " << table.rows << " rows of " << file;
  if (!chosen.loss.empty()) std::cout << "; loss: " << names(chosen.loss);
  if (!chosen.lr.empty()) std::cout << "; learning rate: " << names(chosen.lr);
  std::cout << "\n";
  if (table.skipped > 0)
    std::cout << "strata plot: skipped " << table.skipped << " NaN/inf value" << (table.skipped == 1 ? "" : "s")
              << " (not drawn)\n";
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
        "NaN and inf values are skipped and counted.\n"
        "Example: strata plot lightning_logs/version_0 -o loss.svg\n"
        "         strata plot metrics.jsonl -o loss.png");
    sub->add_option("RUN_DIR_OR_METRICS", config->input, "Run folder, metrics.csv or metrics.jsonl")->required();
    sub->add_option("-o,--output", config->output,
                    "Picture to write: NAME.svg or NAME.png (default: plot.png beside the metrics file)");
    NumericFlags& n = *numbers;
    PlotOptions& o = config->options;
    n.add_integer(sub, "--width", "Picture width in pixels", 320, 4096, [&o](int64_t v) { o.width = int(v); },
                  "1000");
    n.add_integer(sub, "--height", "Picture height in pixels", 240, 4096, [&o](int64_t v) { o.height = int(v); },
                  "720");
    sub->add_option("--title", o.title, "Line at the top (default: the metrics file's path)");
    return sub;
  };
  command.run = [config, numbers] {
    numbers->apply();
    return run_plot(*config);
  };
  return command;
}

}  // namespace strata::cli
