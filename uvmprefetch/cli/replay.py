"""``uvmprefetch replay``: replay a trace against a simulated GPU under one policy."""

from __future__ import annotations

NAME = "replay"
HELP = "replay a trace against a simulated GPU under a policy"
DESCRIPTION = ("Replay a recorded trace against a simulated GPU with a given memory capacity (or oversubscription "
               "= working footprint / capacity) under one policy, and print time, slowdown against infinite "
               "memory, faults, bytes moved and prefetch accuracy/coverage. The model (driver fault path, copy "
               "engines, eviction) is described in docs/simulator.md.")
EPILOG = """\
examples:
  uvmprefetch replay gpt2l.uvmt --oversub 2 --policy demand          # h100-pcie (measured costs), host live
  uvmprefetch replay gpt2l.uvmt --gpu h100-pcie-lit --host free --oversub 2 --policy demand   # the literature's
  uvmprefetch replay gpt2l.uvmt --capacity 24GiB --policy oracle --json
  uvmprefetch replay gpt2l.uvmt --oversub 1.5 --policy deepum:window=32 --perfetto run.json --plot run.png
  uvmprefetch replay gpt2l.uvmt --oversub 2 --block-size 64KiB --gpu-set fault_batch_latency_s=30e-6
  uvmprefetch replay live.uvmt --oversub 1.5 --policy uvmprefetch --allocator first-fit --json
  uvmprefetch replay gpt2l.uvmt --oversub 2 --policy tmof --gpus 4          # 4 GPUs sharing one host link
  uvmprefetch replay gpt2l.uvmt --host live-sync --oversub 1.5 --policy oracle --evict uvm
  uvmprefetch replay gpt2l.uvmt --oversub 2 --evict copy:mirror_bytes=16GiB
"""


def add_gpu_arguments(p) -> None:
    """--gpu / --gpu-set / --block-size / --writeback-clean / --no-discard / --host / --evict, shared with ``bench``."""
    from ..gpus import DEFAULT_GPU, PROFILES
    p.add_argument("--gpu", default=DEFAULT_GPU, metavar="NAME",
                   help=f"GPU profile ({', '.join(PROFILES)}; default {DEFAULT_GPU}). A plain name carries the "
                        f"unified-memory costs measured on that card where it was measured (h100-pcie, h100-sxm, "
                        f"h200); NAME-lit the literature's (45 us fault batches, the link's bandwidth both ways)")
    p.add_argument("--gpu-set", action="append", metavar="FIELD=VALUE",
                   help="override a profile number, e.g. link_htod_bw=20e9 (repeatable)")
    p.add_argument("--ssd", metavar="PRESET",
                   help="add an SSD tier behind host memory (docs/tiers.md): pcie4-nvme, pcie4-nvme-6.4 or "
                        "pcie3-nvme; bound the host memory with --gpu-set host_capacity_bytes=N (default unlimited)")
    p.add_argument("--block-size", default="2MiB", metavar="SIZE",
                   help="simulated block: 2MiB (the driver's VA block, default) or 64KiB (its big page)")
    p.add_argument("--writeback-clean", action="store_true",
                   help="model a driver without dirty tracking: every evicted live block is written back")
    p.add_argument("--no-discard", dest="discards", action="store_false",
                   help="model the live GPU runtime's default (UVMPREFETCH_DISCARD unset): dead data is never "
                        "dropped, so a policy's discards are evictions and freed memory is written back and "
                        "moved back like live data (default: discards drop dead blocks for free)")
    p.add_argument("--host", default=None, metavar="MODEL",
                   help="model the host threads (docs/simulator.md 'Host clock'): live (the default with one GPU: "
                        "the runtime as built now, the C++ observer's cost on the training thread, decisions on a "
                        "planner thread taking effect 4 launches later at the earliest, moves on a mover thread "
                        "that UVM's eviction holds), live-sync (the earlier synchronous runtime: measured decision "
                        "time and evictions on the training thread), free (the host never limits; the default with "
                        "--gpus N), or k=v pairs such as decision_s=20e-6,blocking_evict=true, or "
                        "live:planner_lag=8")
    p.add_argument("--evict", default="auto", metavar="MODE[:k=v,...]",
                   help="how evicted data leaves the GPU (docs/simulator.md 'Eviction paths'): uvm (UVM's eviction "
                        "only, what the live runtime does today), copy (copy-out into a pinned host mirror + discard "
                        "for every block whose allocations the runtime fully observes, UVM for the rest) or auto "
                        "(default: the policy chooses per block; demand and deepum keep UVM's). Only profiles with "
                        "copy_dtoh_bw > 0 (the calibrated ones) have the copy path; elsewhere auto is uvm. "
                        "Parameters: mirror_bytes=SIZE (pinned mirror memory, default unlimited), "
                        "ineligible=KIND+KIND (allocation kinds to treat as not fully observed)")


