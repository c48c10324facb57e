#!/usr/bin/env python3
"""Trace-replay benchmark of the simulator itself, with the issue's speed targets checked.

1. Replays the GPT-2-large two-iteration trace under ``demand`` at oversubscription 2 and checks that it
   takes under 10 s of wall time (layout included).
2. Runs the whole benchmark matrix (standard traces x every available policy x 1/1.25/1.5/2/3) and checks
   that it takes under 10 minutes.
3. Writes ``replay-bench-<date>.json`` (figures, machine, versions) plus the usual CSV/PNG to ``--out``
   (default ``./replay_bench-<date>/``) and, with ``--update-baseline``, the figures to
   ``bench/baselines/replay_bench.json``; prints the table last.

Without the standard traces (``uvmprefetch.trace.standard``) it falls back to ``traces/*.uvmt`` and, failing
that, to synthetic training traces (and says so).

    python bench/replay_bench.py [--gpt2l PATH] [--traces A.uvmt B.uvmt] [--gpu h100-pcie] [--out DIR]
                                 [--update-baseline]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from uvmprefetch import results  # noqa: E402
from uvmprefetch.errors import UvmPrefetchError  # noqa: E402
from uvmprefetch.gpus import get_profile  # noqa: E402
from uvmprefetch.policy import available  # noqa: E402
from uvmprefetch.sim import bench as B  # noqa: E402
from uvmprefetch.sim.layout import build_layout  # noqa: E402
from uvmprefetch.sim.replay import replay  # noqa: E402
from uvmprefetch.trace.format import load  # noqa: E402

TARGET_GPT2L_S = 10.0
TARGET_BENCH_S = 600.0


def pick_gpt2l(traces, explicit):
    if explicit:
        return Path(explicit).stem, load(explicit)
    for name, t in traces:
        key = (name + " " + json.dumps(t.meta)).lower()
        if "gpt2" in key.replace("-", "") and "large" in key and t.iterations >= 2:
            return name, t
    return None


def synthetic_traces():
    """Stand-ins where no standard traces are available."""
    from uvmprefetch.sim.synthetic import training_trace
    return [("synthetic-24x32MiB", training_trace(layers=24, param_bytes=32 << 20, act_bytes=24 << 20)),
            ("synthetic-96x8MiB", training_trace(layers=96, param_bytes=8 << 20, act_bytes=6 << 20))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    B.add_trace_arguments(ap)
    ap.add_argument("--gpt2l", help="the GPT-2-large 2-iteration trace (default: found in the standard set)")
    ap.add_argument("--policies", default="all")
    ap.add_argument("--oversub", default="1,1.25,1.5,2,3")
    results.add_arguments(ap, "replay_bench")
    args = ap.parse_args()
    try:
        gpu = get_profile(args.gpu)
        traces, source = B.bench_traces(args.traces, synthetic_traces)
        oversubs = B.parse_oversub_list(args.oversub)
        out = results.run_dir(args.out, "replay_bench")
    except UvmPrefetchError as e:  # (a bad profile, trace file or --oversub)
        print(f"error: {e}", file=sys.stderr)
        return 2
    policies = available() if args.policies == "all" else args.policies.split(",")
    figures: dict = {"source": source, "traces": [n for n, _ in traces], "policies": policies, "oversub": oversubs}

    g = pick_gpt2l(traces, args.gpt2l)
    if g is not None:
        name, t = g
        t0 = time.perf_counter()
        lay = build_layout(t)
        r = replay(t, "demand", gpu, oversub=2.0, layout=lay)
        wall = time.perf_counter() - t0
        figures["gpt2l"] = {"trace": name, "launches": t.n_launches, "block_accesses": lay.block_accesses,
                            "wall_s": wall, "replay_s": r["wall_s"], "slowdown": r["slowdown"],
                            "ok": wall < TARGET_GPT2L_S}
        print(f"GPT-2-large ({name}, {t.n_launches} launches): demand @ oversub 2 replayed in {wall:.2f} s "
              f"(target < {TARGET_GPT2L_S:.0f} s: {'OK' if wall < TARGET_GPT2L_S else 'MISSED'}), "
              f"slowdown {r['slowdown']:.2f}x", file=sys.stderr)
    else:
        print("no GPT-2-large 2-iteration trace found: speed target 1 not measured", file=sys.stderr)

    t0 = time.perf_counter()
    rows = B.run_bench(traces, policies, oversubs, gpu)
    wall = time.perf_counter() - t0
    B.save_outputs(rows, oversubs, out, B.bench_meta(gpu, 2 << 20, wall))
    figures["bench_wall_s"] = wall
    figures["bench_ok"] = wall < TARGET_BENCH_S
    meta = B.bench_meta(gpu, 2 << 20, wall)
    res_path = out / f"replay-bench-{results.stamp()}.json"
    slim = [{k: r.get(k) for k in B.CSV_FIELDS} for r in rows]
    res_path.write_text(json.dumps({"meta": meta, "figures": figures, "results": slim}, indent=1))
    print(f"benchmark matrix: {len(rows)} results in {wall:.1f} s (target < {TARGET_BENCH_S:.0f} s: "
          f"{'OK' if wall < TARGET_BENCH_S else 'MISSED'}); traces: {source}; wrote {res_path}", file=sys.stderr)
    print(B.markdown(rows, oversubs))
    ok = figures["bench_ok"] and figures.get("gpt2l", {}).get("ok", True)
    return results.finish_run(args, "replay_bench", f"{args.gpu} {source}", {"meta": meta, "figures": figures}, out,
                              0 if ok else 1)


if __name__ == "__main__":
    sys.exit(main())
