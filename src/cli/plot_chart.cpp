// The chart `strata plot` draws: a title, a loss panel (train and
// validation loss against step) and, when a run has one, a learning-rate
// panel below it sharing the step axis. Each panel has a frame, grid lines
// at "nice" tick values (1, 2 or 5 times a power of ten; decades on a log
// axis), tick labels, an axis label and a legend. Several runs share the
// axes, each in its own colour. Smoothed loss is drawn over the raw values,
// which stay visible in a faint tint, as TensorBoard draws them. Drawn once,
// on any Canvas.
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

// `c` moved towards `to` by `amount` (0: c, 1: to).
Color mix(Color c, Color to, double amount) {
  const auto at = [amount](std::uint8_t a, std::uint8_t b) {
    return static_cast<std::uint8_t>(std::lround(a + (b - a) * amount));
  };
  return {at(c.r, to.r), at(c.g, to.g), at(c.b, to.b)};
}

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

// A tick label on a log axis. Every label of an axis uses one form: plain
// decimals when every tick is within 0.001..10000 ("0.002", "500"), else a
// short exponent form ("1e-5", "2e-4", "1e0").
std::string log_tick_label(double value, bool plain) {
  char text[48];
  if (plain) {
    std::snprintf(text, sizeof text, "%.6g", value);
    return text;
  }
  const int exponent = static_cast<int>(std::floor(std::log10(value) + 1e-9));
  std::snprintf(text, sizeof text, "%.6ge%d", value / std::pow(10.0, exponent), exponent);
  return text;
}

bool log_labels_plain(const std::vector<double>& ticks) {
  return std::all_of(ticks.begin(), ticks.end(), [](double t) { return t >= 1e-3 * (1 - 1e-9) && t < 1e4 * 1.5; });
}

