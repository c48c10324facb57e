"""The trace-replay benchmark: traces x policies x oversubscription levels -> table, CSV, plot.

Used by ``uvmprefetch bench`` and ``bench/replay_bench.py``. Each trace's layout and durations are built
once and shared by all its replays; ``ideal`` does not depend on the capacity, so it is replayed once per
trace and reported at every level.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import time
from pathlib import Path

from ..errors import ConfigError
from ..gpus import GpuProfile
from ..jsonutil import json_default
from ..policy import make_policy
from ..trace.format import Trace, load
from .layout import build_layout
from .copypath import parse_evict
from .replay import launch_durations, replay

DEFAULT_OVERSUB = (1.0, 1.25, 1.5, 2.0, 3.0)
CSV_FIELDS = ("trace", "policy", "gpu", "oversub_target", "oversub", "capacity_bytes", "time_s", "ideal_s",
              "slowdown", "steady_slowdown", "stall_s", "faults", "fault_batches", "bytes_htod", "bytes_dtoh", "prefetch_issued_bytes",
              "prefetch_useful_bytes", "accuracy", "coverage", "cold_first_touch_s", "evictions", "writebacks",
              "drops", "n_launches", "block_accesses", "wall_s", "events_per_s", "block_accesses_per_s", "offline",
              "planning_s", "n_gpus", "error")


def standard_trace_set(progress: bool = True) -> list[tuple[str, Trace]]:
    """The standard traces: ``uvmprefetch.trace.standard.standard_traces()`` when it exists, else the
    ``.uvmt`` files shipped in ``traces/``.

    Raises
    ------
    ConfigError
        If neither is available (the message says how to get traces).
    """
    try:
        from ..trace.standard import standard_traces
    except ImportError:
        standard_traces = None
    if standard_traces is not None:
        import inspect
        kw = {"progress": progress} if "progress" in inspect.signature(standard_traces).parameters else {}
        got = standard_traces(**kw)
        items = got.items() if isinstance(got, dict) else ((None, x) for x in got)
        out = []
        for name, x in items:
            if isinstance(x, Trace):
                out.append((name or x.meta.get("name") or x.meta.get("model") or f"trace{len(out)}", x))
            else:
                out.append((name or Path(x).stem, load(x)))
        if out:
            return out
    shipped = sorted((Path(__file__).resolve().parents[2] / "traces").glob("*.uvmt"))
    if shipped:
        return [(p.stem, load(p)) for p in shipped]
    raise ConfigError("no standard traces available (uvmprefetch.trace.standard is missing and traces/ has no "
                      ".uvmt files): pass trace files, e.g. `uvmprefetch bench my.uvmt`, or record one with "
                      "`uvmprefetch record`")


def parse_oversub_list(text: str) -> list[float]:
    """``"1,1.5,2"`` -> [1.0, 1.5, 2.0]. Raises ConfigError naming ``--oversub`` on a bad value."""
    vals = []
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        try:
            v = float(part)
        except ValueError:
            raise ConfigError(f"--oversub: {part!r} is not a number (expected e.g. 1,1.25,1.5,2,3)") from None
        if not (math.isfinite(v) and v > 0):
            raise ConfigError(f"--oversub: {part!r} must be a positive number")
        vals.append(v)
    if not vals:
        raise ConfigError("--oversub: empty list (expected e.g. 1,1.25,1.5,2,3)")
    return vals


def run_bench(traces: list[tuple[str, Trace]], policies: list[str], oversubs: list[float], gpu: GpuProfile,
              block_size: int = 2 << 20, writeback_clean: bool = False, progress: bool = True, n_gpus: int = 1,
              shared_link: bool = True, host=None, discards: bool = True, evict=None) -> list[dict]:
    """Replay every trace under every policy at every oversubscription level.

    A combination the capacity cannot hold (a launch wider than the capacity) becomes a row with ``error``
    set instead of stopping the benchmark. With ``n_gpus`` > 1 every replay but ``ideal`` runs ``n_gpus``
    data-parallel GPUs on one host link (``sim/multigpu.py``; ``shared_link=False``: a link each). ``host``:
    the host clock of ``replay`` (one GPU only; the ``ideal`` reference runs without it); ``discards=False``: no
    dead data is dropped (``replay``; one GPU only); ``evict``: the eviction paths (``replay``). Each row
    says whether its policy is ``offline`` (sees the whole trace in advance) and its ``planning_s``.
    """
    from .multigpu import replay_multi
    if writeback_clean and n_gpus > 1:
        raise ConfigError("--writeback-clean is not supported with --gpus > 1")
    if not discards and n_gpus > 1:
        raise ConfigError("--no-discard is not supported with --gpus > 1")
    if host is not None and n_gpus > 1:
        raise ConfigError("--host is not supported with --gpus > 1")
    from tqdm import tqdm
    for p in policies:  # fail early on a bad policy spec
        make_policy(p)
    total = sum(1 + (len(policies) - ("ideal" in policies)) * len(oversubs) for _ in traces)
    bar = tqdm(total=total, desc="bench", unit="replay", disable=not progress, leave=False, mininterval=1.0)
    rows: list[dict] = []
    try:
        for tname, t in traces:
            bar.set_postfix_str(f"{tname}: layout")
            lay = build_layout(t, block_size)
            dur = launch_durations(t, gpu)
            ideal = replay(t, "ideal", gpu, oversub=1.0, layout=lay, durations=dur)
            bar.update(1)
            for p in policies:
                for ov in oversubs:
                    if make_policy(p).ideal:
                        r = dict(ideal)
                        r["oversub"] = ov
                        r["capacity_bytes"] = math.ceil(lay.footprint_blocks / ov - 1e-9) * lay.block_size
                    else:
                        bar.set_postfix_str(f"{tname}: {p} @ {ov}")
                        try:
                            if n_gpus > 1:
                                r = replay_multi(t, p, gpu, n_gpus, oversub=ov, layout=lay, durations=dur,
                                                 shared_link=shared_link, evict=evict)
                            else:
                                r = replay(t, p, gpu, oversub=ov, layout=lay, durations=dur,
                                           writeback_clean=writeback_clean, host=host, discards=discards,
                                           evict=evict)
                        except ConfigError as e:
                            r = {"policy": p, "gpu": gpu.name, "oversub": ov, "error": str(e),
                                 "ideal_s": ideal["ideal_s"]}
                        bar.update(1)
                    r["trace"] = tname
                    r["offline"] = bool(make_policy(p).offline)
                    r["planning_s"] = (r.get("policy_report") or {}).get("planning_s")
                    r["n_gpus"] = n_gpus if not r["policy"] == "ideal" else 1
                    r["policy_name"] = r["policy"]
                    r["policy"] = p  # the spec: variants of one policy stay apart in tables
                    r["oversub_target"] = ov
                    rows.append(r)
    finally:
        bar.close()
    return rows


TARGET_LEVELS = (1.5, 2.0, 3.0)


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(map(math.log, xs)) / len(xs))


def targets(rows: list[dict]) -> list[dict]:
    """The policy targets, measured on ``rows`` at the levels 1.5, 2 and 3 that ran (every trace there):

    - ``uvmprefetch`` / ``oracle`` in steady state (last iteration), geomean over traces and levels, <= 1.05;
    - the same over the whole run, <= 1.10;
    - the share of the oracle's speed-up over ``demand`` that ``uvmprefetch`` recovers, ``(demand/uvm) /
      (demand/oracle)`` on whole-run times, geomean, >= 0.90 (``detail``: the worst pair, and the share of the time
      ``demand`` loses that it wins back, ``(demand - uvm) / (demand - oracle)``);
    - faster than ``deepum`` (whole run) on every trace and level.

    Each is ``{"target", "value", "limit", "ok", "detail"}``; a target whose policies did not run is left out."""
    by = {(r["trace"], r["policy"], r["oversub_target"]): r for r in rows
          if r.get("error") is None and r.get("slowdown") is not None}
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    levels = [ov for ov in TARGET_LEVELS if any(k[2] == ov for k in by)]
    pairs = [(t, ov) for t in traces for ov in levels if (t, "uvmprefetch", ov) in by and (t, "oracle", ov) in by]
    out: list[dict] = []
    if not pairs:
        return out
    lv = ", ".join(f"{ov:g}x" for ov in levels)

    def ratio(pol_a, pol_b, key):
        return [by[(t, pol_a, ov)][key] / by[(t, pol_b, ov)][key] for t, ov in pairs
                if by[(t, pol_a, ov)].get(key) and by[(t, pol_b, ov)].get(key)]
    for key, limit, what in (("steady_slowdown", 1.05, "steady state"), ("slowdown", 1.10, "whole run")):
        rs = ratio("uvmprefetch", "oracle", key)
        if rs:
            g = _geomean(rs)
            out.append({"target": f"uvmprefetch / oracle, {what}, geomean at {lv}", "value": g, "limit": limit,
                        "ok": g <= limit, "detail": f"worst {max(rs):.3f}"})
    if all((t, "demand", ov) in by for t, ov in pairs):
        rec, won = [], []
        for t, ov in pairs:
            d, u, o = (by[(t, p, ov)]["time_s"] for p in ("demand", "uvmprefetch", "oracle"))
            rec.append((d / u) / (d / o))
            if d > o:
                won.append((d - u) / (d - o))
        g = _geomean(rec)
        out.append({"target": f"share of the oracle's speed-up over demand, (demand/uvm)/(demand/oracle), geomean "
                              f"at {lv}", "value": g, "limit": 0.90, "ok": g >= 0.90,
                    "detail": f"worst {min(rec):.3f}; time demand loses won back {min(won):.0%}..{max(won):.0%}"
                    if won else f"worst {min(rec):.3f}"})
    dp = [(t, ov) for t, ov in pairs if (t, "deepum", ov) in by]
    if dp:
        rs = [by[(t, "uvmprefetch", ov)]["slowdown"] / by[(t, "deepum", ov)]["slowdown"] for t, ov in dp]
        slower = [f"{t} {ov:g}x" for (t, ov), r in zip(dp, rs) if r >= 1]
        out.append({"target": f"uvmprefetch / deepum, whole run, worst of every trace at {lv}", "value": max(rs),
                    "limit": 1.0, "ok": not slower,
                    "detail": ("slower on " + ", ".join(slower)) if slower else f"best {min(rs):.3f}"})
    return out


def targets_markdown(tg: list[dict]) -> str:
    lines = ["Targets (uvmprefetch against the oracle, managed memory and DeepUM):", "",
             "| target | measured | limit | pass | detail |", "|---|---:|---:|---|---|"]
    for x in tg:
        op = ">=" if "share" in x["target"] else "<="
        lines.append(f"| {x['target']} | {x['value']:.3f} | {op} {x['limit']:g} | {'yes' if x['ok'] else 'NO'} | "
                     f"{x['detail']} |")
    return "\n".join(lines)


def _cell(v) -> str:
    return "—" if v is None else f"{v:.2f}"


def markdown(rows: list[dict], oversubs: list[float]) -> str:
    """Slowdown table (rows: trace x policy, columns: oversubscription) and replay throughput per policy."""
    head = "| trace | policy | " + " | ".join(f"{o:g}x" for o in oversubs) + " |"
    sep = "|---|---|" + "---:|" * len(oversubs)
    lines = ["Slowdown vs. ideal (time / sum of kernel durations) by oversubscription (footprint / capacity):",
             "", head, sep]
    seen: dict[tuple, dict] = {}
    offline = {r["policy"] for r in rows if r.get("offline") and r["policy"] != "ideal"}
    gpus = max((r.get("n_gpus") or 1 for r in rows), default=1)
    if gpus > 1:
        lines[0:1] = [f"{gpus} data-parallel GPUs on one host link (sim/multigpu.py); " + lines[0][0].lower() + lines[0][1:]]

    def label(pol: str) -> str:
        return f"{pol} (offline)" if pol in offline else pol

    for r in rows:
        seen.setdefault((r["trace"], r["policy"]), {})[r["oversub_target"]] = r
    for (tname, pol), by in seen.items():
        cells = [_cell(by.get(o, {}).get("slowdown")) for o in oversubs]
        lines.append(f"| {tname} | {label(pol)} | " + " | ".join(cells) + " |")
    lines += ["", "Steady state: last iteration / its ideal time (the first iteration pays the cold start):", "",
              head, sep]
    for (tname, pol), by in seen.items():
        cells = [_cell(by.get(o, {}).get("steady_slowdown")) for o in oversubs]
        lines.append(f"| {tname} | {label(pol)} | " + " | ".join(cells) + " |")
    tg = targets(rows)
    if tg:
        lines += ["", targets_markdown(tg)]
    if offline:
        lines += ["", "(offline): the policy sees the whole trace in advance (planners, the oracle); the others "
                  "learn from what a runtime observes. Compare them with that in mind."]
    lines += ["", "Replay throughput (this machine); planning s = the offline planners' own planning time, summed:",
              "", "| policy | replays | launches/s | block accesses/s | wall s | planning s |",
              "|---|---:|---:|---:|---:|---:|"]
    pols: dict[str, list[dict]] = {}
    for r in rows:
        if r.get("error") is None and r["policy"] != "ideal" or (r["policy"] == "ideal" and r["oversub_target"] == oversubs[0]):
            pols.setdefault(r["policy"], []).append(r)
    for pol, rs in pols.items():
        wall = sum(r["wall_s"] for r in rs)
        launches = sum(r["n_launches"] * (r.get("n_gpus") or 1) for r in rs)
        acc = sum(r["block_accesses"] for r in rs)
        plan = [r["planning_s"] for r in rs if r.get("planning_s") is not None]
        ptxt = f"{sum(plan):.2f}" if plan else "—"
        lines.append(f"| {pol} | {len(rs)} | {launches / wall:,.0f} | {acc / wall:,.0f} | {wall:.2f} | {ptxt} |"
                     if wall > 0 else f"| {pol} | {len(rs)} | — | — | 0 | {ptxt} |")
    return "\n".join(lines)


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in CSV_FIELDS})


_Y_TICKS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0)


def plot(rows: list[dict], path: Path, key: str = "slowdown") -> None:
    """One panel per trace: ``key`` (slowdown or steady_slowdown) vs. oversubscription, one line per policy
    (log y; offline policies dashed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator, ScalarFormatter
    n = len(traces)
    cols = 2 if n == 4 else min(n, 3)
    nrows = math.ceil(n / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.5 * cols, 3.4 * nrows + 0.6), squeeze=False)
    legend: dict = {}
    for ax, tname in zip(axes.ravel(), traces):
        by: dict[str, list] = {}
        for r in rows:
            if r["trace"] == tname and r.get(key) is not None:
                by.setdefault(r["policy"], []).append((r["oversub_target"], r[key]))
        offline = {r["policy"] for r in rows if r.get("offline")}
        for k, (pol, pts) in enumerate(by.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="os^vDP*Xph"[k % 10], ms=3,
                    ls="--" if pol in offline else "-", color=plt.cm.tab20(k % 20),
                    label=f"{pol} (offline)" if pol in offline else pol)
        ax.set_yscale("log")
        # Slowdowns span ~1-6x, less than a decade: label readable steps instead of powers of ten.
        top = max((p[1] for pts in by.values() for p in pts), default=1.0)
        ax.yaxis.set_major_locator(FixedLocator([v for v in _Y_TICKS if v <= top * 1.05] or [1.0]))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_locator(NullLocator())
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_title(tname, fontsize=9)
        ax.set_xlabel("oversubscription")
        ax.set_ylabel("slowdown vs ideal" if key == "slowdown" else "steady-state slowdown (last iteration)")
        ax.grid(alpha=0.3, which="both")
        for h, lab in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(lab, h)
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    # One legend for all panels, under them: with a dozen policies a legend inside a panel hides its curves.
    ncol = min(len(legend), 5) or 1
    rows_l = math.ceil(len(legend) / ncol)
    fig.tight_layout(rect=(0, 0.035 * rows_l / nrows + 0.02, 1, 1))
    if legend:
        fig.legend(list(legend.values()), list(legend.keys()), loc="lower center", ncol=ncol, fontsize=8,
                   frameon=False)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def save_outputs(rows: list[dict], oversubs: list[float], out: Path, meta: dict) -> dict:
    """Write ``results.csv``, ``results.json``, ``slowdown.png``, ``steady.png`` and ``table.md`` under ``out``."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_csv(rows, out / "results.csv")
        (out / "results.json").write_text(json.dumps({"meta": meta, "results": rows}, indent=1, default=json_default))
        table = header(meta) + "\n\n" + markdown(rows, oversubs)
        (out / "table.md").write_text(table + "\n")
        plot(rows, out / "slowdown.png")
        plot(rows, out / "steady.png", key="steady_slowdown")
    except OSError as e:
        raise ConfigError(f"--out {out}: cannot write ({e.strerror})") from None
    return {"csv": str(out / "results.csv"), "json": str(out / "results.json"), "plot": str(out / "slowdown.png"),
            "steady_plot": str(out / "steady.png"), "table": str(out / "table.md")}



def add_trace_arguments(ap) -> None:
    """The replay benchmarks' ``--traces FILE...`` (default: the standard set) and ``--gpu PROFILE``."""
    ap.add_argument("--traces", nargs="*", help="trace files instead of the standard set")
    ap.add_argument("--gpu", default="h100-pcie", help="GPU profile (default h100-pcie)")


