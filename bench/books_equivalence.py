#!/usr/bin/env python3
"""Do two trees' cuda backends issue the same CUDA calls for the same launches? (the books' "no behaviour change")

The C++ observer records ``--iters`` iterations of a training loop once (the small-op loop of
``bench/runtime_overhead.py``, or ``--model gpt2-small``); then, in a fresh process per tree, the real
``CudaBackend``, ``Mover`` and mover thread plan those same records on one thread over the fake CUDA boundary of
``tests/unit/fake_cuda.py`` (as ``runtime_overhead.py --split`` does), with the backend's clock pinned to the
launch number (the policy paces prefetches by it), and log every call that reaches the fake: kind, address, bytes,
destination, stream, thread, in order; and the books' counters. The base tree is ``git archive`` of ``--base``; the
head is this checkout. Any difference is printed (the first few) and the exit status is 1. Last, a table of the planner thread's CPU per
launch by part (``runtime_overhead.py --split``'s parts), the median of ``--rounds`` alternating runs per tree.

    python bench/books_equivalence.py                      # this tree against main, the small-op loop
    python bench/books_equivalence.py --rounds 5           # and the books' CPU per launch, base against head
    python bench/books_equivalence.py --base HEAD~3 --model gpt2-small --batch 2 --seq 128 --iters 2 --budget 1GiB
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import statistics
import tempfile
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def record(args, path: Path) -> int:
    """Record the loop's ops with the C++ observer into ``path`` (.npy); returns how many."""
    import numpy as np
    sys.path.insert(0, str(ROOT / "bench"))
    from runtime_overhead import make_step
    from uvmprefetch.runtime import native_observer

    step = make_step(args)
    for _ in range(args.warmup):
        step()
    lib = native_observer.load()
    lib.drain_ops()
    lib.start("cpu", active=True)
    ops = []
    for _ in range(args.iters):
        step()
        ops.append(lib.drain_ops())
    lib.stop()
    if lib.counters()["dropped"]:
        raise SystemExit("books_equivalence: records dropped while recording: lower --iters")
    ops = np.concatenate(ops)
    np.save(path, ops)
    # the observer's last sequence number: what the planner sees as finished (fake_cuda.cpu_progress) when it plans
    # in the recording process, as runtime_overhead.py --split does
    path.with_suffix(".seq").write_text(str(int(lib.held.uvmobs_seq())))
    return int(ops.size)


def plan(ops_path: str, budget: str, out: str) -> None:
    """(child, run with PYTHONPATH at the tree under test) Plan the recorded ops with the cuda backend over the fake
    boundary; write the call log and the books' counters to ``out``."""
    import numpy as np
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    import fake_cuda
    from uvmprefetch.config import from_env
    from uvmprefetch.runtime import cuda_backend, native_observer
    from uvmprefetch.runtime.planner import Planner

    ops = np.load(ops_path)
    lib = native_observer.load()
    cfg = from_env({"UVMPREFETCH": "1", "UVMPREFETCH_BACKEND": "cuda", "UVMPREFETCH_BUDGET": budget,
                    "UVMPREFETCH_LOG": "quiet"})
    now = [0.0]
    # the policy paces prefetches by the backend's wall clock: pinned to the launch number, both trees see the same
    cuda_backend.time = types.SimpleNamespace(perf_counter=lambda: now[0])
    with tempfile.TemporaryDirectory() as d, fake_cuda.gate_library(fake_cuda.build_libcudart(d)):
        s, rt = fake_cuda.session(cfg)
        s.backend.attach_native(lib)
        done = max(0, int(Path(ops_path).with_suffix(".seq").read_text()) - 1)
        s.backend.progress = native_observer.NativeProgress(
            types.SimpleNamespace(lib=types.SimpleNamespace(uvmgate_completed_seq=lambda: done)),
            s.backend.max_blocks)
        s.active = True
        sys.path.insert(0, str(ROOT / "bench"))
        from runtime_overhead import _timed  # the parts as runtime_overhead.py --split times them
        acc = {k: [0, 0] for k in ("policy", "backend", "mover", "fake")}
        _timed(s.policy, ("on_launch", "on_fault", "on_free", "on_evict", "on_iteration"), acc, "policy")
        _timed(s.backend, ("launch", "free", "end_iteration"), acc, "backend")
        _timed(s.backend.mover, ("prefetch", "advise", "mark_moves", "discard", "populate"), acc, "mover")
        _timed(s.backend.shim, ("stats", "segments"), acc, "fake")
        launch = s.backend.launch

        def at_launch(info):
            now[0] = info.index * 50e-6
            launch(info)
        s.backend.launch = at_launch
        p = Planner(s, lib, 0)
        p.push_ops(p._whole_runs(ops))
        c = time.thread_time_ns()
        p._plan(None)
        total = time.thread_time_ns() - c
        s.backend.settle()
        calls = [list(c) for c in rt.calls]
        books = {k: v for k, v in s.backend.res.m.items()}
        s.backend.close()
    n = max(s.index, 1)
    cpu = {k: v[1] / 1e3 / n for k, v in acc.items()}
    parts = {"planner": total / 1e3 / n, "policy": cpu["policy"], "mover": cpu["mover"], "fake": cpu["fake"],
             "books": cpu["backend"] - cpu["policy"] - cpu["mover"] - cpu["fake"],
             "bookkeeping": total / 1e3 / n - cpu["backend"]}
    Path(out).write_text(json.dumps({"launches": s.index, "calls": calls, "books": books, "us_per_launch": parts}))


