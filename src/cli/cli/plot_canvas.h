// The drawing surface `strata plot` lays its chart out on. The chart
// (plot_chart.cpp) is written once against this interface; SvgCanvas turns
// the calls into SVG elements, PngCanvas into pixels drawn by cairo.
// Coordinates are in pixels from the top-left corner. Text is one
// monospaced font at 10*scale px (DejaVu Sans Mono), whose glyphs are
// 6*scale pixels apart, so both surfaces agree on how wide a label is.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace strata::cli {

struct Color {
  std::uint8_t r = 0, g = 0, b = 0;
};

enum class Anchor { kStart, kMiddle, kEnd };

using Points = std::vector<std::pair<double, double>>;

class Canvas {
 public:
  virtual ~Canvas() = default;
  /// A filled rectangle.
  virtual void rect(double x, double y, double w, double h, Color fill) = 0;
  /// A straight line `width` pixels wide.
  virtual void line(double x0, double y0, double x1, double y1, Color color, double width) = 0;
  /// A data series: its points joined by a line; `name` labels it and
  /// `values` are the data values of the points (SVG keeps them as
  /// data-series="name" and data-values="v0 v1 ...", so a reader can check
  /// what was drawn without inverting the axes).
  virtual void polyline(const Points& points, Color color, double width, const std::string& name,
                        const std::vector<double>& values) = 0;
  /// A filled dot of radius `r` (marks the points of short series).
  virtual void dot(double x, double y, double r, Color color) = 0;
  /// Printable-ASCII `text` whose vertical middle is at `y` (or, when
  /// `vertical`, text read bottom to top whose horizontal middle is at x).
  virtual void text(double x, double y, const std::string& text, int scale, Anchor anchor, Color color,
                    bool vertical = false) = 0;
};

/// Width in pixels of `text` drawn at `scale`.
inline double text_width(const std::string& text, int scale) {
  return text.empty() ? 0.0 : (6.0 * static_cast<double>(text.size()) - 1.0) * scale;
}

/// Lays the chart of `runs` out on `canvas` (plot_chart.cpp).
struct PlotRun;
struct PlotOptions;
void draw_chart(const std::vector<PlotRun>& runs, const PlotOptions& options, Canvas& canvas);

}  // namespace strata::cli
