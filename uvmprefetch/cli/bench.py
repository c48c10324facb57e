"""``uvmprefetch bench``: the trace-replay benchmark (traces x policies x oversubscription)."""

from __future__ import annotations

NAME = "bench"
HELP = "replay traces under every policy at several oversubscription levels: table, CSV, plot"
DESCRIPTION = ("Replay each trace (default: the standard traces) under each policy (default: every available "
               "one) at oversubscription 1.0/1.25/1.5/2/3 on a simulated GPU (default: h100-pcie with the costs "
               "measured on an H100, the runtime's threads as the host model, both named in the header). Prints "
               "Markdown tables of slowdown vs. ideal (whole run and steady state), the restated targets with "
               "pass/fail where their policies ran, and the replay throughput per policy; writes results.csv, results.json, "
               "table.md, slowdown.png and steady.png to --out (default ./replay-<UTC date-time>/) and, with "
               "--update-baseline, the figures to bench/baselines/replay.json. A progress bar goes to stderr.")
EPILOG = """\
examples:
  uvmprefetch bench                                         # h100-pcie (measured costs), host live, --evict auto
  uvmprefetch bench gpt2l.uvmt bert.uvmt --policies demand,oracle --oversub 1.5,2
  uvmprefetch bench --gpu a100-pcie --out /tmp/bench --json > results.json
  uvmprefetch bench --update-baseline                       # the figures the README quotes
  uvmprefetch bench --gpu h100-pcie-lit --host free --update-baseline   # the literature's costs, an idle host
  uvmprefetch bench --host live-sync --no-discard --evict uvm \
      --policies demand,deepum,uvmprefetch,oracle --oversub 1.5,2,3    # the earlier synchronous runtime
  uvmprefetch bench --policies capuchin,tmof,uvmprefetch --oversub 1.5,2 --gpus 4   # 4 GPUs, one host link
  uvmprefetch bench --policies demand,g10,flashneuron,oracle --ssd pcie4-nvme --gpu-set host_capacity_bytes=8e9
"""


