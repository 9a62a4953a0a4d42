// RasterCanvas: the chart as pixels, and those pixels as a PNG file.
//
// Lines are antialiased by coverage: a pixel whose centre lies within
// width/2 of the segment is covered, with a one-pixel ramp at the edge;
// the ends are round, so a polyline's joints are round too. A polyline's
// segments first collect their coverage in a mask (the largest per pixel)
// and the colour is blended once, so joints do not darken where segments
// overlap. Text is the built-in 5x7 font (plot_font.cpp), scaled by whole
// pixels. The PNG is 8-bit RGB, every row with filter 0, compressed by zlib.
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "cli/plot.h"
#include "cli/plot_canvas.h"
#include "strata/core/error.h"

namespace strata::cli {
namespace {

class RasterCanvas : public Canvas {
 public:
  RasterCanvas(int width, int height)
      : w_(width), h_(height), rgb_(static_cast<std::size_t>(width) * height * 3, 255),
        mask_(static_cast<std::size_t>(width) * height, 0.0f) {}

  void rect(double x, double y, double w, double h, Color fill) override {
    const int x0 = clamp_x(std::lround(x)), x1 = clamp_x(std::lround(x + w));
    const int y0 = clamp_y(std::lround(y)), y1 = clamp_y(std::lround(y + h));
    for (int j = y0; j < y1; ++j)
      for (int i = x0; i < x1; ++i) blend(i, j, fill, 1.0f);
  }

  void line(double x0, double y0, double x1, double y1, Color color, double width) override {
    // A thin horizontal or vertical line sits on pixel centres, so it is
    // one sharp pixel wide rather than two half-grey ones.
    if (width <= 1.0 && y0 == y1) y0 = y1 = std::floor(y0) + 0.5;
    if (width <= 1.0 && x0 == x1) x0 = x1 = std::floor(x0) + 0.5;
    stroke(x0, y0, x1, y1, width);
    composite(color);
  }

  void polyline(const Points& points, Color color, double width, const std::string& name,
                const std::vector<double>& values) override {
    (void)name;
    (void)values;
    if (points.size() == 1) stroke(points[0].first, points[0].second, points[0].first, points[0].second, width);
    for (std::size_t i = 1; i < points.size(); ++i)
      stroke(points[i - 1].first, points[i - 1].second, points[i].first, points[i].second, width);
    composite(color);
  }

  void dot(double x, double y, double r, Color color) override {
    stroke(x, y, x, y, 2 * r);
    composite(color);
  }

  void text(double x, double y, const std::string& text, int scale, Anchor anchor, Color color,
            bool vertical) override {
    const double width = text_width(text, scale);
    const double shift = anchor == Anchor::kStart ? 0 : anchor == Anchor::kMiddle ? width / 2 : width;
    // Text-local coordinates: u along the text, v down the glyphs.
    const long u0 = std::lround(-shift);
    const long v0 = std::lround(-3.5 * scale);
    for (std::size_t k = 0; k < text.size(); ++k) {
      const std::uint8_t* rows = glyph(text[k]);
      for (int gy = 0; gy < 7; ++gy) {
        for (int gx = 0; gx < 5; ++gx) {
          if (!(rows[gy] & (0x10 >> gx))) continue;
          for (int sy = 0; sy < scale; ++sy) {
            for (int sx = 0; sx < scale; ++sx) {
              const long u = u0 + static_cast<long>(k) * 6 * scale + gx * scale + sx;
              const long v = v0 + gy * scale + sy;
              // Vertical text reads bottom to top: u runs up the page.
              const long px = vertical ? std::lround(x) + v : std::lround(x) + u;
              const long py = vertical ? std::lround(y) - u : std::lround(y) + v;
              if (px >= 0 && py >= 0 && px < w_ && py < h_) blend(int(px), int(py), color, 1.0f);
            }
          }
        }
      }
    }
  }

  std::string png() const;

 private:
  int clamp_x(long x) const { return static_cast<int>(std::clamp<long>(x, 0, w_)); }
  int clamp_y(long y) const { return static_cast<int>(std::clamp<long>(y, 0, h_)); }

  void blend(int i, int j, Color c, float a) {
    std::uint8_t* p = &rgb_[(static_cast<std::size_t>(j) * w_ + i) * 3];
    const std::uint8_t src[3] = {c.r, c.g, c.b};
    for (int k = 0; k < 3; ++k) p[k] = static_cast<std::uint8_t>(std::lround(p[k] + (src[k] - p[k]) * a));
  }

