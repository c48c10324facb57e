"""Discards under oversubscription: the same training with ``UVMPREFETCH_DISCARD=1`` and ``=0`` (issue #32).

GPT-2 large (bf16 autocast, deterministic kernels, per-parameter AdamW) trains ``--iters`` iterations under
``uvmprefetch`` at a budget of working set / ratio, for each ratio (default 1.5 and 2), once with discards on
and once off, each in its own process. The working set is a plain run's peak reserved bytes (``--working-set``
skips that run). Checks: every run finite and not degraded; the discard run really discarded; its losses
**bit-equal** to the run without discards (the same process setup, deterministic kernels: a difference is
lost data); D2H per iteration and seconds per iteration both ways; at 1.5x D2H <= 20 GiB per iteration with
discards (the H200 moved 51-60 GiB without, 19-20 with, before discards were taken off).

Report fields it reads (``docs/runtime.md``, "Report" and "Liveness from the allocator"):
``iterations``, ``degraded``, ``errors``, ``bytes_dtoh`` / ``bytes_htod`` (the runtime's books) and
``backend_result.cupti.um_bytes_dtoh`` / ``um_bytes_htod`` (measured, when CUPTI is there: preferred),
``backend_result.discards`` (blocks discarded), ``backend_result.liveness.{allocations_seen, discards_issued,
populates_issued, discards_refused, unknown_kernels_seen, gate_closures_per_iteration, source, unknown}`` (cuda;
the dryrun backend has none),
``backend_result.host_time.hook_s``, ``backend_result.mover_wait_s``, ``launches``.
"""

from __future__ import annotations

import math
import sys

import _common as C
import baseline as B

NAME = "discards"
EPILOG = """\
examples:
  python bench/gpu/discards.py                              # GPT-2 large b8 s1024 bf16, 1.5x and 2x, 7 iterations
  python bench/gpu/discards.py --ratios 1.5 --iters 20      # where time allows
  python bench/gpu/discards.py --working-set 51539607552    # skip the plain sizing run
  python bench/gpu/discards.py --dry-run                    # tiny GPT-2 on the CPU, runtime dryrun backend
  python bench/gpu/discards.py --ratios 1.5 --discard-batch 1   # one gate closure per discarding launch

runtime report fields read: iterations, degraded, errors, bytes_dtoh, bytes_htod, launches,
  backend_result.{cupti.um_bytes_dtoh, cupti.um_bytes_htod, discards, host_time.hook_s, mover_wait_s},
  backend_result.liveness.{allocations_seen, discards_issued, populates_issued, discards_refused,
  unknown_kernels_seen, gate_closures_per_iteration}
"""
D2H_TARGET_GIB = 20.0  # at 1.5x with discards (issue #32)
GIB = float(1 << 30)


def d2h_h2d(report: dict | None) -> tuple[float | None, float | None, str]:
    """(D2H bytes, H2D bytes, source) of a run: CUPTI's unified-memory counters where the runtime had them,
    else the runtime's books (blocks it evicted / prefetched or faulted, times the block size)."""
    d = C.report_get(report, "backend_result.cupti.um_bytes_dtoh")
    h = C.report_get(report, "backend_result.cupti.um_bytes_htod")
    if d is not None and h is not None:
        return float(d), float(h), "cupti"
    d, h = C.report_get(report, "bytes_dtoh"), C.report_get(report, "bytes_htod")
    return (float(d) if d is not None else None), (float(h) if h is not None else None), "books"


def discarded_blocks(report: dict | None) -> int:
    return int(C.report_get(report, "backend_result.liveness.discards_issued", "backend_result.discards", default=0))