def add_gpus_arguments(p) -> None:
    """--gpus / --own-links, shared with ``bench``."""
    p.add_argument("--gpus", default="1", metavar="N",
                   help="data-parallel GPUs sharing one host link, each running the trace (default 1; "
                        "docs/simulator.md 'Several GPUs on one host link'; the setting of the tmof policy)")
    p.add_argument("--own-links", action="store_true",
                   help="with --gpus N: give every GPU a link of its own (the no-contention reference)")


def gpus_from_args(args) -> int:
    """``--gpus`` as an int in 1..64 (ConfigError naming the flag otherwise)."""
    from ..errors import ConfigError
    try:
        n = int(args.gpus)
    except ValueError:
        raise ConfigError(f"--gpus {args.gpus!r}: expected a whole number of GPUs, 1..64") from None
    if not 1 <= n <= 64:
        raise ConfigError(f"--gpus {n}: expected 1..64")
    if args.own_links and n == 1:
        raise ConfigError("--own-links needs --gpus N with N > 1")
    return n


def gpu_from_args(args):
    """The GpuProfile that ``--gpu`` / ``--gpu-set`` name (ConfigError on a bad one)."""
    from ..gpus import get_profile, parse_overrides
    gpu = get_profile(args.gpu)
    over = parse_overrides(args.gpu_set)
    preset = getattr(args, "ssd", None)
    if preset:
        from ..errors import ConfigError
        from ..gpus import SSD_PRESETS
        if preset not in SSD_PRESETS:
            raise ConfigError(f"--ssd {preset!r}: unknown SSD preset; valid: {', '.join(SSD_PRESETS)}")
        over = {**SSD_PRESETS[preset], **over}
    return gpu.with_overrides(**over) if over else gpu


def host_spec(args, n_gpus: int = 1) -> str:
    """The host model's name or spec: ``--host``, else ``live`` with one GPU and ``free`` with several."""
    from ..sim.host import DEFAULT_HOST
    return args.host if args.host is not None else (DEFAULT_HOST if n_gpus == 1 else "free")


def host_from_args(args, n_gpus: int = 1):
    """The ``HostModel`` that ``--host`` names (``host_spec``), or None for a free host (ConfigError naming the flag
    on a bad one)."""
    from ..errors import ConfigError
    from ..sim.host import parse_host
    try:
        return parse_host(host_spec(args, n_gpus))
    except ConfigError as e:
        raise ConfigError(f"--host {args.host!r}: {e}") from None


def evict_from_args(args):
    """The ``EvictModel`` that ``--evict`` names (ConfigError naming the flag on a bad one)."""
    from ..errors import ConfigError
    from ..sim.copypath import parse_evict
    try:
        return parse_evict(args.evict)
    except ConfigError as e:
        raise ConfigError(f"--evict {args.evict!r}: {e}") from None


def block_size_from_args(args) -> int:
    from ..units import parse_size
    return parse_size(args.block_size, "--block-size")


def add_arguments(p) -> None:
    from ..policy import DEFAULT_POLICY, available
    p.add_argument("trace", metavar="TRACE", help="trace file (.uvmt) from `uvmprefetch record`")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--capacity", metavar="SIZE", help="GPU memory for managed data, e.g. 24GiB")
    g.add_argument("--oversub", type=float, metavar="X",
                   help="working footprint / capacity (1.0 = everything fits, 2.0 = half fits)")
    p.add_argument("--policy", default=DEFAULT_POLICY, metavar="NAME[:k=v,...]",
                   help=f"policy and parameters (default {DEFAULT_POLICY}); policies: {', '.join(available())}")
    add_gpu_arguments(p)
    add_gpus_arguments(p)
    p.add_argument("--allocator", default="auto", metavar="{auto,caching,first-fit}",
                   help="where the trace's tensors are placed in the simulated address space (decides which "
                        "tensors share a block, hence the footprint and the faults): 'caching' models PyTorch's "
                        "CUDA caching allocator (small-pool segments, 2 MiB-rounded large requests), right for "
                        "traces from `uvmprefetch record` or a real GPU run; 'first-fit' is the live dryrun "
                        "runtime's own address space, right for traces it recorded (UVMPREFETCH_TRACE with "
                        "UVMPREFETCH_BACKEND=dryrun), so the replay sees exactly the live run's blocks; 'auto' "
                        "(default) picks first-fit for traces the dryrun runtime recorded (trace meta), caching "
                        "otherwise. The result's 'allocator' field says which was used")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.add_argument("--perfetto", metavar="OUT.json", help="write a Chrome-trace timeline for ui.perfetto.dev")
    p.add_argument("--plot", metavar="OUT.png", help="plot GPU memory in use and stalls over time")


