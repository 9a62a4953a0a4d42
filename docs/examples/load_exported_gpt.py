"""Loads a model that `strata ckpt export CKPT OUT` wrote into a PyTorch GPT.

    python docs/examples/load_exported_gpt.py OUT "Once upon a time"

OUT/config.json has every hyperparameter of strata's example GPT and
OUT/model.safetensors its weights under the module's own names, so the
PyTorch model below takes them with load_state_dict(strict=True). Needs
torch and safetensors; nothing from strata.
"""
import json
import math
import sys

import torch
from safetensors.torch import load_file
from torch import nn
from torch.nn import functional as F


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.n_head = c["n_head"]
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"], bias=c["bias"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"], bias=c["bias"])

    def forward(self, x):
        b, t, n = x.shape
        q, k, v = (z.view(b, t, self.n_head, n // self.n_head).transpose(1, 2)
                   for z in self.c_attn(x).split(n, dim=2))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(n // self.n_head)
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        return self.c_proj((att @ v).transpose(1, 2).reshape(b, t, n))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"], bias=c["bias"])
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"], bias=c["bias"])

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1, self.attn = nn.LayerNorm(c["n_embd"]), Attention(c)
        self.ln2, self.mlp = nn.LayerNorm(c["n_embd"]), MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte = nn.Embedding(c["vocab_size"], c["n_embd"])
        self.wpe = nn.Embedding(c["block_size"], c["n_embd"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["n_layer"]))
        self.ln_f = nn.LayerNorm(c["n_embd"])
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        if c["tie_weights"]:
            self.lm_head.weight = self.wte.weight  # the file holds it under both names

    def forward(self, idx):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def load(folder):
    with open(folder + "/config.json") as f:
        config = json.load(f)
    assert config["model_type"] == "strata-gpt", config
    model = GPT(config)
    model.load_state_dict(load_file(folder + "/model.safetensors"), strict=True)
    return model.eval(), config


def main():
    model, config = load(sys.argv[1])
    idx = torch.tensor([list(sys.argv[2].encode())[-config["block_size"]:]])  # byte-level tokens
    with torch.no_grad():
        for _ in range(40):
            probs = model(idx[:, -config["block_size"]:])[0, -1].softmax(-1)
            idx = torch.cat([idx, torch.multinomial(probs, 1)[None]], dim=1)
    print(bytes(idx[0].tolist()).decode(errors="replace"))


if __name__ == "__main__":
    main()
