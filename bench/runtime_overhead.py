#!/usr/bin/env python3
"""What the live runtime costs the training thread per op, on the CPU (the dryrun backend).

A loop of small ATen ops (a chain of linear layers of a few KB each: forward, backward, an in-place SGD update)
runs in a fresh process per case, with the runtime switched on the way a user does (``UVMPREFETCH=1`` through
the start-up hook):

- ``plain``: no runtime;
- ``fits``: ``UVMPREFETCH_BACKEND=dryrun`` with a budget the model fits in (the planner stays dormant: the
  per-op cost is the C++ observer's counting callback);
- ``moves``: a budget below the working set (the planner plans every launch and the simulated GPU moves
  blocks; the training thread pays the full callback and shares the GIL with the planner thread);
- ``python-fits``: as ``fits`` with ``UVMPREFETCH_OBSERVER=python`` (the fallback dispatch mode).

Each child times ``--iters`` loop iterations after a warm-up and prints microseconds per op (ops counted once
per iteration with a counting dispatch mode, outside the timed part). The cases run in alternating rounds
(plain, fits, moves, ... again), and the ratio to plain is taken round by round; medians are printed last.

    python bench/runtime_overhead.py [--rounds 5] [--iters 300] [--out out/runtime-overhead.json]
    python bench/runtime_overhead.py --child            # one timed loop (what the rounds run)
    python bench/runtime_overhead.py --inprocess fits --rounds 20 --iters 20   # alternating in one process
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "plain": {},
    "fits": {"UVMPREFETCH": "1", "UVMPREFETCH_BACKEND": "dryrun", "UVMPREFETCH_BUDGET": "1GiB"},
    "moves": {"UVMPREFETCH": "1", "UVMPREFETCH_BACKEND": "dryrun", "UVMPREFETCH_BUDGET": "8MiB"},
    "python-fits": {"UVMPREFETCH": "1", "UVMPREFETCH_BACKEND": "dryrun", "UVMPREFETCH_BUDGET": "1GiB",
                    "UVMPREFETCH_OBSERVER": "python"},
}


def make_step(args):
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    width, layers = args.width, args.layers
    ws = [(torch.randn(width, width) * 0.1).requires_grad_() for _ in range(layers)]
    bs = [torch.zeros(width, requires_grad=True) for _ in range(layers)]
    x = torch.randn(args.batch, width)

    def step():
        h = x
        for w, b in zip(ws, bs):
            h = (h @ w + b).relu()
        (h * h).mean().backward()
        with torch.no_grad():
            for p in ws + bs:
                p.sub_(p.grad, alpha=1e-3)
                p.grad = None
    return step


def inprocess(args) -> dict:
    """Plain and runtime blocks alternating in one process (``uvmprefetch.enable`` / ``disable`` between them,
    outside the timed blocks): the start-up of a process is not in the figures, and drift cancels pair by pair."""
    from uvmprefetch import runtime
    step = make_step(args)
    for _ in range(args.warmup):
        step()

    def block() -> float:
        t0 = time.perf_counter()
        for _ in range(args.iters):
            step()
        return time.perf_counter() - t0
    env = CASES[args.inprocess]
    ratios, reps = [], []
    for _ in range(args.rounds):
        plain = block()
        runtime.enable(backend="dryrun", budget=env["UVMPREFETCH_BUDGET"], log="quiet",
                       observer=env.get("UVMPREFETCH_OBSERVER", "auto"), report=None, trace=None)
        step()  # warm-up under the runtime (first sight of every storage; the planner wakes if it must)
        on = block()
        reps.append(runtime.disable())
        ratios.append(on / plain)
    last = reps[-1]
    return {"case": args.inprocess, "rounds": args.rounds, "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios), "ratios": ratios,
            "observer": last["observer"]["kind"], "planned": last["launches"],
            "planner": (last.get("observe_time") or {}).get("planner")}


def child(args) -> dict:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    step = make_step(args)
    width = args.width

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, a=(), kw=None):
            Count.n += 1
            return func(*a, **(kw or {}))

    for _ in range(args.warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(args.iters):
        step()
    dt = time.perf_counter() - t0
    from uvmprefetch import runtime
    s = runtime.current()
    if s is not None:
        s.active = False  # the count below must not reach the runtime
    with Count():
        step()
    ops = Count.n
    out = {"s": dt, "iters": args.iters, "ops_per_iter": ops, "us_per_op": dt / args.iters / ops * 1e6,
           "tensor_kb": width * width * 4 / 1024}
    if s is not None:
        rep = runtime.disable()
        ot = rep.get("observe_time") or {}
        out.update(observer=rep["observer"]["kind"], planned=rep["launches"],
                   bytes_dtoh=rep["bytes_dtoh"], working_set_bytes=rep["working_set_bytes"],
                   planner=ot.get("planner"), callback_us_per_launch=ot.get("callback_us_per_launch"))
    return out


def run_case(name: str, args) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env.update(CASES[name], UVMPREFETCH_LOG="quiet", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, __file__, "--child", "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--width", str(args.width), "--layers", str(args.layers), "--batch", str(args.batch)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"case {name} failed (exit {r.returncode}): {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", action="store_true", help="run one timed loop and print its JSON")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--iters", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--width", type=int, default=64, help="layer width (weights width^2 * 4 bytes: 16 KiB)")
    p.add_argument("--layers", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--cases", default="plain,fits,moves,python-fits")
    p.add_argument("--out", help="write the figures here (JSON)")
    p.add_argument("--inprocess", choices=sorted(set(CASES) - {"plain"}),
                   help="alternate plain and this case inside one process (enable/disable between blocks) "
                        "instead of one process per case")
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    if args.inprocess:
        res = inprocess(args)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(res, indent=1))
        print(f"{res['case']}: x plain median {res['ratio_median']:.3f} (min {res['ratio_min']:.3f}, max "
              f"{res['ratio_max']:.3f}) over {res['rounds']} in-process rounds; observer {res['observer']}, "
              f"planned {res['planned']}")
        return
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if "plain" not in cases:
        raise SystemExit("--cases must include plain (the ratios are to it)")
    runs: dict = {c: [] for c in cases}
    for _ in range(args.rounds):
        for c in cases:
            runs[c].append(run_case(c, args))
    plain = [r["us_per_op"] for r in runs["plain"]]
    table = []
    for c in cases:
        us = [r["us_per_op"] for r in runs[c]]
        ratio = [u / p for u, p in zip(us, plain)]
        last = runs[c][-1]
        table.append({"case": c, "us_per_op_median": statistics.median(us), "ratio_median": statistics.median(ratio),
                      "ratio_min": min(ratio), "ratio_max": max(ratio), "observer": last.get("observer"),
                      "planned": last.get("planned"), "bytes_dtoh": last.get("bytes_dtoh"),
                      "callback_us_per_launch": last.get("callback_us_per_launch"),
                      "planner_woke": (last.get("planner") or {}).get("woke") is not None,
                      "ops_per_iter": last["ops_per_iter"]})
    result = {"bench": "runtime_overhead", "args": vars(args), "cases": table, "runs": runs,
              "machine": os.uname().nodename, "cpus": os.cpu_count()}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{'case':<12} {'us/op':>8} {'x plain':>8} {'min':>6} {'max':>6}  observer  planned  dtoh")
    for t in table:
        print(f"{t['case']:<12} {t['us_per_op_median']:>8.2f} {t['ratio_median']:>8.3f} {t['ratio_min']:>6.2f} "
              f"{t['ratio_max']:>6.2f}  {t['observer'] or '-':<8}  {t['planned'] or 0:>7}  {t['bytes_dtoh'] or 0}")


if __name__ == "__main__":
    main()