ALLOCATOR_CHOICES = ("auto", "caching", "first-fit")


def run(args) -> int:
    from ..errors import ConfigError
    from ..policy import make_policy
    from ..sim.replay import replay
    from ..trace.format import load
    from ..units import parse_size
    if args.allocator not in ALLOCATOR_CHOICES:
        raise ConfigError(f"--allocator {args.allocator!r}: choose one of {', '.join(ALLOCATOR_CHOICES)}")
    gpu = gpu_from_args(args)
    bs = block_size_from_args(args)
    cap = parse_size(args.capacity, "--capacity") if args.capacity is not None else None
    policy = make_policy(args.policy)
    n_gpus = gpus_from_args(args)
    trace = load(args.trace)
    evict = evict_from_args(args)
    want_tl = bool(args.perfetto or args.plot)
    if n_gpus > 1:
        if want_tl or args.writeback_clean or args.host or not args.discards:
            raise ConfigError("--perfetto, --plot, --writeback-clean, --no-discard and --host work with one GPU only "
                              "(drop --gpus)")
        from ..sim.multigpu import replay_multi
        res = replay_multi(trace, args.policy, gpu, n_gpus, capacity_bytes=cap, oversub=args.oversub,
                           block_size=bs, shared_link=not args.own_links, allocator=args.allocator, evict=evict)
        res["trace"] = str(args.trace)
        if args.json:
            from . import emit_json
            emit_json(res)
        else:
            print(format_multi(res))
        return 0
    host = host_from_args(args)
    res = replay(trace, policy, gpu, capacity_bytes=cap, oversub=args.oversub, block_size=bs, timeline=want_tl,
                 writeback_clean=args.writeback_clean, allocator=args.allocator, host=host, discards=args.discards,
                 evict=evict)
    res["trace"] = str(args.trace)
    if args.perfetto:
        from ..sim.timeline import write_perfetto
        write_perfetto(res, args.perfetto, trace.names)
    if args.plot:
        from ..sim.timeline import plot_timeline
        plot_timeline(res, args.plot)
    res.pop("timeline", None)
    if args.json:
        from . import emit_json
        emit_json(res)
    else:
        print(format_result(res))
    return 0


def _fmt(v, unit: str = "") -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}{unit}"
    return f"{v}{unit}"


