#!/usr/bin/env python3
"""What the live runtime costs the training thread per op, on the CPU (the dryrun backend, and the cuda backend
over a fake CUDA boundary).

A loop of small ATen ops (a chain of linear layers of a few KB each: forward, backward, an in-place SGD update;
or ``--model gpt2-small``, a transformers model with random weights and AdamW) runs in a fresh process per case,
with the runtime switched on the way a user does (``UVMPREFETCH=1`` through the start-up hook):

- ``plain``: no runtime;
- ``fits``: ``UVMPREFETCH_BACKEND=dryrun`` with a budget the model fits in (the planner stays dormant: the
  per-op cost is the C++ observer's counting callback);
- ``moves``: a budget below the working set (the planner wakes and the simulated GPU moves blocks; the training
  thread pays the full callback while observed and parks for the planner's turns; a planner that falls more than
  ``UVMPREFETCH_PLANNER_LAG`` launches behind sheds observation until it has caught up: ``planned`` says how many
  launches it planned, ``parked`` how long the training thread waited for it);
- ``python-fits``: as ``fits`` with ``UVMPREFETCH_OBSERVER=python`` (the fallback dispatch mode);
- ``fits-cuda``, ``moves-cuda``: the same budgets with the real cuda backend, planner and mover threads over the
  fake CUDA boundary of ``tests/unit/fake_cuda.py`` (started by the child itself, before the model is built):
  ``calls/launch`` is the CUDA calls that reached the fake per planned launch.

Each child times ``--iters`` loop iterations after a warm-up and prints microseconds per op (ops counted once
per iteration with a counting dispatch mode, outside the timed part). The cases run in alternating rounds
(plain, fits, moves, ... again), and the ratio to plain is taken round by round; medians are printed last.

    python bench/runtime_overhead.py [--rounds 5] [--iters 300] [--out out/runtime-overhead.json]
    python bench/runtime_overhead.py --cases plain,moves,moves-cuda --rounds 5
    python bench/runtime_overhead.py --child            # one timed loop (what the rounds run)
    python bench/runtime_overhead.py --inprocess fits --rounds 20 --iters 20   # alternating in one process
    python bench/runtime_overhead.py --split --iters 20     # the planner's CPU per launch, by part
    python bench/runtime_overhead.py --split --model gpt2-small --batch 2 --seq 128 --iters 3 --warmup 1 --budget 1GiB

``--split`` answers "where does the planner's time go": the observer records ``--iters`` iterations of the loop
(the rings drained by this thread between iterations, nothing planned), then a planner plans every recorded launch
on this thread alone (no training thread beside it), at the ``moves`` budget (``--budget``), twice: for a dryrun
session and for a cuda session over the fake boundary (its ``Mover`` queues the calls for its mover thread, which
makes them). Each part is the planner thread's CPU time: the policy's hooks; the simulated GPU (dryrun: the
backend's calls minus the policy's hooks inside them) or the books (cuda: the same minus the ``Mover``'s methods and
the fake shim's); the ``Mover``'s methods; the planner's bookkeeping (the rest: records to storages and byte
ranges, block ids, iteration ends, counts). The cuda row adds the CUDA calls per launch and the mover thread's CPU.
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
    # the real cuda backend over the fake CUDA boundary (tests/unit/fake_cuda.py), started by the child itself
    "fits-cuda": {"UVMPREFETCH_BUDGET": "1GiB"},
    "moves-cuda": {"UVMPREFETCH_BUDGET": "8MiB"},
}
FAKE_CUDA_CASES = ("fits-cuda", "moves-cuda")


def make_step(args):
    import torch
    torch.manual_seed(0)
    torch.set_num_threads(1)
    if args.model != "loop":  # a transformers model with random weights (uvmprefetch.trace.models), AdamW
        from uvmprefetch.trace.models import build_model, make_batch
        name, _, config = args.model.partition("-")
        net = build_model(name, config or "small", device="cpu")
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
        batch = make_batch(name, net, batch=args.batch, seq=args.seq, image_size=None, device="cpu")

        def model_step():
            net(**batch).loss.backward()
            opt.step()
            opt.zero_grad()
        return model_step
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


def _fake_cuda():
    """``tests/unit/fake_cuda.py``: the fake at the cuda backend's true boundary (CUDA calls, streams, events)."""
    sys.path.insert(0, str(ROOT / "tests" / "unit"))
    import fake_cuda
    return fake_cuda


