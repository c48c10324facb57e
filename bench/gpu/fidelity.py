"""Simulator fidelity: predicted vs measured iteration time for the same runs (issue 6, item 5).

Each live run under the runtime is recorded (``UVMPREFETCH_TRACE``) and then replayed in the simulator
(``uvmprefetch.sim.replay.replay``) with the same policy and a capacity equal to the run's budget, on the GPU
profile calibrated by ``calibrate.py`` (``--profile``). The steady-state median iteration time the simulator
predicts is compared with the one measured; the error per case is ``predicted / measured - 1``.
The error is split into the compute model (the replay's infinite-memory time vs the reference run that fits,
both over that run's steady iterations: from ``max(warmup, 2)`` on, since iterations 0 and 1 still pay
start-up and first-touch faults) and the memory model (slowdown over that reference). Oversubscription is
shown as each side defines it, identically: distinct blocks touched / capacity blocks (the replay's
``oversub`` vs the live report's ``backend_result.oversub``), with both footprints.
Target: within +-20 %. Where a case misses it, the table's fault/transfer columns (replay vs runtime report)
show which cost the model gets wrong.

Runs come from ``--from RUN/oversub.json`` (an ``oversub.py --trace`` result: no new GPU time) or
are made here (``--config``, ``--ratios``, ``--modes``). ``--cases`` needs no GPU: it replays every case of
``bench/baselines/gpu.json`` from a trace re-recorded on the CPU and writes each one's ``fidelity`` field there
(``_fidelity_cases.py`` says how; docs/simulator.md "Fidelity" has the figures). In ``--dry-run`` the "measured"
side is the dryrun backend's simulated GPU driven live, so the check is that the live runtime path and the offline
replay agree.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import _common as C

NAME = "fidelity"
EPILOG = """\
examples:
  python bench/gpu/fidelity.py --profile RUN/calibrate.json                       # own runs, GPT-2 medium
  python bench/gpu/fidelity.py --from RUN/oversub.json --profile RUN/calibrate.json
  python bench/gpu/fidelity.py --dry-run
  python bench/gpu/fidelity.py --cases                     # every case of bench/baselines/gpu.json, on the CPU
