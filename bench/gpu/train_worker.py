"""Train a transformers model for a few iterations and write its losses and iteration times as JSON.

This is the *user's program* of the GPU validation: it never imports uvmprefetch. Whether it runs on plain
PyTorch, on managed memory without prefetch, or under the uvmprefetch runtime is decided only by the
environment its parent sets (``UVMPREFETCH=1``, ``UVMPREFETCH_POLICY``, ``UVMPREFETCH_BUDGET``, ...), exactly as
for a user's unchanged training script. Models are built from a config with random weights (never a hub
download); data are random token ids from a seeded CPU generator, so every mode sees the same batches.

    python bench/gpu/train_worker.py --model gpt2 --config small --iters 20 --out run.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# (model, config) -> constructor keyword arguments. Sizes follow the published GPT-2 family; "tiny" is the
# dry-run model; the llama entries are Llama-style decoders of about 0.5 B and 1.2 B parameters.
CONFIGS = {
    ("gpt2", "tiny"): dict(n_layer=2, n_embd=64, n_head=2, vocab_size=512, n_positions=128, bos_token_id=511,
                          eos_token_id=511),
    # "mini": the smallest model whose working set spans tens of 2 MB blocks, so that a budget of half of it is
    # still a meaningful capacity for the dry runs of the oversubscription scripts.
    ("gpt2", "mini"): dict(n_layer=2, n_embd=256, n_head=4, vocab_size=4096, n_positions=128, bos_token_id=4095,
                           eos_token_id=4095),
    ("gpt2", "small"): dict(n_layer=12, n_embd=768, n_head=12),
    ("gpt2", "medium"): dict(n_layer=24, n_embd=1024, n_head=16),
    ("gpt2", "large"): dict(n_layer=36, n_embd=1280, n_head=20),
    ("gpt2", "xl"): dict(n_layer=48, n_embd=1600, n_head=25),
    ("llama", "tiny"): dict(num_hidden_layers=2, hidden_size=64, intermediate_size=172, num_attention_heads=2,
                            num_key_value_heads=2, vocab_size=512, max_position_embeddings=128),
    ("llama", "0.5b"): dict(num_hidden_layers=16, hidden_size=1536, intermediate_size=4096, num_attention_heads=16,
                            num_key_value_heads=16, vocab_size=32000, max_position_embeddings=2048),
    ("llama", "1b"): dict(num_hidden_layers=16, hidden_size=2048, intermediate_size=5504, num_attention_heads=32,
                          num_key_value_heads=32, vocab_size=32000, max_position_embeddings=2048),
}


def build_model(model: str, config: str, seq: int, eager_attention: bool):
    import transformers
    try:
        kw = dict(CONFIGS[(model, config)])
    except KeyError:
        valid = ", ".join(f"{m}:{c}" for m, c in CONFIGS)
        raise SystemExit(f"train_worker: unknown model/config {model}:{config}; valid: {valid}") from None
    if model == "gpt2":
        kw["n_positions"] = max(kw.get("n_positions", 1024), seq)
        cfg = transformers.GPT2Config(**kw)
        cls = transformers.GPT2LMHeadModel
    else:
        kw["max_position_embeddings"] = max(kw["max_position_embeddings"], seq)
        cfg = transformers.LlamaConfig(**kw)
        cls = transformers.LlamaForCausalLM
    # Eager attention in deterministic runs: the fused SDPA backward kernels may accumulate in a different order
    # from run to run, which would make a bitwise comparison between modes meaningless.
    cfg._attn_implementation = "eager" if eager_attention else "sdpa"
    return cls(cfg), cfg.vocab_size


def deterministic_kernels() -> None:
    """Deterministic kernels, so that two runs of the same training compare bitwise."""
    import torch
    # warn_only: an op without a deterministic kernel warns instead of killing the run; the caller's two
    # plain runs then differ, and the comparison falls back to a tolerance and says so.
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def train(model, opt, vocab: int, gen, dev, *, batch: int, seq: int, iters: int, dtype: str = "fp32"):
    """``iters`` steps on random token batches from ``gen``: (losses, seconds per iteration). Resets the CUDA
    peak memory figures first, so that they are the training's."""
    import torch
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    losses, iter_s = [], []
    for _ in range(iters):
        ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(dev)
        sync()
        t0 = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        val = loss.item()
        sync()
        iter_s.append(time.perf_counter() - t0)
        losses.append(val)
    return losses, iter_s


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="gpt2", choices=sorted({m for m, _ in CONFIGS}))
    p.add_argument("--config", default="small")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"], help="bf16 = autocast around the forward pass")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels (torch.use_deterministic_algorithms, eager attention, no TF32)")
    p.add_argument("--foreach", default="auto", choices=["auto", "on", "off"],
                   help="AdamW's multi-tensor (foreach) path: one op over every parameter at once (auto = "
                        "PyTorch's choice: on for CUDA)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    for name in ("batch", "seq", "iters"):
        if getattr(a, name) <= 0:
            raise SystemExit(f"train_worker: --{name} must be positive")

    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("train_worker: --device cuda but torch sees no CUDA GPU")
    if a.deterministic:
        deterministic_kernels()
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    model, vocab = build_model(a.model, a.config, a.seq, eager_attention=a.deterministic)
    model.to(dev).train()
    n_params = sum(t.numel() for t in model.parameters())
    foreach = {"auto": None, "on": True, "off": False}[a.foreach]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=foreach)
    gen = torch.Generator().manual_seed(a.seed + 1)
    losses, iter_s = train(model, opt, vocab, gen, dev, batch=a.batch, seq=a.seq, iters=a.iters, dtype=a.dtype)

    res = {
        "model": a.model, "config": a.config, "batch": a.batch, "seq": a.seq, "iters": a.iters, "dtype": a.dtype,
        "deterministic": a.deterministic, "foreach": a.foreach, "device": str(dev), "seed": a.seed,
        "n_params": n_params,
        # Parameters, gradients and the two AdamW moments: the part of the working set that lives all iteration.
        "state_bytes": 4 * 4 * n_params,
        "losses": losses,
        # float.hex of the fp32 loss widened to a Python float: equal strings <=> bitwise-equal losses.
        "losses_hex": [float(x).hex() for x in losses],
        "iter_s": iter_s,
        "torch": torch.__version__,
    }
    if dev.type == "cuda":
        res.update(peak_allocated_bytes=int(torch.cuda.max_memory_allocated()),
                   peak_reserved_bytes=int(torch.cuda.max_memory_reserved()),
                   device_name=torch.cuda.get_device_name(0))
    with open(a.out, "w") as f:
        json.dump(res, f)
    print(f"train_worker: {a.model}-{a.config} {a.iters} iterations, last loss {losses[-1]:.6f}, "
          f"median {sorted(iter_s)[len(iter_s) // 2] * 1e3:.1f} ms/iter", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
