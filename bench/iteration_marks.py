#!/usr/bin/env python3
"""What the policy loses without iteration ends, and what the runtime's inferred ones give back.

The live runtime ends an iteration in ``torch.optim``'s step post-hook. A loop without one (a hand-written
update) gives no such hook; ``uvmprefetch.runtime.iterations.IterationEnds`` then infers the ends from the
launch phases. This replays each standard trace under ``uvmprefetch`` three times, changing only where
``on_iteration`` is called:

- ``trace``: the recorded ends (after each optimizer step; what the hooks give);
- ``none``: never (the runtime before iteration ends were inferred, on a loop without a hooked step);
- ``inferred``: where ``IterationEnds`` puts them when no hook fires (the optimizer's launches then carry the
  forward phase, as a hand-written update's do).

and prints the whole-run time of each over the ``oracle``'s (which uses the recorded ends; its time does not
depend on them). Writes ``iteration-marks-<date>.json`` to ``--out`` (default ``./iteration_marks-<date>/``) and,
with ``--update-baseline``, to ``bench/baselines/iteration_marks.json``.

    python bench/iteration_marks.py [--traces A.uvmt ...] [--oversub 2] [--gpu h100-pcie] [--out DIR]
                                    [--update-baseline]
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from uvmprefetch import results  # noqa: E402
from uvmprefetch.errors import UvmPrefetchError  # noqa: E402
from uvmprefetch.gpus import get_profile  # noqa: E402
from uvmprefetch.runtime.iterations import IterationEnds  # noqa: E402
from uvmprefetch.sim import bench as B  # noqa: E402
from uvmprefetch.sim.replay import replay  # noqa: E402
from uvmprefetch.trace.format import PHASES  # noqa: E402


def inferred_marks(trace) -> np.ndarray:
    """Iteration of each launch as ``IterationEnds`` splits the trace with no hooked step (the optimizer's
    launches seen as forward-phase ones)."""
    ends = IterationEnds()
    its = np.empty(trace.n_launches, dtype=trace.launch_iter.dtype)
    k = 0
    for i, ph in enumerate(trace.launch_phase.tolist()):
        name = PHASES[ph]
        if ends.ends_before("forward" if name == "optimizer" else name):
            k += 1
        its[i] = k
    return its


def with_marks(trace, its: np.ndarray):
    t = copy.copy(trace)
    t.launch_iter = its
    return t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    B.add_trace_arguments(ap)
    ap.add_argument("--oversub", type=float, default=2.0)
    results.add_arguments(ap, "iteration_marks")
    args = ap.parse_args()
    try:
        gpu = get_profile(args.gpu)
        traces, _ = B.bench_traces(args.traces)
        out = results.run_dir(args.out, "iteration_marks")
    except UvmPrefetchError as e:  # (a bad profile, trace file or --oversub)
        print(f"error: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    rows = []
    for name, tr in traces:
        variants = {"trace": tr, "none": with_marks(tr, np.zeros_like(tr.launch_iter)),
                    "inferred": with_marks(tr, inferred_marks(tr))}
        orc = replay(tr, "oracle", gpu, oversub=args.oversub)["time_s"]
        row = {"name": name, "oracle_s": orc}
        for label, t in variants.items():
            r = replay(t, "uvmprefetch", gpu, oversub=args.oversub)
            row[label] = r["time_s"] / orc
            row[f"{label}_iterations"] = int(t.launch_iter.max()) + 1 if t.n_launches else 0
        rows.append(row)
        print(f"  {name}: " + ", ".join(f"{k} {row[k]:.3f}" for k in variants), file=sys.stderr, flush=True)
    geo = {k: math.exp(sum(math.log(r[k]) for r in rows) / len(rows)) for k in ("trace", "none", "inferred")}
    lines = [f"# uvmprefetch whole-run time / oracle by iteration ends ({gpu.name}, oversub {args.oversub:g})", "",
             "| trace | recorded ends | none | inferred (no hooked step) |", "|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['trace']:.3f} ({r['trace_iterations']}) | {r['none']:.3f} (1) | "
                     f"{r['inferred']:.3f} ({r['inferred_iterations']}) |")
    lines.append(f"| geomean | {geo['trace']:.3f} | {geo['none']:.3f} | {geo['inferred']:.3f} |")
    lines += ["", "(iterations the policy saw in parentheses)"]
    path = out / f"iteration-marks-{results.stamp()}.json"
    payload = {"gpu": gpu.name, "oversub": args.oversub, "rows": rows, "geomean": geo,
               "wall_s": time.perf_counter() - t0}
    path.write_text(json.dumps(payload, indent=1))
    print("\n".join(lines))
    print(f"\nwrote {path}")
    setting = f"{gpu.name} {args.oversub:g}x" + ("" if args.traces is None else " " + ",".join(n for n, _ in traces))
    return results.finish_run(args, "iteration_marks", setting, payload, out)


if __name__ == "__main__":
    sys.exit(main())
