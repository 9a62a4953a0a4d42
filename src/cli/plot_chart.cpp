// The chart `strata plot` draws: a title, a loss panel (train and
// validation loss against step) and, when the file has one, a learning-rate
// panel below it sharing the step axis. Each panel has a frame, grid lines
// at "nice" tick values (1, 2 or 5 times a power of ten), tick labels, an
// axis label and a legend. Drawn once, on any Canvas.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>

#include "cli/plot.h"
#include "cli/plot_canvas.h"
#include "strata/core/error.h"

namespace strata::cli {
namespace {

constexpr Color kInk{40, 40, 40};
constexpr Color kMuted{110, 110, 110};
constexpr Color kFrame{170, 170, 170};
constexpr Color kGrid{232, 232, 232};
constexpr Color kWhite{255, 255, 255};
// Series colours: blue and orange first (train, validation), then others
// that stay apart for the common kinds of colour blindness.
constexpr Color kPalette[] = {{31, 119, 180}, {230, 120, 20}, {44, 160, 44},  {214, 39, 40},
                              {148, 103, 189}, {140, 86, 75},  {200, 80, 160}, {100, 100, 100}};
constexpr std::size_t kMaxSeriesPerPanel = 8;

struct Range {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -std::numeric_limits<double>::infinity();
  void add(double v) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  bool empty() const { return !(lo <= hi); }
};

// Tick values inside [lo, hi], about `target` of them, at 1, 2 or 5 times a
// power of ten; `step` receives the spacing.
std::vector<double> nice_ticks(double lo, double hi, int target, double& step) {
  const double raw = (hi - lo) / std::max(target, 1);
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  const double fraction = raw / magnitude;
  step = (fraction <= 1.5 ? 1 : fraction <= 3 ? 2 : fraction <= 7 ? 5 : 10) * magnitude;
  std::vector<double> ticks;
  for (double t = std::ceil(lo / step) * step; t <= hi + step * 1e-9 && ticks.size() < 50; t += step)
    ticks.push_back(std::abs(t) < step * 1e-9 ? 0.0 : t);
  return ticks;
}

// A tick label. Every label of an axis uses the same form, chosen from the
// spacing `step` and the largest value `top`: "1.2M" or "200k" for large
// counts, plain integers, fixed decimals as many as the spacing needs, or a
// short exponent form ("8e-5") for very small values.
std::string tick_label(double value, double step, double top) {
  char text[48];
  if (value == 0) return "0";
  const auto decimals = [](double spacing) {
    return std::clamp(static_cast<int>(std::ceil(-std::log10(spacing) - 1e-9)), 0, 8);
  };
  if (top >= 1e6 && step >= 1e5 && top < 1e15) {
    std::snprintf(text, sizeof text, "%.*fM", decimals(step / 1e6), value / 1e6);
  } else if (top >= 1e4 && step >= 1e3 && top < 1e15) {
    std::snprintf(text, sizeof text, "%.*fk", decimals(step / 1e3), value / 1e3);
  } else if (step >= 1 && top < 1e15) {
    std::snprintf(text, sizeof text, "%.0f", value);
  } else if (step >= 1e-4 && top < 1e6) {
    std::snprintf(text, sizeof text, "%.*f", decimals(step), value);
  } else {
    // Ticks are multiples of 1, 2 or 5 times a power of ten: the mantissa
    // needs as many digits as the value's exponent is above the spacing's.
    const int digits = std::clamp(static_cast<int>(std::floor(std::log10(std::abs(value))) -
                                                   std::floor(std::log10(step))), 0, 8);
    std::snprintf(text, sizeof text, "%.*e", digits, value);
    std::string s = text;
    const std::size_t e = s.find('e');
    std::string mantissa = s.substr(0, e), exponent = s.substr(e + 1);
    if (mantissa.find('.') != std::string::npos) {
      while (mantissa.back() == '0') mantissa.pop_back();
      if (mantissa.back() == '.') mantissa.pop_back();
    }
    const bool negative = exponent[0] == '-';
    exponent = exponent.substr(1);
    while (exponent.size() > 1 && exponent[0] == '0') exponent.erase(0, 1);
    return mantissa + "e" + (negative ? "-" : "") + exponent;
  }
  return text;
}

// `text` with anything outside printable ASCII replaced, at most `max` long.
std::string label(const std::string& text, std::size_t max) {
  std::string out;
  for (char c : text) out.push_back(c >= 0x20 && c < 0x7F ? c : '?');
  if (out.size() > max) out = out.substr(0, max - 3) + "...";
  return out;
}

// Legend and drawing order: per-step training loss first (the noisy line,
// drawn underneath), then epoch-level training loss, then validation, then
// the rest, each group in file order.
int rank_of(const std::string& name) {
  const bool epoch = name.find("epoch") != std::string::npos;
  if (name.find("train") != std::string::npos || name == "loss") return epoch ? 1 : 0;
  if (name.find("val") != std::string::npos) return 2;
  return 3;
}

struct Panel {
  std::string title;
  std::vector<const Series*> series;
  double top = 0, height = 0;
  Range y;
};

class Chart {
 public:
  Chart(const MetricsTable& table, const PlotOptions& options, Canvas& canvas)
      : table_(table), options_(options), canvas_(canvas) {}

