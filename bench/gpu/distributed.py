"""Distributed training under the runtime: ``UVMPREFETCH=1 torchrun ...`` gives every rank its own runtime.

torchrun starts ``--nproc`` ranks of ``bench/gpu/dist_worker.py`` (DDP, or FSDP2 with ``--wrap fsdp``) twice: plain
PyTorch, then with ``UVMPREFETCH=1`` under a budget below each rank's working set. On a GPU the ranks talk over
NCCL (one rank is enough to run NCCL's collectives on managed buffers, which every CUDA allocation is under the
runtime); the dry run trains two CPU ranks over gloo with the runtime's dryrun backend.

Checks: each rank's losses bit-equal to the plain job's (deterministic kernels); each rank wrote its own report
(``r.rank<N>.json``) with launches, every iteration, no degradation, and data moved both ways (the budget was
felt); each rank's trace holds the collectives (they ran inside observed ops); the launcher wrote no report.
Recorded, not checked: whether a CUDA IPC handle can be exported for a parameter's memory (plain, and managed
under the runtime), the way ``torch.multiprocessing`` shares CUDA tensors. The figures go to the GPU baseline
file (``bench/gpu/baseline.py``; a dry run writes ``out/gpu-dryrun/gpu.json``).
"""

from __future__ import annotations

import json
import math
import sys
import tempfile
import time
from pathlib import Path

import _common as C
import baseline as B

NAME = "distributed"
EPILOG = """\
examples:
  python bench/gpu/distributed.py                      # 1 rank, NCCL, DDP on GPT-2 small, budget = working set / 2
  python bench/gpu/distributed.py --nproc 2 --wrap fsdp  # two GPUs, FSDP2
  python bench/gpu/distributed.py --dry-run            # 2 CPU ranks, gloo, GPT-2 mini, dryrun backend
  bench/gpu/run_all.sh dist                            # on a lent GPU: Numba's cache warmed first, then this
"""
WORKER = C.HERE / "dist_worker.py"
# The dry run's budget: GPT-2 mini's biggest launch (DDP's broadcast of the parameters at construction) touches
# 22 MiB, and its ranks' working sets are ~60 MB, so 24 MiB both fits every launch and forces moves.
DRY_BUDGET = 24 << 20
COLLECTIVES = {"ddp": ("c10d::allreduce_",), "fsdp": ("c10d::_allgather_base_", "c10d::_reduce_scatter_base_")}


def run_job(case: str, args, work: dict, tmp: Path, *, budget: int | None, timeout: float) -> dict:
    """One torchrun job (``case`` "plain": without the runtime); what each rank and the launcher wrote."""
    folder = tmp / case
    out = folder / "ranks"
    folder.mkdir(parents=True, exist_ok=True)
    env = C.training_env(deterministic=True)
    env["OMP_NUM_THREADS"] = "1"
    runtime = case != "plain"
    if runtime:
        env.update(UVMPREFETCH="1", UVMPREFETCH_POLICY=args.policy, UVMPREFETCH_LOG="quiet",
                   UVMPREFETCH_BACKEND="dryrun" if args.dry_run else "cuda",
                   UVMPREFETCH_REPORT=str(folder / "r.json"), UVMPREFETCH_TRACE=str(folder / "t.uvmt"))
        if budget is not None:
            env["UVMPREFETCH_BUDGET"] = str(int(budget))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={args.nproc}",
           str(WORKER), "--wrap", args.wrap, "--model", work["model"], "--config", work["config"],
           "--batch", str(work["batch"]), "--seq", str(work["seq"]), "--iters", str(work["iters"]),
           "--device", "cpu" if args.dry_run else "cuda", "--deterministic", "--seed", str(args.seed),
           "--out", str(out)] + ([] if args.dry_run else ["--probe-ipc"])
    t0 = time.perf_counter()
    rc, err = C.run_child(cmd, env, timeout)
    ranks = []
    for rank in range(args.nproc):
        f = out / f"rank{rank}.json"
        res = json.loads(f.read_text()) if f.exists() else {}
        rep = folder / f"r.rank{rank}.json"
        res["report"] = json.loads(rep.read_text()) if rep.exists() else None
        res["collectives"] = _collectives(folder / f"t.rank{rank}.uvmt")
        res.update(rank=rank, returncode=rc, stderr_tail=err[-2000:], policy=args.policy if runtime else None,
                   runtime_active=res["report"] is not None)
        ranks.append(res)
    return {"case": case, "returncode": rc, "wall_s": time.perf_counter() - t0, "budget": budget, "ranks": ranks,
            "launcher_files": sorted(p.name for p in folder.glob("r*.json") if ".rank" not in p.name)}


