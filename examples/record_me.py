"""A plain PyTorch training script, written for a GPU, with nothing uvmprefetch-specific in it.

    python examples/record_me.py --steps 5                         # trains on a GPU (or the CPU)
    uvmprefetch record --script examples/record_me.py --iters 2 -o me.uvmt -- --steps 5

It loads its token data from disk, moves the model and batches to ``cuda`` when available, logs the loss
with ``.item()`` and stops on a NaN loss: the things a recorder without a GPU has to cope with.
"""

import argparse
import math
import os
import tempfile

import numpy as np
import torch
import torch.nn as nn


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int, seq: int):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(seq, dim))
        block = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.1, batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.head = nn.Linear(dim, vocab)

    def forward(self, x):
        h = self.tok(x) + self.pos[: x.shape[1]]
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device)
        return self.head(self.blocks(h, mask=mask, is_causal=True))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", help="token file (.npy); default: a random one written to a temporary folder")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    args = p.parse_args()

    if args.data is None:  # make a data file so the script really reads from disk
        args.data = os.path.join(tempfile.mkdtemp(), "tokens.npy")
        np.save(args.data, np.random.default_rng(0).integers(0, 1000, size=200_000, dtype=np.int64))
    tokens = torch.from_numpy(np.load(args.data))

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = TinyLM(vocab=1000, dim=128, layers=2, heads=4, seq=args.seq).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    loss_fn = nn.CrossEntropyLoss()
    for step in range(args.steps):
        starts = torch.randint(0, tokens.numel() - args.seq - 1, (args.batch,))
        batch = torch.stack([tokens[s: s + args.seq + 1] for s in starts.tolist()])
        x, y = batch[:, :-1].to(device), batch[:, 1:].to(device)
        logits = model(x)
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = loss.item()
        if math.isnan(value):
            raise SystemExit(f"step {step}: loss is NaN")
        print(f"step {step} loss {value:.4f}")


if __name__ == "__main__":
    main()
