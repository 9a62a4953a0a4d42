"""Runs strata's emitted StableHLO on JAX's CPU backend: the test oracle.

Usage: jax_oracle.py REQUEST.json RESULT.json

REQUEST: {"cases": [{"name", "module" (StableHLO text), "replicas",
          "inputs": [[{"dtype", "dims", "values"} per argument] per replica]}],
          "compile_options": [{"name", "hex"}]}
RESULT:  {"jax": version, "cases": [{"name", "outputs": [[{"dtype", "dims",
          "values" (inf and nan as strings)} per output] per replica]} or
          {"name", "error"}],
          "compile_options": [{"name", "num_replicas", "num_partitions",
          "device_assignment" (jaxlib's text of it, "" when absent)}]}
or {"skip": why} when jax is not installed. The collectives need two host
devices, so XLA_FLAGS forces them before jax is imported.

The private jaxlib entry points (xla_client.DeviceList, execute_sharded,
CompileOptions.ParseFromString) are used here and only here; jax is pinned in
scripts/requirements.txt, and tests/xla/oracle_test.cpp fails first if a jax
bump moves them.
"""
import json
import math
import os
import sys

os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def write(path, result):
    with open(path, "w") as f:
        json.dump(result, f)


def main():
    request_path, result_path = sys.argv[1], sys.argv[2]
    try:
        import jax
        import ml_dtypes
        import numpy as np
    except ImportError as e:
        write(result_path, {"skip": f"jax is not installed ({e}); scripts/install-deps.sh installs the pinned jax"})
        return
    jax.config.update("jax_enable_x64", True)  # i64 and f64 inputs stay 64-bit
    from jax._src.lib import xla_client as xc
    from jax.extend import backend as jb

    dtypes = {
        "i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
        "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32, "ui64": np.uint64,
        "f16": np.float16, "bf16": ml_dtypes.bfloat16, "f32": np.float32, "f64": np.float64,
    }
    names = {np.dtype(v): k for k, v in dtypes.items()}

    with open(request_path) as f:
        request = json.load(f)
    backend = jb.get_backend("cpu")
    result = {"jax": jax.__version__, "cases": [], "compile_options": []}

    for case in request.get("cases", []):
        n = case["replicas"]
        try:
            devices = backend.local_devices()[:n]
            if len(devices) < n:
                raise RuntimeError(f"{n} replicas, {len(devices)} CPU devices")
            options = jb.get_compile_options(num_replicas=n, num_partitions=1)
            exe = backend.compile_and_load(case["module"], xc.DeviceList(tuple(devices)), options)
            # One argument = one array whose shard on device r is replica r's
            # value; the sharding is "replicated" so the global shape is the
            # program's, and execute_sharded hands each device its own shard.
            mesh = jax.sharding.Mesh(np.array(devices), ("r",))
            replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
            arguments = []
            for a in range(len(case["inputs"][0])):
                shards = []
                for r, device in enumerate(devices):
                    spec = case["inputs"][r][a]
                    value = np.asarray(spec["values"], dtype=np.float64).astype(dtypes[spec["dtype"]])
                    shards.append(jax.device_put(value.reshape(spec["dims"]), device))
                arguments.append(jax.make_array_from_single_device_arrays(
                    tuple(case["inputs"][0][a]["dims"]), replicated, shards))
            per_output = exe.execute_sharded(arguments).disassemble_into_single_device_arrays()
            outputs = []
            for r in range(n):
                replica = []
                for out in per_output:
                    value = np.asarray(out[r])
                    replica.append({"dtype": names[value.dtype], "dims": list(value.shape),
                                    "values": [v if math.isfinite(v) else repr(v)  # "inf", "nan": not JSON numbers
                                               for v in value.astype(np.float64).reshape(-1).tolist()]})
                outputs.append(replica)
            result["cases"].append({"name": case["name"], "outputs": outputs})
        except Exception as e:  # reported per case; the C++ test names it
            result["cases"].append({"name": case["name"], "error": f"{type(e).__name__}: {e}"})

    for entry in request.get("compile_options", []):
        parsed = xc.CompileOptions.ParseFromString(bytes.fromhex(entry["hex"]))
        assignment = parsed.device_assignment
        result["compile_options"].append({
            "name": entry["name"], "num_replicas": parsed.num_replicas,
            "num_partitions": parsed.num_partitions,
            "device_assignment": "" if assignment is None else str(assignment)})

    write(result_path, result)


if __name__ == "__main__":
    main()