  // Adds the coverage of a round-capped segment to the mask.
  void stroke(double x0, double y0, double x1, double y1, double width) {
    if (!std::isfinite(x0 + y0 + x1 + y1)) return;
    const double half = width / 2;
    const int i0 = clamp_x(std::lround(std::floor(std::min(x0, x1) - half - 1)));
    const int i1 = clamp_x(std::lround(std::ceil(std::max(x0, x1) + half + 1)));
    const int j0 = clamp_y(std::lround(std::floor(std::min(y0, y1) - half - 1)));
    const int j1 = clamp_y(std::lround(std::ceil(std::max(y0, y1) + half + 1)));
    const double dx = x1 - x0, dy = y1 - y0, len2 = dx * dx + dy * dy;
    for (int j = j0; j < j1; ++j) {
      for (int i = i0; i < i1; ++i) {
        const double cx = i + 0.5, cy = j + 0.5;
        const double t = len2 > 0 ? std::clamp(((cx - x0) * dx + (cy - y0) * dy) / len2, 0.0, 1.0) : 0.0;
        const double ex = cx - (x0 + t * dx), ey = cy - (y0 + t * dy);
        const double cover = std::clamp(half + 0.5 - std::sqrt(ex * ex + ey * ey), 0.0, 1.0);
        float& m = mask_[static_cast<std::size_t>(j) * w_ + i];
        m = std::max(m, static_cast<float>(cover));
      }
    }
    dirty_i0_ = std::min(dirty_i0_, i0);
    dirty_i1_ = std::max(dirty_i1_, i1);
    dirty_j0_ = std::min(dirty_j0_, j0);
    dirty_j1_ = std::max(dirty_j1_, j1);
  }

  // Blends `color` through the mask and clears it.
  void composite(Color color) {
    for (int j = dirty_j0_; j < dirty_j1_; ++j) {
      for (int i = dirty_i0_; i < dirty_i1_; ++i) {
        float& m = mask_[static_cast<std::size_t>(j) * w_ + i];
        if (m > 0) blend(i, j, color, m);
        m = 0;
      }
    }
    dirty_i0_ = dirty_j0_ = 1 << 30;
    dirty_i1_ = dirty_j1_ = 0;
  }

  int w_, h_;
  std::vector<std::uint8_t> rgb_;
  std::vector<float> mask_;
  int dirty_i0_ = 1 << 30, dirty_i1_ = 0, dirty_j0_ = 1 << 30, dirty_j1_ = 0;
};

void put_u32(std::string& out, std::uint32_t v) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<char>((v >> shift) & 0xFF));
}

// One PNG chunk: length, type, data, CRC-32 of type and data.
void put_chunk(std::string& out, const char* type, const std::string& data) {
  put_u32(out, static_cast<std::uint32_t>(data.size()));
  const std::size_t start = out.size();
  out.append(type, 4);
  out += data;
  const auto* bytes = reinterpret_cast<const Bytef*>(out.data() + start);
  put_u32(out, static_cast<std::uint32_t>(::crc32(0L, bytes, static_cast<uInt>(out.size() - start))));
}

std::string RasterCanvas::png() const {
  // Scanlines: a filter byte (0, none) then the row's RGB bytes.
  const std::size_t row = static_cast<std::size_t>(w_) * 3;
  std::string raw;
  raw.reserve((row + 1) * h_);
  for (int j = 0; j < h_; ++j) {
    raw.push_back('\0');
    raw.append(reinterpret_cast<const char*>(&rgb_[j * row]), row);
  }
  uLongf packed_size = ::compressBound(static_cast<uLong>(raw.size()));
  std::string packed(packed_size, '\0');
  const int rc = ::compress2(reinterpret_cast<Bytef*>(packed.data()), &packed_size,
                             reinterpret_cast<const Bytef*>(raw.data()), static_cast<uLong>(raw.size()), 9);
  STRATA_ASSERT(rc == Z_OK, "zlib compress2 returned ", rc);
  packed.resize(packed_size);

  std::string out("\x89PNG\r\n\x1a\n", 8);
  std::string header;
  put_u32(header, static_cast<std::uint32_t>(w_));
  put_u32(header, static_cast<std::uint32_t>(h_));
  header += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit, RGB, deflate, filter 0, no interlace
  put_chunk(out, "IHDR", header);
  put_chunk(out, "IDAT", packed);
  put_chunk(out, "IEND", "");
  return out;
}

}  // namespace

std::string render_png(const std::vector<PlotRun>& runs, const PlotOptions& options) {
  RasterCanvas canvas(options.width, options.height);
  draw_chart(runs, options, canvas);
  return canvas.png();
}

}  // namespace strata::cli
