#!/usr/bin/env python3
"""Where does a live run's time go? Policy variants under one budget, with the launch hook's host time.

``oversub.py`` says *how fast* each mode is; this script says *why*, by running the same workload under one
budget with several policy specs (``UVMPREFETCH_POLICY`` strings: ``uvmprefetch:invalidate=false`` switches
one mechanism off) and printing, per run, the steady iteration time next to the seconds the runtime's launch
hook spent on the training thread, split by stage (the policy's decision, the books, and each kind of CUDA
call: ``host_time`` of the cuda backend's report). A stage whose seconds approach the iteration time is
blocking the thread that launches the kernels.

Example (an H100; the budget is 1.5x below GPT-2 large's 48.4 GiB working set, as oversub.py measured it)::

    python3 bench/gpu/diagnose.py --budget 34636562432 \\
        --policies 'demand;uvmprefetch;uvmprefetch:invalidate=false;uvmprefetch:prefetch=false,pre_evict=false'

Without a GPU it refuses (exit 5) unless ``--dry-run`` (the tiny model on the CPU, dryrun backend).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

sys.path.insert(0, str(C.REPO))

NAME = "diagnose"
STAGES = ("policy", "books", "discard", "evict", "advise", "prefetch", "after")


# what run_training sets for every run (the managed limit: C.SHARED_GPU_ENV): a spec may not override these
_OWN = ("UVMPREFETCH", "UVMPREFETCH_POLICY", "UVMPREFETCH_BUDGET", "UVMPREFETCH_REPORT", "UVMPREFETCH_TRACE",
        "UVMPREFETCH_BACKEND", *C.SHARED_GPU_ENV)


def parse_spec(spec: str) -> tuple[str, dict]:
    """``'policy[:params][|VAR=VALUE ...]'`` -> (policy spec, runtime variables); both validated."""
    from uvmprefetch.config import VARIABLES, from_env
    from uvmprefetch.errors import ConfigError
    from uvmprefetch.policy import make_policy

    policy, *rest = [t.strip() for t in spec.split("|")]
    make_policy(policy)
    env = {}
    for item in " ".join(rest).split():
        var, eq, value = item.partition("=")
        if not eq or var not in VARIABLES or var in _OWN:
            settable = ", ".join(v for v in VARIABLES if v not in _OWN)
            raise ConfigError(f"{spec!r}: {item!r} is not VAR=VALUE with VAR one of {settable}")
        env[var] = value
    from_env({"UVMPREFETCH": "1", **env}, check_policy=False)  # each value in its accepted forms
    return policy, env


def main(argv=None) -> int:
    p = C.parser(NAME, __doc__.split("\n\n")[0],
                 epilog="Policy specs are separated by ';' (each may hold commas). A spec may end with runtime "
                        "variables after '|', e.g. 'uvmprefetch|UVMPREFETCH_DISCARD=1' or "
                        "'demand|UVMPREFETCH_MOVER=thread'.")
    p.add_argument("--budget", type=int, default=None,
                   help="budget in bytes (default: half of the plain run's working set, measured first)")
    p.add_argument("--policies", default="demand;uvmprefetch",
                   help="';'-separated UVMPREFETCH_POLICY specs (default 'demand;uvmprefetch')")
    C.add_workload_arguments(p, config="large", iters=4, warmup=2)
    p.add_argument("--timeout", type=float, default=120.0, help="seconds allowed per run (default 120)")
    p.add_argument("--deadline", type=float, default=480.0, help="start no run after this many seconds")
    p.add_argument("--work-dir", type=Path, default=None)
    args = p.parse_args(argv)
    C.require_gpu(args, NAME)
    specs = [s.strip() for s in args.policies.split(";") if s.strip()]
    if not specs:
        C.fail(NAME, "--policies names no policy")
    from uvmprefetch.errors import ConfigError
    parsed = []
    for s in specs:
        try:
            parsed.append(parse_spec(s))
        except ConfigError as e:
            C.fail(NAME, f"--policies: {e}")
    if args.iters <= args.warmup:
        C.fail(NAME, "--iters must be larger than --warmup")

    start = time.monotonic()
    work = (C.tiny_workload(iters=3, foreach="off") if args.dry_run else
            C.Workload(args.model, args.config, args.batch, args.seq, args.iters, args.warmup, args.dtype,
                       foreach="off"))
    wdir = args.work_dir or (C.out_dir(args) / "diagnose-runs")
    budget = args.budget
    if budget is None:
        ref = C.run_training("managed" if args.dry_run else "plain", work, wdir, "sizing", seed=args.seed,
                             dry_run=args.dry_run, timeout=args.timeout)
        ok, why = C.run_ok(ref)
        if not ok:
            C.fail(NAME, f"the sizing run failed ({why})", 1)
        budget = C.working_set_bytes(ref) // 2
    runs, rows, checks = [], [], []
    for i, (spec, (policy, env)) in enumerate(zip(specs, parsed)):
        if time.monotonic() - start > args.deadline:
            checks.append(C.Check(f"{spec} ran", "skipped: --deadline reached", "ok", False))
            continue
        r = C.run_training("managed", work, wdir, f"v{i}", seed=args.seed, dry_run=args.dry_run, budget=budget,
                           timeout=args.timeout, extra_env={"UVMPREFETCH_POLICY": policy, **env})
        r["spec"] = spec
        runs.append(r)
        ok, why = C.run_ok(r)
        checks.append(C.Check(f"{spec} ran", "ok" if ok else why, "ok, runtime active", ok))
        times, _ = C.iteration_times(r, args.dry_run)
        med = C.steady_median(times, work.warmup) if times else float("nan")
        ht = C.report_get(r.get("report"), "backend_result.host_time") or {}
        tot = ht.get("total_s", {})
        n_it = max(1, len(times))
        br = C.report_get(r.get("report"), "backend_result") or {}  # a dotted path: one key
        rows.append([spec, f"{med:.3f}", " ".join(f"{t:.2f}" for t in times),
                     f"{ht.get('hook_s', float('nan')) / n_it:.3f}",
                     *[f"{tot.get(s, float('nan')) / n_it:.3f}" for s in STAGES],
                     f"{br.get('bytes_htod', 0) / n_it / 2**30:.1f}", f"{br.get('bytes_dtoh', 0) / n_it / 2**30:.1f}",
                     br.get("discards", "-"), br.get("cuda_calls", "-"), "" if ok else why])
    # host_time covers every launch, iteration 0 and start-up included: its columns are run totals / iterations
    headers = ["policy", "median s/iter (steady)", "iteration s", "hook s/iter (all iters)",
               *[f"{s} s/iter (all)" for s in STAGES], "H2D GiB/iter", "D2H GiB/iter", "discards", "cuda calls",
               "problem"]
    payload = {"workload": work.__dict__, "budget": budget, "policies": specs, "runs": runs, "table": rows}
    return C.finish(args, NAME, payload, headers, rows, checks)


if __name__ == "__main__":
    sys.exit(main())
