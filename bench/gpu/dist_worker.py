"""One rank of a data-parallel training job: DDP or FSDP2 (``fully_shard``) over a transformers model.

The *user's program* of the distributed checks, started by ``torchrun``; it never imports uvmprefetch (whether
the runtime runs is decided by the environment only, as for a user's script). Every rank builds the same model
from a seed (random weights, no hub download), trains on its own seeded random token batches, and writes its
losses and iteration times to ``OUT/rank<N>.json``. ``--probe-ipc`` also tries to export a CUDA IPC handle for
one parameter's memory (``torch.multiprocessing``'s path for sharing CUDA tensors) and records the answer.

    torchrun --standalone --nproc_per_node=2 bench/gpu/dist_worker.py --wrap ddp --device cpu --config mini \\
        --iters 3 --out /tmp/ranks
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from train_worker import CONFIGS, build_model, deterministic_kernels, train  # noqa: E402 - as the single-process checks


def _wrap(model, how: str, dev, bucket_mb: float):
    import torch
    if how == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None, bucket_cap_mb=bucket_mb)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh(dev.type, (torch.distributed.get_world_size(),))
    blocks = getattr(getattr(model, "transformer", None), "h", None) or getattr(getattr(model, "model", None),
                                                                                 "layers", [])
    for block in blocks:  # one all-gather per transformer block, then the rest (embeddings, head) at the root
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _probe_ipc(model) -> str:
    """What exporting a CUDA IPC handle for a parameter's memory answers: ``ok`` or the error (one line)."""
    p = next(model.parameters()).data
    p = p.to_local() if hasattr(p, "to_local") else p  # FSDP2: the rank's shard
    try:
        p.untyped_storage()._share_cuda_()
        return "ok"
    except Exception as e:  # noqa: BLE001 - the answer is the point
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]


def _save(path: str, res: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(res, f)
    os.replace(tmp, path)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wrap", default="ddp", choices=["ddp", "fsdp"])
    p.add_argument("--model", default="gpt2", choices=sorted({m for m, _ in CONFIGS}))
    p.add_argument("--config", default="small")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP gradient bucket size (PyTorch's default 25)")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels (torch.use_deterministic_algorithms, eager attention, no TF32)")
    p.add_argument("--probe-ipc", action="store_true", help="cuda: try a CUDA IPC export of a parameter's memory")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--out", required=True, help="folder; rank N writes OUT/rankN.json")
    a = p.parse_args(argv)
    for name in ("batch", "seq", "iters"):
        if getattr(a, name) <= 0:
            raise SystemExit(f"dist_worker: --{name} must be positive")
    if "WORLD_SIZE" not in os.environ:
        raise SystemExit("dist_worker: no WORLD_SIZE in the environment: start it with torchrun")

    import torch
    import torch.distributed as dist

    if a.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("dist_worker: --device cuda but torch sees no CUDA GPU")
    if a.deterministic:
        deterministic_kernels()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local) if a.device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(a.seed)  # the same initial weights on every rank
    model, vocab = build_model(a.model, a.config, a.seq, eager_attention=a.deterministic)
    model.to(dev).train()
    n_params = sum(t.numel() for t in model.parameters())
    model = _wrap(model, a.wrap, dev, a.bucket_mb)
    # per-parameter AdamW: the foreach path is one op over every parameter, which no budget below the whole
    # optimizer state can hold (bench/gpu/_common.Workload)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=False)
    gen = torch.Generator().manual_seed(a.seed + 1 + 1000 * rank)  # each rank its own batches
    losses, iter_s = train(model, opt, vocab, gen, dev, batch=a.batch, seq=a.seq, iters=a.iters)
    res = {"rank": rank, "world_size": world, "local_rank": local, "wrap": a.wrap, "model": a.model,
           "config": a.config, "batch": a.batch, "seq": a.seq, "iters": a.iters, "device": str(dev),
           "backend": dist.get_backend(), "n_params": n_params, "state_bytes": 4 * 4 * n_params,
           "losses": losses, "losses_hex": [float(x).hex() for x in losses], "iter_s": iter_s,
           "torch": torch.__version__, "pid": os.getpid()}
    if dev.type == "cuda":
        res.update(peak_allocated_bytes=int(torch.cuda.max_memory_allocated(dev)),
                   peak_reserved_bytes=int(torch.cuda.max_memory_reserved(dev)),
                   device_name=torch.cuda.get_device_name(dev))
    dist.barrier()
    dist.destroy_process_group()
    path = os.path.join(a.out, f"rank{rank}.json")
    _save(path, res)
    if a.probe_ipc and dev.type == "cuda":  # last, after the results are written: whatever it answers
        _save(path, {**res, "ipc_export": _probe_ipc(model)})
    print(f"dist_worker: rank {rank}/{world} {a.wrap} {a.model}-{a.config} {a.iters} iterations, last loss "
          f"{losses[-1]:.6f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
