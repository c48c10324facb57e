#!/usr/bin/env python3
"""Side by side with what users would use instead: every way to train one model under one GPU memory budget.

A person whose model does not fit turns on activation checkpointing, offloads saved activations to the host,
or shards and offloads parameters and optimizer state; uvmprefetch asks for no code change. This script
trains one model (GPT-2 large, bf16 autocast, AdamW, batch 8 x 1024 by default) every way under one budget,
each way in its own process with its own time limit:

- ``plain`` without a cap (the reference: its peak reserved bytes are the working set) and under the cap
  (expected: out of memory);
- ``checkpoint`` (activation checkpointing per transformer block), ``offload`` (``save_on_cpu(pin_memory=True)``
  around the forward pass), ``checkpoint+offload``, ``fsdp-offload`` (FSDP2 ``CPUOffloadPolicy``, a process
  group of one), ``deepspeed-offload`` (only where deepspeed imports);
- ``managed`` (``UVMPREFETCH_POLICY=demand``) and ``uvmprefetch``, with ``UVMPREFETCH_BUDGET`` = the budget.

The PyTorch-native ways are held to the budget with ``torch.cuda.set_per_process_memory_fraction``; every row
shows its peak GPU bytes against it. Budget = working set / ``--oversub`` (1.5 first, then 2 while the
``--deadline`` allows), or ``--budget`` bytes. Per row: seconds per iteration (median of the steady iterations),
peak GPU bytes, host bytes pinned, the first losses and whether they match plain's. Output: a table (stdout,
last), a plot (bars per method, a line at the plain time), ``<out>/alternatives.json``, and the rows in the
GPU baseline file as ``alt/<method>/<oversub>``.
"""

from __future__ import annotations

import importlib.util
import math
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402
import baseline as B  # noqa: E402

sys.path.insert(0, str(C.REPO))

NAME = "alternatives"
EPILOG = """\
examples:
  python bench/gpu/alternatives.py                          # GPT-2 large b8x1024 bf16 at 1.5x, then 2x
  python bench/gpu/alternatives.py --oversub 2 --methods checkpoint,uvmprefetch
  python bench/gpu/alternatives.py --budget 30GiB --config medium
  python bench/gpu/alternatives.py --dry-run                # every method on a tiny model, CPU, no cap
"""
GIB = 2**30
# Relative loss difference accepted where bit-equality is not implied (the reasons are per method, below).
RTOL = 1e-3


@dataclass(frozen=True)
class Method:
    """One way to train under the budget.

    ``flags`` are the worker's flags (the code change the method asks of a user); ``runtime`` is the
    uvmprefetch policy the runtime runs (None: PyTorch's own allocator, held to the budget by a memory cap).
    """

    name: str
    flags: tuple[str, ...] = ()
    runtime: str | None = None
    code_change: bool = True
    # why the losses may differ from plain's on a GPU without --deterministic (bit-equal on a CPU)
    tolerance_why: str = "CUDA's fused attention backward is not run-to-run deterministic"
    # why they may differ even with --deterministic (None: bit-equal expected then)
    always_why: str | None = None


METHODS = {m.name: m for m in (
    Method("plain", code_change=False),
    Method("checkpoint", ("--checkpoint",)),
    Method("offload", ("--offload-activations",)),
    Method("checkpoint+offload", ("--checkpoint", "--offload-activations")),
    Method("fsdp-offload", ("--fsdp-offload",),
           always_why="AdamW steps on the CPU (CPUOffloadPolicy), plain's on the GPU: other rounding"),
    Method("deepspeed-offload"),
    Method("managed", runtime="demand", code_change=False,
           tolerance_why="fused attention backward; AdamW's per-parameter loop against plain's foreach"),
    Method("uvmprefetch", runtime="uvmprefetch", code_change=False,
           tolerance_why="fused attention backward; AdamW's per-parameter loop against plain's foreach"),
)}
# Run order within a budget, most valuable first, so that a --deadline cut loses the least: the product, the
# strongest alternative, the other alternatives, plain's expected out-of-memory (short), then naive managed
# memory (the slowest run, and measured by oversub.py too).
RUN_ORDER = ("uvmprefetch", "checkpoint", "offload", "checkpoint+offload", "fsdp-offload", "plain", "managed",
             "deepspeed-offload")


# ------------------------------------------------------------------------------------------------- judging

