// render_png in a build without cairo (CMakeLists.txt compiles this file
// instead of plot_png.cpp when pkg-config finds no cairo): the PNG output
// is refused, saying what to do; SVG output is unaffected.
#include "cli/plot.h"
#include "strata/core/error.h"

namespace strata::cli {

std::string render_png(const std::vector<PlotRun>& runs, const PlotOptions& options) {
  (void)runs;
  (void)options;
  throw ConfigError(
      "[plot] this strata was built without cairo, which draws the PNG: write SVG instead (-o NAME.svg), or "
      "install cairo (scripts/install-deps.sh, or apt-get install libcairo2-dev fonts-dejavu-core) and rebuild");
}

}  // namespace strata::cli
