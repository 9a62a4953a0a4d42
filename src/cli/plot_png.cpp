// PngCanvas: the chart drawn by cairo into an RGB image and written as PNG.
//
// cairo antialiases every line, dot and glyph; text is set in DejaVu Sans
// Mono (a real font, found through fontconfig; Debian's fonts-dejavu-core),
// whose glyphs advance 0.6 em, so at 10*scale px they are the 6*scale px
// apart that the chart's layout assumes (text_width in plot_canvas.h) and
// that the SVG's monospace text uses. When fontconfig has no DejaVu Sans
// Mono it substitutes its nearest monospace font.
//
// Note [PNG through cairo]
// `strata plot` keeps PNG beside SVG because a PNG is what a user can put
// anywhere: an issue or a chat message, a notebook, a terminal image viewer,
// a slide; an SVG needs a browser, and a chart whose text is drawn by the
// viewer looks different in each. The pixels come from cairo, the 2D
// library Debian's desktop stack is built on, so lines and text are
// antialiased in a real font rather than by strata's own rasteriser and
// bitmap font. It costs one Debian package (libcairo2-dev, with its
// fonts); the tests read the PNG back with a decoder of their own.
#include <cairo.h>

#include <cmath>
#include <memory>
#include <numbers>

#include "cli/plot.h"
#include "cli/plot_canvas.h"
#include "strata/core/error.h"

namespace strata::cli {
namespace {

constexpr const char* kFontFamily = "DejaVu Sans Mono";

// A failed cairo call is an internal error naming cairo's status.
void check(cairo_status_t status, const char* what) {
  STRATA_ASSERT(status == CAIRO_STATUS_SUCCESS, "[plot] cairo ", what, ": ", cairo_status_to_string(status));
}

class PngCanvas : public Canvas {
 public:
  PngCanvas(int width, int height)
      : surface_(cairo_image_surface_create(CAIRO_FORMAT_RGB24, width, height), cairo_surface_destroy),
        cr_(cairo_create(surface_.get()), cairo_destroy) {
    check(cairo_surface_status(surface_.get()), "image surface");
    check(cairo_status(cr_.get()), "context");
    cairo_select_font_face(cr_.get(), kFontFamily, CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    cairo_set_line_join(cr_.get(), CAIRO_LINE_JOIN_ROUND);
    cairo_set_line_cap(cr_.get(), CAIRO_LINE_CAP_ROUND);
  }

  void rect(double x, double y, double w, double h, Color fill) override {
    cairo_t* cr = cr_.get();
    set_color(fill);
    cairo_rectangle(cr, x, y, w, h);
    cairo_fill(cr);
  }

  void line(double x0, double y0, double x1, double y1, Color color, double width) override {
    // A thin horizontal or vertical line sits on pixel centres, so it is
    // one sharp pixel wide rather than two half-grey ones.
    if (width <= 1.0 && y0 == y1) y0 = y1 = std::floor(y0) + 0.5;
    if (width <= 1.0 && x0 == x1) x0 = x1 = std::floor(x0) + 0.5;
    cairo_t* cr = cr_.get();
    set_color(color);
    cairo_set_line_width(cr, width);
    cairo_move_to(cr, x0, y0);
    cairo_line_to(cr, x1, y1);
    cairo_stroke(cr);
  }

  void polyline(const Points& points, Color color, double width, const std::string& name,
                const std::vector<double>& values) override {
    (void)name;
    (void)values;
    if (points.empty()) return;
    cairo_t* cr = cr_.get();
    set_color(color);
    cairo_set_line_width(cr, width);
    cairo_move_to(cr, points[0].first, points[0].second);
    // One point: a zero-length segment, drawn as a round cap (a dot).
    if (points.size() == 1) cairo_line_to(cr, points[0].first, points[0].second);
    for (std::size_t i = 1; i < points.size(); ++i) cairo_line_to(cr, points[i].first, points[i].second);
    cairo_stroke(cr);
  }

  void dot(double x, double y, double r, Color color) override {
    cairo_t* cr = cr_.get();
    set_color(color);
    cairo_new_sub_path(cr);
    cairo_arc(cr, x, y, r, 0, 2 * std::numbers::pi);
    cairo_fill(cr);
  }

  void text(double x, double y, const std::string& text, int scale, Anchor anchor, Color color,
            bool vertical) override {
    cairo_t* cr = cr_.get();
    cairo_save(cr);
    set_color(color);
    cairo_set_font_size(cr, 10.0 * scale);
    cairo_text_extents_t extents;
    cairo_text_extents(cr, text.c_str(), &extents);
    cairo_font_extents_t font;
    cairo_font_extents(cr, &font);
    const double shift = anchor == Anchor::kStart ? 0 : anchor == Anchor::kMiddle ? extents.x_advance / 2
                                                                                  : extents.x_advance;
    cairo_translate(cr, x, y);
    if (vertical) cairo_rotate(cr, -std::numbers::pi / 2);  // read bottom to top
    // The baseline where the font's ascent and descent are centred on y.
    cairo_move_to(cr, -shift, (font.ascent - font.descent) / 2);
    cairo_show_text(cr, text.c_str());
    cairo_restore(cr);
  }

  std::string png() {
    cairo_surface_flush(surface_.get());
    check(cairo_status(cr_.get()), "drawing");
    std::string out;
    check(cairo_surface_write_to_png_stream(surface_.get(), &PngCanvas::append, &out), "PNG encoding");
    return out;
  }

 private:
  void set_color(Color c) { cairo_set_source_rgb(cr_.get(), c.r / 255.0, c.g / 255.0, c.b / 255.0); }

  static cairo_status_t append(void* closure, const unsigned char* data, unsigned int length) {
    static_cast<std::string*>(closure)->append(reinterpret_cast<const char*>(data), length);
    return CAIRO_STATUS_SUCCESS;
  }

  std::unique_ptr<cairo_surface_t, void (*)(cairo_surface_t*)> surface_;
  std::unique_ptr<cairo_t, void (*)(cairo_t*)> cr_;
};

}  // namespace

std::string render_png(const std::vector<PlotRun>& runs, const PlotOptions& options) {
  PngCanvas canvas(options.width, options.height);
  draw_chart(runs, options, canvas);
  return canvas.png();
}

}  // namespace strata::cli