def _collectives(trace: Path) -> dict:
    """Launch counts of the ``c10d::``/``fsdp::`` ops a rank's live trace holds."""
    if not trace.exists():
        return {}
    from uvmprefetch.trace.format import load
    t = load(trace)
    out: dict = {}
    for i in t.launch_name.tolist():
        n = t.names[i]
        if n.startswith(("c10d::", "fsdp::")):
            out[n] = out.get(n, 0) + 1
    return out


def _per_iter_gib(rep: dict | None, key: str, iters: int):
    v = C.report_get(rep, key)
    return None if v is None or not iters else v / iters / 2**30


def main(argv=None) -> int:
    p = C.parser(NAME, __doc__.split("\n\n")[0], EPILOG)
    p.add_argument("--nproc", type=int, default=None, help="ranks (default: 1 on a GPU, 2 in a dry run)")
    p.add_argument("--wrap", default="ddp", choices=["ddp", "fsdp"])
    p.add_argument("--config", default="small", help="GPT-2 size (default small)")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--pressure", type=float, default=2.0,
                   help="budget = the plain rank's peak reserved bytes / PRESSURE (default 2; dry run: 24 MiB)")
    p.add_argument("--policy", default="uvmprefetch", choices=["uvmprefetch", "deepum", "demand"])
    p.add_argument("--timeout", type=float, default=100.0, help="seconds allowed per torchrun job (default 100)")
    p.add_argument("--deadline", type=float, default=170.0, help="seconds for the whole script (default 170)")
    p.add_argument("--baseline", type=Path, default=None,
                   help="baseline file to update (default bench/baselines/gpu.json; dry run out/gpu-dryrun/gpu.json)")
    args = p.parse_args(argv)
    C.require_gpu(args, NAME)
    args.nproc = args.nproc if args.nproc is not None else (2 if args.dry_run else 1)
    if args.nproc < 1 or args.iters < 2 or args.batch <= 0 or args.seq <= 0:
        C.fail(NAME, "need --nproc >= 1, --iters >= 2 and positive --batch/--seq")
    if args.pressure <= 1.0:
        C.fail(NAME, f"--pressure {args.pressure}: must be > 1 (working set / budget)")
    if not args.dry_run:
        import torch
        if torch.cuda.device_count() < args.nproc:
            C.fail(NAME, f"--nproc {args.nproc}: this machine has {torch.cuda.device_count()} GPU(s)")
    start = time.monotonic()
    work = (dict(model="gpt2", config="mini", batch=2, seq=32, iters=2) if args.dry_run else
            dict(model="gpt2", config=args.config, batch=args.batch, seq=args.seq, iters=args.iters))
    tmp = Path(tempfile.mkdtemp(prefix="uvmp-distributed-"))

    def left() -> float:
        return args.deadline - (time.monotonic() - start)

    plain = run_job("plain", args, work, tmp, budget=None, timeout=min(args.timeout, max(left(), 1.0)))
    budget = DRY_BUDGET if args.dry_run else None
    if not args.dry_run:
        ws = max((r.get("peak_reserved_bytes") or 0) for r in plain["ranks"])
        budget = int(ws / args.pressure) if ws else None
    jobs = [plain]
    if budget and left() > 20:
        jobs.append(run_job("uvmprefetch", args, work, tmp, budget=budget, timeout=min(args.timeout, left())))

    checks: list[C.Check] = []
    rows = []
    bit_equal: dict[int, bool] = {}
    for job in jobs:
        for r in job["ranks"]:
            ok, why = C.run_ok(r)
            ref = plain["ranks"][r["rank"]]
            same = bool(r.get("losses_hex")) and r.get("losses_hex") == ref.get("losses_hex")
            rel = (max(abs(a - b) / max(abs(a), 1e-30) for a, b in zip(ref["losses"], r["losses"]))
                   if ok and ref.get("losses") and len(ref["losses"]) == len(r["losses"]) else math.nan)
            rep = r.get("report")
            rows.append([job["case"], r["rank"], job["budget"] or "-", len(r.get("losses", [])),
                         f"{r['losses'][-1]:.6f}" if r.get("losses") else "-", "yes" if same else "no",
                         C.report_get(rep, "launches", default="-"), C.report_get(rep, "iterations", default="-"),
                         C.report_get(rep, "bytes_dtoh", default="-"), ", ".join(sorted(r["collectives"])) or "-",
                         r.get("ipc_export", "-"), why])
            if job is plain:
                checks.append(C.Check(f"plain rank {r['rank']} ran", "ok" if ok else why, "runs", ok))
                continue
            bit_equal[r["rank"]] = same
            checks.append(C.Check(f"rank {r['rank']} losses", "bitwise" if same else f"max rel diff {rel:.3g}",
                                  "bitwise equal to plain", same))
            iters_ok = ok and rep["iterations"] == work["iters"] and rep["launches"] > 0
            checks.append(C.Check(f"rank {r['rank']} report", "ok" if iters_ok else (why or str(
                {k: rep.get(k) for k in ("launches", "iterations")})), "own report, launches, every iteration",
                iters_ok))
            if ok:
                moved = (rep.get("bytes_htod") or 0) > 0 and (rep.get("bytes_dtoh") or 0) > 0
                checks.append(C.Check(f"rank {r['rank']} budget felt",
                                      f"{rep.get('bytes_htod')} B in, {rep.get('bytes_dtoh')} B out",
                                      "data moved both ways", moved))
                want = COLLECTIVES[args.wrap]
                seen = all(n in r["collectives"] for n in want)
                checks.append(C.Check(f"rank {r['rank']} collectives observed",
                                      ", ".join(f"{n} x{c}" for n, c in sorted(r["collectives"].items())) or "none",
                                      " and ".join(want) + " in its trace", seen))
        if job is not plain:
            checks.append(C.Check("launcher report", ", ".join(job["launcher_files"]) or "none", "none",
                                  not job["launcher_files"]))
    if len(jobs) < 2:
        checks.append(C.Check("uvmprefetch job", "skipped: " + ("no working-set figure" if not budget
                                                                 else "--deadline reached"), "runs", False))
    if not args.dry_run and jobs[-1]["case"] != "plain":
        ipc = [r.get("ipc_export", "-") for j in jobs for r in j["ranks"][:1]]
        checks.append(C.Check("CUDA IPC export of a parameter (plain, managed)", " / ".join(ipc), "recorded", None,
                              "torch.multiprocessing shares CUDA tensors this way"))

    headers = ["job", "rank", "budget B", "iters", "last loss", "bit-equal plain", "launches", "iterations",
               "bytes D2H", "collectives", "IPC export", "problem"]
    env = C.environment(args.dry_run)
    _write_baseline(args, env, work, plain, jobs[1] if len(jobs) > 1 else None, budget, bit_equal)
    payload = {"workload": work, "nproc": args.nproc, "wrap": args.wrap, "budget_bytes": budget,
               "jobs": [{**j, "ranks": [{k: v for k, v in r.items() if k != "stderr_tail" or not C.run_ok(r)[0]}
                                        for r in j["ranks"]]} for j in jobs]}
    return C.finish(args, NAME, payload, headers, rows, checks)