def steady(iter_s: list[float], warmup: int) -> tuple[float | None, str]:
    """(median seconds per iteration over the steady iterations, note). With no iteration after ``warmup``:
    the last one, said so; None when none ran."""
    if len(iter_s) > warmup:
        return statistics.median(iter_s[warmup:]), ""
    if iter_s:
        return iter_s[-1], f"not steady: {len(iter_s)} iteration(s), the last"
    return None, ""


def compare_losses(ref: dict, run: dict, exact: bool) -> dict:
    """Losses of ``run`` against the reference's over their common iterations.

    ``exact``: bit-equality is implied (``ok`` iff every loss is bit-equal); otherwise every loss must be within
    ``RTOL``. ``first_equal`` says whether the first loss (the forward pass from the same weights, before any
    step) is bit-equal: where it is not, the forward itself picked other kernels (say, for another alignment).
    """
    n = min(len(ref.get("losses_hex") or []), len(run.get("losses_hex") or []))
    if n == 0:
        return {"n": 0, "bit_equal": None, "max_rel": None, "ok": None}
    a, b = ref["losses"][:n], run["losses"][:n]
    bit_equal = ref["losses_hex"][:n] == run["losses_hex"][:n]
    max_rel = max(abs(x - y) / abs(x) for x, y in zip(a, b))
    first = ref["losses_hex"][0] == run["losses_hex"][0]
    ok = bit_equal if exact else max_rel <= RTOL
    return {"n": n, "bit_equal": bit_equal, "first_equal": first, "max_rel": max_rel, "ok": ok}


def peak_gpu_bytes(res: dict, method: Method) -> int | None:
    """GPU bytes the run held at its peak: PyTorch's peak reserved bytes, or under the runtime (where those are
    the managed allocation, the working set) the runtime's peak GPU-resident bytes."""
    if method.runtime is not None:
        return C.report_get(res.get("report"), "peak_resident_bytes")
    return res.get("peak_reserved_bytes")


def judge(res: dict, method: Method, ref: dict | None, *, warmup: int, exact: bool, expect_oom: bool) -> dict:
    """One row's verdicts from a worker result (``run_training``'s dict): status, time, peak within the
    budget, losses against the reference. Pure: the unit tests drive it with hand-made results."""
    ok, why = C.run_ok(res)
    oom = res.get("oom")
    t, note = steady(res.get("iter_s") or [], warmup) if ok else (None, "")
    if ok and res.get("stopped_early"):
        note = "; ".join(filter(None, [note, f"time limit: {len(res['iter_s'])} of {res['workload']['iters']} "
                                              "iterations"]))
    status = "ok" if ok else ("OOM" if oom else "timed out" if res.get("returncode") == 124 else "failed")
    budget = res.get("budget_bytes")
    peak = peak_gpu_bytes(res, method)
    within = None if budget is None or peak is None else peak <= budget
    losses = compare_losses(ref, res, exact) if ok and ref is not None else {"ok": None, "n": 0}
    if expect_oom and ok:
        problem = "ran: plain fits under this cap, so the cap does not bind"
    elif not ok and not oom:
        problem = why
    elif losses["ok"] is False:
        problem = "losses differ from plain's"
    else:
        problem = ""
    return {"status": status, "s_per_iter": t, "note": note, "peak_gpu_bytes": peak, "within_budget": within,
            "losses": losses, "problem": problem,
            "oom_at": None if not oom else ("model placement" if oom.get("iteration") is None
                                            else f"iteration {oom['iteration']}")}


def losses_cell(cmp: dict, exact: bool, method: Method) -> str:
    if not cmp.get("n"):
        return "-"
    if cmp["bit_equal"]:
        return "bit-equal"
    tol = "" if exact else f" (tol {RTOL:g}: {method.always_why or method.tolerance_why})"
    first = "first bit-equal, " if cmp["first_equal"] else "first differs, "
    return f"{'ok' if cmp['ok'] else 'DIFFERS'}: {first}max rel {cmp['max_rel']:.2g}{tol}"


# ---------------------------------------------------------------------------------------------- running

