#!/usr/bin/env python3
"""Per-op cost of the Python observer (the dispatch mode the runtime falls back to where the C++ observer
cannot be built), measured on the CPU under the dryrun backend: a small GPT-2 training step, plain vs
``uvmprefetch.runtime.enable(backend='dryrun', observer='python')``. The C++ observer's cost is measured by
``bench/runtime_overhead.py``.

Two kinds of figures:

- **end to end**: median step time with the runtime on minus plain, divided by the ops the step dispatches
  (every op goes through the dispatcher mode; only kernel-launching ones reach the session), and by the
  launches the session observed;
- **breakdown** (a separate run, with timers around each piece, so it carries the timers' own cost): median
  microseconds per observed launch of ``on_op`` as a whole, the access walk, the execution id (shape key +
  hash), the FLOP count, tensor deaths (``_drain_frees``, including the backend's ``free``), the policy
  hooks, the simulated GPU model (``backend.launch`` minus the policy), and the rest of ``on_op`` (storage
  lookup, extents, block ids, the launch record).

Writes ``observe-overhead-<date>.json`` to ``--out`` (default ``./observe_overhead-<date>/``) and, with
``--update-baseline``, to ``bench/baselines/observe_overhead.json``; prints the table last.

    python bench/observe_overhead.py [--steps 6] [--policies demand,uvmprefetch] [--label after] [--out DIR]
                                     [--update-baseline]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from uvmprefetch import results  # noqa: E402
from uvmprefetch.errors import UvmPrefetchError  # noqa: E402

# Pieces of the session's per-launch path, by the module-level name ``uvmprefetch.runtime.session`` calls
# them through (both the original names and the fast path's, so the same bench measures before and after).
PIECES = {"accesses": ("accesses_of", "scan_op"),
          "exec_id": ("_shape_key", "exec_id_of", "cached_exec_id"),
          "flops": ("flops_of", "cached_flops")}
POLICY_HOOKS = ("on_launch", "on_fault", "on_free", "on_evict", "on_iteration")


def build(args):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=args.layers, n_embd=args.embd, n_head=4, vocab_size=args.vocab, n_positions=args.seq,
                     bos_token_id=0, eos_token_id=0, attn_implementation="eager")
    model = GPT2LMHeadModel(cfg)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, args.vocab, (args.batch, args.seq))

    def step():
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def count_ops(step) -> int:
    from torch.utils._python_dispatch import TorchDispatchMode
    n = [0]

    class Count(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            n[0] += 1
            return func(*args, **(kwargs or {}))
    with Count():
        step()
    return n[0]


def step_times(step, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        out.append(time.perf_counter() - t0)
    return out


def _timer(store: list, fn):
    def wrapped(*a, **k):
        t0 = time.perf_counter_ns()
        try:
            return fn(*a, **k)
        finally:
            store.append(time.perf_counter_ns() - t0)
    return wrapped


def breakdown(step, policy: str, budget: str, steps: int) -> dict:
    """Median us per observed launch of each piece (timers around the module functions the session uses)."""
    import uvmprefetch.runtime as rt
    import uvmprefetch.runtime.session as S
    ns: dict[str, list] = {k: [] for k in ("on_op", *PIECES, "frees", "backend", "policy")}
    saved = {}
    for piece, names in PIECES.items():
        for name in names:
            if hasattr(S, name):
                saved[name] = getattr(S, name)
                setattr(S, name, _timer(ns[piece], saved[name]))
    on_op = S.Session.on_op
    per_launch: list[dict] = []

    def timed_on_op(self, *a, **k):
        marks = {p: len(v) for p, v in ns.items()}
        t0 = time.perf_counter_ns()
        on_op(self, *a, **k)
        ns["on_op"].append(time.perf_counter_ns() - t0)
        per_launch.append({p: sum(v[marks[p]:]) for p, v in ns.items() if p != "on_op"})
    S.Session.on_op = timed_on_op
    drain = S.Session._drain_frees
    S.Session._drain_frees = _timer(ns["frees"], drain)
    try:
        sess = rt.enable(backend="dryrun", budget=budget, policy=policy, report=None, trace=None, observer="python")
        for h in POLICY_HOOKS:
            setattr(sess.policy, h, _timer(ns["policy"], getattr(sess.policy, h)))
        sess.backend.launch = _timer(ns["backend"], sess.backend.launch)
        step()  # warm-up iteration (first sight of every storage, policy learning)
        ns["on_op"].clear()
        per_launch.clear()
        for _ in range(steps):
            step()
        launches = sess.index
        rt.disable()
    finally:
        S.Session.on_op = on_op
        S.Session._drain_frees = drain
        for name, fn in saved.items():
            setattr(S, name, fn)
    n = len(per_launch)
    rows = {"on_op": statistics.median(ns["on_op"]) / 1e3}
    for p in ("accesses", "exec_id", "flops", "frees", "policy"):
        rows[p] = statistics.median(r[p] for r in per_launch) / 1e3
    rows["model"] = statistics.median(r["backend"] - r["policy"] for r in per_launch) / 1e3
    rest = [tot - r["accesses"] - r["exec_id"] - r["flops"] - r["frees"] - r["backend"]
            for tot, r in zip(ns["on_op"][-n:], per_launch)]
    rows["rest"] = statistics.median(rest) / 1e3
    means = {"on_op": statistics.fmean(ns["on_op"]) / 1e3, "rest": statistics.fmean(rest) / 1e3,
             "model": statistics.fmean(r["backend"] - r["policy"] for r in per_launch) / 1e3}
    for p in ("accesses", "exec_id", "flops", "frees", "policy"):
        means[p] = statistics.fmean(r[p] for r in per_launch) / 1e3
    return {"us_median_per_launch": rows, "us_mean_per_launch": means, "launches_total": launches, "launches_timed": n}


class NullBackend:
    """Takes launches and does nothing: ``on_op`` with it is the observation alone (what a GPU run pays
    before the policy and the cuda backend's own work)."""

    name, virtual_addresses, device_type, block_size, capacity_bytes, gpu = "null", True, "cpu", 2 << 20, 1 << 40, None

    def block_ids(self, start, length):
        import numpy as np
        return np.arange(start // self.block_size, (start + max(length, 1) - 1) // self.block_size + 1,
                         dtype=np.int64)

    def free(self, blocks):
        pass

    def launch(self, info):
        pass

    def end_iteration(self, k):
        pass

    def close(self):
        pass


def observe_only(step, passes: int = 5) -> dict:
    """Median/mean us per launch of ``Session.on_op`` (null backend) over one step's captured launches."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from uvmprefetch.config import RuntimeConfig
    from uvmprefetch.runtime.session import Session
    from uvmprefetch.trace.recorder import launches_kernel
    ops = []

    class Capture(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if launches_kernel(func):
                ops.append((func, args, kwargs, out, torch._C._current_autograd_node() is not None))
            return out
    with Capture():
        step()
    sess = Session(RuntimeConfig(enabled=True, backend="dryrun", policy="demand"), backend=NullBackend())
    sess.active = True  # not started: on_op is called directly, no dispatcher mode
    times = []
    for _ in range(passes):
        for op in ops:
            t0 = time.perf_counter_ns()
            sess.on_op(*op)
            times.append(time.perf_counter_ns() - t0)
    times = times[len(ops):]  # the first pass registers every storage
    return {"us_median_per_launch": statistics.median(times) / 1e3, "us_mean_per_launch": statistics.fmean(times) / 1e3,
            "launches": len(ops)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--policies", default="demand,uvmprefetch")
    p.add_argument("--budget", default="24MiB")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--embd", type=int, default=128)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--label", default="", help="free text stored in the JSON (e.g. before/after)")
    results.add_arguments(p, "observe_overhead")
    args = p.parse_args()
    try:
        out = results.run_dir(args.out, "observe_overhead")
    except UvmPrefetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)  # a shared 2-core machine: one thread keeps the plain baseline stable
    import uvmprefetch.runtime as rt

    step = build(args)
    step()
    n_ops = count_ops(step)
    plain = statistics.median(step_times(step, args.steps))
    obs = observe_only(step)
    res = {"label": args.label, "observe_only": obs, "host": platform.node(), "python": platform.python_version(),
           "torch": torch.__version__, "model": vars(args), "ops_per_step": n_ops, "plain_step_s": plain,
           "policies": {}}
    for pol in args.policies.split(","):
        sess = rt.enable(backend="dryrun", budget=args.budget, policy=pol, report=None, trace=None, observer="python")
        step()
        i0 = sess.index
        t = statistics.median(step_times(step, args.steps))
        launches = (sess.index - i0) / args.steps
        rt.disable()
        plain2 = statistics.median(step_times(step, args.steps))  # plain again: the machine is shared
        base = min(plain, plain2)
        bd = breakdown(step, pol, args.budget, max(2, args.steps // 2))
        res["policies"][pol] = {"step_s": t, "plain_step_s": base, "launches_per_step": launches,
                                "overhead_us_per_op": (t - base) / n_ops * 1e6,
                                "overhead_us_per_launch": (t - base) / launches * 1e6, "breakdown": bd}
    path = out / f"observe-overhead-{results.stamp()}.json"
    path.write_text(json.dumps(res, indent=2))
    print(f"GPT-2 {args.layers}x{args.embd}, batch {args.batch}x{args.seq}: {n_ops} ops/step, "
          f"plain {plain * 1e3:.1f} ms/step  ({path})")
    print(f"observation alone (on_op, null backend, {obs['launches']} launches x 4 passes): median "
          f"{obs['us_median_per_launch']:.1f} us, mean {obs['us_mean_per_launch']:.1f} us per launch")
    cols = ("on_op", "accesses", "exec_id", "flops", "frees", "policy", "model", "rest")
    print(f"{'policy':<12} {'step ms':>8} {'us/op':>7} {'us/launch':>9} | " + " ".join(f"{c:>8}" for c in cols))
    for pol, r in res["policies"].items():
        b = r["breakdown"]["us_median_per_launch"]
        print(f"{pol:<12} {r['step_s'] * 1e3:8.1f} {r['overhead_us_per_op']:7.1f} {r['overhead_us_per_launch']:9.1f} | "
              + " ".join(f"{b[c]:8.1f}" for c in cols))
    for pol, r in res["policies"].items():
        b = r["breakdown"]["us_mean_per_launch"]
        print(f"{pol + ' (mean)':<40} | " + " ".join(f"{b[c]:8.1f}" for c in cols))
    print("(us/op, us/launch: end-to-end overhead vs plain; right: median (and mean) us per observed launch, "
          "timed run)")
    setting = f"gpt2 {args.layers}x{args.embd} b{args.batch}x{args.seq} budget={args.budget}"
    return results.finish_run(args, "observe_overhead", setting, res, out)


if __name__ == "__main__":
    sys.exit(main())
