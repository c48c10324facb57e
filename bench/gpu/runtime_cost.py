"""The live runtime's cost with the C++ observer, planner and mover threads (issue 8), in one run of <= 6 minutes.

1. **Fits**: GPT-2 medium (bf16, batch 8 x 1024) with a budget above its working set: plain PyTorch and
   ``UVMPREFETCH=1`` alternate ``--rounds`` times. The planner stays dormant (nothing needs to move), so the
   training thread pays no callback at all. Target: overhead <= 3 %.
2. **Oversubscribed**: GPT-2 large at ``--oversub`` (budget = the plain run's working set / 1.5): seconds per
   iteration, the host microseconds per launch the observer's callbacks add on the training thread (target
   <= 10 us), the eviction calls made on the training thread (must be 0: they run on the mover thread), the
   gate's waits and the monitor's late / faulting / wasted blocks.

Both cases run with deterministic kernels so that the losses under the runtime are compared bit for bit with
plain ones. Figures go into ``bench/baselines/gpu.json`` (dry run: ``out/gpu-dryrun/gpu.json``). Every run has
its own timeout and the whole script a time limit (``--time-limit``): a case that no longer fits is skipped
and says so. The C++ observer is built first, outside the timed runs (``UVMPREFETCH_OBSERVER=native`` makes a
run fail rather than fall back to the Python observer).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import _common as C
import baseline as B

NAME = "runtime_cost"
EPILOG = """\
examples:
  python bench/gpu/runtime_cost.py                     # GPT-2 medium fits, GPT-2 large at 1.5x (<= 6 min)
  python bench/gpu/runtime_cost.py --rounds 1 --over-iters 4
  python bench/gpu/runtime_cost.py --dry-run           # the same code path on the CPU (dryrun backend)
