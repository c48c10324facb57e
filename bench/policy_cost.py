#!/usr/bin/env python3
"""Decision cost of the learned policies: microseconds per ``on_launch`` call (target: median <= 20 us per launch
on this machine), measured inside a simulator replay so that the hook sees real residency states.

Each call is timed with ``time.perf_counter_ns`` around ``on_launch`` only (not the simulator); the other
hooks (``on_fault``, ``on_free``, ``on_evict``) are timed too and reported per launch. Writes
``policy-cost-<date>.json`` to ``--out`` (default ``./policy_cost-<date>/``) and, with ``--update-baseline``, to
``bench/baselines/policy_cost.json``; prints the table last, then each policy's median by iteration (the first
iterations take other paths than the steady state: nothing learned yet, the allocator still moving tensors).

    python bench/policy_cost.py [TRACE.uvmt | STANDARD-NAME] [--oversub 2] [--policies uvmprefetch,deepum]
                                [--model gpt2:small] [--rounds 3] [--disturb 64] [--out DIR] [--update-baseline]

The issue's target (median <= 20 us on GPT-2 large at 2x): ``python bench/policy_cost.py gpt2-large --policies
uvmprefetch`` (the standard trace by name, recorded into the trace cache if missing).

``--disturb MiB`` reads that much other memory before each ``on_launch`` (outside the timing), as the training
framework's own work does between two hooks of a live run: the decision's cost is mostly misses on the policy's
state, so a replay whose caches keep that state between launches shows the cheapest case. On the development
CPU (32 MiB L3), 64 MiB took ``uvmprefetch`` on GPT-2 large at 2x from ~18 to ~110-130 us median (``--disturb 0``
against ``--disturb 64``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from uvmprefetch import results  # noqa: E402
from uvmprefetch.errors import UvmPrefetchError  # noqa: E402
from uvmprefetch.policy import make_policy  # noqa: E402
from uvmprefetch.sim.replay import replay  # noqa: E402
from uvmprefetch.trace.format import load  # noqa: E402

HOOKS = ("on_launch", "on_fault", "on_free", "on_evict", "on_iteration")


def timed(policy, disturb: np.ndarray | None = None):
    """Wrap the policy's hooks; returns {hook: list of ns}. ``disturb``: an array read in full before each
    ``on_launch``, untimed (the other work of a live run between two hooks)."""
    out = {h: [] for h in HOOKS}
    for h in HOOKS:
        fn = getattr(policy, h)
        pre = disturb.sum if disturb is not None and h == "on_launch" else None

        def wrap(*a, _fn=fn, _acc=out[h], _pre=pre):
            if _pre is not None:
                _pre()
            t0 = time.perf_counter_ns()
            r = _fn(*a)
            _acc.append(time.perf_counter_ns() - t0)
            return r

        setattr(policy, h, wrap)
    return out


def get_trace(path: str | None, model: str):
    from uvmprefetch.trace.standard import STANDARD, standard_traces
    if path and path in STANDARD and not Path(path).exists():  # a standard trace by name (recorded if missing)
        return path, load(standard_traces(names=[path])[0])
    if path:
        return Path(path).stem, load(path)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from uvmprefetch.trace.models import record_model
        fam, _, cfg = model.partition(":")
        return f"{fam}-{cfg}", record_model(fam, cfg or "small", batch=4, seq=512, iters=3)
    except (ImportError, UvmPrefetchError) as e:
        from uvmprefetch.sim.synthetic import training_trace
        print(f"note: recorder unavailable ({e}); using a synthetic trace", file=sys.stderr)
        return "synthetic-24x8MiB", training_trace(layers=24, iterations=3, bw=0.3e12)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", nargs="?",
                    help="a .uvmt trace, or the name of a standard trace (gpt2-large: the issue's target, median <= "
                         "20 us at --oversub 2; recorded into the trace cache if missing); default: record GPT-2 "
                         "small, 3 iterations")
    ap.add_argument("--model", default="gpt2:small")
    ap.add_argument("--oversub", type=float, default=2.0)
    ap.add_argument("--policies", default="uvmprefetch,deepum")
    results.add_arguments(ap, "policy_cost")
    ap.add_argument("--rounds", type=int, default=3,
                    help="timed replays per policy after one untimed warm-up (Numba compiles there); the machine "
                         "is shared and noisy: the table gives the median of the rounds' medians and their spread")
    ap.add_argument("--disturb", type=float, default=0.0, metavar="MIB",
                    help="read this many MiB of other memory before each on_launch, untimed (default 0: the "
                         "policy's state stays in cache between launches, the cheapest case); 64 flushes a "
                         "32 MiB L3 as a live run's own work does")
    args = ap.parse_args()
    if args.rounds < 1:
        print(f"error: --rounds must be >= 1, got {args.rounds}", file=sys.stderr)
        return 2
    if not 0 <= args.disturb <= 4096:
        print(f"error: --disturb must be between 0 and 4096 MiB, got {args.disturb:g}", file=sys.stderr)
        return 2
    disturb = np.ones(int(args.disturb * (1 << 20)) // 8) if args.disturb else None
    try:
        name, trace = get_trace(args.trace, args.model)
        last = trace.launch_iter == trace.launch_iter.max()  # the steady state: what a long run lives in
        iters = np.unique(trace.launch_iter)
        rows = []
        for spec in args.policies.split(","):
            replay(trace, make_policy(spec), "h100-pcie", oversub=args.oversub)  # warm-up, untimed
            rounds = []
            for _ in range(args.rounds):
                pol = make_policy(spec)
                ns = timed(pol, disturb)
                r = replay(trace, pol, "h100-pcie", oversub=args.oversub)
                lu = np.asarray(ns["on_launch"], dtype=np.float64) / 1e3
                other = sum(sum(ns[h]) for h in HOOKS if h != "on_launch") / 1e3
                steady = lu[last[: lu.size]] if lu.size == last.size else lu
                # (the first iterations take other paths than the steady state: cold tables, moves being learned)
                by_it = [float(np.median(lu[trace.launch_iter == k])) for k in iters] if lu.size == last.size else []
                rounds.append({"median": float(np.median(lu)), "p90": float(np.percentile(lu, 90)),
                               "p99": float(np.percentile(lu, 99)), "mean": float(lu.mean()),
                               "steady_median": float(np.median(steady)), "other": other / max(1, lu.size),
                               "by_iteration": by_it})
            med = {k: float(np.median([x[k] for x in rounds])) for k in rounds[0] if k != "by_iteration"}
            by_iter = (np.median([x["by_iteration"] for x in rounds], axis=0).tolist()
                       if rounds[0]["by_iteration"] else [])
            rows.append({"policy": spec, "trace": name, "oversub": args.oversub, "launches": int(lu.size),
                         "disturb_mib": args.disturb,
                         "rounds": rounds, "on_launch_median_us": med["median"],
                         "on_launch_median_spread_us": [min(x["median"] for x in rounds),
                                                        max(x["median"] for x in rounds)],
                         "on_launch_steady_median_us": med["steady_median"],
                         "on_launch_p90_us": med["p90"], "on_launch_p99_us": med["p99"],
                         "on_launch_mean_us": med["mean"], "other_hooks_us_per_launch": med["other"],
                         "on_launch_by_iteration_median_us": by_iter,
                         "slowdown": r["slowdown"], "state_bytes": r["policy_report"].get("state_bytes")})
        meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
                "machine": platform.machine(), "cpus": os.cpu_count(), "numpy": np.__version__,
                "note": "shared 2-core machine: medians are the robust figure"}
        out = results.run_dir(args.out, "policy_cost")
        path = out / f"policy-cost-{results.stamp()}.json"
        path.write_text(json.dumps({"meta": meta, "results": rows}, indent=1))
        setting = f"{name} {args.oversub:g}x" + (f" disturb={args.disturb:g}MiB" if args.disturb else "")
        closing = results.close_run(args, "policy_cost", setting, {"meta": meta, "results": rows}, out)
    except UvmPrefetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{args.rounds} timed rounds each; figures are the median over rounds (spread: min-max of the rounds' medians)")
    if args.disturb:
        print(f"{args.disturb:g} MiB of other memory read before each on_launch (--disturb), as between two live hooks")
    print("| policy | trace | launches | on_launch median us (spread) | last iteration median | p90 | p99 | mean "
          "| other hooks us/launch | target |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ok = "ok" if r["on_launch_median_us"] <= 20 else "MISSED (> 20 us)"
        lo, hi = r["on_launch_median_spread_us"]
        print(f"| {r['policy']} | {r['trace']} | {r['launches']} | {r['on_launch_median_us']:.1f} ({lo:.1f}-{hi:.1f}) | "
              f"{r['on_launch_steady_median_us']:.1f} | {r['on_launch_p90_us']:.1f} | {r['on_launch_p99_us']:.1f} | "
              f"{r['on_launch_mean_us']:.1f} | {r['other_hooks_us_per_launch']:.1f} | {ok} |")
    for r in rows:
        if r["on_launch_by_iteration_median_us"]:
            its = " / ".join(f"{v:.1f}" for v in r["on_launch_by_iteration_median_us"])
            print(f"{r['policy']}: on_launch median by iteration (us): {its}")
    print(f"JSON: {path}")
    print(closing)
    return 0


if __name__ == "__main__":
    sys.exit(main())
