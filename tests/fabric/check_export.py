"""Loads what `strata ckpt export` wrote with the example in
docs/examples/load_exported_gpt.py and compares its logits with strata's:
    check_export.py EXPORT_DIR LOGITS_FILE (holding "idx" and "logits")."""
import importlib.util
import os
import sys

import torch
from safetensors.torch import load_file

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "load_exported_gpt", os.path.join(here, "..", "..", "docs", "examples", "load_exported_gpt.py"))
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)

model, config = example.load(sys.argv[1])
theirs = load_file(sys.argv[2])
with torch.no_grad():
    ours = model(theirs["idx"])
print("tensors loaded: %d" % len(model.state_dict()))
print("max_abs_diff %.3g" % (ours - theirs["logits"]).abs().max().item())
sys.exit(0 if torch.allclose(ours, theirs["logits"], rtol=1e-5, atol=1e-5) else 1)