def _timed(obj, names, acc: dict, key: str) -> None:
    """Wrap ``obj``'s methods ``names`` so that their wall time and this thread's CPU time add up in ``acc[key]``
    (``[wall ns, cpu ns]``; a wall time includes waits for the GIL, the CPU time does not)."""
    wall, cpu = time.perf_counter_ns, time.thread_time_ns
    for name in names:
        fn = getattr(obj, name)

        def wrap(*a, _fn=fn, **kw):
            t, c = wall(), cpu()
            try:
                return _fn(*a, **kw)
            finally:
                part = acc[key]
                part[0] += wall() - t
                part[1] += cpu() - c
        setattr(obj, name, wrap)


def split(args) -> dict:
    """Record the loop with the C++ observer, then plan the records on this thread, timed by part: once for a dryrun
    session and once for a cuda session over the fake boundary (``tests/unit/fake_cuda.py``)."""
    import tempfile

    import numpy as np
    from uvmprefetch.runtime import native_observer

    step = make_step(args)
    for _ in range(args.warmup):
        step()
    lib = native_observer.load()
    if lib.lib.uvmalloc_install() != 0:
        raise SystemExit("split: the CPU allocator slot is taken (another allocator is installed)")
    lib.drain_ops(), lib.drain_allocs()
    lib.lib.uvmalloc_set_events(1)
    lib.start("cpu", active=True)
    ops, allocs = [], []
    t0 = time.perf_counter()
    for _ in range(args.iters):
        step()
        ops.append(lib.drain_ops())
        allocs.append(lib.drain_allocs())
    recorded_s = time.perf_counter() - t0
    lib.stop()
    lib.lib.uvmalloc_set_events(0)
    lib.lib.uvmalloc_uninstall()
    dropped = lib.counters()["dropped"] + lib.alloc_stats()["dropped"]
    if dropped:
        raise SystemExit(f"split: {dropped} records dropped while recording: lower --iters")
    res = _plan_split("dryrun", lib, np.concatenate(ops), np.concatenate(allocs), args.budget)
    with tempfile.TemporaryDirectory() as d:
        fake = _fake_cuda()
        with fake.gate_library(fake.build_libcudart(d)):
            res["cuda"] = _plan_split("cuda", lib, np.concatenate(ops), None, args.budget)
    res["recorded_us_per_launch"] = recorded_s * 1e6 / res["launches"]
    res.update(case="split", note="one thread, no GIL contention; the parts are wall time (on a shared machine wall "
               "exceeds CPU: planner_cpu_us_per_launch is this thread's CPU time). cuda: the same records planned by "
               "the real CudaBackend, Mover and mover thread over a fake CUDA boundary (tests/unit/fake_cuda.py): "
               "mover_us is the planner thread's time in the Mover's methods (queueing the calls; the calls run on "
               "the mover thread), books_us the backend's own (block ids, ranges, budget, GPU progress); no allocator "
               "events (as on a GPU without UVMPREFETCH_DISCARD=1 or UVMPREFETCH_EVICT=auto)")
    return res


def _plan_split(backend: str, lib, ops, allocs, budget: str | None) -> dict:
    """Plan the recorded ``ops`` (and CPU allocator events ``allocs``, dryrun) with a session of ``backend`` at
    ``budget`` (None: the ``moves`` case's), on this thread; the parts timed."""
    import numpy as np
    from uvmprefetch.config import from_env
    from uvmprefetch.runtime.planner import Planner
    from uvmprefetch.runtime.session import Session

    cfg = from_env({**CASES["moves"], "UVMPREFETCH_BACKEND": backend, "UVMPREFETCH_LOG": "quiet",
                    **({"UVMPREFETCH_BUDGET": budget} if budget else {})})
    rt = None
    if backend == "cuda":
        s, rt = _fake_cuda().session(cfg)
        s.backend.attach_native(lib)  # as under the C++ observer: the mover thread, the gate's book, GPU progress
    else:
        s = Session(cfg, dormant=False)
    s.active = True
    acc = {k: [0, 0] for k in ("policy", "backend", "mover", "fake")}
    _timed(s.policy, ("on_launch", "on_fault", "on_free", "on_evict", "on_iteration"), acc, "policy")
    _timed(s.backend, ("launch", "free", "end_iteration"), acc, "backend")
    mover_cpu = []  # the mover thread's CPU clock, read on that thread before and after
    if rt is not None:
        _timed(s.backend.mover, ("prefetch", "advise", "mark_moves", "discard", "populate"), acc, "mover")
        _timed(s.backend.shim, ("stats", "segments"), acc, "fake")  # the fake shim's own work, not the backend's
        s.backend.mover.thread.submit(0, lambda: mover_cpu.append(time.thread_time_ns()))
    p = Planner(s, lib, 0)
    p.push_ops(p._whole_runs(ops))
    if allocs is not None:
        p._events = allocs[np.argsort(allocs["seq"], kind="stable")]
    t, c = time.perf_counter_ns(), time.thread_time_ns()
    p._plan(None)
    p._apply_events(len(p._events))
    total = [time.perf_counter_ns() - t, time.thread_time_ns() - c]
    n = s.index
    if not n:
        raise SystemExit(f"split: no launch planned ({backend})")

    def us(part, i=1):
        return part[i] / 1e3 / n
    own = "books_us" if rt is not None else "simulator_us"  # the backend's own work: its books, or the simulated GPU
    inner = [acc["backend"][i] - acc["policy"][i] - acc["mover"][i] - acc["fake"][i] for i in (0, 1)]
    rest = [total[i] - acc["backend"][i] for i in (0, 1)]
    row = {"launches": n, "iterations": s.iteration, "planner_us_per_launch": us(total, 0),
           "planner_cpu_us_per_launch": us(total), "policy_us": us(acc["policy"]), own: us(inner),
           "bookkeeping_us": us(rest),
           "wall_us": {"policy": us(acc["policy"], 0), own[:-3]: us(inner, 0), "bookkeeping": us(rest, 0)}}
    if rt is not None:
        s.backend.mover.thread.submit(0, lambda: mover_cpu.append(time.thread_time_ns()))
        s.backend.settle()
        row.update(mover_us=us(acc["mover"]), fake_us=us(acc["fake"]), cuda_calls_per_launch=len(rt.calls) / n,
                   mover_thread_cpu_us=(mover_cpu[1] - mover_cpu[0]) / 1e3 / n,
                   moves_to_gpu=sum(1 for c in rt.calls if c[3] == "gpu"),
                   moves_to_host=sum(1 for c in rt.calls if c[3] == "host"))
        row["wall_us"].update(mover=us(acc["mover"], 0), fake=us(acc["fake"], 0))
        s.backend.close()
    return row


