"""Correctness: the same training gives the same losses with and without uvmprefetch (issue 6, item 2).

GPT-2 (random init, fixed seed, random token batches from a seeded generator) trains N iterations in separate
processes: plain PyTorch twice (the second run tells whether the kernels are deterministic on this machine),
managed memory without prefetch, uvmprefetch with no budget, and uvmprefetch under a budget of half the
working set (so that eviction and re-fetch happen between the optimizer reading a tensor and writing it).
With ``--discard``, uvmprefetch also runs under that budget with ``UVMPREFETCH_DISCARD=1``: dead data
discarded instead of written back (the run that ended with a NaN loss on the H100 in the third GPU session).

Target: losses bitwise equal to plain PyTorch when the two plain runs are bitwise equal (deterministic kernels:
``--deterministic`` is the default and uses torch.use_deterministic_algorithms, eager attention, no TF32);
otherwise within ``--rtol`` and the table says the comparison was by tolerance. A run under the runtime counts
only if the runtime really ran (it wrote its UVMPREFETCH_REPORT).
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

import _common as C

NAME = "correctness"
EPILOG = """\
examples:
  python bench/gpu/correctness.py                       # GPT-2 small, 20 iterations, on the GPU
  python bench/gpu/correctness.py --config medium --iters 10
  python bench/gpu/correctness.py --dry-run             # tiny GPT-2 on the CPU, runtime dryrun backend
  python bench/gpu/correctness.py --discard             # + a run under the budget with UVMPREFETCH_DISCARD=1
"""


def compare(ref: dict, other: dict) -> tuple[bool, float]:
    """(bitwise equal, max relative difference) of two runs' losses."""
    if len(ref["losses"]) != len(other["losses"]):
        return False, math.inf
    bitwise = ref["losses_hex"] == other["losses_hex"]
    rel = max(abs(a - b) / max(abs(a), 1e-30) for a, b in zip(ref["losses"], other["losses"]))
    return bitwise, rel


def main(argv=None) -> int:
    p = C.parser(NAME, __doc__.split("\n\n")[0], EPILOG)
    p.add_argument("--model", default="gpt2", choices=["gpt2", "llama"])
    p.add_argument("--config", default="small")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--nondeterministic", action="store_true",
                   help="use the fast (possibly nondeterministic) kernels; compare by --rtol instead of bitwise")
    p.add_argument("--rtol", type=float, default=1e-4, help="tolerance when kernels are not deterministic")
    p.add_argument("--pressure", type=float, default=2.0,
                   help="also run uvmprefetch with budget = working set / PRESSURE (0 = skip; default 2)")
    p.add_argument("--discard", action="store_true",
                   help="also run uvmprefetch under the budget with UVMPREFETCH_DISCARD=1 (dead data discarded, "
                        "not written back; the check fails if the runtime did not issue discards)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per training run")
    args = p.parse_args(argv)
    C.require_gpu(args, NAME)
    if args.discard and not args.pressure:
        C.fail(NAME, "--discard runs under the budget: it needs --pressure > 1, not 0")
    if args.iters < 2 or args.batch <= 0 or args.seq <= 0:
        C.fail(NAME, "--iters must be >= 2 and --batch/--seq positive")
    if args.pressure and args.pressure <= 1.0:
        C.fail(NAME, f"--pressure {args.pressure}: must be > 1 (working set / budget) or 0 to skip")

    det = not args.nondeterministic
    if args.dry_run:
        work = C.tiny_workload(iters=2, deterministic=det)
    else:
        work = C.Workload(args.model, args.config, args.batch, args.seq, args.iters, warmup=0, deterministic=det)
    tmp = Path(tempfile.mkdtemp(prefix="uvmp-correctness-"))
    run = lambda mode, case, **kw: C.run_training(mode, work, tmp, case, seed=args.seed, dry_run=args.dry_run,
                                                 timeout=args.timeout, **kw)

    runs = [run("plain", "plain"), run("plain", "plain-again")]
    runs += [run("managed", "managed"), run("uvmprefetch", "uvmprefetch")]
    budget = None
    if args.pressure:
        # GPU: the plain run's peak reserved bytes; CPU dry run: the first runtime report's peak managed bytes.
        sized = [r for r in runs if r.get("peak_reserved_bytes") or r.get("report")]
        ws = C.working_set_bytes(sized[0]) if sized else 0
        budget = int(ws / args.pressure) if ws else None
        if budget:
            runs.append(run("uvmprefetch", "uvmprefetch-budget", budget=budget))
            if args.discard:
                runs.append(run("uvmprefetch", "uvmprefetch-budget-discard", budget=budget,
                                extra_env={"UVMPREFETCH_DISCARD": "1"}))

    ref = runs[0]
    ref_ok, ref_why = C.run_ok(ref)
    checks: list[C.Check] = [C.Check("plain PyTorch run", "ok" if ref_ok else ref_why, "runs", ref_ok)]
    rows = []
    deterministic = False
    if ref_ok:
        again_ok, why = C.run_ok(runs[1])
        deterministic = again_ok and compare(ref, runs[1])[0]
        checks.append(C.Check("plain vs plain (determinism)", "bitwise" if deterministic else (why or "differs"),
                              "informational", None,
                              "kernels deterministic: others must be bitwise" if deterministic
                              else f"kernels not deterministic: others compared with rtol {args.rtol:g}"))
    for r in runs:
        ok, why = C.run_ok(r)
        bitwise, rel = compare(ref, r) if ok and ref_ok else (False, math.nan)
        rows.append([r["case"], r["mode"], C.report_get(r.get("report"), "policy", default=r["policy"] or "-"),
                     r["budget"] if r["budget"] else "-", len(r.get("losses", [])),
                     f"{r['losses'][-1]:.6f}" if r.get("losses") else "-", "yes" if bitwise else "no", rel,
                     "yes" if r["runtime_active"] else "no", why])
        if r is ref or r is runs[1]:
            continue
        if r["case"].endswith("-discard") and ok:
            # (the cuda backend issues none without the batch API; a run without them tested nothing new)
            issued = C.report_get(r.get("report"), "backend_result.discards_issued", default=False)
            n = C.report_get(r.get("report"), "backend_result.discards", default=0)
            checks.append(C.Check(f"{r['case']} discards issued", f"{'on' if issued else 'off'}, {n} blocks",
                                  "on (UVMPREFETCH_DISCARD=1 and the batch API)", bool(issued)))
        if not ok:
            checks.append(C.Check(f"{r['case']} losses", why, "runs, runtime active", False))
            continue
        if deterministic:
            checks.append(C.Check(f"{r['case']} losses", "bitwise" if bitwise else f"max rel diff {rel:.3g}",
                                  "bitwise equal to plain", bitwise))
        else:
            checks.append(C.Check(f"{r['case']} losses", f"max rel diff {rel:.3g}", f"<= {args.rtol:g}",
                                  ref_ok and rel <= args.rtol))
    if args.pressure and budget is None:
        checks.append(C.Check("uvmprefetch under budget", "no working-set figure to size the budget from",
                              f"budget = working set / {args.pressure:g}", False))

    headers = ["case", "mode", "policy", "budget B", "iters", "last loss", "bitwise", "max rel diff",
               "runtime active", "problem"]
    payload = {"workload": work.__dict__, "deterministic_kernels": deterministic, "budget_bytes": budget,
               "runs": [{k: v for k, v in r.items() if k != "stderr_tail" or not C.run_ok(r)[0]} for r in runs]}
    return C.finish(args, NAME, payload, headers, rows, checks)


if __name__ == "__main__":
    sys.exit(main())