  void draw() {
    const ChartSeries chosen = choose_series(table_);
    const double w = options_.width, h = options_.height;
    canvas_.rect(0, 0, w, h, kWhite);
    canvas_.text(left_, 22, label(options_.title, static_cast<std::size_t>((w - left_ - 20) / 12)), 2,
                 Anchor::kStart, kInk);

    std::vector<Panel> panels;
    if (!chosen.loss.empty()) panels.push_back(Panel{"loss", chosen.loss, 0, 0, {}});
    if (!chosen.lr.empty()) panels.push_back(Panel{"learning rate", chosen.lr, 0, 0, {}});
    Range x;
    for (Panel& panel : panels) {
      for (const Series* s : panel.series) {
        for (std::size_t i = 0; i < s->steps.size(); ++i) {
          x.add(s->steps[i]);
          panel.y.add(s->values[i]);
        }
      }
    }
    if (x.empty()) x.add(0);
    if (x.lo == x.hi) x = {x.lo - 1, x.hi + 1};
    // A little room at both ends keeps the first and last points (and their
    // dots) off the frame.
    const double xpad = (x.hi - x.lo) * 0.015;
    x_ = {x.lo - xpad, x.hi + xpad};

    // Vertical space: the title, the panels (loss gets the larger share),
    // the gaps that hold each panel's tick labels, the step label, a footnote.
    const double top = 52, bottom = 56, gap = 44;
    const double usable = h - top - bottom - gap * static_cast<double>(panels.size() - 1);
    double y = top;
    for (std::size_t i = 0; i < panels.size(); ++i) {
      panels[i].top = y;
      panels[i].height = panels.size() == 1 ? usable : usable * (i == 0 ? 0.62 : 0.38);
      y += panels[i].height + gap;
    }
    right_ = w - 24;
    for (std::size_t i = 0; i < panels.size(); ++i) draw_panel(panels[i], i + 1 == panels.size());

    std::string note = std::to_string(table_.rows) + " rows";
    if (table_.skipped > 0) note += "; " + std::to_string(table_.skipped) + " NaN/inf values skipped";
    canvas_.text(w - 12, h - 12, note, 1, Anchor::kEnd, kMuted);
  }

 private:
  double px(double step) const { return left_ + (step - x_.lo) / (x_.hi - x_.lo) * (right_ - left_); }

  void draw_panel(Panel& panel, bool last) {
    const double top = panel.top, bottom = panel.top + panel.height;
    Range y = panel.y;
    if (y.empty()) y.add(0);
    if (y.lo == y.hi) {
      const double pad = y.lo == 0 ? 1.0 : std::abs(y.lo) * 0.1;
      y = {y.lo - pad, y.hi + pad};
    } else {
      const double pad = (y.hi - y.lo) * 0.06;
      y = {y.lo - pad, y.hi + pad};
    }
    const auto py = [&](double v) { return bottom - (v - y.lo) / (y.hi - y.lo) * panel.height; };

    // Grid and tick labels.
    double ystep = 0, xstep = 0;
    const int yticks = std::max(2, static_cast<int>(panel.height / 45));
    const std::vector<double> yvalues = nice_ticks(y.lo, y.hi, yticks, ystep);
    const double ytop = std::max(std::abs(y.lo), std::abs(y.hi));
    for (double t : yvalues) {
      canvas_.line(left_, py(t), right_, py(t), kGrid, 1);
      canvas_.text(left_ - 8, py(t), tick_label(t, ystep, ytop), 1, Anchor::kEnd, kMuted);
    }
    const int xticks = std::max(2, static_cast<int>((right_ - left_) / 110));
    const std::vector<double> xvalues = nice_ticks(x_.lo, x_.hi, xticks, xstep);
    const double xtop = std::max(std::abs(x_.lo), std::abs(x_.hi));
    for (double t : xvalues) {
      canvas_.line(px(t), top, px(t), bottom, kGrid, 1);
      canvas_.text(px(t), bottom + 14, tick_label(t, xstep, xtop), 1, Anchor::kMiddle, kMuted);
    }
    // Frame.
    canvas_.line(left_, top, right_, top, kFrame, 1);
    canvas_.line(left_, bottom, right_, bottom, kFrame, 1);
    canvas_.line(left_, top, left_, bottom, kFrame, 1);
    canvas_.line(right_, top, right_, bottom, kFrame, 1);
    // The axis title, smaller when the panel is too short for it.
    const int title_scale = text_width(panel.title, 2) + 8 <= panel.height ? 2 : 1;
    canvas_.text(22, (top + bottom) / 2, panel.title, title_scale, Anchor::kMiddle, kInk, /*vertical=*/true);
    if (last) canvas_.text((left_ + right_) / 2, bottom + 36, "step", 2, Anchor::kMiddle, kInk);

    // Series, thinned to at most two points per pixel column (the lowest and
    // highest value in it, in step order) so a long run stays a small file.
    const std::size_t columns = static_cast<std::size_t>(std::max(1.0, right_ - left_));
    for (std::size_t k = 0; k < panel.series.size(); ++k) {
      const Series& s = *panel.series[k];
      const Color color = kPalette[k % std::size(kPalette)];
      Points points;
      if (s.steps.size() <= 2 * columns) {
        for (std::size_t i = 0; i < s.steps.size(); ++i) points.emplace_back(px(s.steps[i]), py(s.values[i]));
      } else {
        std::size_t i = 0;
        while (i < s.steps.size()) {
          const long column = std::lround(px(s.steps[i]));
          std::size_t lo = i, hi = i, j = i;
          for (; j < s.steps.size() && std::lround(px(s.steps[j])) == column; ++j) {
            if (s.values[j] < s.values[lo]) lo = j;
            if (s.values[j] > s.values[hi]) hi = j;
          }
          points.emplace_back(px(s.steps[std::min(lo, hi)]), py(s.values[std::min(lo, hi)]));
          if (lo != hi) points.emplace_back(px(s.steps[std::max(lo, hi)]), py(s.values[std::max(lo, hi)]));
          i = j;
        }
      }
      canvas_.polyline(points, color, 2, s.name);
      if (s.steps.size() <= 60) {
        for (const auto& [x, y] : points) canvas_.dot(x, y, 3, color);
      }
    }
    draw_legend(panel, top);
  }