def child(args) -> dict:
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    fake, rt = None, None
    if args.fake_cuda:  # (what UVMPREFETCH=1 does at start-up, with the cuda backend over the fake boundary)
        import tempfile

        from uvmprefetch.config import from_env
        fc = _fake_cuda()
        so = fc.build_libcudart(tempfile.mkdtemp(prefix="uvm-fakecudart-"))
        cfg = from_env({**os.environ, "UVMPREFETCH": "1", "UVMPREFETCH_BACKEND": "cuda"})
        fake, rt = fc.start(cfg, so, dormant=True)
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
    s = fake or runtime.current()
    if s is not None:
        s.active = False  # the count below must not reach the runtime
    with Count():
        step()
    ops = Count.n
    out = {"s": dt, "iters": args.iters, "ops_per_iter": ops, "us_per_op": dt / args.iters / ops * 1e6,
           "tensor_kb": width * width * 4 / 1024}
    if s is not None:
        rep = s.stop() if fake is not None else runtime.disable()
        ot = rep.get("observe_time") or {}
        out.update(observer=rep["observer"]["kind"], planned=rep["launches"], recorded=ot.get("recorded"),
                   bytes_dtoh=rep["bytes_dtoh"], working_set_bytes=rep["working_set_bytes"],
                   planner=ot.get("planner"), callback_us_per_launch=ot.get("callback_us_per_launch"),
                   degraded=rep["degraded"])
        if rt is not None:
            br = rep["backend_result"]
            out.update(cuda_calls=len(rt.calls), mover_wait_s=br["mover_wait_s"],
                       mover_calls_on_training_thread=br["mover_calls_on_training_thread"],
                       moves_on_training_thread=sum(1 for c in rt.calls if c[5] == "MainThread"))
    return out