def add_arguments(p) -> None:
    from ..policy import available
    from .replay import add_gpu_arguments, add_gpus_arguments
    p.add_argument("traces", nargs="*", metavar="TRACE", help="trace files (replace the standard set)")
    p.add_argument("--policies", default="all", metavar="A,B|all",
                   help=f"comma-separated policy specs (NAME[:k=v,...] each), or all (default: {', '.join(available())})")
    p.add_argument("--oversub", default="1,1.25,1.5,2,3", metavar="X,Y,...",
                   help="oversubscription levels (footprint / capacity; default 1,1.25,1.5,2,3)")
    add_gpu_arguments(p)
    add_gpus_arguments(p)
    from .. import results
    results.add_arguments(p, "replay")
    p.add_argument("--json", action="store_true", help="print one JSON list of replay results (each with `trace`)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    import time

    from .. import results
    from ..errors import ConfigError
    from ..policy import available
    from ..sim import bench as B
    from .replay import (block_size_from_args, evict_from_args, gpu_from_args, gpus_from_args, host_from_args,
                         host_spec)
    gpu = gpu_from_args(args)
    n_gpus = gpus_from_args(args)
    bs = block_size_from_args(args)
    host = host_from_args(args, n_gpus)
    evict = evict_from_args(args)
    oversubs = B.parse_oversub_list(args.oversub)
    if args.policies.strip() == "all":
        policies = available()
    else:
        policies = split_policies(args.policies)
        if not policies:
            raise ConfigError("--policies: empty list")
    traces = B.load_traces(args.traces) if args.traces else B.standard_trace_set(progress=not args.no_progress)
    t0 = time.perf_counter()
    rows = B.run_bench(traces, policies, oversubs, gpu, block_size=bs, writeback_clean=args.writeback_clean,
                       progress=not args.no_progress, n_gpus=n_gpus, shared_link=not args.own_links, host=host,
                       discards=args.discards, evict=evict)
    wall = time.perf_counter() - t0
    out = results.run_dir(args.out, "replay", create=False)
    meta = B.bench_meta(gpu, bs, wall, host, args.discards, evict, host_name=host_spec(args, n_gpus))
    files = B.save_outputs(rows, oversubs, out, meta)
    baseline = None
    if args.update_baseline:
        baseline = results.update_baseline("replay", setting(args, n_gpus, standard=not args.traces,
                                                             copy_path=gpu.copy_path),
                                           baseline_payload(rows, oversubs, meta))
    if args.json:
        from . import emit_json
        emit_json(rows)
    else:
        print(B.header(meta))
        print()
        print(B.markdown(rows, oversubs))
        print(f"\n{len(rows)} results in {wall:.1f} s; wrote {files['csv']}, {files['plot']}, {files['steady_plot']}")
        if baseline is not None:
            print(f"baseline: {baseline}")
        print(f"results: {out}")
    return 0


def split_policies(text: str) -> list[str]:
    """``--policies``' comma-separated specs; a piece ``k=v`` without a policy name goes on the spec before it, so
    ``uvmprefetch:a=1,b=2,oracle`` is two specs (a policy's name never holds ``=``)."""
    specs: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if "=" in piece and ":" not in piece and specs:
            specs[-1] += "," + piece
        else:
            specs.append(piece)
    return specs


def setting(args, n_gpus: int, standard: bool, copy_path: bool = False) -> str:
    """The baseline key of a run: the flags that change the simulated machine, in the order they are written
    (``h100-pcie host=live evict=auto``, ``h100-pcie-lit host=free``, ``h100-pcie no-discard host=live-sync``, ...).
    ``--evict`` is part of it where the profile has the copy path (elsewhere every mode replays as ``uvm``)."""
    from ..gpus import ALIASES
    from .replay import host_spec
    parts = [ALIASES.get(args.gpu, args.gpu)]
    parts += [f"set:{kv}" for kv in args.gpu_set or ()]
    if args.ssd:
        parts.append(f"ssd={args.ssd}")
    if args.block_size != "2MiB":
        parts.append(f"block={args.block_size}")
    if args.writeback_clean:
        parts.append("writeback-clean")
    if not args.discards:
        parts.append("no-discard")
    parts.append(f"host={host_spec(args, n_gpus)}")
    if n_gpus > 1:
        parts.append(f"gpus={n_gpus}" + (" own-links" if args.own_links else ""))
    if copy_path and getattr(args, "evict", "uvm") != "uvm":
        parts.append(f"evict={args.evict}")
    if not standard:
        from pathlib import Path
        parts.append("traces=" + ",".join(Path(t).stem for t in args.traces))
    return " ".join(parts)


# The per-row figures a baseline keeps (results.json of the run folder has every field).
BASELINE_FIELDS = ("slowdown", "steady_slowdown", "time_s", "ideal_s", "stall_s", "faults", "bytes_htod",
                   "bytes_dtoh", "accuracy", "coverage", "error")


def _short(v):
    """Floats to 6 significant digits (the file stays readable; the run folder keeps every digit)."""
    return float(f"{v:.6g}") if isinstance(v, float) else v


def baseline_payload(rows: list[dict], oversubs: list[float], meta: dict) -> dict:
    """The run's figures for ``bench/baselines/replay.json``: its meta, the geomean over traces of each policy's
    slowdown (whole run and steady state) per oversubscription level, and the rows' headline fields."""
    import math
    traces = list(dict.fromkeys(r["trace"] for r in rows))
    geo: dict[str, dict] = {}
    for pol in dict.fromkeys(r["policy"] for r in rows):
        g = geo.setdefault(pol, {"slowdown": {}, "steady_slowdown": {}})
        for ov in oversubs:
            for key in g:
                xs = [r.get(key) for r in rows if r["policy"] == pol and r["oversub_target"] == ov]
                ok = [x for x in xs if x is not None and x > 0]
                # a level where some trace failed (capacity too small) has no geomean over all traces
                g[key][f"{ov:g}"] = (round(math.exp(sum(map(math.log, ok)) / len(ok)), 4)
                                     if ok and len(ok) == len(traces) else None)
    slim = [{"trace": r["trace"], "policy": r["policy"], "oversub": r["oversub_target"],
             **{k: _short(r.get(k)) for k in BASELINE_FIELDS}} for r in rows]
    from ..sim import bench as B
    return {"meta": {k: meta.get(k) for k in ("date", "commit", "gpu", "block_size", "host_name", "host", "discards",
                                              "evict", "cpus", "wall_s")},
            "traces": traces, "oversub": list(oversubs), "geomean": geo,
            "targets": [{k: _short(v) for k, v in x.items()} for x in B.targets(rows)], "rows": slim}
