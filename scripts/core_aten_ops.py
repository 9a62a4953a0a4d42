#!/usr/bin/env python3
"""Writes docs/xla-core-ops.txt: the ATen operators tagged `core` in the
native_functions.yaml of the installed torch (the wheel ships it under
torchgen/packaged/ATen/native/), one `aten::name.overload` per line, in
the file's order. These are the operators torch.export and ExecuTorch
decompose to, the set docs/xla.md's "Core ATen coverage" table classifies
for the xla device.

Usage (the project's venv, scripts/env.sh):
    source scripts/env.sh && "$STRATA_PYTHON" scripts/core_aten_ops.py [OUT]
    "$STRATA_PYTHON" scripts/core_aten_ops.py --check   # fails when the list is stale
"""
import argparse
import os
import sys

import torch
import torchgen
import yaml


def yaml_path():
    path = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native", "native_functions.yaml")
    if not os.path.exists(path):
        sys.exit(f"core_aten_ops: no native_functions.yaml at {path}: install the torch wheel scripts/env.sh names")
    return path


def tags_of(entry):
    tags = entry.get("tags", [])
    return [tags] if isinstance(tags, str) else list(tags)


def operator_name(func):
    """`add.Tensor(Tensor self, ...) -> Tensor` -> `aten::add.Tensor`."""
    return "aten::" + func.split("(", 1)[0].strip()


def core_ops(path):
    with open(path) as f:
        entries = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return [operator_name(e["func"]) for e in entries if "core" in tags_of(e)]


def render(ops):
    header = [
        f"# ATen operators tagged `core` in torch {torch.__version__.split('+')[0]}'s native_functions.yaml",
        "# (written by scripts/core_aten_ops.py; do not edit). One operator.overload a line.",
    ]
    return "\n".join(header + ops) + "\n"


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", default=os.path.join(root, "docs", "xla-core-ops.txt"))
    parser.add_argument("--check", action="store_true", help="compare with OUT instead of writing it")
    args = parser.parse_args()
    text = render(core_ops(yaml_path()))
    if args.check:
        with open(args.out) as f:
            if f.read() != text:
                sys.exit(f"core_aten_ops: {args.out} differs from the installed torch's list: rerun this script")
        return
    with open(args.out, "w") as f:
        f.write(text)
    print(f"core_aten_ops: {text.count(chr(10)) - 2} operators -> {args.out}")


if __name__ == "__main__":
    main()
