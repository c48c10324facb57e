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


def discarded_blocks(report: dict | None) -> int:
    return int(C.report_get(report, "backend_result.liveness.discards_issued", "backend_result.discards", default=0))


def main(argv=None) -> int:
    p = C.parser(NAME, __doc__.split("\n\n")[0], EPILOG)
    C.add_paired_arguments(p, deadline=340.0, why="the script fits 6 minutes")
    p.add_argument("--discard-batch", type=int, default=None, metavar="N",
                   help="UVMPREFETCH_DISCARD_BATCH for the discard runs: discarding launches per gate closure "
                        "(default: the runtime's, 16)")
    p.add_argument("--nondeterministic", action="store_true",
                   help="fast kernels; the loss comparison then cannot tell lost data from kernel noise")
    args = p.parse_args(argv)
    if args.discard_batch is not None and args.discard_batch <= 0:
        p.error(f"--discard-batch must be a positive integer, not {args.discard_batch}")
    pr = C.paired_runs(NAME, args)
    work, t_plain = pr.work, pr.t_plain
    det = not args.nondeterministic
    batch = {} if args.discard_batch is None else {"UVMPREFETCH_DISCARD_BATCH": str(args.discard_batch)}
    runs, skipped = pr.run_pairs([("discard-on", {"discard": True}, {"UVMPREFETCH_DISCARD": "1", **batch}),
                                  ("discard-off", {"discard": False}, {"UVMPREFETCH_DISCARD": "0"})])

    checks: list[C.Check] = []
    rows, cases = [], []
    for r, f, other in pr.each(runs, args.dry_run):
        ok, why, rep, t = f.ok, f.why, f.report, f.t
        d2h_it, h2d_it, src = f.d2h_gib_per_iter, f.h2d_gib_per_iter, f.bytes_source
        live = C.report_get(rep, "backend_result.liveness", default={}) or {}
        equal = C.same_losses(r, ok, other)
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
                checks.append(C.losses_check(f"{r['ratio']:g}x losses, discards on vs off", r, other, equal, det))
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
    env = C.environment(args.dry_run)
    path = B.path_for(args.dry_run)
    B.update(path, env.get("device") or "unknown", env, cases)
    headers = ["case", "budget B", "iters", "s/iter (steady)", "D2H GiB/iter", "H2D GiB/iter", "bytes from",
               "discarded blocks", "gate closures/iter", "populated blocks", "refused", "losses = other", "problem"]
    return pr.finish(args, NAME, path, runs, skipped, headers, rows, checks)


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
