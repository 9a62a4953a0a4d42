#!/usr/bin/python3
"""An independent safetensors reader, using only the Python standard library.

Reads a safetensors file (written by strata or anyone else) and prints one
JSON object to stdout:
  {"metadata": {...}, "tensors": {name: {"dtype": "F32", "shape": [...],
                                         "values": [flat list, row-major]}}}
Floats are printed exactly (Python's repr round-trips a double, and every
F16/BF16/F32 value is a double); non-finite values are the strings "nan",
"inf" and "-inf" so the output stays plain JSON.

Usage: read_safetensors.py FILE
Exit status 1 with a message on stderr when the file is malformed.
"""
import json
import math
import struct
import sys

# dtype -> (struct format character, item size)
FORMATS = {
    "F64": ("d", 8), "F32": ("f", 4), "F16": ("e", 2), "BF16": (None, 2),
    "I64": ("q", 8), "I32": ("i", 4), "I16": ("h", 2), "I8": ("b", 1),
    "U8": ("B", 1), "BOOL": ("?", 1),
}


def decode(dtype, raw):
    fmt, size = FORMATS[dtype]
    count = len(raw) // size
    if dtype == "BF16":
        # bfloat16 is the upper half of a float32.
        return [struct.unpack("<f", b"\x00\x00" + raw[2 * i:2 * i + 2])[0] for i in range(count)]
    return list(struct.unpack("<%d%s" % (count, fmt), raw))


def jsonable(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    return value


def read(path):
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError("%s: shorter than 8 bytes" % path)
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise ValueError("%s: header length %d past end of file" % (path, n))
    header = json.loads(data[8:8 + n].decode("utf-8"))
    buffer = data[8 + n:]
    out = {"metadata": header.pop("__metadata__", {}) or {}, "tensors": {}}
    for name, entry in header.items():
        dtype, shape = entry["dtype"], entry["shape"]
        begin, end = entry["data_offsets"]
        numel = 1
        for d in shape:
            numel *= d
        if dtype not in FORMATS:
            raise ValueError("%s: tensor %r has unknown dtype %r" % (path, name, dtype))
        if end - begin != numel * FORMATS[dtype][1] or end > len(buffer):
            raise ValueError("%s: tensor %r has bad data_offsets" % (path, name))
        values = [jsonable(v) for v in decode(dtype, buffer[begin:end])]
        out["tensors"][name] = {"dtype": dtype, "shape": shape, "values": values}
    return out


def main():
    if len(sys.argv) != 2:
        sys.stderr.write("usage: read_safetensors.py FILE\n")
        return 2
    try:
        result = read(sys.argv[1])
    except (OSError, ValueError, KeyError) as e:
        sys.stderr.write("error: %s\n" % e)
        return 1
    json.dump(result, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
