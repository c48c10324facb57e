"""Trace replay on a real GPU: touch kernels over managed memory, any trace, any online policy (issue 38).

Each trace's allocations become one managed arena laid out as the simulator lays them out; each launch runs a
touch kernel (``kernels/touch.cu``) that reads and writes exactly its byte ranges and then spins to its duration
(the simulator's, for the card's calibrated profile); launches run in order on one stream while the live
runtime's cuda backend, with the policy and a budget of ``footprint / --oversub``, moves blocks with its own
``Mover`` (``_replay_runtime.py``). Measured: GPU time (events), per-iteration times, stall (time beyond the
launches' durations), host time per launch, and faults and bytes each way where CUPTI runs (``null`` otherwise);
next to them the simulator's prediction for the same run (the same scaled trace, layout, durations, policy and
budget, without discards as the cuda backend's default, the host clock of ``--host``) and the error.

The arena never exceeds ``--max-fraction`` of the GPU memory free at start (the shared-GPU rule, docs/design.md §5):
a trace that does not fit at ``--scale`` is halved again until it does, and the result says so
(``uvmprefetch.trace.scale``: sizes, access ranges, FLOPs and durations shrink together). ``--dry-run`` replays
the shipped small trace on the CPU through the same loop and the same runtime over a fake CUDA driver
(``_replay_fake.py``), and checks that every launch touched exactly its bytes, once, in trace order. On both, the
bytes the kernels wrote are read back after the replay: a move that lost data fails the case.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

import _common as C
import baseline

NAME = "replay_gpu"
EPILOG = """\
examples:
  python bench/gpu/replay_gpu.py --standard --oversub 1.5 --policies demand,uvmprefetch --scale 1/8
  python bench/gpu/replay_gpu.py traces/gpt2-small-b2s128.uvmt --oversub 1.5,2 --policies uvmprefetch,deepum
  python bench/gpu/replay_gpu.py my.uvmt --host live-sync --profile h100-sxm-cal --no-baseline
  python bench/gpu/replay_gpu.py --dry-run
"""
SHIPPED = C.REPO / "traces" / "gpt2-small-b2s128.uvmt"
TARGET = 0.20  # fidelity target, as bench/gpu/fidelity.py
DRY_SCALE = "1/8"  # the dry run's default: the shipped trace's 2.7 GiB footprint becomes ~350 MiB of host arrays


def resolve_traces(args) -> list[tuple[str, Path]]:
    """(label, path) of every trace to replay: files as given, standard names recorded on demand."""
    from uvmprefetch.errors import ConfigError
    from uvmprefetch.trace.standard import STANDARD, standard_traces
    items = list(args.traces)
    if args.standard:
        items += [n for n in STANDARD if n not in items]
    if not items:
        items = [str(SHIPPED)] if args.dry_run else []
    if not items:
        C.fail(NAME, "no trace: give .uvmt files or standard trace names, or --standard")
    out = []
    for it in items:
        if it in STANDARD:
            try:
                path = standard_traces(args.trace_dir, progress=False, names=[it])[0]
            except ConfigError as e:
                C.fail(NAME, str(e))
            out.append((it, path))
        elif Path(it).is_file():
            out.append((Path(it).stem, Path(it)))
        else:
            C.fail(NAME, f"{it}: neither a trace file nor a standard trace ({', '.join(STANDARD)})")
    return out


def card_profile(device: str, override: str | None):
    """(profile, description): ``--profile``, else the card's hand-fitted ``*-cal`` profile of gpus.py."""
    import calibrate
    from uvmprefetch.errors import ConfigError
    from uvmprefetch.gpus import PROFILES, get_profile
    if override:
        try:
            prof = get_profile(override)
        except ConfigError as e:
            C.fail(NAME, f"--profile: {e}")
        return prof, f"{prof.name} (--profile)"
    name = calibrate.base_profile_for(device)
    cal = PROFILES.get(f"{name}-cal")
    if cal is not None:
        return cal, f"{cal.name} (uvmprefetch/gpus.py: {cal.calibrated})"
    return get_profile(name), f"{name} (UNCALIBRATED: gpus.py has no calibrated profile for {device})"


