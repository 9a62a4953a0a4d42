"""Reads a Trainer run's CSV logger files with Python's own readers (the
csv module for metrics.csv, PyYAML for hparams.yaml) and prints them as one
JSON object: {"header": [...], "rows": [{column: float or null}], "hparams": {...}}.

Usage: read_logs.py LOG_DIR
"""
import csv
import json
import math
import sys

import yaml


def main(log_dir):
    with open(f"{log_dir}/metrics.csv", newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames
        rows = []
        for row in reader:
            out = {}
            for key, text in row.items():
                if text == "":
                    out[key] = None
                else:
                    value = float(text)
                    out[key] = value if math.isfinite(value) else str(value)
            rows.append(out)
    with open(f"{log_dir}/hparams.yaml") as f:
        hparams = yaml.safe_load(f)
    print(json.dumps({"header": header, "rows": rows, "hparams": hparams}))


if __name__ == "__main__":
    main(sys.argv[1])