"""
TARGET = 0.20


def load_profile(path: Path | None, device: str, dry_run: bool):
    """(GpuProfile, description): the calibrated profile from calibrate.json, or the uncalibrated default."""
    from uvmprefetch.gpus import get_profile
    import calibrate
    if dry_run and path is None:
        # The dryrun backend simulates UVMPREFETCH_GPU (default h100-pcie): replay must use the same numbers.
        return get_profile("h100-pcie"), "h100-pcie (the dryrun backend's profile)"
    from uvmprefetch.gpus import PROFILES
    if path is None:
        # the device's hand-fitted profile where gpus.py has one (h100-sxm on an H100 SXM: calibrate.py's own atan
        # fit failed there), else the literature numbers
        name = calibrate.base_profile_for(device)
        if PROFILES[name].calibrated:
            cal = PROFILES[name]
            return cal, f"{cal.name} (uvmprefetch/gpus.py: {cal.calibrated})"
        return get_profile(name), f"{name} (UNCALIBRATED: no --profile given)"
    from uvmprefetch.gpus import ALIASES
    if not Path(path).exists() and (str(path) in PROFILES or str(path) in ALIASES):  # a profile by name, e.g. h100-sxm
        g = get_profile(str(path))
        return g, f"{g.name} (uvmprefetch/gpus.py: {g.calibrated or 'literature'})"
    try:
        cal = json.loads(Path(path).read_text())
        # calibrate.py fits the literature's fault model: its overrides apply to the card's NAME-lit profile (files
        # written before the profiles were renamed name the card alone)
        from uvmprefetch.gpus import card_name
        lit = card_name(cal["base_profile"]) + "-lit"
        base = get_profile(lit if lit in PROFILES else cal["base_profile"])
        return base.with_overrides(**cal["profile_overrides"]), f"{base.name} calibrated by {path}"
    except (OSError, ValueError, KeyError) as e:
        C.fail(NAME, f"--profile {path}: not a calibrate.py result ({type(e).__name__}: {e})")


def predict(run: dict, profile, warmup: int, host=None) -> dict:
    """Replay ``run``'s trace with its policy and budget; the steady-state median iteration time and figures.

    ``ideal_s`` (infinite memory) is over the reference's steady iterations (``C.steady_reference``), so the
    compute error compares the same iterations on both sides. The replay drops dead data only where the live
    run did (its report's ``discards_issued``; the cuda backend's default issues discards as evictions), so
    both sides pay the same write-backs and returns of freed memory."""
    from uvmprefetch.sim.replay import replay
    from uvmprefetch.trace.format import load
    trace = load(run["trace"])
    discards = bool(((run.get("report") or {}).get("backend_result") or {}).get("discards_issued", True))
    t0 = time.perf_counter()
    res = replay(trace, run["policy"], gpu=profile, capacity_bytes=int(run["budget"]), host=host,
                 discards=discards)
    times = res.get("iteration_times_s") or []
    ideal = res.get("ideal_iteration_times_s") or []
    keep = ("faults", "bytes_htod", "bytes_dtoh", "stall_s", "accuracy", "coverage", "oversub", "footprint_bytes",
            "allocator", "host_stall_s", "host_decision_s", "host_blocked_s")
    return {"predicted_s": C.steady_median(times, warmup),
            "ideal_s": C.steady_reference(ideal, warmup)[0] if ideal else float("nan"),
            "replay_iters": len(times), "replay_wall_s": time.perf_counter() - t0, "discards": discards,
            **{k: res.get(k) for k in keep}}


def main(argv=None) -> int:
    p = C.parser(NAME, __doc__.split("\n\n")[0], EPILOG)
    p.add_argument("--profile", type=Path, default=None,
                   help="a calibrate.py run's calibrate.json, or a gpus.py profile name "
                        "(h100-sxm: the H100 costs fitted by hand where calibrate.py's atan fit failed)")
    p.add_argument("--host", default=None, metavar="MODEL",
                   help="the simulator's host clock (docs/simulator.md 'Host clock'): live-sync charges the "
                        "observation, decision time, blocking evictions, prefetch calls and discards the synchronous "
                        "runtime paid on the H100, live the runtime's threads; default free (the host never limits); "
                        "with --cases default live-sync (the runtime the cases ran)")
    p.add_argument("--cases", nargs="?", const=".", default=None, metavar="REGEX",
                   help="replay every case of --baseline (default bench/baselines/gpu.json; those whose name matches "
                        "REGEX) from a trace recorded here on the CPU, and write its fidelity field there")
    p.add_argument("--baseline", type=Path, default=None, help="with --cases: the GPU baseline file")
    p.add_argument("--trace-cache", type=Path, default=None,
                   help="with --cases: where the recorded traces are kept (default ~/.cache/uvmprefetch/fidelity)")
    p.add_argument("--from", dest="from_", type=Path, default=None,
                   help="an oversub.py --trace result JSON: replay its runs instead of making new ones")
    C.add_workload_arguments(p, config="medium", iters=8, warmup=3)
    p.add_argument("--ratios", default="1.5,2")
    p.add_argument("--modes", default="managed,uvmprefetch", help="subset of managed,deepum,uvmprefetch")
    p.add_argument("--timeout", type=float, default=240.0, help="seconds allowed per training run")
    p.add_argument("--deadline", type=float, default=480.0,
                   help="seconds for the live runs (own runs only): runs are cut to what is left and later "
                        "cases skipped, so the replay and the result still happen inside one device call")
    args = p.parse_args(argv)
    start = time.monotonic()
    if args.cases is not None:
        return cases_main(args)
    args.host = args.host or "free"
    C.require_gpu(args, NAME)
    env = C.environment(args.dry_run)
    profile, prof_desc = load_profile(args.profile, env.get("device", ""), args.dry_run)
    from uvmprefetch.cli.replay import host_from_args
    from uvmprefetch.errors import ConfigError
    try:
        host = host_from_args(args)
    except ConfigError as e:
        C.fail(NAME, str(e))

    checks_skipped: list[str] = []
    if args.from_ is not None:
        try:
            src = json.loads(args.from_.read_text())
            runs = [r for r in src["runs"] if r.get("policy") and r.get("budget")]  # not the unbudgeted probe
            warmup = src["workload"]["warmup"]
            ref_runs = [r for r in src["runs"] if not r.get("budget")]  # oversub.py's plain/unbudgeted probe
            ref_times = C.iteration_times(ref_runs[0], args.dry_run)[0] if ref_runs else []
            if ref_times:
                t_ref, ref_iters = C.steady_reference(ref_times, warmup)
            else:  # an oversub.json without the probe's times: its plain_s (iterations >= warmup)
                t_ref, ref_iters = float(src["plain_s"]), f"oversub.py plain_s (iterations >= {warmup})"
        except (OSError, ValueError, KeyError) as e:
            C.fail(NAME, f"--from {args.from_}: not an oversub.py result ({type(e).__name__}: {e})")
        if src.get("env", {}).get("dry_run", False) != args.dry_run:
            C.fail(NAME, f"--from {args.from_}: made {'with' if not args.dry_run else 'without'} --dry-run, "
                         "unlike this run")
        if not src.get("traced"):
            C.fail(NAME, f"--from {args.from_}: made without --trace; run oversub.py with --trace")
        work_desc = src["workload"]
    else:
        try:
            ratios = [float(x) for x in args.ratios.split(",") if x.strip()]
        except ValueError:
            C.fail(NAME, f"--ratios {args.ratios!r}: expected numbers like 1.5,2")
        if not ratios or any(r <= 1 for r in ratios):
            C.fail(NAME, f"--ratios {args.ratios!r}: each must be > 1")
        modes = [m.strip() for m in args.modes.split(",") if m.strip()]
        if not modes or any(m not in ("managed", "deepum", "uvmprefetch") for m in modes):
            C.fail(NAME, f"--modes {args.modes!r}: choose from managed, deepum, uvmprefetch")
        work = C.tiny_workload(iters=3, foreach="off") if args.dry_run else C.Workload(
            args.model, args.config, args.batch, args.seq, args.iters, args.warmup, args.dtype, foreach="off")
        warmup = work.warmup
        work_desc = work.__dict__
        wdir = C.out_dir(args) / "fidelity-runs"
        run = lambda mode, case, **kw: C.run_training(mode, work, wdir, case, seed=args.seed, dry_run=args.dry_run,
                                                     timeout=args.timeout, **kw)
        # The reference that fits: plain PyTorch on a GPU; in a dry run an unbudgeted managed run (its report
        # has the peak managed bytes and the modelled GPU's time; the CPU has neither).
        plain = run("managed", "unbudgeted") if args.dry_run else run("plain", "plain")
        if not C.run_ok(plain)[0]:
            C.fail(NAME, f"reference run failed ({C.run_ok(plain)[1]}); pick a smaller workload", 1)
        ws = C.working_set_bytes(plain)
        t_ref, ref_iters = C.steady_reference(C.iteration_times(plain, args.dry_run)[0], warmup)
        if ws <= 0:
            C.fail(NAME, "no working-set figure: the sizing run reported no peak bytes", 1)
        runs = []
        for ratio in ratios:
            for mode in modes:
                left = args.deadline - (time.monotonic() - start)
                if left <= 0:
                    checks_skipped.append(f"{mode}@{ratio:g}x")
                    continue
                r = C.run_training(mode, work, wdir, f"{mode}-at-{ratio:g}x", seed=args.seed, dry_run=args.dry_run,
                                   timeout=max(30.0, min(args.timeout, left)), budget=int(ws / ratio), trace=True)
                r.update(ratio=ratio, case=f"{mode}@{ratio:g}x")
                runs.append(r)

    checks, rows, cases = [], [], []
    for r in runs:
        ok, why = C.run_ok(r) if "returncode" in r else (True, "")
        if ok and not (r.get("trace") and Path(r["trace"]).exists()):
            ok, why = False, "no trace recorded (UVMPREFETCH_TRACE wrote nothing)"
        if not ok:
            checks.append(C.Check(f"{r['case']} prediction", why, f"within +-{TARGET:.0%}", False))
            rows.append([r["case"], r.get("budget"), "-", "-", "-", "-", "-", "-", "-", "-", "-", why])
            continue
        times, source = C.iteration_times(r, args.dry_run)
        measured = C.steady_median(times, warmup)
        try:
            pred = predict(r, profile, warmup, host)
        except Exception as e:  # noqa: BLE001 - one bad replay is a finding for that case, not a crash
            checks.append(C.Check(f"{r['case']} prediction", f"replay failed: {type(e).__name__}: {e}",
                                  f"within +-{TARGET:.0%}", False))
            rows.append([r["case"], r.get("budget"), measured * 1e3, "-", "-", "-", "-", "-", "-", "-", "-",
                         f"replay: {e}"])
            continue
        err = pred["predicted_s"] / measured - 1.0
        # Split the error: compute model (replay's infinite-memory time vs the run that fits) and memory model
        # (slowdown over that reference, predicted vs measured); err + 1 = (compute + 1) * (slowdown ratio).
        compute_err = pred["ideal_s"] / t_ref - 1.0
        slow_sim, slow_live = pred["predicted_s"] / pred["ideal_s"], measured / t_ref
        rep_faults = C.report_get(r.get("report"), "faults", "expected_faults", default="-")
        # Oversubscription as each side sees it, one definition (distinct blocks touched / capacity blocks): a
        # replay layout with another footprint than the live address space faults more or less at the same
        # budget, whatever the cost model. (peak_managed_bytes / budget is another figure: whole-block rounding.)
        live_over = C.report_get(r.get("report"), "backend_result.oversub")
        live_fp = C.report_get(r.get("report"), "backend_result.footprint_bytes")
        mib = lambda b: f"{b / 2**20:.0f}" if b else "-"  # noqa: E731
        rows.append([r["case"], r["budget"], measured * 1e3, pred["predicted_s"] * 1e3, f"{err:+.1%}",
                     f"{compute_err:+.1%}", f"{slow_sim:.2f} / {slow_live:.2f}",
                     f"{pred['oversub']:.2f} / " + (f"{live_over:.2f}" if live_over else "-") if pred.get("oversub")
                     else "-", f"{mib(pred.get('footprint_bytes'))} / {mib(live_fp)}",
                     f"{pred['faults']} / {rep_faults}",
                     f"{pred['bytes_htod']} / {C.report_get(r.get('report'), 'bytes_htod', default='-')}", source])
        checks.append(C.Check(f"{r['case']} prediction", f"{err:+.1%}", f"within +-{TARGET:.0%}",
                              abs(err) <= TARGET))
        cases.append({"case": r["case"], "policy": r["policy"], "budget": r["budget"], "measured_s": measured,
                      "measured_source": source, "error": err, "reference_s": t_ref, "compute_error": compute_err,
                      "slowdown_sim": slow_sim, "slowdown_live": slow_live, **pred, "oversub_live": live_over,
                      "footprint_bytes_live": live_fp, "report": r.get("report")})
    for case in checks_skipped:
        checks.append(C.Check(f"{case} prediction", "skipped: --deadline reached", f"within +-{TARGET:.0%}", False))
    if not runs:
        checks.append(C.Check("cases", 0, ">= 1", False))
    errs = [abs(c["error"]) for c in cases]
    payload = {"host": args.host, "profile": prof_desc, "profile_fields": {k: getattr(profile, k) for k in (
                   "link_htod_bw", "link_dtoh_bw", "fault_batch_latency_s", "launch_overhead_s", "calibrated")},
               "workload": work_desc, "cases": cases, "target": TARGET,
               "reference_s": t_ref, "reference_iterations": ref_iters,
               "max_abs_error": max(errs) if errs else None,
               "median_abs_error": statistics.median(errs) if errs else None}
    rows.append(["reference (fits)", "-", t_ref * 1e3, "-", "-", "-", "-", "-", "-", "-", "-",
                 f"compute reference: {ref_iters} of the {'unbudgeted dryrun' if args.dry_run else 'plain'} run "
                 "(earlier iterations pay start-up and first-touch faults)"])
    rows.append(["profile", prof_desc, "-", "-", "-", "-", "-", "-", "-", "-", "-", ""])
    return C.finish(args, NAME, payload, ["case", "budget B", "measured ms/iter", "predicted ms/iter", "error",
                                          "compute model error (steady iters)", "slowdown sim / live",
                                          "oversub sim / live (blocks touched / capacity)", "footprint MiB sim / live",
                                          "faults sim / live", "bytes H2D sim / live", "measured by"], rows, checks)


def cases_main(args) -> int:
    """``--cases``: the fidelity field of every case in the GPU baseline file (no GPU needed)."""
    import _fidelity_cases as F
    import baseline as B
    path = args.baseline or B.BASELINE
    host = args.host or "live-sync"
    try:
        data = B.load(path)
    except B.BaselineError as e:
        C.fail(NAME, str(e))
    if not data:
        C.fail(NAME, f"--baseline {path}: no cases")
    cache = args.trace_cache or Path.home() / ".cache" / "uvmprefetch" / "fidelity"
    try:
        done = F.run_cases(data, cache, host=host, only=None if args.cases == "." else args.cases)
    except Exception as e:  # noqa: BLE001 - one line, not a traceback
        C.fail(NAME, f"--cases: {type(e).__name__}: {e}", 1)
    rows, checks = [], []
    for device, entry in data.items():
        B.annotate(path, device, {c["name"]: {"fidelity": c["fidelity"]} for c in entry["cases"] if "fidelity" in c})
        for c in entry["cases"]:
            f = c.get("fidelity")
            if not f:
                continue
            if not f.get("replayed"):
                rows.append([device, c["name"], "-", "-", "-", "-", "-", f["why"]])
                continue
            rows.append([device, c["name"], f["measured_s_per_iter"], f["predicted_s_per_iter"], f"{f['error']:+.0%}",
                         "{} / {}".format(*f["htod_gib_per_iter"]), "{} / {}".format(*f["host_blocked_s_per_iter"]),
                         ""])
            checks.append(C.Check(f"{device[:12]} {c['name']}", f"{f['error']:+.1%}", f"within +-{TARGET:.0%}",
                                  f["within_target"]))
    headers = ["device", "case", "measured s/iter", "predicted s/iter", "error", "H2D GiB/iter sim / live",
               "evictions held s/iter sim / live", "not replayed"]
    out = C.out_dir(args) / f"{NAME}-cases.json"
    passed = all(c.ok is not False for c in checks)
    out.write_text(json.dumps({"script": f"bench/gpu/{NAME}.py --cases", "host": host, "baseline": str(path),
                               "cases": done, "table": {"headers": headers, "rows": rows},
                               "checks": [c.__dict__ for c in checks], "passed": passed}, indent=1) + "\n")
    print(f"\n## {NAME} --cases: {sum(len(v) for v in done.values())} cases replayed on this CPU with --host {host}; "
          f"wrote their fidelity fields to {path}")
    print(f"result: {out}")
    print(C.md_table(headers, rows))
    print()
    print(C.checks_table(checks))
    print(f"{NAME}: {'PASS' if passed else 'FAIL'}")
    return 0 if passed else C.EXIT_CHECK_FAILED


if __name__ == "__main__":
    sys.exit(main())