def check_policies(text: str) -> list[str]:
    from uvmprefetch.errors import ConfigError
    from uvmprefetch.policy import make_policy
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        C.fail(NAME, "--policies: give at least one policy")
    for n in names:
        try:
            pol = make_policy(n)
        except (ConfigError, ValueError) as e:
            C.fail(NAME, f"--policies: {e}")
        if pol.offline or pol.ideal:
            C.fail(NAME, f"--policies: {n} is a simulator baseline (offline or infinite memory); the live runtime "
                         "runs online policies only")
    return names


def fit_trace(trace, scale: float, cap: int, log):
    """(scaled trace, layout, plan, scale, note): ``trace`` at ``scale``, halved until its arena and chunk table
    fit in ``cap`` bytes."""
    from _replay_core import TABLE_DTYPE, touch_plan
    from uvmprefetch.sim.layout import build_layout
    from uvmprefetch.trace.scale import scale_trace
    asked, note = scale, ""
    while True:
        st = scale_trace(trace, scale)
        lay = build_layout(st)
        plan = touch_plan(st, lay.base)
        need = lay.max_blocks * (2 << 20) + plan.n_chunks * TABLE_DTYPE.itemsize
        if need <= cap:
            break
        if scale < 1e-4:
            C.fail(NAME, f"the trace does not fit in {cap >> 20} MiB even at scale {scale:.2g}", 5)
        log(f"at scale {scale:.4g} the arena and its chunk table take {need / 2**30:.2f} GiB, above the cap of "
            f"{cap / 2**30:.2f} GiB: halving the scale")
        scale /= 2
    if scale != asked:
        note = (f"scaled to {scale:.4g} (asked {asked:.4g}) to fit {cap / 2**30:.2f} GiB: sizes, access ranges, FLOPs "
                "and durations x scale")
    return st, lay, plan, scale, note


def host_model(spec: str, measured: dict):
    """The simulator's host clock for the prediction: ``measured`` = live-sync (decisions on the launching
    thread, timed in the simulator; evictions that hold it; a wait for the GPU at each iteration's end) with this
    run's own host seconds per launch outside them; else a ``--host`` spec."""
    from uvmprefetch.sim.engine import HOST_PRESETS, parse_host
    if spec == "measured":
        return dataclasses.replace(HOST_PRESETS["live-sync"], launch_s=float(measured["host_launch_s"]))
    return parse_host(spec)


def predict(run, profile, host) -> dict:
    from uvmprefetch.sim.replay import replay
    r = replay(run.trace, run.policy, gpu=profile, capacity_bytes=run.budget_bytes, layout=run.layout,
               durations=run.durations, discards=False, host=host)
    keep = ("time_s", "ideal_s", "slowdown", "stall_s", "host_stall_s", "faults", "bytes_htod", "bytes_dtoh",
            "prefetch_issued_bytes", "prefetch_useful_bytes", "accuracy", "coverage", "iteration_times_s",
            "oversub", "capacity_bytes", "footprint_bytes", "events_per_s")
    return {k: r.get(k) for k in keep}


def steady(times: list[float]) -> float | None:
    """The steady-state iteration time: the last iteration's, as ``uvmprefetch bench``'s ``steady_slowdown``
    (sim/replay.py). The caching allocator's layout settles at a trace's own iteration (2 for most standard traces,
    3 for T5 base: uvmprefetch/trace/standard.py); the last one is past it on each of them."""
    return times[-1] if times else None


def rel_err(pred, meas) -> float | None:
    return pred / meas - 1.0 if pred is not None and meas else None


def _gib(x) -> str:
    return "-" if x is None else f"{x / 2**30:.2f}"