def _write_baseline(args, env: dict, work: dict, plain: dict, job: dict | None, budget, bit_equal: dict) -> None:
    """One case per run of this script: rank 0's figures, the others' in ``per_rank``."""
    if job is None:
        return
    r0, p0 = job["ranks"][0], plain["ranks"][0]
    rep = r0.get("report")
    warm = min(2, work["iters"] - 1)
    # the plain ranks' peak reserved bytes on a GPU; in a dry run the runtime's own figure (peak live bytes)
    ws = (max((r.get("peak_reserved_bytes") or 0) for r in plain["ranks"])
          or C.report_get(rep, "working_set_bytes") or None)
    fields = dict(
        model=f"gpt2-{work['config']}", budget_bytes=budget, oversub=(ws / budget) if ws and budget else None,
        policy=args.policy, discards=False, iterations=work["iters"],
        s_per_iter_median=C.steady_median(r0["iter_s"], warm) if r0.get("iter_s") else None,
        plain_s_per_iter=C.steady_median(p0["iter_s"], warm) if p0.get("iter_s") else None,
        losses_bit_equal_plain=all(bit_equal.values()) if bit_equal else None,
        htod_gib_per_iter=_per_iter_gib(rep, "bytes_htod", work["iters"]),
        dtoh_gib_per_iter=_per_iter_gib(rep, "bytes_dtoh", work["iters"]),
        ranks=args.nproc, wrap=args.wrap, process_group=r0.get("backend"),
        collectives=r0.get("collectives") or None,
        ipc_export_plain=p0.get("ipc_export"), ipc_export_managed=r0.get("ipc_export"),
        per_rank=[{"rank": r["rank"], "losses_bit_equal_plain": bit_equal.get(r["rank"]),
                   "launches": C.report_get(r.get("report"), "launches"),
                   "iterations": C.report_get(r.get("report"), "iterations")} for r in job["ranks"]])
    fields = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in fields.items()}
    case = B.case(f"torchrun/gpt2-{work['config']}/{args.wrap}-{args.nproc}rank", **fields)
    B.update(B.path_for(args.dry_run, args.baseline), env.get("device"), env, [case])


if __name__ == "__main__":
    sys.exit(main())
