#!/usr/bin/env python3
"""How much decision time per launch a training run can hide: the end-to-end cost of the policy's ``on_launch``
under the simulator's host clock (issue 4: "cheap enough for the live runtime").

``bench/policy_cost.py`` says what a decision costs (microseconds per ``on_launch`` on this machine). This tool
says what that costs the run. The decision runs on the thread that launches the kernels; a host that is ahead
of the GPU hides it, and a host that waits (for a write-back, for the loss at an iteration's end) pays it. Each
trace is replayed under ``HostModel`` (``docs/simulator.md`` "Host clock") with a fixed decision cost per
launch from ``--costs``, then once with the policy's own measured ``on_launch`` time on this machine. Per trace
it prints:

- the run's time at each cost, relative to a free decision (cost 0);
- the *budget*: the largest cost on the grid whose run is at most ``--tolerance`` slower than cost 0;
- the policy's measured median and mean ``on_launch`` time, and the run's time with each launch charged its
  own measured time.

The host model by default is the live runtime's, as measured on an H100 (``live-sync``: the policy's eviction
calls hold the thread until the write-back is done, 10 us of dispatch and observation per launch), with no
discards (the live cuda default) and a sync at each iteration's end (a loop that reads its loss). Change it
with ``--launch-us``, ``--no-blocking-evict`` (an asynchronous mover), ``--discards``, ``--no-sync``.

    python bench/decision_budget.py [TRACE.uvmt ...] [--oversub 2] [--policy uvmprefetch]
                                    [--costs 0,5,10,20,45,100,200,400] [--tolerance 0.01] [--out DIR]
                                    [--update-baseline]

Without traces it takes the standard traces (``uvmprefetch bench`` records them once). Small kernels are
where a decision cannot hide: add the shipped ``traces/gpt2-small-b2s128.uvmt`` (23 us of GPU time per launch)
in a run of its own with ``--oversub 1.5`` (its widest launch does not fit at 2x). Writes
``decision-budget-<date>.json`` and ``.png`` to ``--out`` (default ``./decision_budget-<date>/``) and, with
``--update-baseline``, the figures to ``bench/baselines/decision_budget.json``; prints the table last. About
15-30 s per replay on the 2-core CPU machine for GPT-2 large: 9 replays per trace.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from uvmprefetch import results  # noqa: E402
from uvmprefetch.errors import UvmPrefetchError  # noqa: E402
from uvmprefetch.policy import make_policy  # noqa: E402
from uvmprefetch.sim.host import HostModel  # noqa: E402
from uvmprefetch.sim.replay import replay  # noqa: E402
from uvmprefetch.sim.bench import load_traces, standard_trace_set  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from policy_cost import timed  # noqa: E402

def parse_costs(text: str) -> list[float]:
    """``"0,10,20"`` -> the costs in microseconds, ascending, 0 always included (ValueError names what is wrong)."""
    try:
        us = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--costs must be comma-separated microseconds, e.g. 0,10,20; got {text!r}") from None
    if not us or any(not math.isfinite(u) or u < 0 or u > 1e6 for u in us):
        raise ValueError(f"--costs must be microseconds between 0 and 1e6, got {text!r}")
    return sorted(set(us) | {0.0})


def traces(paths: list[str], progress: bool) -> list[tuple[str, object]]:
    """The traces given, else the standard set (recorded once per machine)."""
    return load_traces(paths) if paths else standard_trace_set(progress=progress)


def budget(costs_us: list[float], ratios: list[float], tol: float) -> tuple[float, float | None]:
    """The largest cost on the grid whose ratio to cost 0 is within ``1 + tol`` with every smaller cost within
    it too, and the first cost beyond it (None: the whole grid stays within)."""
    best = 0.0
    for c, r in zip(costs_us, ratios):
        if r > 1 + tol:
            return best, c
        best = c
    return best, None


def plot(rows: list[dict], path: Path, tol: float, setting: str = "") -> None:
    """Extra run time (%) against the decision cost, log-log, one line per trace; a star at each trace's measured
    median for its run with measured costs. ``setting``: the host model and replay settings, for the title."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    floor = 1e-3  # (%: a run no slower than at cost 0 is drawn here on the log axis)
    for k, r in enumerate(x for x in rows if "error" not in x):
        pts = [(c, max((q - 1) * 100, floor)) for c, q in zip(r["costs_us"], r["ratios"]) if c > 0]
        line, = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="os^vDP*Xph"[k % 10], ms=4,
                        label=r["trace"])
        m = r["measured"]
        ax.plot([m["median_us"]], [max((m["ratio"] - 1) * 100, floor)], marker="*", ms=13, color=line.get_color(),
                markeredgecolor="black", lw=0)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.axhline(tol * 100, color="grey", ls="--", lw=1)
    ax.axvline(20, color="grey", ls=":", lw=1)
    ax.text(20, ax.get_ylim()[1], " issue 4's 20 us", va="top", fontsize=8, color="grey")
    ax.text(ax.get_xlim()[0], tol * 100, f" {tol:.0%}: the budget's tolerance", va="bottom", fontsize=8, color="grey")
    ax.set_xlabel("decision time per launch (us)")
    ax.set_ylabel("extra run time over free decisions (%)")
    setting = textwrap.fill(setting, 90)
    ax.set_title("End-to-end cost of the decision on the host clock" + (f"\n{setting}" if setting else "")
                 + "\n(star: each launch charged its own measured time, drawn at the median)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="*", help="trace files (.uvmt); default: the standard traces")
    ap.add_argument("--oversub", type=float, default=2.0, help="working footprint / capacity (default 2)")
    ap.add_argument("--policy", default="uvmprefetch", help="policy spec (default uvmprefetch)")
    ap.add_argument("--gpu", default="h100-pcie", help="GPU profile (default h100-pcie)")
    ap.add_argument("--costs", default="0,5,10,20,45,100,200,400",
                    help="fixed decision costs to replay, microseconds per launch (0 is always added)")
    ap.add_argument("--tolerance", type=float, default=0.01,
                    help="the budget is the largest cost whose run is at most this much slower (default 0.01)")
    ap.add_argument("--launch-us", type=float, default=10.0,
                    help="host time per launch outside the policy: dispatch and observation (default 10, the "
                         "live-sync preset's assumption)")
    ap.add_argument("--no-blocking-evict", action="store_true",
                    help="evictions do not hold the host (an asynchronous mover); default: they do, as the live "
                         "cuda backend's did on the H100")
    ap.add_argument("--discards", action="store_true",
                    help="discards drop dead blocks for free (the simulator's default); default here: no "
                         "discards, as the live cuda backend")
    ap.add_argument("--no-sync", action="store_true",
                    help="the host never waits for the GPU at an iteration's end (it may stay ahead all run)")
    results.add_arguments(ap, "decision_budget")
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args()
    try:
        costs = parse_costs(args.costs)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not (math.isfinite(args.oversub) and args.oversub >= 1):
        print(f"error: --oversub must be >= 1, got {args.oversub:g}", file=sys.stderr)
        return 2
    if not (0 < args.tolerance < 1):
        print(f"error: --tolerance must be between 0 and 1, got {args.tolerance:g}", file=sys.stderr)
        return 2
    if not (math.isfinite(args.launch_us) and args.launch_us >= 0):
        print(f"error: --launch-us must be >= 0, got {args.launch_us:g}", file=sys.stderr)
        return 2
    host_kw = dict(launch_s=args.launch_us * 1e-6, blocking_evict=not args.no_blocking_evict,
                   sync_iterations=not args.no_sync)
    from tqdm import tqdm
    t_start = time.time()
    rows = []
    try:
        make_policy(args.policy)  # (a bad spec fails here, before any trace is recorded)
        out = results.run_dir(args.out, "decision_budget")
        got = traces(args.traces, not args.no_progress)
        bar = tqdm(total=len(got) * (len(costs) + 1), desc="decision budget", unit="replay",
                   disable=args.no_progress, leave=False)
        for name, tr in got:
            times, stalls = [], []
            try:
                for c in costs:
                    bar.set_postfix_str(f"{name} {c:g} us")
                    r = replay(tr, make_policy(args.policy), args.gpu, oversub=args.oversub, discards=args.discards,
                               host=HostModel(decision_s=c * 1e-6, **host_kw))
                    times.append(r["time_s"])
                    stalls.append(r["host_stall_s"])
                    bar.update()
                bar.set_postfix_str(f"{name} measured")
                pol = make_policy(args.policy)
                ns = timed(pol)["on_launch"]  # (policy_cost's wrapper: each call's wall time, ns)
                r = replay(tr, pol, args.gpu, oversub=args.oversub, discards=args.discards,
                           host=HostModel(measure_decision=True, **host_kw))
                bar.update()
            except UvmPrefetchError as e:  # (one trace that cannot run at this setting: the others still do)
                bar.update(len(costs) + 1 - len(times))
                rows.append({"trace": name, "error": str(e)})
                continue
            us = np.asarray(ns, dtype=np.float64) / 1e3
            ratios = [t / times[0] for t in times]
            b, over = budget(costs, ratios, args.tolerance)
            rows.append({"trace": name, "launches": int(r["n_launches"]), "iterations": len(r["iteration_times_s"]),
                         "compute_per_launch_us": r["compute_s"] / max(1, r["n_launches"]) * 1e6,
                         "costs_us": costs, "time_s": times, "ratios": ratios, "host_stall_s": stalls,
                         "budget_us": b, "first_over_us": over,
                         "measured": {"median_us": float(np.median(us)), "mean_us": float(us.mean()),
                                      "p90_us": float(np.percentile(us, 90)), "time_s": r["time_s"],
                                      "ratio": r["time_s"] / times[0], "host_decision_s": r["host_decision_s"],
                                      "host_stall_s": r["host_stall_s"]}})
        bar.close()
    except UvmPrefetchError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    stamp = results.stamp()
    meta = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "policy": args.policy, "gpu": args.gpu,
            "oversub": args.oversub, "tolerance": args.tolerance, "discards": args.discards,
            "host": {**host_kw, "decision_s": "swept"}, "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count(), "wall_s": time.time() - t_start,
            "note": "simulator host clock (docs/simulator.md 'Host clock'); measured decision times are this "
                    "shared machine's and vary run to run"}
    path = out / f"decision-budget-{stamp}.json"
    path.write_text(json.dumps({"meta": meta, "results": rows}, indent=1))
    png = out / f"decision-budget-{stamp}.png"
    blocking = "blocking" if host_kw["blocking_evict"] else "asynchronous"
    setting = (f"{args.policy} at {args.oversub:g}x on {args.gpu}; host: {args.launch_us:g} us per launch, {blocking} "
               f"evictions, {'a sync at each iteration end' if host_kw['sync_iterations'] else 'no syncs'}, "
               f"{'discards' if args.discards else 'no discards'}")
    plot(rows, png, args.tolerance, setting)
    print(setting)
    head = " | ".join(f"{c:g} us" for c in costs[1:])
    print(f"| trace | launches | GPU time per launch | run time at cost 0 | {head} | budget (<= +{args.tolerance:.0%}) "
          f"| measured median / mean | run with measured costs |")
    print("|---|---|---|---|" + "---|" * (len(costs) - 1) + "---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['trace']} | error: {r['error']} |")
            continue
        cells = " | ".join(f"{x:.4f}" for x in r["ratios"][1:])
        m = r["measured"]
        b = f"{r['budget_us']:g} us" + ("" if r["first_over_us"] is not None else " (whole grid)")
        print(f"| {r['trace']} | {r['launches']} | {r['compute_per_launch_us']:.0f} us | {r['time_s'][0]:.3f} s | "
              f"{cells} | {b} | {m['median_us']:.1f} / {m['mean_us']:.1f} us | {m['ratio']:.4f} |")
    print("(cells: run time / run time at cost 0)")
    failed = sum("error" in r for r in rows)
    print(f"JSON: {path}\nplot: {png}")
    key = (f"{args.policy} {args.oversub:g}x {args.gpu} {args.launch_us:g}us {blocking}"
           f"{' discards' if args.discards else ''}{' no-sync' if args.no_sync else ''}")
    return results.finish_run(args, "decision_budget", key, {"meta": meta, "results": rows}, out, 1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