def parse_args(argv):
    p = C.parser(NAME, __doc__.split("\n\n")[0], EPILOG)
    p.add_argument("traces", nargs="*",
                   help="trace files (.uvmt) or standard trace names (uvmprefetch/trace/standard.py)")
    p.add_argument("--standard", action="store_true",
                   help="also every standard trace (uvmprefetch/trace/standard.py; recorded on first use)")
    p.add_argument("--trace-dir", default=None,
                   help="cache of the standard traces (default ~/.cache/uvmprefetch/traces)")
    p.add_argument("--policies", default="demand,uvmprefetch", help="online policies (default demand,uvmprefetch)")
    p.add_argument("--oversub", default="1.5", help="footprint / budget ratios, comma-separated (default 1.5)")
    p.add_argument("--scale", default=None,
                   help=f"shrink every trace by this factor first (0.125, 1/8, 12.5%%; default 1, {DRY_SCALE} with "
                        "--dry-run); halved further where the arena would not fit")
    p.add_argument("--max-fraction", type=float, default=0.5,
                   help="most of the GPU's free memory the arena and its chunk table may take (default 0.5)")
    p.add_argument("--profile", default=None,
                   help="gpus.py profile for the durations and the prediction (default: the card's *-cal profile)")
    p.add_argument("--host", default="measured",
                   help="the prediction's host clock: measured (default: live-sync with this run's own host time per "
                        "launch), none, live-sync, or k=v pairs (docs/simulator.md 'Host clock')")
    p.add_argument("--hook", choices=("after", "before"), default="after",
                   help="when the runtime sees a launch: after its kernel was queued (default: as the live "
                        "runtime's observer sees an op) or before it (a what-if: the policy's prefetches for the "
                        "launch itself go out first)")
    p.add_argument("--time-limit", type=float, default=270.0,
                   help="seconds for the whole script; no case starts after it (default 270)")
    p.add_argument("--case-timeout", type=float, default=90.0,
                   help="seconds one replay may launch for; a replay cut there is a failed check (default 90)")
    p.add_argument("--baseline", type=Path, default=None,
                   help="baseline file to update (default bench/baselines/gpu.json; out/gpu-dryrun/gpu.json with "
                        "--dry-run)")
    p.add_argument("--no-baseline", action="store_true", help="do not write the baseline file")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    args = p.parse_args(argv)
    from uvmprefetch.errors import ConfigError
    from uvmprefetch.trace.scale import parse_scale
    try:
        args.scale = parse_scale(args.scale or (DRY_SCALE if args.dry_run else "1"))
        if args.host != "measured":
            host_model(args.host, {})
    except ConfigError as e:
        C.fail(NAME, str(e))
    try:
        args.ratios = [float(x) for x in args.oversub.split(",") if x.strip()]
    except ValueError:
        C.fail(NAME, f"--oversub {args.oversub!r}: expected numbers like 1.5,2")
    if not args.ratios or any(not r >= 1.0 for r in args.ratios):
        C.fail(NAME, f"--oversub {args.oversub!r}: every ratio must be >= 1 (1 = everything fits)")
    if not 0 < args.max_fraction <= 0.9:
        C.fail(NAME, f"--max-fraction {args.max_fraction}: must be in (0, 0.9]: the GPU may be shared")
    if args.time_limit <= 0 or args.case_timeout <= 0:
        C.fail(NAME, "--time-limit and --case-timeout must be > 0")
    args.policy_list = check_policies(args.policies)
    return args


def open_device(args, env):
    from _evict_cuda import CudaError
    try:
        if args.dry_run:
            from _replay_fake import FakeDevice
            return FakeDevice()
        from _replay_cuda import CudaDevice
        return CudaDevice(env.get("device", "GPU 0"))
    except (ImportError, CudaError) as e:
        C.fail(NAME, f"cannot start: {type(e).__name__}: {e}", 5)