  void draw_legend(const Panel& panel, double top) {
    double widest = 0;
    std::vector<std::string> names;
    for (const Series* s : panel.series) {
      names.push_back(label(s->name, 32));
      widest = std::max(widest, text_width(names.back(), 1));
    }
    const double row = 16, box_w = widest + 44, box_h = row * static_cast<double>(names.size()) + 10;
    const double x0 = right_ - box_w - 10, y0 = top + 10;
    canvas_.rect(x0, y0, box_w, box_h, kWhite);
    canvas_.line(x0, y0, x0 + box_w, y0, kFrame, 1);
    canvas_.line(x0, y0 + box_h, x0 + box_w, y0 + box_h, kFrame, 1);
    canvas_.line(x0, y0, x0, y0 + box_h, kFrame, 1);
    canvas_.line(x0 + box_w, y0, x0 + box_w, y0 + box_h, kFrame, 1);
    for (std::size_t k = 0; k < names.size(); ++k) {
      const double y = y0 + 5 + row * (static_cast<double>(k) + 0.5);
      const Color color = kPalette[k % std::size(kPalette)];
      canvas_.line(x0 + 8, y, x0 + 30, y, color, 2.5);
      canvas_.text(x0 + 36, y, names[k], 1, Anchor::kStart, kInk);
    }
  }

  const MetricsTable& table_;
  const PlotOptions& options_;
  Canvas& canvas_;
  double left_ = 92, right_ = 0;
  Range x_;
};

}  // namespace

ChartSeries choose_series(const MetricsTable& table) {
  ChartSeries chosen;
  for (const Series& s : table.series) {
    if (s.values.empty()) continue;
    std::string lower = s.name;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    if (lower.find("loss") != std::string::npos && chosen.loss.size() < kMaxSeriesPerPanel)
      chosen.loss.push_back(&s);
    else if (lower.rfind("lr", 0) == 0 && chosen.lr.size() < kMaxSeriesPerPanel)
      chosen.lr.push_back(&s);
  }
  std::stable_sort(chosen.loss.begin(), chosen.loss.end(),
                   [](const Series* a, const Series* b) { return rank_of(a->name) < rank_of(b->name); });
  if (chosen.loss.empty() && chosen.lr.empty()) {
    std::string names;
    for (std::size_t i = 0; i < table.columns.size() && i < 12; ++i)
      names += (i ? ", " : "") + label(table.columns[i], 40);
    if (table.columns.size() > 12) names += ", ...";
    throw ConfigError(detail::cat("[plot] ", table.path, " has no value to plot: no column named *loss* or lr* "
                                  "with a finite value (columns: ", names.empty() ? "none" : names, ")"));
  }
  return chosen;
}

void draw_chart(const MetricsTable& table, const PlotOptions& options, Canvas& canvas) {
  Chart(table, options, canvas).draw();
}

}  // namespace strata::cli