def deepspeed_state() -> str:
    """Why deepspeed-offload cannot run here (this script has no DeepSpeed path: the CPU machines where it is
    tested have no deepspeed, and no network fetches one at run time)."""
    if importlib.util.find_spec("deepspeed") is None:
        return "deepspeed is not installed (no module named 'deepspeed')"
    r = subprocess.run([sys.executable, "-c", "import deepspeed; print(deepspeed.__version__)"], env=C.child_env(),
                       capture_output=True, text=True, timeout=120, check=False)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no message"])[-1]
        return f"deepspeed does not import ({last[:160]})"
    return (f"deepspeed {r.stdout.strip()} imports, but this script has no ZeRO-Offload path yet (untested on the "
            "CPU machines)")


def parse_list(text: str, what: str, valid=None, conv=str) -> list:
    items = [t.strip() for t in text.split(",") if t.strip()]
    try:
        out = [conv(t) for t in items]
    except ValueError:
        C.fail(NAME, f"{what} {text!r}: expected a comma-separated list")
    if not out or (valid is not None and any(x not in valid for x in out)):
        C.fail(NAME, f"{what} {text!r}: choose from {', '.join(valid)}" if valid else f"{what} is empty")
    return out


def parse_args(argv):
    p = C.parser(NAME, __doc__.split("\n\n")[0], EPILOG)
    C.add_workload_arguments(p, config="large", iters=6, warmup=3)
    p.add_argument("--oversub", default="1.5,2",
                   help="working set / budget, in order; the first is run in full before the next starts "
                        "(default 1.5,2)")
    p.add_argument("--budget", default=None,
                   help="one budget in bytes (20GiB, 3.2e10, ...) instead of --oversub")
    p.add_argument("--methods", default=",".join(METHODS), help=f"subset of {','.join(METHODS)} (default all)")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels and AdamW's per-parameter loop everywhere, so that the losses of "
                        "checkpoint, offload, managed and uvmprefetch must be bit-equal to plain's (slower: eager "
                        "attention keeps the attention matrices)")
    p.add_argument("--timeout", type=float, default=150.0, help="seconds allowed per run (default 150)")
    p.add_argument("--deadline", type=float, default=360.0,
                   help="seconds for the whole script: runs are cut to what is left, runs that cannot start "
                        "in time are skipped and listed (default 360)")
    p.add_argument("--work-dir", type=Path, default=None, help="runs' files (default <out>/alternatives-runs)")
    p.add_argument("--baseline", type=Path, default=None,
                   help=f"GPU baseline file the rows go into (default {B.BASELINE.relative_to(C.REPO)}, or "
                        f"{B.DRYRUN_BASELINE.relative_to(C.REPO)} with --dry-run)")
    args = p.parse_args(argv)
    C.require_gpu(args, NAME)
    args.methods = parse_list(args.methods, "--methods", valid=list(METHODS))
    if args.budget is not None:
        from uvmprefetch.errors import ConfigError
        from uvmprefetch.units import parse_size
        try:
            args.budget = parse_size(args.budget, "--budget")
        except ConfigError as e:
            C.fail(NAME, str(e))
        args.oversub = None
    else:
        args.oversub = parse_list(args.oversub, "--oversub", conv=float)
        if any(r <= 1.0 for r in args.oversub):
            C.fail(NAME, f"--oversub: every ratio must be > 1 (1 = the model fits), got {args.oversub}")
    if args.iters <= args.warmup:
        C.fail(NAME, "--iters must be larger than --warmup")
    if args.timeout < 30 or args.deadline < args.timeout / 2:
        C.fail(NAME, "--timeout must be at least 30 s and --deadline at least half of it")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.monotonic()
    dry = args.dry_run
    work = (C.tiny_workload(iters=3, deterministic=args.deterministic) if dry else
            C.Workload(args.model, args.config, args.batch, args.seq, args.iters, args.warmup, args.dtype,
                       deterministic=args.deterministic))
    wdir = args.work_dir or (C.out_dir(args) / "alternatives-runs")
    # Bit-equality is implied on the CPU (deterministic kernels, every optimizer on the CPU) and with
    # --deterministic (every method then runs AdamW's per-parameter loop, as the runtime needs under a budget).
    exact_run = dry or args.deterministic

    def run(method: Method, case: str, budget: int | None) -> dict:
        left = args.deadline - (time.monotonic() - start)
        timeout = max(30.0, min(args.timeout, left))
        foreach = "off" if method.runtime or args.deterministic else work.foreach
        w = C.Workload(**{**work.__dict__, "foreach": foreach})
        flags = list(method.flags)
        if method.runtime is None and budget is not None and not dry:
            flags += ["--memory-cap", str(budget)]
        # the worker stops iterating in time to write its result before the run's limit
        flags += ["--max-seconds", f"{max(10.0, timeout - 20.0):.0f}"]
        mode = {None: "plain", "demand": "managed"}.get(method.runtime, method.runtime)
        res = C.run_training(mode, w, wdir, case, seed=args.seed, dry_run=dry, timeout=timeout,
                             budget=budget if method.runtime else None, worker_args=flags)
        res["budget_bytes"] = budget
        return res

    ref = run(METHODS["plain"], "plain-fits", None)
    # plain PyTorch's peak reserved bytes (a CPU run has none: there, the parameter, gradient and AdamW bytes)
    ws = C.sized_working_set(NAME, ref, dry, hint=" (the reference is plain PyTorch without a cap)")
    t_ref, _ = steady(ref["iter_s"], work.warmup)
    # the seconds a run needs before its first iteration, from the reference (start-up, model build)
    startup = max(0.0, ref["wall_s"] - sum(ref["iter_s"]))
    need = startup + 2 * (t_ref or 0) + 10.0
    if not dry and args.oversub is None and args.budget >= ws:
        C.fail(NAME, f"--budget {args.budget} is not below the working set ({ws} bytes): nothing to oversubscribe")
    if dry:  # no cap on the CPU: one setting, named after the first ratio asked for
        settings = [("budget" if args.oversub is None else f"{args.oversub[0]:g}", None)]
    elif args.oversub is None:
        settings = [(f"{ws / args.budget:.2f}", args.budget)]
    else:
        settings = [(f"{r:g}", int(ws / r)) for r in args.oversub]

    ds_why = deepspeed_state() if "deepspeed-offload" in args.methods else ""
    rows: list[dict] = [{"method": "plain", "oversub": "fits", "budget": None, "res": ref, "skipped": ""}]
    for label, budget in settings:
        for name in RUN_ORDER:
            if name not in args.methods:
                continue
            row = {"method": name, "oversub": label, "budget": budget, "res": None, "skipped": ""}
            rows.append(row)
            left = args.deadline - (time.monotonic() - start)
            if name == "deepspeed-offload":
                row["skipped"] = ds_why
            elif left < need:
                row["skipped"] = (f"skipped: {left:.0f} s left of --deadline {args.deadline:g}, a run needs "
                                  f"~{need:.0f} s")
            else:
                row["res"] = run(METHODS[name], f"{name}-at-{label}x", budget)
    return report(args, work, rows, ws, t_ref, exact_run, ds_why)