def run_tree(tree: Path, ops: Path, budget: str, out: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env.update(PYTHONPATH=str(tree), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, str(tree / "bench" / "books_equivalence.py"), "--plan", str(ops),
                        "--budget", budget, "--out", str(out)], env=env, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise SystemExit(f"books_equivalence: planning under {tree} failed: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(out.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="main", help="the git revision to compare this tree with (default main)")
    p.add_argument("--model", default="loop", help="loop or a model of uvmprefetch.trace.models, e.g. gpt2-small")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=256)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--budget", default="8MiB", help="the budget the records are planned at (default 8MiB)")
    p.add_argument("--rounds", type=int, default=1, help="alternating runs per tree, for the timing table")
    p.add_argument("--plan", metavar="OPS", help="(child) plan the ops in this .npy file and write --out")
    p.add_argument("--out", help="(child) the call log's JSON file")
    args = p.parse_args()
    if args.plan:
        plan(args.plan, args.budget, args.out)
        return
    from uvmprefetch.config import parse_budget
    from uvmprefetch.errors import ConfigError
    if args.rounds < 1 or args.iters < 1:
        p.error("--rounds and --iters must be at least 1")
    if args.model != "loop":
        from uvmprefetch.trace.models import CONFIGS
        name, _, config = args.model.partition("-")
        if name not in CONFIGS or config and config not in CONFIGS[name]:
            p.error(f"--model {args.model}: loop or <model>-<config> of {', '.join(CONFIGS)} (e.g. gpt2-small)")
    try:
        parse_budget(args.budget)
    except ConfigError as e:
        p.error(f"--budget: {e}")
    with tempfile.TemporaryDirectory(prefix="books-eq-") as d:
        d = Path(d)
        base = d / "base"
        base.mkdir()
        arch = subprocess.run(["git", "-C", str(ROOT), "archive", args.base], capture_output=True)
        if arch.returncode != 0:
            p.error(f"--base {args.base}: {arch.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", str(base)], input=arch.stdout, check=True)
        # the child script is this tree's, run against the base tree's package
        (base / "bench" / "books_equivalence.py").write_text(Path(__file__).read_text())
        n = record(args, d / "ops.npy")
        runs = {"base": [], "head": []}
        for _ in range(args.rounds):  # alternating: base, head, base, head, ...
            runs["base"].append(run_tree(base, d / "ops.npy", args.budget, d / "base.json"))
            runs["head"].append(run_tree(ROOT, d / "ops.npy", args.budget, d / "head.json"))
        a, b = runs["base"][0], runs["head"][0]
    diffs = [(i, x, y) for i, (x, y) in enumerate(zip(a["calls"], b["calls"])) if x != y]
    same = not diffs and len(a["calls"]) == len(b["calls"]) and a["books"] == b["books"] and \
        a["launches"] == b["launches"]
    same = same and all(r["calls"] == a["calls"] for r in runs["base"] + runs["head"])  # (and run to run)
    for i, x, y in diffs[:5]:
        print(f"call {i}: {args.base} {x}  this tree {y}")
    if a["books"] != b["books"]:
        print(f"books: {args.base} {a['books']}\n       this tree {b['books']}")
    kinds = {}
    for c in b["calls"]:
        kinds[c[0]] = kinds.get(c[0], 0) + 1
    print(f"{args.model}: {n} ops recorded, {b['launches']} launches planned at {args.budget}; CUDA calls: "
          f"{args.base} {len(a['calls'])}, this tree {len(b['calls'])} ({kinds}); "
          f"{'identical' if same else 'DIFFERENT'}")
    parts = list(a["us_per_launch"])
    print(f"planner thread CPU us per launch, median of {args.rounds} alternating runs (one thread; parts as "
          "runtime_overhead.py --split)")
    print(f"{'tree':<10}" + "".join(f"{k:>12}" for k in parts))
    for name, key in ((args.base, "base"), ("this tree", "head")):
        med = {k: statistics.median(r["us_per_launch"][k] for r in runs[key]) for k in parts}
        print(f"{name[:10]:<10}" + "".join(f"{med[k]:>12.1f}" for k in parts))
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
