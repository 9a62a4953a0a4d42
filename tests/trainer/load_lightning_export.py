"""Opens what `strata ckpt export --format lightning` wrote with Lightning's
own tools, and compares it with what strata computed:

    load_lightning_export.py CKPT REFERENCE_FILE

REFERENCE_FILE (safetensors) holds "idx", strata's "logits" for it, and
"exp_avg", the AdamW exp_avg of the token embedding in the checkpoint.
The LightningModule below holds the PyTorch twin of strata's GPT
(docs/examples/load_exported_gpt.py) as its child "model", as strata
train's module does; Lightning's load_from_checkpoint builds it from the
file's hyper_parameters and loads its state_dict strictly.

Prints one JSON object: the file's keys, epoch, global_step, version,
hyper_parameters, the state_dict size, whether the tied head shares the
embedding's storage, the logits' largest difference, and the optimizer
state after torch.optim.AdamW.load_state_dict. Exit status 1 when the
logits differ beyond 1e-5, 77 when lightning is not installed.
"""
import importlib.util
import json
import os
import sys

import torch
from safetensors.torch import load_file

try:
    import lightning as L
except ImportError as e:
    print("lightning is not installed (%s)" % e, file=sys.stderr)
    sys.exit(77)

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location(
    "load_exported_gpt", os.path.join(here, "..", "..", "docs", "examples", "load_exported_gpt.py"))
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)


class LitGPT(L.LightningModule):
    """strata train's module in Lightning: the GPT under "model"."""

    def __init__(self, model_config, lr=2e-3, weight_decay=0.0):
        super().__init__()
        self.save_hyperparameters()
        self.model = example.GPT(model_config)

    def forward(self, idx):
        return self.model(idx)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)


def main():
    path, reference = sys.argv[1], sys.argv[2]
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    model = LitGPT.load_from_checkpoint(path, map_location="cpu", weights_only=True).eval()
    ref = load_file(reference)
    with torch.no_grad():
        logits = model(ref["idx"])
    optimizer = model.configure_optimizers()
    optimizer.load_state_dict(ckpt["optimizer_states"][0])
    wte = model.model.wte.weight
    state = optimizer.state[wte]
    sd = ckpt["state_dict"]
    out = {
        "keys": sorted(ckpt.keys()),
        "epoch": ckpt["epoch"],
        "global_step": ckpt["global_step"],
        "version": ckpt["pytorch-lightning_version"],
        "hyper_parameters": ckpt["hyper_parameters"],
        "model_hparams": dict(model.hparams),
        "state_dict_size": len(sd),
        "tied_storage": sd["model.lm_head.weight"].untyped_storage().data_ptr()
        == sd["model.wte.weight"].untyped_storage().data_ptr(),
        "max_abs_diff": (logits - ref["logits"]).abs().max().item(),
        "optimizer": {
            "lr": optimizer.param_groups[0]["lr"],
            "betas": list(optimizer.param_groups[0]["betas"]),
            "params": len(optimizer.param_groups[0]["params"]),
            "step": state["step"].item(),
            "exp_avg_equal": bool(torch.equal(state["exp_avg"], ref["exp_avg"])),
        },
    }
    print(json.dumps(out))
    return 0 if torch.allclose(logits, ref["logits"], rtol=1e-5, atol=1e-5) else 1


if __name__ == "__main__":
    sys.exit(main())