def bench_traces(paths: list[str] | None, fallback=None) -> tuple[list[tuple[str, Trace]], str]:
    """The traces a benchmark runs, and where they come from: the files in ``paths``, else the standard set, else
    (when there is none and ``fallback`` is given) ``fallback()``'s synthetic traces.

    Raises
    ------
    ConfigError
        A trace file that cannot be loaded, or no standard traces and no ``fallback``.
    """
    if paths:
        return load_traces(paths), "command line"
    try:
        return standard_trace_set(), "standard traces"
    except ConfigError:
        if fallback is None:
            raise
        return fallback(), "SYNTHETIC fallback (no standard traces available)"


def load_traces(paths: list[str]) -> list[tuple[str, Trace]]:
    """Load trace files given on the command line (TraceError names the bad one)."""
    return [(Path(p).stem, load(p)) for p in paths]


def bench_meta(gpu: GpuProfile, block_size: int, wall: float, host=None, discards: bool = True, evict=None,
               host_name: str | None = None) -> dict:
    import os
    import platform
    import subprocess

    from .. import __version__
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5,
                                cwd=Path(__file__).resolve().parent).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "gpu": gpu.name, "block_size": block_size,
            "uvmprefetch": __version__, "commit": commit, "python": platform.python_version(),
            "machine": platform.machine(), "cpus": os.cpu_count(), "wall_s": wall,
            "host": dataclasses.asdict(host) if host is not None else None, "discards": bool(discards),
            "evict": dataclasses.asdict(parse_evict(evict)), "host_name": host_name or host_label(host),
            "gpu_calibrated": gpu.calibrated}


def host_label(host) -> str:
    from .host import host_name
    return host_name(host)


_HOST_WORDS = {"live": "the runtime's threads (C++ observer on the training thread, decisions on a planner thread, "
                       "moves on a mover thread that UVM's eviction holds)",
               "live-sync": "the synchronous runtime (decisions and evictions on the training thread, measured "
                            "decision time)",
               "free": "a free host (it never limits)"}


def header(meta: dict) -> str:
    """One line that says which profile and host model a run used (``uvmprefetch bench`` prints it first)."""
    cal = meta.get("gpu_calibrated")
    prof = (f"costs measured on the card ({cal})" if cal else
            "the literature's link and fault costs" + ("" if str(meta["gpu"]).endswith("-lit") else
                                                        " (nobody has measured this card yet)"))
    hn = meta.get("host_name") or "free"
    ev = (meta.get("evict") or {}).get("mode", "uvm")
    words = _HOST_WORDS.get(hn, f"custom: {meta.get('host')}")
    return (f"Profile {meta['gpu']}: {prof}. Host model {hn}: {words}. "
            f"Eviction {ev}; discards {'on' if meta.get('discards', True) else 'off'}.")