def warm_policies(policies: list[str]) -> float:
    """Compile the policies' Numba kernels (cached on disk) before anything is timed; the seconds it took."""
    from uvmprefetch.sim.replay import replay
    from uvmprefetch.trace.format import load
    t0 = time.perf_counter()
    for pol in policies:
        replay(load(SHIPPED), pol, oversub=1.5)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.monotonic()
    os.environ.update(C.SHARED_GPU_ENV)  # the shim the runtime loads never hands out more than the GPU has free
    log = (lambda s: None) if args.quiet else (lambda s: print(f"[{NAME}] {s}", file=sys.stderr, flush=True))
    C.require_gpu(args, NAME)
    if not args.dry_run:
        from _replay_runtime import preload_shim
        from uvmprefetch.errors import ShimError
        try:
            preload_shim()
        except ShimError as e:
            C.fail(NAME, f"cannot start: {e}", 5)
    env = C.environment(args.dry_run)
    traces = resolve_traces(args)
    profile, prof_desc = card_profile(env.get("device", ""), args.profile)
    dev = open_device(args, env)
    from _replay_core import self_test
    ok, what = self_test(dev)
    checks = [C.Check("touch kernel: every byte of its chunks once, writes stamped", what, "exact", ok)]
    log(f"touch kernel self-test: {what}")
    warm_s = warm_policies(args.policy_list)
    log(f"policies compiled/warmed in {warm_s:.1f} s")
    free, total = dev.cuda.mem_get_info()
    cap = int(free * args.max_fraction)
    host_avail = C.host_available_bytes()
    if host_avail:
        cap = min(cap, host_avail // 2)  # evicted blocks live in host memory
    log(f"{dev.name}: {free / 2**30:.1f} of {total / 2**30:.1f} GiB free; arena cap {cap / 2**30:.2f} GiB; "
        f"profile {prof_desc}")
    bpath = None if args.no_baseline else baseline.path_for(args.dry_run, args.baseline)
    payload = {"profile": prof_desc, "host": args.host, "hook": args.hook, "max_fraction": args.max_fraction,
               "cap_bytes": cap,
               "free_bytes": free, "total_bytes": total, "device_kind": dev.kind, "warm_s": warm_s,
               "self_test": what, "cases": []}
    rows: list[list] = []

    def keep(case: dict) -> None:  # at once: a script cut at its limit keeps every case that finished
        payload["cases"].append(case)
        rows.append(row_for(case))
        (C.out_dir(args) / f"{NAME}.json").write_text(json.dumps({"partial": True, **payload}, indent=1,
                                                                 default=C._json_default))
        if bpath is not None:
            baseline.update(bpath, env.get("device"), env, cases=[baseline_case(case)])

    skipped = run_cases(args, traces, dev, profile, cap, start, checks, rows, keep, log)
    for name in skipped:
        checks.append(C.Check(f"{name} ran", "skipped: --time-limit reached", "completes", False))
    if not payload["cases"] and not skipped:
        checks.append(C.Check("cases", 0, ">= 1", False))
    errs = [abs(c["error"]) for c in payload["cases"] if c.get("error") is not None]
    payload.update(baseline=str(bpath) if bpath else None, skipped=skipped,
                   median_abs_error=statistics.median(errs) if errs else None)
    try:
        dev.cuda.close()
    except Exception as e:  # noqa: BLE001 - after a failure the context may be gone; the results stand
        log(f"cleanup: {type(e).__name__}: {e}")
    return C.finish(args, NAME, payload, ["case", "scale", "footprint MiB", "budget MiB", "measured s", "predicted s",
                                          "error", "steady s/iter meas / pred", "faults meas / pred",
                                          "H2D GiB meas / pred", "D2H GiB meas / pred", "host us/launch", "note"],
                    rows, checks)


def run_cases(args, traces, dev, profile, cap, start, checks, rows, keep, log) -> list[str]:
    """Every (trace, oversub, policy) case in that order, while ``--time-limit`` lasts; the names skipped."""
    import numpy as np

    from _replay_core import Run, replay_on_device
    from _replay_runtime import make_runtime
    from uvmprefetch.sim.replay import capacity_for, launch_durations
    from uvmprefetch.trace.format import load
    skipped: list[str] = []
    over = lambda: time.monotonic() - start > args.time_limit  # noqa: E731
    for label, path in traces:
        suffix = "" if args.hook == "after" else "/hook-before"
        names = [f"replay/{label}/{pol}/{r:g}{suffix}" for r in args.ratios for pol in args.policy_list]
        if over():
            skipped += names
            continue
        try:
            trace = load(path)
        except Exception as e:  # noqa: BLE001 - a bad file is a finding for that trace
            checks.append(C.Check(f"{label}: load", f"{type(e).__name__}: {e}", "loads", False))
            continue
        st, lay, plan, sc, note = fit_trace(trace, args.scale, cap, log)
        if note:
            log(f"{label}: {note}")
        dur = launch_durations(st, profile)
        spin = np.maximum(dur - profile.launch_overhead_s, 0.0)  # the GPU's own launch cost stands for the rest
        widest = int(np.diff(lay.ptr).max()) if st.n_launches else 0
        for ratio in args.ratios:
            budget = capacity_for(lay, None, ratio)
            for pol in args.policy_list:
                name = f"replay/{label}/{pol}/{ratio:g}{suffix}"
                if over():
                    skipped.append(name)
                    continue
                if budget // (2 << 20) < widest:
                    checks.append(C.Check(f"{name} ran", f"budget {budget >> 20} MiB below the widest launch "
                                          f"({widest * 2} MiB)", "a budget that holds every launch", False))
                    continue
                run = Run(st, lay, plan, dur, spin, budget, pol, args.hook == "after")
                log(f"{name}: scale {sc:.4g}, footprint {lay.footprint_blocks * 2} MiB, budget {budget >> 20} MiB, "
                    f"{st.n_launches} launches, {plan.n_chunks} chunks")
                if dev.kind == "fake":
                    dev.kernels.log.clear()
                try:
                    meas = replay_on_device(dev, run, make_runtime, time.monotonic() + args.case_timeout)
                except Exception as e:  # noqa: BLE001 - one failed replay is a finding for that case
                    checks.append(C.Check(f"{name} ran", f"{type(e).__name__}: {str(e)[:300]}", "completes", False))
                    rows.append([name, f"{sc:.4g}", lay.footprint_blocks * 2, budget >> 20] + ["-"] * 8
                                + [f"failed: {e}"[:120]])
                    continue
                case = record_case(name, label, pol, ratio, sc, note, run, meas, profile, args, checks, dev)
                keep(case)
                log(f"{name}: measured {meas['time_s']:.3f} s, predicted "
                    f"{(case['predicted'] or {}).get('time_s', float('nan')):.3f} s")
    return skipped


def record_case(name, label, pol, ratio, sc, note, run, meas, profile, args, checks, dev) -> dict:
    """The case's figures (measured, predicted, errors) and its checks."""
    pred = None
    if not meas["cut"]:
        pred = predict(run, profile, host_model(args.host, meas))
    checks.append(C.Check(f"{name} ran", "cut at --case-timeout" if meas["cut"] else f"{meas['launches']} launches",
                          "every launch", not meas["cut"]))
    evictions = (meas.get("budget_evictions") or 0) + (meas.get("policy_evictions") or 0)
    wanted = (["evictions under the budget"] if ratio > 1 else []) + ([] if pol == "demand" else ["prefetches"])
    if wanted:  # (demand with everything fitting moves nothing: no check)
        moved = evictions > 0 if ratio > 1 else True
        if pol != "demand":
            moved = moved and (meas.get("prefetch_issued_bytes") or 0) > 0
        if dev.kind == "fake" and ratio > 1:  # the fake driver saw the evictions happen, not only the books
            moved = moved and (meas.get("bytes_dtoh") or 0) > 0
        checks.append(C.Check(f"{name} moves issued by the runtime's mover", f"{evictions} evictions, "
                              f"{_gib(meas.get('prefetch_issued_bytes'))} GiB prefetched", ", ".join(wanted), moved))
    d = meas["data"]
    checks.append(C.Check(f"{name} written data intact after the moves", f"{d['wrong']} of {d['checked']} sampled "
                          "bytes wrong" + (f" (first: {d['first_wrong']})" if d["wrong"] else ""),
                          "0 wrong, > 0 checked", d["checked"] > 0 and d["wrong"] == 0))
    if dev.kind == "fake":
        from _replay_fake import check_log
        ok, what = check_log(dev.kernels.log, run.trace, run.layout.base, meas["arena_base"])
        checks.append(C.Check(f"{name} touched each launch's bytes once, in order", what, "exact", ok))
    err = rel_err(pred["time_s"], meas["time_s"]) if pred else None
    m_st, p_st = steady(meas["iteration_times_s"]), steady(pred["iteration_times_s"]) if pred else None
    if pred:
        checks.append(C.Check(f"{name} prediction", f"{err:+.1%} (steady {rel_err(p_st, m_st):+.1%})"
                              if m_st and p_st else f"{err:+.1%}", f"within +-{TARGET:.0%}",
                              None if dev.kind == "fake" else abs(err) <= TARGET,
                              "the fake's timings are not a GPU's" if dev.kind == "fake" else ""))
    return {"name": name, "trace": label, "policy": pol, "oversub_asked": ratio, "scale": sc, "scale_note": note,
            "footprint_bytes": run.layout.footprint_blocks * (2 << 20), "budget_bytes": run.budget_bytes,
            "oversub": run.layout.footprint_blocks / (run.budget_bytes // (2 << 20)),
            "profile": profile.name, "host": args.host, "hook": args.hook, "measured": meas, "predicted": pred,
            "error": err, "steady_s_measured": m_st, "steady_s_predicted": p_st, "steady_error": rel_err(p_st, m_st),
            "fault_ratio": rel_err(pred["faults"], meas["faults"]) if pred and meas["faults"] else None}


def row_for(c: dict) -> list:
    m, p = c["measured"], c["predicted"] or {}
    pair = lambda a, b, f: f"{f(a)} / {f(b)}"  # noqa: E731
    num = lambda x: "-" if x is None else f"{x:.4g}"  # noqa: E731
    return [c["name"], f"{c['scale']:.4g}", c["footprint_bytes"] >> 20, c["budget_bytes"] >> 20, m["time_s"],
            p.get("time_s", "-"), "-" if c["error"] is None else f"{c['error']:+.1%}",
            pair(c["steady_s_measured"], c["steady_s_predicted"], num), pair(m["faults"], p.get("faults"), num),
            pair(m["bytes_htod"], p.get("bytes_htod"), _gib), pair(m["bytes_dtoh"], p.get("bytes_dtoh"), _gib),
            m["host_us_per_launch"], "cut" if m["cut"] else (c["scale_note"] or m.get("measured_by") or
                                                             m.get("not_measured", ""))]


def baseline_case(c: dict) -> dict:
    """The case as a ``bench/baselines/gpu.json`` entry (``baseline.case``'s fields, then the replay's)."""
    m, p = c["measured"], c["predicted"] or {}
    n = max(m["iterations"], 1)
    per_iter = lambda x: None if x is None else x / n / 2**30  # noqa: E731
    return {"name": c["name"], "model": c["trace"], "budget_bytes": c["budget_bytes"], "oversub": c["oversub"],
            "policy": c["policy"], "discards": False, "iterations": m["iterations"],
            "s_per_iter_median": c["steady_s_measured"], "htod_gib_per_iter": per_iter(m["bytes_htod"]),
            "dtoh_gib_per_iter": per_iter(m["bytes_dtoh"]), "host_us_per_launch": m["host_us_per_launch"],
            "scale": c["scale"], "footprint_bytes": c["footprint_bytes"], "time_s": m["time_s"],
            "ideal_s": m["ideal_s"], "stall_s": m["stall_s"], "faults": m["faults"], "bytes_htod": m["bytes_htod"],
            "bytes_dtoh": m["bytes_dtoh"], "measured_by": m.get("measured_by"), "cut": m["cut"],
            "iteration_times_s": m["iteration_times_s"], "profile": c["profile"], "host_model": c["host"],
            "hook": c["hook"], "data_bytes_checked": m["data"]["checked"], "data_bytes_wrong": m["data"]["wrong"],
            "predicted_time_s": p.get("time_s"), "predicted_s_per_iter": c["steady_s_predicted"],
            "predicted_stall_s": p.get("stall_s"), "predicted_host_stall_s": p.get("host_stall_s"),
            "predicted_faults": p.get("faults"), "predicted_bytes_htod": p.get("bytes_htod"),
            "predicted_bytes_dtoh": p.get("bytes_dtoh"), "error": c["error"], "steady_error": c["steady_error"]}


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