# ----------------------------------------------------------------------------------------------- output

def report(args, work: C.Workload, rows: list[dict], ws: int, t_ref: float, exact_run: bool, ds_why: str) -> int:
    dry = args.dry_run
    ref = rows[0]["res"]
    checks: list[C.Check] = []
    table, cases = [], []
    env = C.environment(dry)
    model = f"{work.model}-{work.config}"
    groups = list(dict.fromkeys(r["oversub"] for r in rows))
    for row in sorted(rows, key=lambda r: (groups.index(r["oversub"]), list(METHODS).index(r["method"]))):
        m, res, label = METHODS[row["method"]], row["res"], row["oversub"]
        title = f"{m.name}@{label}x" if label != "fits" else "plain (no cap)"
        if res is None:
            table.append([m.name, label, gib(row["budget"]), "-", "-", "-", "-", "-", "-", "-", 0, row["skipped"]])
            checks.append(C.Check(f"{title} ran", row["skipped"], "ran", None if m.name == "deepspeed-offload"
                                  else False))
            continue
        is_ref = res is ref
        # a dry run has every optimizer on the CPU; --deterministic leaves the methods that differ anyway
        exact = dry or (exact_run and m.always_why is None)
        expect_oom = m.name == "plain" and not is_ref and not dry
        v = judge(res, m, None if is_ref else ref, warmup=work.warmup, exact=exact, expect_oom=expect_oom)
        row["verdict"] = v
        t = v["s_per_iter"]
        pinned = res.get("host_pinned_peak_bytes")
        notes = [v["note"], v["problem"]]
        if v["status"] == "OOM":
            notes.insert(0, f"out of memory at {v['oom_at']}" + (" (expected)" if expect_oom else ""))
        if dry and not is_ref:
            notes.append("dry run: no cap" if m.runtime is None else "dry run: peak of the modelled GPU, no budget")
        if m.name == "checkpoint+offload":
            notes.append(helps(rows, row))
        table.append([m.name, label, gib(row["budget"]), "OOM" if v["status"] == "OOM" else fmt(t),
                      fmt(t / t_ref) if t and t_ref else "-", gib(v["peak_gpu_bytes"]),
                      {True: "yes", False: "NO", None: "-"}[v["within_budget"]], gib(pinned),
                      " ".join(f"{x:.6g}" for x in res.get("losses", [])[:3]) or "-",
                      "reference" if is_ref else losses_cell(v["losses"], exact, m), len(res.get("iter_s") or []),
                      "; ".join(filter(None, notes))])
        if is_ref:
            checks.append(C.Check("plain (no cap) ran", "ok", "ok", True, f"working set {gib(ws)} GiB"
                                  + (" (dry run: the optimizer state; no cap)" if dry else "")))
        elif expect_oom:
            checks.append(C.Check(f"{title} runs out of memory", v["status"], "OOM", v["status"] == "OOM",
                                  v["problem"]))
        else:
            # a native alternative that runs out of memory under the budget is a finding, not a script failure;
            # the runtime modes must train (that is the product)
            ran_ok = v["status"] == "ok" or (v["status"] == "OOM" and m.runtime is None)
            checks.append(C.Check(f"{title} trains under the budget", v["status"], "ok (OOM: a finding)",
                                  ran_ok and not v["problem"], v["problem"]))
        if v["within_budget"] is not None:
            checks.append(C.Check(f"{title} peak GPU within budget", gib(v["peak_gpu_bytes"]),
                                  f"<= {gib(row['budget'])} GiB", v["within_budget"]))
        if v["losses"].get("n"):
            checks.append(C.Check(f"{title} losses vs plain", losses_cell(v["losses"], exact, m),
                                  "bit-equal" if exact else f"rel <= {RTOL:g}",
                                  v["losses"]["ok"]))
        cases.append(baseline_case(row, m, v, res, model, t_ref, exact, is_ref))
    targets = product_targets(rows, dry)
    checks += targets
    payload = {"workload": work.__dict__, "working_set_bytes": ws, "plain_s": t_ref, "deterministic": exact_run,
               "time_source": "CPU wall clock (dry run)" if dry else "GPU wall clock",
               "deepspeed": ds_why, "targets": [t.__dict__ for t in targets],
               "rows": [{k: v for k, v in r.items() if k != "res"} | {"run": slim(r["res"])} for r in rows]}
    out = C.out_dir(args)
    plot = draw(rows, t_ref, out / f"{NAME}.png", f"{model} b{work.batch}x{work.seq} {work.dtype}"
                + (" [dry run: CPU wall clock, no cap]" if dry else ""),
                (lambda g: "dry run (no cap)") if dry else (lambda g: f"budget = working set / {g}"))
    payload["plot"] = str(plot) if plot else None
    path = B.path_for(dry, args.baseline)
    B.update(path, env.get("device"), env, cases)
    print(f"plot: {plot or 'not drawn (matplotlib missing)'}\nbaseline: {path} ({len(cases)} cases)")
    headers = ["method", "oversub", "budget GiB", "s/iter", "x plain", "peak GPU GiB", "within budget",
               "host pinned GiB", "first losses", "= plain", "iters", "note"]
    return C.finish(args, NAME, payload, headers, table, checks)


