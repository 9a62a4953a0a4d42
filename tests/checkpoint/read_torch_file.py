"""Reads a torch.save file with torch.load(weights_only=True), the reader
Lightning's tools use, and prints what it holds as one JSON object: every
value by its Python type, tensors as {"tensor": dtype, "shape", "values"
(float64, flattened), "storage" (the storage's data pointer, to tell shared
storages apart)}, tuples as {"tuple": [...]}, dict keys that are ints as
"int:<k>"."""
import json
import sys

import torch


def describe(value):
    if isinstance(value, torch.Tensor):
        return {"tensor": str(value.dtype).replace("torch.", ""), "shape": list(value.shape),
                "values": value.double().flatten().tolist(),
                "storage": value.untyped_storage().data_ptr()}
    if isinstance(value, tuple):
        return {"tuple": [describe(v) for v in value]}
    if isinstance(value, list):
        return [describe(v) for v in value]
    if isinstance(value, dict):
        return {(("int:%d" % k) if isinstance(k, int) else k): describe(v) for k, v in value.items()}
    return value


def main():
    print(json.dumps(describe(torch.load(sys.argv[1], weights_only=True))))


if __name__ == "__main__":
    main()
