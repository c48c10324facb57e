"""A plain GPT-2 training script: transformers, a small config, random weights, AdamW. No uvmprefetch import.

Run it unchanged under the runtime:

    UVMPREFETCH=1 python examples/train_gpt2.py                                  # on a GPU
    UVMPREFETCH=1 UVMPREFETCH_BACKEND=dryrun UVMPREFETCH_BUDGET=24MiB \\
        UVMPREFETCH_REPORT=report.json python examples/train_gpt2.py             # on the CPU, simulated GPU

It picks CUDA when available, else the CPU, prints one loss per iteration (and its exact float.hex) and, with
``--out``, writes them as JSON, so runs with and without the runtime can be compared bit for bit.
"""

import argparse
import json
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # random init from a config: never reach a model hub

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--embd", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto (cuda if available, else cpu), cuda or cpu")
    p.add_argument("--deterministic", action="store_true", help="torch.use_deterministic_algorithms (bitwise runs)")
    p.add_argument("--out", help="write {device, losses, losses_hex, iter_s, peak_reserved_bytes} as JSON here")
    args = p.parse_args()

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS refuses deterministic mode without it
        torch.use_deterministic_algorithms(True)
    torch.manual_seed(args.seed)
    cfg = GPT2Config(n_layer=args.layers, n_embd=args.embd, n_head=args.heads, vocab_size=args.vocab,
                     n_positions=max(args.seq, 64), bos_token_id=0, eos_token_id=0,
                     attn_implementation="eager")
    model = GPT2LMHeadModel(cfg).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(args.seed + 1)
    losses, iter_s = [], []
    for it in range(args.iters):
        t0 = time.perf_counter()
        ids = torch.randint(0, args.vocab, (args.batch, args.seq), generator=gen).to(device)
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        loss = float(out.loss.detach().cpu())
        iter_s.append(time.perf_counter() - t0)
        losses.append(loss)
        print(f"iter {it} loss {loss:.6f} ({loss.hex()})", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": device, "losses": losses, "losses_hex": [x.hex() for x in losses],
                       "iter_s": iter_s,
                       "peak_reserved_bytes": torch.cuda.max_memory_reserved() if device == "cuda" else None}, f)


if __name__ == "__main__":
    main()