def run_case(name: str, args) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UVMPREFETCH")}
    env.update(CASES[name], UVMPREFETCH_LOG="quiet", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    if args.budget and name.startswith("moves"):
        env["UVMPREFETCH_BUDGET"] = args.budget
    if args.fits_budget and name.startswith("fits"):
        env["UVMPREFETCH_BUDGET"] = args.fits_budget
    cmd = [sys.executable, __file__, "--child", "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--width", str(args.width), "--layers", str(args.layers), "--batch", str(args.batch),
           "--model", args.model, "--seq", str(args.seq)]
    if name in FAKE_CUDA_CASES:
        cmd.append("--fake-cuda")
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
    p.add_argument("--model", default="loop",
                   help="loop (the chain of small linear layers) or a model of uvmprefetch.trace.models with random "
                        "weights, e.g. gpt2-small (then --batch and --seq size its batch)")
    p.add_argument("--seq", type=int, default=128, help="sequence length (--model gpt2-...)")
    p.add_argument("--fits-budget", help=f"the fits cases' budget (default {CASES['fits']['UVMPREFETCH_BUDGET']}; a "
                                         "model must fit in it: its planner stays dormant below half of it)")
    p.add_argument("--budget", help=f"the moves cases' budget, and the one --split plans at (default "
                                    f"{CASES['moves']['UVMPREFETCH_BUDGET']})")
    p.add_argument("--cases", default="plain,fits,moves,python-fits",
                   help=f"comma-separated, of {', '.join(CASES)} (the -cuda cases: the real cuda backend, planner and "
                        "mover threads over the fake CUDA boundary of tests/unit/fake_cuda.py)")
    p.add_argument("--fake-cuda", action="store_true", help="(--child) the cuda backend over the fake CUDA boundary")
    p.add_argument("--out", help="write the figures here (JSON)")
    p.add_argument("--inprocess", choices=sorted(set(CASES) - {"plain"}),
                   help="alternate plain and this case inside one process (enable/disable between blocks) "
                        "instead of one process per case")
    p.add_argument("--split", action="store_true",
                   help="record the loop, then plan the records on one thread: the planner's CPU per launch by part")
    args = p.parse_args()
    from uvmprefetch.config import parse_budget
    from uvmprefetch.errors import ConfigError
    unknown = [c for c in args.cases.split(",") if c.strip() and c.strip() not in CASES]
    if unknown:
        p.error(f"--cases: unknown {', '.join(unknown)} (known: {', '.join(CASES)})")
    if args.model != "loop":
        from uvmprefetch.trace.models import CONFIGS
        name, _, config = args.model.partition("-")
        if config and name in CONFIGS and config not in CONFIGS[name] or name not in CONFIGS:
            p.error(f"--model {args.model}: loop or <model>-<config> of {', '.join(CONFIGS)} (e.g. gpt2-small)")
    for flag, v in (("--budget", args.budget), ("--fits-budget", args.fits_budget)):
        try:
            if v is not None:
                parse_budget(v)
        except ConfigError as e:
            p.error(f"{flag}: {e}")
    if args.split:
        res = split(args)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(json.dumps(res, indent=1))
        print("planner thread, us per launch (parts: CPU time; wall: with waits for the GIL); mover thread CPU us")
        print(f"{'backend':<7} {'launches':>8} {'wall':>7} {'cpu':>7} {'policy':>7} {'simulator':>9} {'books':>6} "
              f"{'mover':>6} {'fake':>5} {'bookkeeping':>11} {'calls/launch':>12} {'mover thr':>9}")
        for name, r in (("dryrun", res), ("cuda", res["cuda"])):
            print(f"{name:<7} {r['launches']:>8} {r['planner_us_per_launch']:>7.1f} "
                  f"{r['planner_cpu_us_per_launch']:>7.1f} {r['policy_us']:>7.1f} {r.get('simulator_us', 0):>9.1f} "
                  f"{r.get('books_us', 0):>6.1f} {r.get('mover_us', 0):>6.1f} {r.get('fake_us', 0):>5.1f} "
                  f"{r['bookkeeping_us']:>11.1f} {r.get('cuda_calls_per_launch', 0):>12.2f} "
                  f"{r.get('mover_thread_cpu_us', 0):>9.1f}")
        return
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
                      "recorded": last.get("recorded"),
                      "parked_s": (last.get("planner") or {}).get("training_parked_s"),
                      "shed_s": (last.get("planner") or {}).get("shed_s"),
                      "shed_windows": (last.get("planner") or {}).get("shed_windows"),
                      "cuda_calls_per_launch": (last["cuda_calls"] / last["planned"] if last.get("planned")
                                                and "cuda_calls" in last else None),
                      "moves_on_training_thread": last.get("moves_on_training_thread"),
                      "degraded": last.get("degraded"),
                      "ops_per_iter": last["ops_per_iter"]})
    result = {"bench": "runtime_overhead", "args": vars(args), "cases": table, "runs": runs,
              "machine": os.uname().nodename, "cpus": os.cpu_count()}
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{'case':<12} {'us/op':>8} {'x plain':>8} {'min':>6} {'max':>6}  observer  planned  parked s  shed s  "
          f"sheds  calls/launch  dtoh")
    for t in table:
        cpl = t["cuda_calls_per_launch"]
        print(f"{t['case']:<12} {t['us_per_op_median']:>8.2f} {t['ratio_median']:>8.3f} {t['ratio_min']:>6.2f} "
              f"{t['ratio_max']:>6.2f}  {t['observer'] or '-':<8}  {t['planned'] or 0:>7}  {t['parked_s'] or 0:>8.3f}  "
              f"{t['shed_s'] or 0:>6.2f}  {t['shed_windows'] or 0:>5}  {'-' if cpl is None else f'{cpl:.2f}':>12}  "
              f"{t['bytes_dtoh'] or 0}")


if __name__ == "__main__":
    main()