def format_result(r: dict) -> str:
    """A short human-readable summary of one replay result."""
    from ..units import format_size

    def host_name(h):
        from ..sim.host import HostModel
        from ..sim.host import host_name as name
        return name(HostModel(**h) if h else None)
    lines = [
        f"trace      {r.get('trace', '-')}  ({r['n_launches']} launches, {r['iterations']} iterations)",
        f"gpu        {r['gpu']}  capacity {format_size(r['capacity_bytes'])}  footprint "
        f"{format_size(r['footprint_bytes'])}  oversub {r['oversub']:.3f}  block {format_size(r['block_size'])}",
        f"policy     {r['policy']}  (allocator model {r.get('allocator', '-')}; host model "
        f"{host_name(r.get('host'))})",
        f"time       {r['time_s'] * 1e3:.3f} ms  (ideal {r['ideal_s'] * 1e3:.3f} ms, slowdown {r['slowdown']:.3f}x, "
        f"steady state {_fmt(r['steady_slowdown'])}x)",
        f"stall      {r['stall_s'] * 1e3:.3f} ms  (faults {r['fault_stall_s'] * 1e3:.3f} ms, late prefetch "
        f"{r['late_stall_s'] * 1e3:.3f} ms)",
        f"faults     {r['faults']} blocks in {r['fault_batches']} batches",
        f"moved      H2D {format_size(r['bytes_htod'])}  D2H {format_size(r['bytes_dtoh'])}  "
        f"(evictions {r['evictions']}: {r['writebacks']} written back, {r['drops']} dropped)",
        f"prefetch   issued {format_size(r['prefetch_issued_bytes'])}  useful "
        f"{format_size(r['prefetch_useful_bytes'])}  accuracy {_fmt(r['accuracy'])}  coverage {_fmt(r['coverage'])}",
        f"cold       first-touch {format_size(r['cold_first_touch_bytes'])}, {r['cold_first_touch_s'] * 1e3:.3f} ms "
        f"on demand",
    ]
    if r.get("copy_path"):
        lines.append(f"copy path  out {format_size(r['copy_out_bytes'])} ({r['copy_evictions']} blocks copied, "
                     f"{r['discard_only_evictions']} only discarded), in {format_size(r['copy_in_bytes'])} "
                     f"({r['copy_in_gated']} gated, {r['copy_in_stall_s'] * 1e3:.3f} ms); mirrors peak "
                     f"{format_size(r['mirror_peak_bytes'])}; by UVM: {r['writebacks']} written back")
    elif r.get("evict", {}).get("mode", "uvm") != "uvm":
        lines.append(f"copy path  off: the profile {r['gpu']} has none (copy_dtoh_bw = 0), every eviction is UVM's")
    if r.get("host"):
        lines.append(f"host       GPU idle waiting for the host {r['host_stall_s'] * 1e3:.3f} ms; decisions "
                     f"{r['host_decision_s'] * 1e3:.3f} ms; host held by evictions {r['host_blocked_s'] * 1e3:.3f} ms")
        if r["host"].get("planner"):
            lines.append(f"threads    mover busy {r['mover_busy_s'] * 1e3:.3f} ms; decisions waiting at most "
                         f"{r['planner_pending_max']}")
    its = r.get("iteration_times_s") or []
    if its:
        cols = [f"{t * 1e3:.3f}" for t in its]
        lines.append("iterations " + "  ".join(cols) + " ms")
        # (per iteration, under each time: where warm-up iterations lose time against the steady state)
        for label, f, fmt, unit in ((" H2D", "iteration_bytes_htod", lambda v: f"{v / 2**30:.2f}", "GiB"),
                                    (" D2H", "iteration_bytes_dtoh", lambda v: f"{v / 2**30:.2f}", "GiB"),
                                    (" stall", "iteration_stall_s", lambda v: f"{v * 1e3:.3f}", "ms"),
                                    (" faults", "iteration_faults", str, "blocks")):
            vals = r.get(f)
            if vals and len(vals) == len(cols):
                lines.append(f"{label:<11s}" + "  ".join(fmt(v).rjust(len(c)) for c, v in zip(cols, vals))
                             + f" {unit}")
    lines.append(f"replay     {r['wall_s']:.2f} s wall, {_fmt(r['events_per_s'])} launches/s, "
                 f"{_fmt(r['block_accesses_per_s'])} block accesses/s")
    return "\n".join(lines)


def format_multi(r: dict) -> str:
    """A short summary of a multi-GPU replay (``--gpus N``)."""
    from ..units import format_size
    link = "one shared host link" if r["shared_link"] else "a link each"
    lines = [
        f"trace      {r.get('trace', '-')}  ({r['n_launches']} launches, {r['iterations']} iterations)",
        f"gpus       {r['n_gpus']} x {r['gpu']} on {link}  capacity {format_size(r['capacity_bytes'])} each  "
        f"oversub {r['oversub']:.3f}",
        f"policy     {r['policy']}",
        f"time       {r['time_s'] * 1e3:.3f} ms  (one GPU's ideal {r['ideal_s'] * 1e3:.3f} ms, slowdown "
        f"{r['slowdown']:.3f}x, steady state {_fmt(r['steady_slowdown'])}x)",
        f"waits      stalls {r['stall_s'] * 1e3:.3f} ms (all GPUs), at the iteration barriers "
        f"{r['sync_wait_s'] * 1e3:.3f} ms; shared H2D engine busy {_fmt(r['link_busy_htod'])} of the run",
        f"moved      H2D {format_size(r['bytes_htod'])}  D2H {format_size(r['bytes_dtoh'])}  (all GPUs); faults "
        f"{r['faults']}",
        "per GPU    " + "  ".join(f"#{g['rank']} stall {g['stall_s'] * 1e3:.1f} ms" for g in r["per_gpu"]),
        f"replay     {r['wall_s']:.2f} s wall",
    ]
    return "\n".join(lines)