// Tick values for a log axis spanning 10^lo..10^hi: whole decades when three
// or more fit (every second, third... when there are many), else 1, 2 and 5
// times a power of ten, else the linear ticks of a very narrow range.
std::vector<double> log_ticks(double lo, double hi, int target) {
  std::vector<double> decades;
  const int first = static_cast<int>(std::ceil(lo - 1e-9)), last = static_cast<int>(std::floor(hi + 1e-9));
  const int every = std::max(1, static_cast<int>(std::ceil((last - first + 1) / double(std::max(target, 1)))));
  for (int k = first; k <= last; ++k)
    if (k % every == 0) decades.push_back(std::pow(10.0, k));
  if (decades.size() >= 3) return decades;
  std::vector<double> ticks;
  for (int k = static_cast<int>(std::floor(lo)); k <= static_cast<int>(std::ceil(hi)); ++k) {
    for (double m : {1.0, 2.0, 5.0}) {
      const double v = m * std::pow(10.0, k), e = std::log10(v);
      if (e >= lo - 1e-9 && e <= hi + 1e-9) ticks.push_back(v);
    }
  }
  if (ticks.size() >= 2 && ticks.size() <= static_cast<std::size_t>(2 * std::max(target, 1))) return ticks;
  if (decades.size() >= 2) return decades;
  double step = 0;
  return nice_ticks(std::pow(10.0, lo), std::pow(10.0, hi), target, step);
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

// The points of `series` a log axis can show (values above 0).
void positive_part(const Series& series, std::vector<double>& steps, std::vector<double>& values) {
  for (std::size_t i = 0; i < series.values.size(); ++i) {
    if (series.values[i] > 0) {
      steps.push_back(series.steps[i]);
      values.push_back(series.values[i]);
    }
  }
}

// One metric of one run as the chart draws it.
struct Drawn {
  std::string legend;  // the metric, or "RUN: metric" when there are several runs
  std::size_t run = 0;
  std::size_t shade = 0;  // its place among its run's series on the panel
  std::vector<double> steps, raw, values;  // values: smoothed, or the raw values
};

struct Panel {
  std::string title;
  std::string short_title;  // when the title does not fit beside the panel
  std::vector<Drawn> series;
  bool smoothed = false;
  double top = 0, height = 0;
  Range y;
};

class Chart {
 public:
  Chart(const std::vector<PlotRun>& runs, const PlotOptions& options, Canvas& canvas)
      : runs_(runs), options_(options), canvas_(canvas) {}

  void draw() {
    const double w = options_.width, h = options_.height;
    std::vector<Panel> panels = make_panels();
    canvas_.rect(0, 0, w, h, kWhite);
    canvas_.text(left_, 22, label(options_.title, static_cast<std::size_t>((w - left_ - 20) / 12)), 2,
                 Anchor::kStart, kInk);

    Range x;
    for (Panel& panel : panels) {
      for (const Drawn& s : panel.series) {
        for (std::size_t i = 0; i < s.steps.size(); ++i) {
          x.add(s.steps[i]);
          panel.y.add(y_of(s.raw[i]));
          panel.y.add(y_of(s.values[i]));
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

    std::int64_t rows = 0, skipped = 0, not_positive = 0;
    for (const PlotRun& run : runs_) {
      rows += run.table.rows;
      skipped += run.table.skipped;
    }
    if (options_.log_y)
      for (const LogSkip& s : log_skips(runs_)) not_positive += s.count;
    std::vector<std::string> notes = {std::to_string(rows) + " rows"};
    if (runs_.size() > 1) notes[0] += " from " + std::to_string(runs_.size()) + " runs";
    if (options_.smooth > 0) {
      char weight[32];
      std::snprintf(weight, sizeof weight, "%.3g", options_.smooth);
      notes.push_back(std::string("loss smoothed ") + weight);
    }
    if (skipped > 0) notes.push_back(std::to_string(skipped) + (skipped == 1 ? " NaN/inf value" : " NaN/inf values") +
                                     " skipped");
    if (not_positive > 0)
      notes.push_back(std::to_string(not_positive) + (not_positive == 1 ? " value" : " values") +
                      " <= 0 left off the log scale");
    draw_footnote(notes);
  }

 private:
  // The panels and what they draw: the loss panel holds every run's loss
  // series (smoothed when asked), the learning-rate panel every run's lr
  // series (never smoothed: a schedule is not noise).
  std::vector<Panel> make_panels() const {
    Panel loss{options_.log_y ? "loss (log)" : "loss", "loss", {}, options_.smooth > 0, 0, 0, {}};
    Panel lr{options_.log_y ? "learning rate (log)" : "learning rate", options_.log_y ? "lr (log)" : "lr", {},
             false, 0, 0, {}};
    const bool several = runs_.size() > 1;
    for (std::size_t r = 0; r < runs_.size(); ++r) {
      const ChartSeries chosen = choose_series(runs_[r].table);
      for (auto [panel, list] : {std::pair{&loss, &chosen.loss}, std::pair{&lr, &chosen.lr}}) {
        std::size_t shade = 0;
        for (const Series* s : *list) {
          Drawn d;
          d.legend = several ? label(runs_[r].name, 40) + ": " + label(s->name, 32) : label(s->name, 32);
          d.run = r;
          d.shade = shade;
          if (options_.log_y) {
            positive_part(*s, d.steps, d.raw);
          } else {
            d.steps = s->steps;
            d.raw = s->values;
          }
          if (d.steps.empty()) continue;  // every value <= 0 on a log axis: said in the footnote
          d.values = panel->smoothed ? smooth_values(d.raw, options_.smooth) : d.raw;
          panel->series.push_back(std::move(d));
          ++shade;
        }
      }
    }
    std::vector<Panel> panels;
    if (!loss.series.empty()) panels.push_back(std::move(loss));
    if (!lr.series.empty()) panels.push_back(std::move(lr));
    if (panels.empty()) {
      // Only a log axis can empty every panel (choose_series saw values).
      const std::vector<LogSkip> skips = log_skips(runs_);
      std::string what = "no value above 0";
      if (!skips.empty()) {
        char value[64];
        std::snprintf(value, sizeof value, "%.6g at step %.0f", skips[0].first_value, skips[0].first_step);
        what += std::string(" (") + label(skips[0].metric, 40) + " of " + label(skips[0].run, 40) + " is " + value +
                ")";
      }
      throw ConfigError(detail::cat("[plot] --log-y: the metrics to plot have ", what,
                                    "; a log scale shows only positive values, so drop --log-y"));
    }
    return panels;
  }

  // The footnote, right-aligned in the bottom corner; when it would run into
  // the "step" label, the row count moves to the left corner and the rest
  // is shortened to fit.
  void draw_footnote(const std::vector<std::string>& notes) {
    const double w = options_.width, h = options_.height;
    const double room = w - 12 - ((left_ + right_) / 2 + text_width("step", 2) / 2 + 16);
    std::string all;
    for (const std::string& n : notes) all += (all.empty() ? "" : "; ") + n;
    if (text_width(all, 1) <= room || notes.size() == 1) {
      canvas_.text(w - 12, h - 12, label(all, static_cast<std::size_t>(std::max(4.0, room / 6))), 1, Anchor::kEnd,
                   kMuted);
      return;
    }
    std::string rest;
    for (std::size_t i = 1; i < notes.size(); ++i) rest += (rest.empty() ? "" : "; ") + notes[i];
    canvas_.text(12, h - 12, notes[0], 1, Anchor::kStart, kMuted);
    canvas_.text(w - 12, h - 12, label(rest, static_cast<std::size_t>(std::max(4.0, room / 6))), 1, Anchor::kEnd,
                 kMuted);
  }

  double y_of(double v) const { return options_.log_y ? std::log10(v) : v; }
  double px(double step) const { return left_ + (step - x_.lo) / (x_.hi - x_.lo) * (right_ - left_); }

  // The colours of a series: one per series with one run, one per run with
  // several (a run's later series darker, so validation stands apart from
  // training in the same hue).
  Color color_of(const Drawn& d, std::size_t k) const {
    if (runs_.size() == 1) return kPalette[k % std::size(kPalette)];
    return mix(kPalette[d.run % std::size(kPalette)], kInk, std::min(0.5, 0.3 * static_cast<double>(d.shade)));
  }

  // The series' points at pixel positions, thinned to at most two points
  // per pixel column (the lowest and highest value in it, in step order) so
  // a long run stays a small file; `kept` receives their values.
  template <typename Py>
  Points thin(const std::vector<double>& steps, const std::vector<double>& values, const Py& py,
              std::vector<double>& kept) const {
    const std::size_t columns = static_cast<std::size_t>(std::max(1.0, right_ - left_));
    Points points;
    const auto keep = [&](std::size_t i) {
      points.emplace_back(px(steps[i]), py(values[i]));
      kept.push_back(values[i]);
    };
    if (steps.size() <= 2 * columns) {
      for (std::size_t i = 0; i < steps.size(); ++i) keep(i);
      return points;
    }
    std::size_t i = 0;
    while (i < steps.size()) {
      const long column = std::lround(px(steps[i]));
      std::size_t lo = i, hi = i, j = i;
      for (; j < steps.size() && std::lround(px(steps[j])) == column; ++j) {
        if (values[j] < values[lo]) lo = j;
        if (values[j] > values[hi]) hi = j;
      }
      keep(std::min(lo, hi));
      if (lo != hi) keep(std::max(lo, hi));
      i = j;
    }
    return points;
  }

  void draw_panel(Panel& panel, bool last) {
    const double top = panel.top, bottom = panel.top + panel.height;
    Range y = panel.y;
    if (y.empty()) y.add(0);
    if (y.lo == y.hi) {
      const double pad = options_.log_y ? 0.5 : y.lo == 0 ? 1.0 : std::abs(y.lo) * 0.1;
      y = {y.lo - pad, y.hi + pad};
    } else {
      const double pad = (y.hi - y.lo) * 0.06;
      y = {y.lo - pad, y.hi + pad};
    }
    // `y` is in axis units: log10 of the value on a log axis.
    const auto py = [&](double v) { return bottom - (y_of(v) - y.lo) / (y.hi - y.lo) * panel.height; };

    // Grid and tick labels.
    double ystep = 0, xstep = 0;
    const int yticks = std::max(2, static_cast<int>(panel.height / 45));
    if (options_.log_y) {
      const std::vector<double> ticks = log_ticks(y.lo, y.hi, yticks);
      const bool plain = log_labels_plain(ticks);
      for (double t : ticks) {
        canvas_.line(left_, py(t), right_, py(t), kGrid, 1);
        canvas_.text(left_ - 8, py(t), log_tick_label(t, plain), 1, Anchor::kEnd, kMuted);
      }
    } else {
      const std::vector<double> yvalues = nice_ticks(y.lo, y.hi, yticks, ystep);
      const double ytop = std::max(std::abs(y.lo), std::abs(y.hi));
      for (double t : yvalues) {
        canvas_.line(left_, py(t), right_, py(t), kGrid, 1);
        canvas_.text(left_ - 8, py(t), tick_label(t, ystep, ytop), 1, Anchor::kEnd, kMuted);
      }
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
    // The axis title; shorter, then smaller, when the panel is too short for it.
    const bool fits = text_width(panel.title, 2) + 8 <= panel.height;
    const std::string& title = fits ? panel.title : panel.short_title;
    const int title_scale = text_width(title, 2) + 8 <= panel.height ? 2 : 1;
    canvas_.text(22, (top + bottom) / 2, title, title_scale, Anchor::kMiddle, kInk, /*vertical=*/true);
    if (last) canvas_.text((left_ + right_) / 2, bottom + 36, "step", 2, Anchor::kMiddle, kInk);

    // Note [Smoothed over raw]: as TensorBoard draws a smoothed scalar, the
    // raw values stay on the chart as a faint line of the same hue and the
    // smoothed line goes on top; every raw line first, so no run's raw
    // values cover another run's smoothed line.
    if (panel.smoothed) {
      for (std::size_t k = 0; k < panel.series.size(); ++k) {
        const Drawn& s = panel.series[k];
        std::vector<double> kept;
        const Points points = thin(s.steps, s.raw, py, kept);
        canvas_.polyline(points, mix(color_of(s, k), kWhite, 0.68), 1.5, s.legend + " (raw)", kept);
      }
    }
    for (std::size_t k = 0; k < panel.series.size(); ++k) {
      const Drawn& s = panel.series[k];
      const Color color = color_of(s, k);
      std::vector<double> kept;
      const Points points = thin(s.steps, s.values, py, kept);
      canvas_.polyline(points, color, 2, s.legend, kept);
      if (s.steps.size() <= 60) {
        for (const auto& [x, y] : points) canvas_.dot(x, y, 3, color);
      }
    }
    draw_legend(panel, top);
  }

  void draw_legend(const Panel& panel, double top) {
    // As many rows as fit in the panel; the last says how many are left out.
    const double row = 16;
    const std::size_t fit = static_cast<std::size_t>(std::max(1.0, (panel.height - 30) / row));
    std::vector<std::pair<std::string, Color>> rows;
    for (std::size_t k = 0; k < panel.series.size(); ++k) rows.emplace_back(panel.series[k].legend,
                                                                            color_of(panel.series[k], k));
    if (rows.size() > fit) {
      const std::size_t more = rows.size() - (fit - 1);
      rows.resize(fit - 1);
      rows.emplace_back("... " + std::to_string(more) + " more", kWhite);
    }
    double widest = 0;
    for (const auto& entry : rows) widest = std::max(widest, text_width(entry.first, 1));
    const double box_w = widest + 44, box_h = row * static_cast<double>(rows.size()) + 10;
    const double x0 = right_ - box_w - 10, y0 = top + 10;
    canvas_.rect(x0, y0, box_w, box_h, kWhite);
    canvas_.line(x0, y0, x0 + box_w, y0, kFrame, 1);
    canvas_.line(x0, y0 + box_h, x0 + box_w, y0 + box_h, kFrame, 1);
    canvas_.line(x0, y0, x0, y0 + box_h, kFrame, 1);
    canvas_.line(x0 + box_w, y0, x0 + box_w, y0 + box_h, kFrame, 1);
    for (std::size_t k = 0; k < rows.size(); ++k) {
      const double y = y0 + 5 + row * (static_cast<double>(k) + 0.5);
      canvas_.line(x0 + 8, y, x0 + 30, y, rows[k].second, 2.5);
      canvas_.text(x0 + 36, y, rows[k].first, 1, Anchor::kStart, kInk);
    }
  }

  const std::vector<PlotRun>& runs_;
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

void draw_chart(const std::vector<PlotRun>& runs, const PlotOptions& options, Canvas& canvas) {
  Chart(runs, options, canvas).draw();
}

}  // namespace strata::cli
