"""Reads an MLflow run back with MLflow's own client (MlflowClient: get_run,
get_metric_history) and prints it as one JSON object:
{"run_id", "run_name", "status", "experiment", "params": {k: v}, "tags": {k: v},
 "metrics": {key: [[step, value], ...]}, "csv": {column: [[step, value], ...]}}.
A metric's history is sorted by (step, value); "csv" (with --csv) holds a
CSVLogger's metrics.csv read by Python's csv module, in the same shape.

Usage: read_mlflow.py URI (--run-id ID | --experiment NAME --run-name NAME) [--csv PATH]
"""
import argparse
import csv
import json
import math

from mlflow.tracking import MlflowClient


def number(v):
    return v if math.isfinite(v) else str(v)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("uri")
    parser.add_argument("--run-id")
    parser.add_argument("--experiment")
    parser.add_argument("--run-name")
    parser.add_argument("--csv")
    args = parser.parse_args()
    client = MlflowClient(tracking_uri=args.uri)
    if args.run_id:
        run = client.get_run(args.run_id)
    else:
        experiment = client.get_experiment_by_name(args.experiment)
        if experiment is None:
            raise SystemExit(f"no experiment named {args.experiment!r}")
        runs = [r for r in client.search_runs([experiment.experiment_id]) if r.info.run_name == args.run_name]
        if len(runs) != 1:
            raise SystemExit(f"{len(runs)} runs named {args.run_name!r} in {args.experiment!r}")
        run = runs[0]
    metrics = {}
    for key in run.data.metrics:
        history = client.get_metric_history(run.info.run_id, key)
        metrics[key] = sorted([m.step, number(m.value)] for m in history)
    out = {
        "run_id": run.info.run_id,
        "run_name": run.info.run_name,
        "status": run.info.status,
        "experiment": client.get_experiment(run.info.experiment_id).name,
        "params": dict(run.data.params),
        "tags": dict(run.data.tags),
        "metrics": metrics,
    }
    if args.csv:
        columns = {}
        with open(args.csv, newline="") as f:
            for row in csv.DictReader(f):
                for key, text in row.items():
                    if key == "step" or text == "":
                        continue
                    columns.setdefault(key, []).append([int(row["step"]), number(float(text))])
        out["csv"] = {k: sorted(v) for k, v in columns.items()}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
