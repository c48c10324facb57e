"""``uvmprefetch bench``: the trace-replay benchmark (traces x policies x oversubscription)."""

from __future__ import annotations

NAME = "bench"
HELP = "replay traces under every policy at several oversubscription levels: table, CSV, plot"
DESCRIPTION = ("Replay each trace (default: the standard traces) under each policy (default: every available "
               "one) at oversubscription 1.0/1.25/1.5/2/3 on a simulated GPU. Prints a Markdown table of "
               "slowdown vs. ideal and the replay throughput per policy; writes results.csv, results.json, "
               "table.md, slowdown.png and steady.png to --out. A progress bar goes to stderr.")
EPILOG = """\
examples:
  uvmprefetch bench
  uvmprefetch bench gpt2l.uvmt bert.uvmt --policies demand,oracle --oversub 1.5,2
  uvmprefetch bench --gpu a100-pcie --out /tmp/bench --json > results.json
  uvmprefetch bench --policies capuchin,tmof,uvmprefetch --oversub 1.5,2 --gpus 4   # 4 GPUs, one host link
  uvmprefetch bench --policies demand,g10,flashneuron,oracle --ssd pcie4-nvme --gpu-set host_capacity_bytes=8e9
"""


def add_arguments(p) -> None:
    from ..policy import available
    from .replay import add_gpu_arguments, add_gpus_arguments
    p.add_argument("traces", nargs="*", metavar="TRACE", help="trace files (replace the standard set)")
    p.add_argument("--policies", default="all", metavar="A,B|all",
                   help=f"comma-separated policy specs (NAME[:k=v...] each), or all (default: {', '.join(available())})")
    p.add_argument("--oversub", default="1,1.25,1.5,2,3", metavar="X,Y,...",
                   help="oversubscription levels (footprint / capacity; default 1,1.25,1.5,2,3)")
    add_gpu_arguments(p)
    add_gpus_arguments(p)
    p.add_argument("--out", metavar="DIR", help="where to write CSV/JSON/PNG (default bench/results/replay-<date>/)")
    p.add_argument("--json", action="store_true", help="print one JSON list of replay results (each with `trace`)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    import time
    from pathlib import Path

    from ..errors import ConfigError
    from ..policy import available
    from ..sim import bench as B
    from .replay import block_size_from_args, gpu_from_args, gpus_from_args, host_from_args
    gpu = gpu_from_args(args)
    n_gpus = gpus_from_args(args)
    bs = block_size_from_args(args)
    host = host_from_args(args)
    oversubs = B.parse_oversub_list(args.oversub)
    if args.policies.strip() == "all":
        policies = available()
    else:
        policies = [p.strip() for p in args.policies.split(",") if p.strip()]
        if not policies:
            raise ConfigError("--policies: empty list")
    traces = B.load_traces(args.traces) if args.traces else B.standard_trace_set(progress=not args.no_progress)
    t0 = time.perf_counter()
    rows = B.run_bench(traces, policies, oversubs, gpu, block_size=bs, writeback_clean=args.writeback_clean,
                       progress=not args.no_progress, n_gpus=n_gpus, shared_link=not args.own_links, host=host,
                       discards=args.discards)
    wall = time.perf_counter() - t0
    out = Path(args.out) if args.out else Path("bench/results") / f"replay-{time.strftime('%Y%m%d', time.gmtime())}"
    files = B.save_outputs(rows, oversubs, out, B.bench_meta(gpu, bs, wall, host, args.discards))
    if args.json:
        from . import emit_json
        emit_json(rows)
    else:
        print(B.markdown(rows, oversubs))
        print(f"\n{len(rows)} results in {wall:.1f} s; wrote {files['csv']}, {files['plot']}, {files['steady_plot']}")
    return 0
