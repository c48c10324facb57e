#!/usr/bin/env python3
"""The prefetcher's scorecard (issue 4): targets, DeepUM-style ablation, prediction quality, robustness.

1. Targets on the standard traces (h100-pcie): ``uvmprefetch`` geomean time / ``oracle`` at each
   oversubscription level, speed-up over ``demand`` at 2x, and ``uvmprefetch`` vs ``deepum`` per trace,
   measured twice: on the whole trace (warm-up iterations included) and on the steady state (the last
   iteration, ``steady_slowdown``: what a long training run spends its time in).
2. Ablation, like DeepUM's Table: execution time vs naive UM (``demand``), geomean over traces, for
   prefetch only / + pre-evict / + invalidate / + adaptive window / + advice (= ``uvmprefetch``).
3. Prediction quality of ``uvmprefetch`` per trace: accuracy (useful / issued prefetch bytes) and
   coverage (prefetch-served blocks / (served + faults)).
4. Robustness on the changing-pattern traces (``uvmprefetch.trace.patterns``): time vs ``demand`` and
   iterations to recover after each change.

Without the standard traces (``uvmprefetch.trace.standard`` / ``traces/*.uvmt``) it uses the synthetic
training traces and says so. Writes ``ablation-<date>.json`` to ``--out`` (default ``./ablation-<date>/``) and,
with ``--update-baseline``, its tables to ``bench/baselines/ablation.json``; prints the tables last.

    python bench/ablation.py [--traces A.uvmt ...] [--oversub 1.5,2,3] [--gpu h100-pcie] [--no-patterns]
                             [--out DIR] [--update-baseline]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from uvmprefetch import results  # noqa: E402
from uvmprefetch.errors import UvmPrefetchError  # noqa: E402
from uvmprefetch.gpus import get_profile  # noqa: E402
from uvmprefetch.jsonutil import json_default  # noqa: E402
from uvmprefetch.sim import bench as B  # noqa: E402

ABLATION = [
    ("prefetch only", "uvmprefetch:pre_evict=false,invalidate=false,adaptive_window=false,advice=false"),
    ("+ pre-evict", "uvmprefetch:invalidate=false,adaptive_window=false,advice=false"),
    ("+ invalidate", "uvmprefetch:adaptive_window=false,advice=false"),
    ("+ adaptive window", "uvmprefetch:advice=false"),
    ("+ advice (uvmprefetch)", "uvmprefetch"),
    # Each mechanism of the default switched off alone; see docs/policies.md.
    ("  no fault_late_soft", "uvmprefetch:fault_late_soft=false"),
    ("  no stall_aware", "uvmprefetch:stall_aware=false"),
    ("  margin=0 (no free margin)", "uvmprefetch:margin=0"),
    ("  dead_reuse=false (dead blocks first)", "uvmprefetch:dead_reuse=false"),
]
BASE = ["demand", "deepum", "oracle"]


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def synthetic_traces():
    """Stand-ins where no standard traces are available."""
    from uvmprefetch.sim.synthetic import training_trace
    return [("synthetic-24x8MiB", training_trace(layers=24, iterations=3, bw=0.3e12)),
            ("synthetic-12x16MiB", training_trace(layers=12, param_bytes=16 << 20, act_bytes=12 << 20, iterations=3,
                                                   bw=0.5e12))]


def time_of(rows, trace, policy, ov):
    for r in rows:
        if r["trace"] == trace and r["policy"] == policy and r["oversub_target"] == ov and not r.get("error"):
            return r
    return None


def recovery(it_times, changes, alternating):
    """Per change c: iterations after c until within 10 % of the steady state of that kind of iteration."""
    out = []
    for c in changes:
        kinds = range(c, len(it_times), 2) if alternating else range(c, len(it_times))
        steady = it_times[list(kinds)[-1]]
        k = next((j - c for j in kinds if it_times[j] <= 1.10 * steady), None)
        out.append({"change": c, "iterations_to_recover": k, "steady_s": steady})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    B.add_trace_arguments(ap)
    ap.add_argument("--oversub", default="1.5,2,3")
    ap.add_argument("--no-patterns", action="store_true", help="skip the changing-pattern traces")
    results.add_arguments(ap, "ablation")
    args = ap.parse_args()
    try:
        gpu = get_profile(args.gpu)
        oversubs = B.parse_oversub_list(args.oversub)
        traces, source = B.bench_traces(args.traces, synthetic_traces)
        out = results.run_dir(args.out, "ablation")
    except UvmPrefetchError as e:  # (a bad profile, trace file or --oversub)
        print(f"error: {e}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    specs = BASE + [s for _, s in ABLATION]
    rows = B.run_bench(traces, specs, oversubs, gpu, progress=sys.stderr.isatty())
    names = [n for n, _ in traces]
    lines = [f"# uvmprefetch scorecard ({source}; {gpu.name}; {len(names)} traces)", ""]
    # 1. targets, on the whole trace (warm-up included) and on the steady state (the last iteration: what a
    # training run of thousands of steps spends its time in; the standard traces' iterations 2-4 repeat
    # exactly, see uvmprefetch/trace/standard.py)
    targets = []
    for label, key in (("whole trace (all iterations, warm-up included)", "time_s"),
                       ("steady state (last iteration)", "steady_slowdown")):
        lines += [f"## Targets: {label}", "", "| oversub | uvmprefetch/oracle (geomean) | demand/uvmprefetch (geomean) "
                  "| uvmprefetch/oracle worst trace | traces where uvmprefetch < deepum |", "|---|---|---|---|---|"]
        for ov in oversubs:
            ro, rd, wins, worst = [], [], 0, None
            for n in names:
                u, o, d, du = (time_of(rows, n, p, ov) for p in ("uvmprefetch", "oracle", "demand", "deepum"))
                if u and o and u.get(key) and o.get(key):
                    ro.append(u[key] / o[key])
                    worst = max(worst or 0.0, u[key] / o[key])
                if u and d and u.get(key) and d.get(key):
                    rd.append(d[key] / u[key])
                wins += bool(u and du and u.get(key) and du.get(key) and u[key] < du[key])
            g_o, g_d = geomean(ro), geomean(rd)
            targets.append({"measure": key, "oversub": ov, "uvm_over_oracle": g_o, "demand_over_uvm": g_d,
                            "worst_uvm_over_oracle": worst, "beats_deepum": wins, "traces": len(names)})
            wtxt = "-" if worst is None else f"{worst:.3f}"
            lines.append(f"| {ov:g} | {g_o:.3f} | {g_d:.2f}x | {wtxt} | {wins}/{len(names)} |")
        lines.append("")
    # 2. ablation, on both measures
    abl = []
    for label, key in (("whole trace", "time_s"), ("steady state, last iteration", "steady_slowdown")):
        lines += [f"## Ablation, {label} (time vs demand, geomean over traces; lower is better)", "",
                  "| configuration | " + " | ".join(f"{ov:g}x" for ov in oversubs) + " |",
                  "|---|" + "---|" * len(oversubs)]
        for cfg, spec in [("deepum", "deepum")] + ABLATION + [("oracle", "oracle")]:
            cells, vals = [], {}
            for ov in oversubs:
                rs = []
                for n in names:
                    r, d = time_of(rows, n, spec, ov), time_of(rows, n, "demand", ov)
                    if r and d and r.get(key) and d.get(key):
                        rs.append(r[key] / d[key])
                g = geomean(rs)
                vals[str(ov)] = g
                cells.append(f"{g:.3f} ({(g - 1) * 100:+.1f} %)")
            abl.append({"measure": key, "configuration": cfg, "spec": spec, "time_vs_demand": vals})
            lines.append(f"| {cfg} | " + " | ".join(cells) + " |")
        lines.append("")
    # 3. prediction quality
    lines += ["## Prediction quality of uvmprefetch", "",
              "accuracy = useful / issued prefetch bytes; coverage = prefetch-served / (served + faulted) blocks", "",
              "| trace | oversub | slowdown | steady | accuracy | coverage | faults | window (end) |",
              "|---|---|---|---|---|---|---|---|"]
    quality = []
    for n in names:
        for ov in oversubs:
            r = time_of(rows, n, "uvmprefetch", ov)
            if not r:
                continue
            rep = r.get("policy_report", {})
            q = {"trace": n, "oversub": ov, "slowdown": r["slowdown"], "steady_slowdown": r.get("steady_slowdown"),
                 "accuracy": r.get("accuracy"),
                 "coverage": r.get("coverage"), "faults": r.get("faults"), "window": rep.get("window")}
            quality.append(q)
            acc = "-" if q["accuracy"] is None else f"{q['accuracy']:.3f}"
            cov = "-" if q["coverage"] is None else f"{q['coverage']:.3f}"
            stdy = "-" if q["steady_slowdown"] is None else f"{q['steady_slowdown']:.3f}"
            lines.append(f"| {n} | {ov:g} | {q['slowdown']:.3f} | {stdy} | {acc} | {cov} | {q['faults']} | {q['window']} |")
    # 4. robustness
    robust = []
    if not args.no_patterns:
        from uvmprefetch.trace.patterns import pattern_traces
        pats = list(pattern_traces().items())
        prow = B.run_bench(pats, ["demand", "deepum", "uvmprefetch", "oracle"], oversubs, gpu,
                           progress=sys.stderr.isatty())
        lines += ["", "## Changing patterns (uvmprefetch)", "",
                  "| trace | oversub | vs demand | vs oracle | vs deepum | iterations to recover (per change) |",
                  "|---|---|---|---|---|---|"]
        for n, t in pats:
            ch = t.meta.get("pattern", {}).get("changes", [])
            for ov in oversubs:
                u, d, o, du = (time_of(prow, n, p, ov) for p in ("uvmprefetch", "demand", "oracle", "deepum"))
                if not (u and d):
                    continue
                rec = recovery(u["iteration_times_s"], ch, n == "alternating_seq") if n != "moe" else []
                robust.append({"trace": n, "oversub": ov, "vs_demand": u["time_s"] / d["time_s"],
                               "vs_oracle": u["time_s"] / o["time_s"] if o else None,
                               "vs_deepum": u["time_s"] / du["time_s"] if du else None, "recovery": rec,
                               "iteration_times_s": u["iteration_times_s"]})
                worst = max((x["iterations_to_recover"] for x in rec if x["iterations_to_recover"] is not None),
                            default=None)
                miss = sum(x["iterations_to_recover"] is None for x in rec)
                rtxt = "n/a (data-dependent every step)" if n == "moe" else "n/a (no change)" if not ch else \
                    f"max {worst}" + (f", {miss} never" if miss else "")
                lines.append(f"| {n} | {ov:g} | {u['time_s'] / d['time_s']:.3f} | "
                             f"{u['time_s'] / o['time_s']:.3f} | {u['time_s'] / du['time_s']:.3f} | {rtxt} |")
    wall = time.perf_counter() - t0
    meta = B.bench_meta(gpu, 2 << 20, wall)
    meta["source"] = source
    slim = [{k: v for k, v in r.items() if k in B.CSV_FIELDS or k in ("iteration_times_s",)} for r in rows]
    path = out / f"ablation-{results.stamp()}.json"
    tables = {"meta": meta, "targets": targets, "ablation": abl, "quality": quality, "robustness": robust}
    path.write_text(json.dumps({**tables, "results": slim}, indent=1, default=json_default))
    lines += ["", f"wall {wall:.1f} s; JSON: {path}"]
    # the baseline keeps the tables only; the run folder keeps every replay's row
    setting = f"{args.gpu} {','.join(f'{o:g}' for o in oversubs)}" + ("" if args.traces is None else f" {source}")
    print("\n".join(lines))
    return results.finish_run(args, "ablation", setting, tables, out)


if __name__ == "__main__":
    sys.exit(main())