"""
FIT_TARGET = 0.03
HOST_US_TARGET = 10.0


def main(argv=None) -> int:
    p = C.parser(NAME, __doc__.split("\n\n")[0], EPILOG)
    p.add_argument("--fits-config", default="medium", help="GPT-2 size that fits (default medium)")
    p.add_argument("--over-config", default="large", help="GPT-2 size run oversubscribed (default large)")
    p.add_argument("--oversub", type=float, default=1.5, help="working set / budget of case 2 (default 1.5)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=2, help="plain/runtime pairs of case 1 (default 2)")
    p.add_argument("--fits-iters", type=int, default=20)
    p.add_argument("--over-iters", type=int, default=6)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--time-limit", type=float, default=330.0, help="seconds for the whole script (default 330)")
    p.add_argument("--baseline", type=Path, default=None, help="baseline file to update (default: per --dry-run)")
    args = p.parse_args(argv)
    C.require_gpu(args, NAME)
    if args.oversub <= 1.0 or args.rounds < 1 or min(args.fits_iters, args.over_iters) <= args.warmup:
        C.fail(NAME, "need --oversub > 1, --rounds >= 1 and --fits-iters/--over-iters > --warmup")
    t_start = time.perf_counter()
    try:
        from uvmprefetch.runtime import native, native_observer
        lib = native_observer.load(say=lambda m: print(f"{NAME}: {m}", file=sys.stderr))
    except native.NativeBuildError as e:
        C.fail(NAME, f"the C++ observer cannot be built here: {e}")

    if args.dry_run:
        fits = C.tiny_workload(iters=3, deterministic=True)
        over = C.tiny_workload(iters=3, deterministic=True, foreach="off")
    else:
        common = dict(model="gpt2", batch=args.batch, seq=args.seq, dtype="bf16", deterministic=True,
                      warmup=args.warmup)
        fits = C.Workload(config=args.fits_config, iters=args.fits_iters, **common)
        over = C.Workload(config=args.over_config, iters=args.over_iters, foreach="off", **common)
    tmp = Path(tempfile.mkdtemp(prefix="uvmp-runtime-cost-"))
    native_env = {"UVMPREFETCH_OBSERVER": "native", "UVMPREFETCH_LOG": "info"}
    skipped: list[str] = []

    def left() -> float:
        return args.time_limit - (time.perf_counter() - t_start)

    def run(mode, work, case, timeout, **kw):
        if left() < 20:
            skipped.append(case)
            return None
        return C.run_training(mode, work, tmp, case, seed=args.seed, dry_run=args.dry_run,
                              timeout=min(timeout, left()), extra_env=native_env if mode != "plain" else None, **kw)

    # ------------------------------------------------------------------ case 1: the model fits
    runs1 = [run("plain", fits, "fits-plain-0", 120)]
    ws1 = C.working_set_bytes(runs1[0]) if runs1[0] else 0
    budget1 = int(ws1 * (16 if args.dry_run else 1.5))
    if not args.dry_run and ws1:
        free = C.environment(False).get("gpu_free_bytes_at_start", 0)
        if ws1 * 1.05 > 0.9 * free:
            C.fail(NAME, f"GPT-2 {args.fits_config} needs {ws1 / 2**30:.1f} GiB, more than 90 % of the free "
                         f"{free / 2**30:.1f} GiB: pick a smaller --fits-config or --batch", 1)
        budget1 = min(budget1, int(0.9 * free))
    runs1.append(run("uvmprefetch", fits, "fits-uvm-0", 120, budget=budget1))
    for r in range(1, args.rounds):
        runs1 += [run("plain", fits, f"fits-plain-{r}", 120), run("uvmprefetch", fits, f"fits-uvm-{r}", 120,
                                                                   budget=budget1)]
    runs1 = [r for r in runs1 if r is not None]

    # ------------------------------------------------------------------ case 2: oversubscribed
    plain2 = run("plain", over, "over-plain", 120)
    ws2 = C.working_set_bytes(plain2) if plain2 else 0
    budget2 = int(ws2 / args.oversub)
    uvm2 = run("uvmprefetch", over, "over-uvm", 240, budget=budget2) if ws2 else None

    # ------------------------------------------------------------------ checks, table, baseline
    checks, rows = [], []
    every = runs1 + [r for r in (plain2, uvm2) if r is not None]
    bad = [(r["case"], C.run_ok(r)[1]) for r in every if not C.run_ok(r)[0]]
    checks.append(C.Check("all runs ok (runtime active and not degraded where on)",
                          "; ".join(f"{c}: {w}" for c, w in bad) or "ok", "ok", not bad))
    if skipped:
        checks.append(C.Check("runs within the time limit", f"skipped: {', '.join(skipped)}",
                              f"<= {args.time_limit:.0f} s", None, "the time limit ran out: rerun the rest"))
    for r in every:
        rep = r.get("report") or {}
        checks_native = rep.get("observer", {}).get("kind")
        if r["policy"] is not None and checks_native != "native":
            checks.append(C.Check(f"{r['case']}: C++ observer", checks_native, "native", False))
        rows.append([r["case"], r["workload"]["config"], r["budget"] or "-",
                     steady(r, fits if r["case"].startswith("fits") else over), *runtime_figures(rep)])

    cases = []
    plain1 = [r for r in runs1 if r["mode"] == "plain" and C.run_ok(r)[0]]
    uvm1 = [r for r in runs1 if r["mode"] != "plain" and C.run_ok(r)[0]]
    if plain1 and uvm1:
        t_plain = statistics.median(x for r in plain1 for x in r["iter_s"][fits.warmup:])
        t_uvm = statistics.median(x for r in uvm1 for x in r["iter_s"][fits.warmup:])
        overhead = t_uvm / t_plain - 1.0
        same = all(r["losses_hex"] == plain1[0]["losses_hex"] for r in uvm1)
        checks.append(C.Check("fits: overhead vs plain", f"{overhead:+.2%}", f"<= {FIT_TARGET:.0%}",
                              None if args.dry_run else overhead <= FIT_TARGET,
                              "dry-run: CPU timings, target not applicable" if args.dry_run else ""))
        checks.append(C.Check("fits: losses bit-equal to plain", same, "True", same))
        rep = uvm1[-1]["report"] or {}
        cases.append(B.case(f"native-fits-gpt2-{fits.config}", model=f"gpt2-{fits.config}", budget_bytes=budget1,
                            oversub=round(ws1 / budget1, 4) if budget1 else None, policy=rep.get("policy"),
                            discards=False, iterations=fits.iters, s_per_iter_median=t_uvm, plain_s_per_iter=t_plain,
                            losses_bit_equal_plain=same, host_us_per_launch=runtime_figures(rep)[1],
                            training_thread_wait_s=runtime_figures(rep)[4], observer="native",
                            planner_dormant=planner(rep).get("woke") is None and planner(rep).get("dormant")))
    if plain2 and uvm2 and C.run_ok(plain2)[0] and C.run_ok(uvm2)[0]:
        t_plain, t_uvm = steady(plain2, over), steady(uvm2, over)
        rep = uvm2["report"] or {}
        fig = runtime_figures(rep)
        same = uvm2["losses_hex"] == plain2["losses_hex"]
        checks.append(C.Check("oversubscribed: losses bit-equal to plain", same, "True", same))
        checks.append(C.Check("oversubscribed: host us per launch (callbacks)", fig[1], f"<= {HOST_US_TARGET:g}",
                              None if args.dry_run or fig[1] is None else fig[1] <= HOST_US_TARGET,
                              "dry-run: CPU timings" if args.dry_run else ""))
        ev_main = fig[5]
        checks.append(C.Check("oversubscribed: eviction calls on the training thread", ev_main, "0",
                              None if ev_main is None else ev_main == 0,
                              "dry-run: no mover (simulated GPU)" if args.dry_run else ""))
        iters = max(1, rep.get("iterations") or over.iters)
        gib = 2 ** 30
        mon = rep.get("monitor") or []
        cases.append(B.case(f"native-oversub-gpt2-{over.config}-{args.oversub:g}x", model=f"gpt2-{over.config}",
                            budget_bytes=budget2, oversub=round(ws2 / budget2, 4), policy=rep.get("policy"),
                            discards=False, iterations=over.iters, s_per_iter_median=t_uvm,
                            plain_s_per_iter=t_plain, losses_bit_equal_plain=same,
                            htod_gib_per_iter=(rep.get("bytes_htod") or 0) / gib / iters,
                            dtoh_gib_per_iter=(rep.get("bytes_dtoh") or 0) / gib / iters,
                            host_us_per_launch=fig[1], training_thread_wait_s=fig[4], observer="native",
                            eviction_calls_on_training_thread=ev_main, gate_waits=fig[2],
                            late_blocks=sum(m.get("late_blocks") or 0 for m in mon) if mon else None,
                            fault_blocks=sum(m.get("fault_blocks") or 0 for m in mon) if mon else None,
                            evicted_unused_blocks=sum(m.get("evicted_unused_blocks") or 0 for m in mon) if mon
                            else None, dropped_records=fig[3],
                            training_parked_s=planner(rep).get("training_parked_s"),
                            planner_shed_s=planner(rep).get("shed_s")))
    env = C.environment(args.dry_run)
    if cases:
        B.update(B.path_for(args.dry_run, args.baseline), env.get("device") or "cpu (dry-run)", env, cases)
    payload = {"workloads": {"fits": fits.__dict__, "over": over.__dict__}, "budgets": [budget1, budget2],
               "working_sets": [ws1, ws2], "cases": cases, "skipped": skipped, "observer_library": lib.path,
               "runs": [{k: v for k, v in r.items() if k != "stderr_tail" or not C.run_ok(r)[0]} for r in every]}
    return C.finish(args, NAME, payload, ["case", "config", "budget B", "steady s/iter", "launches planned",
                                          "callback us/launch", "gate waits", "dropped records", "callback s",
                                          "evictions on training thread"], rows, checks)


def planner(rep: dict) -> dict:
    return ((rep or {}).get("observe_time") or {}).get("planner") or {}


def runtime_figures(rep: dict) -> list:
    """[launches planned, callback us per launch, gate waits, dropped records, callback seconds, eviction calls
    made on the training thread] of a runtime report (None where the run had no runtime or did not measure it)."""
    if not rep:
        return [None] * 6
    ot = rep.get("observe_time") or {}
    mover = C.report_get(rep, "backend_result.mover_calls_on_training_thread")
    ev = mover.get("to_host") if isinstance(mover, dict) else None
    return [rep.get("launches"), ot.get("callback_us_per_launch"), (ot.get("gate") or {}).get("waits"),
            ot.get("dropped_records"), ot.get("callback_s"), ev]


def steady(r: dict, work) -> float:
    xs = r.get("iter_s", [])[work.warmup:]
    return statistics.median(xs) if xs else float("nan")


if __name__ == "__main__":
    sys.exit(main())
