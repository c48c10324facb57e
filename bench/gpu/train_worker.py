"""Train a transformers model for a few iterations and write its losses and iteration times as JSON.

This is the *user's program* of the GPU validation: it never imports uvmprefetch. Whether it runs on plain
PyTorch, on managed memory without prefetch, or under the uvmprefetch runtime is decided only by the
environment its parent sets (``UVMPREFETCH=1``, ``UVMPREFETCH_POLICY``, ``UVMPREFETCH_BUDGET``, ...), exactly as
for a user's unchanged training script. Models are built from a config with random weights (never a hub
download); data are random token ids from a seeded CPU generator, so every mode sees the same batches.

The memory-saving methods a user would reach for instead of unified memory are flags that change the training
code the way a user would (``bench/gpu/alternatives.py`` compares them): ``--checkpoint`` (activation
checkpointing per transformer block), ``--offload-activations`` (``save_on_cpu`` around the forward pass),
``--fsdp-offload`` (FSDP2 with ``CPUOffloadPolicy`` on a process group of one), and ``--memory-cap`` holds
PyTorch's caching allocator to a byte budget. A run that runs out of memory writes its result with ``oom`` set
and exits with code 3.

    python bench/gpu/train_worker.py --model gpt2 --config small --iters 20 --out run.json
    python bench/gpu/train_worker.py --config large --checkpoint --memory-cap 33e9 --out ckpt.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

EXIT_OOM = 3

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


def train(model, opt, vocab: int, gen, dev, *, batch: int, seq: int, iters: int, dtype: str = "fp32",
          offload: bool = False, stop_at: float | None = None, log: tuple[list, list] | None = None):
    """``iters`` steps on random token batches from ``gen``: (losses, seconds per iteration). Resets the CUDA
    peak memory figures first, so that they are the training's.

    ``offload``: saved activations go to host memory (``save_on_cpu``, pinned on CUDA). ``stop_at``: a
    ``time.perf_counter()`` value; no iteration starts that the last one's time says would end after it.
    ``log``: the two lists to append to, so that the iterations that finished survive an exception (out of
    memory) raised by a later one."""
    import torch
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    saving = (lambda: torch.autograd.graph.save_on_cpu(pin_memory=dev.type == "cuda")) if offload \
        else contextlib.nullcontext
    losses, iter_s = log if log is not None else ([], [])
    for _ in range(iters):
        if stop_at is not None and iter_s and time.perf_counter() + iter_s[-1] > stop_at:
            break
        ids = torch.randint(0, vocab, (batch, seq), generator=gen).to(dev)
        sync()
        t0 = time.perf_counter()
        with saving(), torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dtype == "bf16"):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        val = loss.item()
        sync()
        iter_s.append(time.perf_counter() - t0)
        losses.append(val)
    return losses, iter_s


def transformer_blocks(model) -> list:
    """The model's transformer blocks: the modules transformers declares it never splits (``GPT2Block``,
    ``LlamaDecoderLayer``), in order."""
    names = set(getattr(model, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise SystemExit(f"train_worker: {type(model).__name__} names no transformer block class (_no_split_modules)")
    return blocks


def fsdp_offload(model, dev):
    """FSDP2 on a process group of one: each transformer block, then the root, ``fully_shard`` with
    ``CPUOffloadPolicy``, so parameters, gradients and AdamW state live on the host and the optimizer steps
    there. Pinned host memory on CUDA (the policy's default); a CPU run has no pinned memory (nor a GPU)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    # An in-process store: a group of one needs no rendezvous, so no port is opened.
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh(dev.type, (1,))
        policy = CPUOffloadPolicy(pin_memory=dev.type == "cuda")
        for block in transformer_blocks(model):
            fully_shard(block, mesh=mesh, offload_policy=policy)
        fully_shard(model, mesh=mesh, offload_policy=policy)
    except BaseException:
        dist.destroy_process_group()
        raise
    return dist.destroy_process_group


def cap_memory(cap: int) -> int:
    """Hold PyTorch's caching allocator to ``cap`` bytes of the GPU (``set_per_process_memory_fraction``,
    computed from the total the allocator itself uses); returns the bytes the fraction allows."""
    import torch
    total = torch.cuda.mem_get_info()[1]
    if not 0 < cap <= total:
        raise SystemExit(f"train_worker: --memory-cap {cap} must be between 1 and the GPU's {total} bytes")
    # round the fraction down so that fraction x total never exceeds the cap
    frac = (cap - 1) / total
    torch.cuda.set_per_process_memory_fraction(frac)
    return int(frac * total)


def pinned_peak_bytes() -> int:
    """Peak bytes of pinned host memory PyTorch's host allocator held (``save_on_cpu`` and ``pin_memory()``
    both take it from there). The key was ``reserved_bytes`` before torch 2.12 and is ``allocated_bytes`` (the
    blocks the allocator owns) since; the larger is the memory pinned."""
    import torch
    stats = torch.cuda.host_memory_stats()
    return int(max(stats.get("reserved_bytes.peak", 0), stats.get("allocated_bytes.peak", 0)))


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
    p.add_argument("--checkpoint", action="store_true",
                   help="activation checkpointing per transformer block (transformers' gradient_checkpointing_enable, "
                        "non-reentrant)")
    p.add_argument("--offload-activations", action="store_true",
                   help="torch.autograd.graph.save_on_cpu around the forward pass (pinned host memory on CUDA)")
    p.add_argument("--fsdp-offload", action="store_true",
                   help="FSDP2 fully_shard per block and root with CPUOffloadPolicy, on a process group of one")
    p.add_argument("--memory-cap", type=float, default=None,
                   help="bytes PyTorch's caching allocator may reserve on the GPU (set_per_process_memory_fraction)")
    p.add_argument("--max-seconds", type=float, default=None,
                   help="stop after the iteration that leaves less than one more iteration's time of this many "
                        "seconds since start (the result says how many ran)")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", required=True)
    a = p.parse_args(argv)
    for name in ("batch", "seq", "iters"):
        if getattr(a, name) <= 0:
            raise SystemExit(f"train_worker: --{name} must be positive")
    if a.memory_cap is not None and a.device != "cuda":
        raise SystemExit("train_worker: --memory-cap needs --device cuda")
    started = time.perf_counter()

    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("train_worker: --device cuda but torch sees no CUDA GPU")
    if a.deterministic:
        deterministic_kernels()
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    cap = cap_memory(int(a.memory_cap)) if a.memory_cap is not None else None
    model, vocab = build_model(a.model, a.config, a.seq, eager_attention=a.deterministic)
    n_params = sum(t.numel() for t in model.parameters())
    if a.checkpoint:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    losses, iter_s, oom, close, placed = [], [], None, None, False
    try:
        # FSDP2 moves each block to the GPU and its shard back to the host as it wraps it: no .to(dev) first
        close = fsdp_offload(model, dev) if a.fsdp_offload else None
        if close is None:
            model.to(dev)
        placed = True
        model.train()
        foreach = {"auto": None, "on": True, "off": False}[a.foreach]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=foreach)
        gen = torch.Generator().manual_seed(a.seed + 1)
        train(model, opt, vocab, gen, dev, batch=a.batch, seq=a.seq, iters=a.iters, dtype=a.dtype,
              offload=a.offload_activations, log=(losses, iter_s),
              stop_at=None if a.max_seconds is None else started + a.max_seconds)
    except torch.OutOfMemoryError as e:
        oom = {"iteration": len(losses) if placed else None, "message": str(e).splitlines()[0][:300]}

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
        "method": {"checkpoint": a.checkpoint, "offload_activations": a.offload_activations,
                   "fsdp_offload": a.fsdp_offload},
        "memory_cap_bytes": cap,
        "oom": oom,
        # fewer iterations than asked: --max-seconds stopped it (an out-of-memory run says so in "oom")
        "stopped_early": oom is None and len(iter_s) < a.iters,
    }
    if dev.type == "cuda":
        res.update(peak_allocated_bytes=int(torch.cuda.max_memory_allocated()),
                   peak_reserved_bytes=int(torch.cuda.max_memory_reserved()),
                   host_pinned_peak_bytes=pinned_peak_bytes(), device_name=torch.cuda.get_device_name(0))
    if close is not None:
        close()
    with open(a.out, "w") as f:
        json.dump(res, f)
    if oom is not None:
        print(f"train_worker: out of memory at iteration {oom['iteration']}: {oom['message']}", file=sys.stderr)
        return EXIT_OOM
    print(f"train_worker: {a.model}-{a.config} {len(iter_s)} iterations, last loss {losses[-1]:.6f}, "
          f"median {sorted(iter_s)[len(iter_s) // 2] * 1e3:.1f} ms/iter", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