def helps(rows: list[dict], row: dict) -> str:
    """Whether adding offload to checkpointing lowers the peak at this budget (the issue runs it "where it
    helps": this row says whether it did)."""
    other = next((r for r in rows if r["method"] == "checkpoint" and r["oversub"] == row["oversub"]), None)
    a = ((other or {}).get("verdict") or {}).get("peak_gpu_bytes")
    b = (row.get("verdict") or {}).get("peak_gpu_bytes")
    if a is None or b is None:
        return ""
    return (f"peak {gib(a - b)} GiB below checkpoint's" if b < a else
            f"helps nothing: peak not below checkpoint's {gib(a)} GiB")


def product_targets(rows: list[dict], dry: bool) -> list[C.Check]:
    """Issue target: uvmprefetch faster than every alternative that needs a code change, at each budget
    (n/a in a dry run: CPU times say nothing of a GPU)."""
    out = []
    for label in sorted({r["oversub"] for r in rows if r["oversub"] != "fits"}):
        at = {r["method"]: r.get("verdict") for r in rows if r["oversub"] == label}
        u = (at.get("uvmprefetch") or {}).get("s_per_iter")
        alts = {k: v["s_per_iter"] for k, v in at.items() if v and METHODS[k].code_change and v["s_per_iter"]}
        if not alts:
            continue
        best = min(alts, key=alts.get)
        value = (f"uvmprefetch {u:.3g} s vs {best} {alts[best]:.3g} s" if u else "uvmprefetch did not train")
        out.append(C.Check(f"uvmprefetch faster than every code-change alternative @{label}x", value,
                           "uvmprefetch < each", None if dry else bool(u) and u < alts[best],
                           "dry run: CPU times" if dry else ""))
    return out


