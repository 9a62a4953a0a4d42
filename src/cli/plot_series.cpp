// What `strata plot` does to a series before drawing it: TensorBoard's
// smoothing, and the values a log-scale axis has to leave out.
#include <algorithm>
#include <cmath>

#include "cli/plot.h"
#include "strata/core/error.h"

namespace strata::cli {

std::vector<double> smooth_values(const std::vector<double>& values, double weight) {
  STRATA_CHECK(weight >= 0 && weight < 1, ConfigError, "[plot] the smoothing weight ", weight,
               " is outside [0, 1)");
  // TensorBoard's resmoothDataset, line for line: a constant series is left
  // as it is (its #786), a non-finite value passes through, and the average
  // of the finite values is debiased by 1 - weight^count.
  std::vector<double> out(values.size());
  const bool constant =
      std::all_of(values.begin(), values.end(), [&](double v) { return v == values.front(); });
  double last = 0;
  int count = 0;
  for (std::size_t i = 0; i < values.size(); ++i) {
    const double v = values[i];
    if (constant || !std::isfinite(v)) {
      out[i] = v;
      continue;
    }
    last = last * weight + (1 - weight) * v;
    ++count;
    out[i] = last / (1 - std::pow(weight, count));
  }
  return out;
}

std::vector<LogSkip> log_skips(const std::vector<PlotRun>& runs) {
  std::vector<LogSkip> skips;
  for (const PlotRun& run : runs) {
    const ChartSeries chosen = choose_series(run.table);
    for (const auto* list : {&chosen.loss, &chosen.lr}) {
      for (const Series* s : *list) {
        LogSkip skip{run.name, s->name, 0, 0, 0};
        for (std::size_t i = 0; i < s->values.size(); ++i) {
          if (s->values[i] > 0) continue;
          if (skip.count++ == 0) {
            skip.first_step = s->steps[i];
            skip.first_value = s->values[i];
          }
        }
        if (skip.count > 0) skips.push_back(skip);
      }
    }
  }
  return skips;
}

}  // namespace strata::cli