def main(argv=None) -> int:
    p = C.parser(NAME, __doc__.split("\n\n")[0], EPILOG)
    C.add_workload_arguments(p, config="large", iters=7, warmup=2)
    C.add_budget_arguments(p, timeout=150.0, deadline=340.0, why="the script fits 6 minutes")
    p.add_argument("--working-set", type=int, default=None,
                   help="working set in bytes (e.g. oversub.json's working_set_bytes): skips the plain sizing run")
    p.add_argument("--discard-batch", type=int, default=None, metavar="N",
                   help="UVMPREFETCH_DISCARD_BATCH for the discard runs: discarding launches per gate closure "
                        "(default: the runtime's, 16)")
    p.add_argument("--nondeterministic", action="store_true",
                   help="fast kernels; the loss comparison then cannot tell lost data from kernel noise")
    args = p.parse_args(argv)
    if args.discard_batch is not None and args.discard_batch <= 0:
        p.error(f"--discard-batch must be a positive integer, not {args.discard_batch}")
    pr = C.paired_runs(NAME, args)
    ratios, work, run, left, ws, t_plain = pr.ratios, pr.work, pr.run, pr.left, pr.ws, pr.t_plain
    det = not args.nondeterministic

    runs, skipped = [], []
    for ratio in ratios:
        for on in (True, False):  # the discard run first: if the deadline cuts, the pair's reference goes
            case = f"{ratio:g}x-discard-{'on' if on else 'off'}"
            if left() <= 0:
                skipped.append(case)
                continue
            env = {"UVMPREFETCH_DISCARD": "1" if on else "0"}
            if on and args.discard_batch is not None:
                env["UVMPREFETCH_DISCARD_BATCH"] = str(args.discard_batch)
            r = run("uvmprefetch", case, budget=int(ws / ratio), extra_env=env)
            r.update(ratio=ratio, discard=on)
            runs.append(r)

    checks: list[C.Check] = []
    rows, cases = [], []
    by = {(r["ratio"], r["discard"]): r for r in runs}
    for r in runs:
        ok, why = C.run_ok(r)
        rep = r.get("report")
        iters = int(C.report_get(rep, "iterations", default=len(r.get("losses", [])))) or 1
        times, _ = C.iteration_times(r, args.dry_run)
        t = C.steady_median(times, work.warmup) if ok else math.nan
        d2h, h2d, src = d2h_h2d(rep)
        d2h_it = d2h / iters / GIB if d2h is not None else None
        h2d_it = h2d / iters / GIB if h2d is not None else None
        live = C.report_get(rep, "backend_result.liveness", default={}) or {}
        other = by.get((r["ratio"], not r["discard"]))
        equal = None
        if other is not None and ok and C.run_ok(other)[0]:
            equal = r["losses_hex"] == other["losses_hex"]
        n_disc = discarded_blocks(rep)
        gates = gate_closures(live, work.warmup)
        rows.append([r["case"], r["budget"], len(r.get("losses", [])), t, d2h_it, h2d_it, src, n_disc,
                     "-" if gates is None else gates, live.get("populates_issued", "-"), live.get("discards_refused", "-"),
                     "-" if equal is None else ("yes" if equal else "NO"), why])
        checks.append(C.Check(f"{r['case']} ran, losses finite", "ok" if ok else why, "ok, runtime active", ok))
        if ok and r["discard"]:
            checks.append(C.Check(f"{r['case']} discarded", f"{n_disc} blocks", "> 0 (the discard path ran)",
                                  n_disc > 0))
            if equal is not None:
                first = next((i for i, (a, b) in enumerate(zip(r["losses_hex"], other["losses_hex"])) if a != b), None)
                checks.append(C.Check(f"{r['ratio']:g}x losses, discards on vs off",
                                      "bit-equal" if equal else f"differ from iteration {first}",
                                      "bit-equal (a difference is lost data)" if det else "informational",
                                      equal if det else None))
            if r["ratio"] == 1.5 and d2h_it is not None:
                checks.append(C.Check("1.5x D2H per iteration with discards", f"{d2h_it:.3g} GiB ({src})",
                                      f"<= {D2H_TARGET_GIB:g} GiB", None if args.dry_run else d2h_it <= D2H_TARGET_GIB,
                                      "dry-run: the modelled GPU's books" if args.dry_run else ""))
            src_live = live.get("source")
            checks.append(C.Check(f"{r['case']} deaths from the caching allocator",
                                  str(src_live) if live else "missing (backend_result.liveness)",
                                  "allocator (the tracker attached)",
                                  None if args.dry_run else src_live == "allocator",
                                  "dry-run: the dryrun backend has no caching allocator" if args.dry_run else ""))
        cases.append({"name": f"discards/{work.model}-{work.config}/{r['ratio']:g}/{'on' if r['discard'] else 'off'}",
                      "model": f"{work.model}-{work.config}", "budget_bytes": r["budget"], "oversub": r["ratio"],
                      "policy": "uvmprefetch", "discards": r["discard"], "iterations": len(r.get("losses", [])),
                      "s_per_iter_median": t if ok else None, "plain_s_per_iter": t_plain,
                      "htod_gib_per_iter": h2d_it, "dtoh_gib_per_iter": d2h_it,
                      "host_us_per_launch": _us_per_launch(rep),
                      "training_thread_wait_s": C.report_get(rep, "backend_result.mover_wait_s"),
                      "losses_bit_equal_discard_off": equal if r["discard"] else None,
                      "losses_finite": ok, "bytes_source": src, "discarded_blocks": n_disc,
                      "populated_blocks": live.get("populates_issued"),
                      "allocations_seen": live.get("allocations_seen"),
                      "discards_refused": live.get("discards_refused"),
                      "unknown_kernels_seen": live.get("unknown_kernels_seen"),
                      "discard_batch": live.get("discard_batch") if r["discard"] else None,
                      "gate_closures_per_iter": gates})
    for case in skipped:
        checks.append(C.Check(f"{case} ran", "skipped: --deadline reached", "ok", False))

    env = C.environment(args.dry_run)
    path = B.path_for(args.dry_run)
    B.update(path, env.get("device") or "unknown", env, cases)
    headers = ["case", "budget B", "iters", "s/iter (steady)", "D2H GiB/iter", "H2D GiB/iter", "bytes from",
               "discarded blocks", "gate closures/iter", "populated blocks", "refused", "losses = other", "problem"]
    payload = {"workload": work.__dict__, "working_set_bytes": ws, "ratios": ratios, "plain_s_per_iter": t_plain,
               "baseline_file": str(path), "skipped": skipped,
               "runs": [{k: v for k, v in r.items() if k != "stderr_tail" or not C.run_ok(r)[0]} for r in runs]}
    return C.finish(args, NAME, payload, headers, rows, checks)


def gate_closures(live: dict, warmup: int) -> float | None:
    """Median closures of the compute stream's gate per steady iteration (one per batch of discards), None where
    the report has none (discards off, the dryrun backend)."""
    per = live.get("gate_closures_per_iteration")
    if not per:
        return None
    steady = sorted(per[warmup:] or per)
    return float(steady[len(steady) // 2])


def _us_per_launch(report: dict | None) -> float | None:
    hook = C.report_get(report, "backend_result.host_time.hook_s")
    n = C.report_get(report, "launches")
    return hook / n * 1e6 if hook is not None and n else None


if __name__ == "__main__":
    sys.exit(main())