def baseline_case(row: dict, m: Method, v: dict, res: dict, model: str, t_ref: float, exact: bool,
                  is_ref: bool) -> dict:
    rep = res.get("report") or {}
    iters = rep.get("iterations") or len(res.get("iter_s") or []) or None

    def per_iter(key):
        x = rep.get(key)
        return None if x is None or not iters else x / iters / GIB
    ot, n = rep.get("observe_time") or {}, rep.get("launches")
    label = row["oversub"]
    return B.case(f"alt/{m.name}/{label}", model=model, budget_bytes=row["budget"],
                  oversub=float(label) if label.replace(".", "", 1).isdigit() else None, policy=m.runtime,
                  discards=False if m.runtime else None, iterations=len(res.get("iter_s") or []),
                  s_per_iter_median=v["s_per_iter"], plain_s_per_iter=t_ref,
                  losses_bit_equal_plain=True if is_ref else v["losses"].get("bit_equal"),
                  htod_gib_per_iter=per_iter("bytes_htod"), dtoh_gib_per_iter=per_iter("bytes_dtoh"),
                  host_us_per_launch=ot["after_op_s"] / n * 1e6 if ot.get("after_op_s") is not None and n else None,
                  training_thread_wait_s=C.report_get(rep, "backend_result.mover_wait_s"),
                  method=m.name, status=v["status"], peak_gpu_bytes=v["peak_gpu_bytes"],
                  host_pinned_bytes=res.get("host_pinned_peak_bytes"),
                  losses_first=(res.get("losses") or [])[:3], loss_check="bit-equal" if exact else f"rtol {RTOL:g}",
                  code_change=m.code_change)


def draw(rows: list[dict], t_ref: float, path: Path, title: str, group_label) -> Path | None:
    """Bars per method (grouped by budget), log seconds per iteration, a line at the plain time; a run that
    did not train is labelled where its bar would be."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    labels = [r["oversub"] for r in rows if r["oversub"] != "fits"]
    groups = list(dict.fromkeys(labels))
    names = [n for n in METHODS if n != "plain" or any(r["method"] == "plain" and r["oversub"] != "fits"
                                                        for r in rows)]
    fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(names) * len(groups), 4.2))
    width = 0.8 / max(1, len(groups))
    for gi, label in enumerate(groups):
        by = {r["method"]: r for r in rows if r["oversub"] == label}
        xs, ys, tags = [], [], []
        for i, n in enumerate(names):
            r = by.get(n)
            x = i + (gi - (len(groups) - 1) / 2) * width
            t = (r.get("verdict") or {}).get("s_per_iter") if r else None
            if t:
                xs.append(x)
                ys.append(t)
            elif r:
                tags.append((x, (r.get("verdict") or {}).get("status") or "skipped"))
        bars = ax.bar(xs, ys, width * 0.9, label=group_label(label))
        ax.bar_label(bars, labels=[f"{y:.3g}" for y in ys], fontsize=7)
        for x, tag in tags:
            ax.text(x, t_ref, tag, rotation=90, ha="center", va="bottom", fontsize=8)
    ax.axhline(t_ref, color="k", linestyle="--", linewidth=1, label=f"plain, no cap ({t_ref:.3g} s)")
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    ax.set_ylabel("seconds per iteration (median, steady)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def slim(res: dict | None) -> dict | None:
    """A run's result for the JSON file: its stderr only where it failed."""
    if res is None:
        return None
    return {k: v for k, v in res.items() if k != "stderr_tail" or not C.run_ok(res)[0]}


def gib(n) -> str:
    return "-" if n is None else f"{n / GIB:.2f}"


def fmt(x) -> str:
    return "-" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.4g}"


if __name__ == "__main__":
    sys.exit(main())
