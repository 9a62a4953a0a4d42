"""Reads an hparams.yaml with Lightning's own reader and prints it as JSON.

  read_hparams_yaml.py FILE  ->  the mapping, every scalar as [type, value]:
      ["float", 0.003], ["int", 2], ["bool", true], ["NoneType", null],
      ["str", "0.003"]; non-finite floats as ["float", "nan"|"inf"|"-inf"]

The reader is lightning.pytorch.core.saving.load_hparams_from_yaml (PyYAML's
full_load), so a value that comes back with another type (a string read as
a number, a key read as a bool) shows in the type. Exit status 1 with a
message on stderr when the file does not load or a key is not a string.
"""
import json
import math
import sys

from lightning.pytorch.core.saving import load_hparams_from_yaml


def typed(value):
    if isinstance(value, dict):
        for key in value:
            if not isinstance(key, str):
                raise ValueError("key %r is a %s, not a str" % (key, type(key).__name__))
        return {key: typed(v) for key, v in value.items()}
    if isinstance(value, list):
        return [typed(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return ["float", repr(value)]
    return [type(value).__name__, value]


def main():
    try:
        hparams = load_hparams_from_yaml(sys.argv[1], use_omegaconf=False)
        if not isinstance(hparams, dict):
            raise ValueError("the file holds a %s, not a mapping" % type(hparams).__name__)
        out = typed(hparams)
    except Exception as e:  # noqa: BLE001 - any failure is a bad file
        print("%s: %s" % (sys.argv[1], e), file=sys.stderr)
        sys.exit(1)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
