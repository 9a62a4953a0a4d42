"""Runs strata's emitted StableHLO on JAX's CPU backend: the test oracle.

Usage: jax_oracle.py REQUEST.json RESULT.json
       jax_oracle.py --replay DUMP_DIR RESULT.json

REQUEST: {"cases": [{"name", "module" (StableHLO text), "replicas",
          "inputs": [[{"dtype", "dims", "values"} per argument] per replica]}],
          "compile_options": [{"name", "hex"}]}
RESULT:  {"jax": version, "cases": [{"name", "outputs": [[{"dtype", "dims",
          "values" (inf and nan as strings)} per output] per replica]} or
          {"name", "error"}],
          "compile_options": [{"name", "num_replicas", "num_partitions",
          "device_assignment" (jaxlib's text of it, "" when absent)}]}
or {"skip": why} when jax is not installed.

--replay: DUMP_DIR is a folder that strata filled with STRATA_XLA_DUMP_DIR
and STRATA_XLA_DUMP_VALUES=1 (Note [Dumping programs] in
src/xla/lazy_executor.cpp): each program that has its recorded values runs
on JAX with the recorded arguments, and its results are compared with the
ones strata's device returned. RESULT: {"jax": version, "cases": [{"name",
"ok": bool, "detail"}]}. Floats agree within 1e-4 of the output's largest
finite value (at least 1; bf16 and f16 within 1.6e-2: two builds of XLA's
CPU compiler may fuse and order sums their own ways), with NaN and the
infinities at the same places; integers and bools exactly. The collectives need two host
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


def run_on_jax(jax, backend, module, inputs):
    """Compiles `module` for len(inputs) replicas and runs it: inputs[r] are
    replica r's arguments (numpy arrays); returns each replica's results."""
    import numpy as np
    from jax._src.lib import xla_client as xc
    from jax.extend import backend as jb

    n = len(inputs)
    devices = backend.local_devices()[:n]
    if len(devices) < n:
        raise RuntimeError(f"{n} replicas, {len(devices)} CPU devices")
    options = jb.get_compile_options(num_replicas=n, num_partitions=1)
    exe = backend.compile_and_load(module, xc.DeviceList(tuple(devices)), options)
    # One argument = one array whose shard on device r is replica r's value;
    # the sharding is "replicated" so the global shape is the program's, and
    # execute_sharded hands each device its own shard.
    mesh = jax.sharding.Mesh(np.array(devices), ("r",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    arguments = []
    for a in range(len(inputs[0])):
        shards = [jax.device_put(inputs[r][a], device) for r, device in enumerate(devices)]
        arguments.append(jax.make_array_from_single_device_arrays(inputs[0][a].shape, replicated, shards))
    per_output = exe.execute_sharded(arguments).disassemble_into_single_device_arrays()
    return [[np.asarray(out[r]) for out in per_output] for r in range(n)]


def disagreement(mine, theirs):
    """Why two results of one output differ, or None when they agree."""
    import numpy as np

    if mine.dtype != theirs.dtype or mine.shape != theirs.shape:
        return f"{theirs.dtype}{list(theirs.shape)} on jax, {mine.dtype}{list(mine.shape)} recorded"
    if mine.size == 0:
        return None
    if mine.dtype.kind not in "fV":  # bfloat16 is a "V" (void) kind to numpy
        if np.array_equal(mine, theirs):
            return None
        return f"values differ at {int(np.argmax(mine.reshape(-1) != theirs.reshape(-1)))}"
    a, b = mine.astype(np.float64), theirs.astype(np.float64)
    if not np.array_equal(np.isnan(a), np.isnan(b)):
        return "NaN at other places"
    if not np.array_equal(np.isposinf(a), np.isposinf(b)) or not np.array_equal(np.isneginf(a), np.isneginf(b)):
        return "infinities at other places"
    finite = np.isfinite(b)
    if not finite.any():
        return None
    scale = max(1.0, float(np.abs(b[finite]).max()))
    tol = (1e-4 if mine.dtype.itemsize >= 4 else 1.6e-2) * scale
    worst = float(np.abs(a[finite] - b[finite]).max())
    return None if worst <= tol else f"max difference {worst:.3g} over {tol:.3g}"


def replay(jax, backend, dtypes, folder):
    """Each dumped program with recorded values, run on jax and compared."""
    import numpy as np

    cases = []
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".json"):
            continue
        stem = name[:-len(".json")]
        values = os.path.join(folder, stem + ".values")
        with open(os.path.join(folder, name)) as f:
            types = json.load(f)
        replicas = types.get("replicas", 1)
        if not os.path.exists(os.path.join(values, f"r{replicas - 1}.out{len(types['results']) - 1}.bin")):
            continue  # compiled but never ran to its end, or dumped without values

        def read(kind, i, r, spec):
            data = np.fromfile(os.path.join(values, f"r{r}.{kind}{i}.bin"), dtype=dtypes[spec["dtype"]])
            return data.reshape(spec["dims"])

        try:
            with open(os.path.join(folder, types["module"])) as f:
                module = f.read()
            inputs = [[read("in", i, r, t) for i, t in enumerate(types["arguments"])] for r in range(replicas)]
            got = run_on_jax(jax, backend, module, inputs)
            problems = []
            for r in range(replicas):
                for o, spec in enumerate(types["results"]):
                    why = disagreement(read("out", o, r, spec), got[r][o])
                    if why:
                        problems.append(f"replica {r} result {o}: {why}")
            cases.append({"name": stem, "ok": not problems, "detail": "; ".join(problems)})
        except Exception as e:  # reported per case; the C++ test names it
            cases.append({"name": stem, "ok": False, "detail": f"{type(e).__name__}: {e}"})
    return cases


def main():
    replaying = len(sys.argv) == 4 and sys.argv[1] == "--replay"
    request_path, result_path = sys.argv[-2], sys.argv[-1]
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

    backend = jb.get_backend("cpu")
    if replaying:
        write(result_path, {"jax": jax.__version__, "cases": replay(jax, backend, dtypes, request_path)})
        return
    with open(request_path) as f:
        request = json.load(f)
    result = {"jax": jax.__version__, "cases": [], "compile_options": []}

    for case in request.get("cases", []):
        try:
            inputs = [[np.asarray(spec["values"], dtype=np.float64).astype(dtypes[spec["dtype"]]).reshape(spec["dims"])
                       for spec in replica] for replica in case["inputs"]]
            outputs = []
            for replica in run_on_jax(jax, backend, case["module"], inputs):
                outputs.append([{"dtype": names[value.dtype], "dims": list(value.shape),
                                 "values": [v if math.isfinite(v) else repr(v)  # "inf", "nan": not JSON numbers
                                            for v in value.astype(np.float64).reshape(-1).tolist()]}
                                for value in replica])
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
