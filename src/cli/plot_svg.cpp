// SvgCanvas: the chart as SVG 1.1 text. Every string that came from the
// metrics file is escaped for XML (and is printable ASCII by then); each
// series is one <polyline> carrying its name in data-series.
#include <cstdio>
#include <string>

#include "cli/plot.h"
#include "cli/plot_canvas.h"

namespace strata::cli {
namespace {

std::string num(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", v);
  return text;
}

std::string rgb(Color c) {
  char text[16];
  std::snprintf(text, sizeof text, "#%02x%02x%02x", c.r, c.g, c.b);
  return text;
}

std::string xml_escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&apos;"; break;
      default: out.push_back(c >= 0x20 && c < 0x7F ? c : '?');
    }
  }
  return out;
}

class SvgCanvas : public Canvas {
 public:
  SvgCanvas(int width, int height) {
    out_ = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
           "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"" + std::to_string(width) +
           "\" height=\"" + std::to_string(height) + "\" viewBox=\"0 0 " + std::to_string(width) + " " +
           std::to_string(height) + "\" font-family=\"DejaVu Sans Mono, Menlo, Consolas, monospace\">\n";
  }

  void rect(double x, double y, double w, double h, Color fill) override {
    out_ += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(w) + "\" height=\"" + num(h) +
            "\" fill=\"" + rgb(fill) + "\"/>\n";
  }

  void line(double x0, double y0, double x1, double y1, Color color, double width) override {
    out_ += "<line x1=\"" + num(x0) + "\" y1=\"" + num(y0) + "\" x2=\"" + num(x1) + "\" y2=\"" + num(y1) +
            "\" stroke=\"" + rgb(color) + "\" stroke-width=\"" + num(width) + "\"/>\n";
  }

  void polyline(const Points& points, Color color, double width, const std::string& name,
                const std::vector<double>& values) override {
    out_ += "<polyline data-series=\"" + xml_escape(name) + "\" data-values=\"";
    char text[32];
    for (std::size_t i = 0; i < values.size(); ++i) {
      std::snprintf(text, sizeof text, "%s%.17g", i ? " " : "", values[i]);
      out_ += text;
    }
    out_ += "\" fill=\"none\" stroke=\"" + rgb(color) +
            "\" stroke-width=\"" + num(width) + "\" stroke-linejoin=\"round\" stroke-linecap=\"round\" points=\"";
    for (std::size_t i = 0; i < points.size(); ++i) {
      if (i) out_.push_back(' ');
      out_ += num(points[i].first) + "," + num(points[i].second);
    }
    out_ += "\"/>\n";
  }

  void dot(double x, double y, double r, Color color) override {
    out_ += "<circle cx=\"" + num(x) + "\" cy=\"" + num(y) + "\" r=\"" + num(r) + "\" fill=\"" + rgb(color) +
            "\"/>\n";
  }

  void text(double x, double y, const std::string& text, int scale, Anchor anchor, Color color,
            bool vertical) override {
    // A monospace font at 10*scale px advances about 6*scale px per
    // character, as the PNG's DejaVu Sans Mono does.
    const char* anchors[] = {"start", "middle", "end"};
    out_ += "<text x=\"" + num(x) + "\" y=\"" + num(y) + "\" font-size=\"" + std::to_string(10 * scale) +
            "\" fill=\"" + rgb(color) + "\" text-anchor=\"" + anchors[static_cast<int>(anchor)] +
            "\" dominant-baseline=\"central\"";
    if (vertical) out_ += " transform=\"rotate(-90 " + num(x) + " " + num(y) + ")\"";
    out_ += ">" + xml_escape(text) + "</text>\n";
  }

  std::string finish() { return out_ + "</svg>\n"; }

 private:
  std::string out_;
};

}  // namespace

std::string render_svg(const std::vector<PlotRun>& runs, const PlotOptions& options) {
  SvgCanvas canvas(options.width, options.height);
  draw_chart(runs, options, canvas);
  return canvas.finish();
}

}  // namespace strata::cli
