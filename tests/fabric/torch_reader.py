"""A real client reads a strata checkpoint: PyTorch loads it.

Builds strata's example GPT in PyTorch (its own code, with the module names
strata's GPT registers), reads the checkpoint's state.safetensors with the
`safetensors` package, loads the GPT's tensors ("module/model...." in the
Trainer's checkpoints of `strata train`, "model/..." in older ones) with
load_state_dict(strict=True), runs the token ids strata ran, and compares
the logits with strata's.

Usage: torch_reader.py CHECKPOINT_DIR LOGITS_FILE
LOGITS_FILE is a safetensors file holding "idx" (int64 [B, T]) and
"logits" (strata's output). Prints "max_abs_diff X" and exits 0 when the
logits agree (allclose, rtol 1e-5, atol 1e-5), 1 otherwise.
"""
import json
import math
import sys

import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn import functional as F

PRESETS = {  # n_layer, n_head, n_embd, block_size (strata's GPTConfig::preset)
    "tiny": (2, 2, 64, 64),
    "small": (4, 4, 128, 128),
    "medium": (6, 6, 384, 256),
    "large": (12, 12, 768, 256),
}
VOCAB = 256


class Attention(nn.Module):
    def __init__(self, n_head, n_embd):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.n_head)
        future = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = att.masked_fill(future, float("-inf")).softmax(-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(b, t, c))


class MLPBlock(nn.Module):
    def __init__(self, n_embd):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, n_head, n_embd):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = Attention(n_head, n_embd)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = MLPBlock(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Tied head, as strata's default: logits use wte's weight."""

    def __init__(self, n_layer, n_head, n_embd, block_size):
        super().__init__()
        self.wte = nn.Embedding(VOCAB, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_head, n_embd) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


def main():
    checkpoint, logits_file = sys.argv[1], sys.argv[2]
    with open(checkpoint + "/metadata.json") as f:
        metadata = json.load(f)
    entries = metadata["entries"]
    if "trainer" in entries:  # a Trainer checkpoint: the GPT is the module's "model"
        size = entries["trainer"]["value"]["module_extra"]["model_size"]
        prefix = "module/model."
    else:
        size = entries["model_size"]["value"]
        prefix = "model/"
    state = load_file(checkpoint + "/state.safetensors")
    model_state = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
    model = GPT(*PRESETS[size])
    model.load_state_dict(model_state, strict=True)
    model.eval()
    theirs = load_file(logits_file)
    with torch.no_grad():
        ours = model(theirs["idx"])
    diff = (ours - theirs["logits"]).abs().max().item()
    print("tensors loaded: %d" % len(model_state))
    print("max_abs_diff %.3g" % diff)
    return 0 if torch.allclose(ours, theirs["logits"], rtol=1e-5, atol=1e-5) else 1


if __name__ == "__main__":
    sys.exit(main())
