"""Replay a trace against the simulated GPU under one policy and measure it (docs/design.md §4 "Replay result").

Oversubscription is measured against the trace's *working footprint*: the number of distinct blocks any
launch touches after the allocations were placed by the caching-allocator model (``sim/layout.py``),
i.e. roughly the memory PyTorch would reserve on a GPU large enough to run it. ``oversub = footprint
blocks / capacity blocks``; given ``oversub``, the capacity is ``ceil(footprint / oversub)`` blocks, so at
1.0 everything fits and nothing is ever evicted.
"""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from ..errors import ConfigError
from ..gpus import GpuProfile, card_name, get_profile
from ..policy import make_policy
from ..policy.base import LaunchInfo, Policy
from ..trace.format import Trace
from .copypath import copy_eligible, parse_evict
from .engine import GpuModel, SimError
from .host import parse_host
from .layout import Layout, build_layout, fresh_for

DEFAULT_BLOCK = 2 << 20


def launch_durations(trace: Trace, gpu: GpuProfile) -> np.ndarray:
    """Durations of ``trace``'s launches on ``gpu``.

    A trace estimated for another GPU is re-estimated with the roofline model
    (``uvmprefetch.trace.roofline.durations_for``) when that module is available; measured durations and
    traces estimated for this GPU are used as recorded.
    """
    meta = trace.meta or {}
    traced_for = meta.get("gpu")
    # (a card's calibrated and literature profiles share its compute: their durations are the same)
    if traced_for in (None, "") or card_name(str(traced_for)) == card_name(gpu.name) or str(meta.get("durations", "estimated")).startswith("measured"):
        return trace.launch_dur
    try:
        from ..trace.roofline import durations_for
    except ImportError:
        return trace.launch_dur
    return np.asarray(durations_for(trace, gpu), dtype=np.float64)


def capacity_for(layout: Layout, capacity_bytes: int | None, oversub: float | None) -> int:
    """Capacity in bytes from exactly one of ``capacity_bytes`` / ``oversub`` (footprint / capacity).

    Raises
    ------
    ConfigError
        If both or neither are given, or ``oversub`` is not a positive number.
    """
    if (capacity_bytes is None) == (oversub is None):
        raise ConfigError("give exactly one of --capacity or --oversub")
    if oversub is not None:
        if not (isinstance(oversub, (int, float)) and math.isfinite(oversub) and oversub > 0):
            raise ConfigError(f"--oversub {oversub!r} must be a positive number (1.0 = everything fits)")
        return max(1, math.ceil(layout.footprint_blocks / oversub - 1e-9)) * layout.block_size
    if capacity_bytes <= 0:
        raise ConfigError(f"--capacity {capacity_bytes!r} must be positive")
    return int(capacity_bytes)


