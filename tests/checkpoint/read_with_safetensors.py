"""Reads a safetensors file with the `safetensors` package (the format's
reference reader) and prints what it sees as one JSON object:
{"keys": [...], "metadata": {...}, "tensors": {name: {"shape", "dtype",
"values"}}} with each tensor's values as float64 (flattened)."""
import json
import sys

from safetensors import safe_open
from safetensors.torch import load_file


def main():
    path = sys.argv[1]
    with safe_open(path, framework="pt") as f:
        metadata = f.metadata() or {}
        keys = list(f.keys())
    tensors = load_file(path)
    out = {"keys": sorted(keys), "metadata": metadata, "tensors": {}}
    for name, t in tensors.items():
        out["tensors"][name] = {
            "shape": list(t.shape),
            "dtype": str(t.dtype).replace("torch.", ""),
            "values": t.double().flatten().tolist() if t.is_floating_point() else t.flatten().tolist(),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
