#!/usr/bin/python3
"""Reads the picture `strata plot` wrote, with the Python standard library only.

  read_plot.py FILE.svg  ->  {"width", "height", "series": {name: point count},
                              "values": {name: [data-values]}, "points": {name: [[x, y]...]},
                              "strokes": {name: "#rrggbb"}, "texts": [...],
                              "text_at": [[text, x, y]...], "dots": N}
      (the SVG parsed as XML by xml.etree)
  read_plot.py FILE.png [R,G,B...]  ->  {"width", "height", "bit_depth", "color_type",
                              "pixels": {"r,g,b": count} for the 8 most used colours,
                              "series_pixels": {"r,g,b": count} for the series colours
                              and the colours named after the file,
                              "colours": distinct colours, "grey_shades": distinct greys
                              (r = g = b) between black and white: antialiased text}
      (every chunk's CRC checked, IDAT inflated with zlib, every row unfiltered)
Exit status 1 with a message on stderr when the file is malformed.
"""
import collections
import json
import struct
import sys
import xml.etree.ElementTree as ET
import zlib

SVG = "{http://www.w3.org/2000/svg}"
SERIES_COLOURS = [(31, 119, 180), (230, 120, 20), (44, 160, 44), (214, 39, 40)]


def read_svg(path):
    root = ET.parse(path).getroot()
    if root.tag != SVG + "svg":
        raise ValueError("root element is %s, not svg" % root.tag)
    series, values, coords, strokes = {}, {}, {}, {}
    for line in root.iter(SVG + "polyline"):
        name = line.get("data-series")
        if name in series:
            raise ValueError("two polylines named %r" % name)
        points = [tuple(float(v) for v in p.split(",")) for p in line.get("points").split()]
        values[name] = [float(v) for v in line.get("data-values").split()]
        if len(values[name]) != len(points):
            raise ValueError("%r: %d values for %d points" % (name, len(values[name]), len(points)))
        series[name] = len(points)
        coords[name] = points
        strokes[name] = line.get("stroke")
    texts = list(root.iter(SVG + "text"))
    return {"width": int(root.get("width")), "height": int(root.get("height")), "series": series,
            "values": values, "points": coords, "strokes": strokes,
            "texts": [t.text for t in texts],
            "text_at": [[t.text, float(t.get("x")), float(t.get("y"))] for t in texts],
            "dots": sum(1 for _ in root.iter(SVG + "circle"))}


def paeth(a, b, c):
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def read_png(path, extra_colours=()):
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("no PNG signature")
    pos, chunks = 8, []
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) != crc:
            raise ValueError("chunk %s: bad CRC" % kind)
        chunks.append((kind, body))
        pos += 12 + length
    if chunks[0][0] != b"IHDR" or chunks[-1][0] != b"IEND":
        raise ValueError("chunks out of order")
    width, height, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", chunks[0][1])
    if depth != 8 or ctype not in (2, 6) or interlace != 0:
        raise ValueError("unsupported PNG form")
    channels = 3 if ctype == 2 else 4
    raw = zlib.decompress(b"".join(body for kind, body in chunks if kind == b"IDAT"))
    stride = width * channels
    if len(raw) != height * (stride + 1):
        raise ValueError("image data is %d bytes, expected %d" % (len(raw), height * (stride + 1)))
    prev = bytearray(stride)
    counts = collections.Counter()
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b, c = prev[i], (prev[i - channels] if i >= channels else 0)
            line[i] = (line[i] + (0, a, b, (a + b) // 2, paeth(a, b, c))[kind]) & 0xFF
        counts.update(bytes(line[i:i + 3]) for i in range(0, stride, channels))
        prev = line
    key = lambda rgb: "%d,%d,%d" % tuple(rgb)
    greys = {rgb[0] for rgb in counts if rgb[0] == rgb[1] == rgb[2] and 0 < rgb[0] < 255}
    return {"width": width, "height": height, "bit_depth": depth, "color_type": ctype,
            "colours": len(counts), "grey_shades": len(greys),
            "pixels": {key(rgb): n for rgb, n in counts.most_common(8)},
            "series_pixels": {key(rgb): counts.get(bytes(rgb), 0)
                              for rgb in SERIES_COLOURS + list(extra_colours)}}


def main():
    path = sys.argv[1]
    try:
        extra = [tuple(int(v) for v in arg.split(",")) for arg in sys.argv[2:]]
        out = read_svg(path) if path.endswith(".svg") else read_png(path, extra)
    except Exception as e:  # noqa: BLE001 - any failure is a malformed file
        print("%s: %s" % (path, e), file=sys.stderr)
        sys.exit(1)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