def replay(trace: Trace, policy: Policy | str, gpu: GpuProfile | str = "h100-pcie", capacity_bytes: int | None = None,
           oversub: float | None = None, block_size: int = DEFAULT_BLOCK, timeline: bool = False, *,
           layout: Layout | None = None, durations: np.ndarray | None = None, writeback_clean: bool = False,
           check: bool = False, allocator: str = "auto", host=None, discards: bool = True, evict=None) -> dict:
    """Replay ``trace`` under ``policy`` on a simulated ``gpu`` with the given capacity or oversubscription.

    Parameters
    ----------
    trace
        The recorded run.
    policy
        A ``Policy`` instance (fresh: it is started here) or a spec like ``"oracle"`` / ``"deepum:window=8"``.
    gpu
        A profile or its name.
    capacity_bytes, oversub
        Exactly one: GPU memory for managed data, or footprint / capacity.
    block_size
        2 MiB (default, the driver's VA block) or 64 KiB (its big page); any power of two 4 KiB..2 MiB.
    timeline
        Also return the event timeline under ``"timeline"`` (for ``--perfetto`` / ``--plot``).
    layout, durations
        Precomputed ``build_layout(trace, block_size)`` / ``launch_durations(trace, gpu)`` (the benchmark
        reuses them across policies).
    writeback_clean
        Model a driver without dirty tracking (every live evicted block is written back).
    discards
        ``False``: the live cuda backend's default (``UVMPREFETCH_DISCARD`` unset), where no dead data is
        dropped: discards become evictions and freed memory is written back and moved back like live data.
    check
        Verify the engine's invariants after every launch (tests).
    allocator
        The address model for ``build_layout``: ``"auto"`` (default: the live dryrun runtime's first-fit
        address space for a trace it recorded, so the replay sees the live run's blocks; the caching-allocator
        model otherwise), ``"caching"`` or ``"first-fit"``. Ignored when ``layout`` is given.
    host
        The host clock: a ``HostModel``, a preset name (``"live"``: the runtime's threads, the command line's
        default; ``"live-sync"``: the synchronous runtime; ``"free"``), ``"k=v,..."``, or None (default: the host
        never limits; ``docs/simulator.md`` "Host clock").
    evict
        The eviction paths: an ``EvictModel``, ``"uvm"`` (None, the default: UVM's eviction only, as the live runtime
        today), ``"copy"``, ``"auto"`` or ``"mode:k=v,..."`` (``docs/simulator.md`` "Eviction paths").

    Returns
    -------
    dict
        The fields of docs/design.md §4 and more; see ``docs/simulator.md``.

    Raises
    ------
    ConfigError
        Bad capacity/oversub/policy/GPU, or a capacity too small for the largest launch.
    """
    if isinstance(gpu, str):
        gpu = get_profile(gpu)
    if isinstance(policy, str):
        policy = make_policy(policy)
    if layout is None:
        t0 = time.perf_counter()
        layout = build_layout(trace, block_size, allocator)
        layout_s = time.perf_counter() - t0
    else:
        layout_s = 0.0
        if layout.block_size != block_size and block_size != DEFAULT_BLOCK:
            raise ConfigError(f"layout block size {layout.block_size} differs from block_size {block_size}")
    bs = layout.block_size
    cap = capacity_for(layout, capacity_bytes, oversub)
    cap_blocks = cap // bs
    widest = int(np.diff(layout.ptr).max()) if trace.n_launches else 0
    if not policy.ideal and cap_blocks < widest:
        need = widest * bs
        raise ConfigError(f"capacity {cap} bytes ({cap_blocks} blocks) is below the largest launch's "
                          f"{widest} blocks ({need} bytes); use a capacity of at least {need} bytes "
                          f"(oversub at most {layout.footprint_blocks / max(widest, 1):.2f})")
    dur = launch_durations(trace, gpu) if durations is None else durations
    evict = parse_evict(evict)
    copy_blocks = copy_eligible(trace, layout, evict.ineligible) if evict.mode != "uvm" and gpu.copy_path else None
    eng = GpuModel(gpu, cap, bs, layout.max_blocks, policy, timeline=timeline, trace=trace, layout=layout,
                   writeback_clean=writeback_clean, discards=discards, check=check, host=parse_host(host),
                   evict=evict, copy_blocks=copy_blocks, fresh=fresh_for(trace, layout))
    L = trace.n_launches
    its = trace.launch_iter.tolist()
    exec_ids = trace.launch_exec_id.tolist()
    names = trace.launch_name.tolist()
    phases = trace.launch_phase.tolist()
    durs = np.asarray(dur, dtype=np.float64).tolist()
    ptr, wptr, dptr = layout.ptr.tolist(), layout.wptr.tolist(), layout.dptr.tolist()
    blocks, wblocks, dead = layout.blocks, layout.write_blocks, layout.dead_blocks
    t0 = time.perf_counter()
    try:
        for i in range(L):
            if i and its[i] != its[i - 1] and its[i - 1] >= 0:
                eng.end_iteration(its[i - 1])
            if dptr[i + 1] > dptr[i]:
                eng.free(dead[dptr[i]:dptr[i + 1]])
            eng.launch(LaunchInfo(index=i, exec_id=exec_ids[i], name=names[i], phase=phases[i], iteration=its[i],
                                  duration=durs[i], blocks=blocks[ptr[i]:ptr[i + 1]],
                                  write_blocks=wblocks[wptr[i]:wptr[i + 1]]))
        if L and its[-1] >= 0:
            eng.end_iteration(its[-1])
        if dptr[L + 1] > dptr[L]:
            eng.free(dead[dptr[L]:dptr[L + 1]])
    except SimError as e:
        raise ConfigError(f"replay under policy {policy.name!r}: {e}") from None
    wall = time.perf_counter() - t0
    res = eng.result()
    ideal_s = float(np.sum(dur))
    out = {
        "policy": policy.name,
        "params": dataclasses.asdict(policy.params) if dataclasses.is_dataclass(policy.params) else {},
        "gpu": gpu.name,
        "capacity_bytes": cap_blocks * bs,
        "oversub": layout.footprint_blocks / cap_blocks if cap_blocks else None,
        "block_size": bs,
        "footprint_bytes": layout.footprint_blocks * bs,
        "reserved_bytes": layout.reserved_bytes,
        "allocator": layout.allocator,
        "time_s": res["time_s"],
        "ideal_s": ideal_s,
        "slowdown": res["time_s"] / ideal_s if ideal_s > 0 else None,
        "n_launches": L,
        "iterations": trace.iterations,
        "events_per_s": L / wall if wall > 0 else None,
        "block_accesses_per_s": res["block_accesses"] / wall if wall > 0 else None,
        "wall_s": wall,
        "layout_s": layout_s,
    }
    for k, v in res.items():
        out.setdefault(k, v)
    ideal_iters, prev = [], 0
    for k, _ in eng.iter_ends:
        last = int(np.flatnonzero(trace.launch_iter == k)[-1]) + 1 if (trace.launch_iter == k).any() else prev
        ideal_iters.append(float(np.sum(dur[prev:last])))
        prev = last
    out["ideal_iteration_times_s"] = ideal_iters
    # The last iteration is the steady state a long training run lives in (the first pays the cold start).
    its_t = out["iteration_times_s"]
    out["steady_slowdown"] = its_t[-1] / ideal_iters[-1] if its_t and ideal_iters and ideal_iters[-1] > 0 else None
    out["policy_report"] = policy.report()
    out["host"] = dataclasses.asdict(eng.host) if eng.host is not None else None
    out["evict"] = dataclasses.asdict(evict)
    out["copy_path"] = eng.copy_on
    if timeline:
        out["timeline"] = eng.timeline()
    return out
