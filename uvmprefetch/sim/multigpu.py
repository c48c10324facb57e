"""Several data-parallel GPUs that share one host link (the setting of TMOF, HPCA'23).

Data-parallel training runs the same step on every GPU (same model, same kernels, other data), so every GPU
replays the same trace. What they share is the path to host memory: GPUs behind one PCIe switch (the usual
8-GPU server has two GPUs per switch) or one CPU root port share its bandwidth, so when every GPU swaps at the
same moment, each gets a fraction of the link. ``replay_multi`` steps ``n_gpus`` ``GpuModel``s launch by
launch over one shared ``Link``:

- **Shared link**: one host-to-device and one device-to-host copy engine *for all GPUs* (``Link``): a
  transfer of any GPU queues behind the transfers every GPU issued before it (FIFO). Each transfer still
  moves at the profile's per-transfer bandwidth (the switch's uplink is as fast as one GPU's link), so one
  GPU alone sees exactly the single-GPU model; ``shared_link=False`` gives every GPU a link of its own.
- **Event order**: at each launch index the GPUs run in the order of their compute clocks (the one that is
  furthest behind first), so transfers enter the shared FIFO roughly in time order.
- **Synchronisation**: data parallelism all-reduces the gradients every step; at the end of each iteration
  every GPU waits for the slowest (``sync_wait_s``). The all-reduce itself is not modelled (it takes the same
  time under every policy; it would run over NVLink or the same PCIe switch).
- **Ranks**: GPU ``r`` gets its own policy object, told ``rank = r`` and ``world = n_gpus`` before it
  starts (``Policy.rank`` / ``Policy.world``). Policies that ignore them make the same decisions on every
  GPU at the same time: the contention TMOF's disjoint swapping avoids.

The result has the single-GPU fields (``time_s`` = the slowest GPU's clock, ``slowdown`` against the ideal
time of one GPU, ``iteration_times_s`` between barriers, byte counters summed over GPUs) plus ``n_gpus``,
``shared_link``, ``sync_wait_s``, ``link_busy_htod`` (fraction of the run the shared H2D engine was busy)
and ``per_gpu`` (each GPU's own time, stall, faults and bytes).
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from ..errors import ConfigError
from ..gpus import GpuProfile, get_profile
from ..policy import make_policy
from ..policy.base import LaunchInfo
from ..trace.format import Trace
from .copypath import copy_eligible, parse_evict
from .engine import GpuModel, SimError
from .link import Link
from .layout import Layout, build_layout, fresh_for
from .replay import DEFAULT_BLOCK, capacity_for, launch_durations

_SUMMED = ("faults", "fault_batches", "bytes_htod", "bytes_dtoh", "prefetch_issued_bytes", "prefetch_useful_bytes",
           "stall_s", "fault_stall_s", "late_stall_s", "evictions", "writebacks")


def replay_multi(trace: Trace, policy: str, gpu: GpuProfile | str = "h100-pcie", n_gpus: int = 4, *,
                 oversub: float | None = None, capacity_bytes: int | None = None, shared_link: bool = True,
                 block_size: int = DEFAULT_BLOCK, layout: Layout | None = None, durations: np.ndarray | None = None,
                 check: bool = False, allocator: str = "auto", evict=None) -> dict:
    """Replay ``trace`` on ``n_gpus`` data-parallel GPUs that share one host link.

    Parameters
    ----------
    trace
        One GPU's training step (every GPU runs it).
    policy
        A policy spec (``"tmof"``, ``"uvmprefetch:window=64"``): each GPU gets its own instance.
    gpu
        The profile of each GPU and of the shared link (its ``link_htod_bw`` / ``link_dtoh_bw``).
    n_gpus
        Number of GPUs (1 reproduces ``replay``'s timing).
    oversub, capacity_bytes
        Exactly one, per GPU, as in ``replay``.
    shared_link
        False: every GPU has a link of its own (the no-contention reference).
    check
        Verify the engines' invariants after every launch (tests).
    evict
        The eviction paths, as in ``replay`` (the copy engines of the copy path are the shared link's).

    Raises
    ------
    ConfigError
        Bad ``n_gpus``, capacity, policy or GPU; a capacity below the largest launch.
    """
    if not isinstance(n_gpus, int) or isinstance(n_gpus, bool) or not 1 <= n_gpus <= 64:
        raise ConfigError(f"n_gpus must be an integer in 1..64, got {n_gpus!r}")
    if isinstance(gpu, str):
        gpu = get_profile(gpu)
    if not isinstance(policy, str):
        raise ConfigError("replay_multi takes a policy spec (a string): each GPU needs its own policy object")
    if layout is None:
        layout = build_layout(trace, block_size, allocator)
    bs = layout.block_size
    cap = capacity_for(layout, capacity_bytes, oversub)
    widest = int(np.diff(layout.ptr).max()) if trace.n_launches else 0
    policies = []
    for r in range(n_gpus):
        p = make_policy(policy)
        p.rank, p.world = r, n_gpus
        policies.append(p)
    if not policies[0].ideal and cap // bs < widest:
        raise ConfigError(f"capacity {cap} bytes is below the largest launch's {widest} blocks of {bs} bytes")
    dur = launch_durations(trace, gpu) if durations is None else durations
    shared = Link() if shared_link else None
    evict = parse_evict(evict)
    copy_blocks = copy_eligible(trace, layout, evict.ineligible) if evict.mode != "uvm" and gpu.copy_path else None
    engines = [GpuModel(gpu, cap, bs, layout.max_blocks, p, trace=trace, layout=layout, check=check,
                        link=shared if shared_link else Link(), evict=evict, copy_blocks=copy_blocks,
                        fresh=fresh_for(trace, layout))
               for p in policies]
    L = trace.n_launches
    its = trace.launch_iter.tolist()
    exec_ids, names, phases = trace.launch_exec_id.tolist(), trace.launch_name.tolist(), trace.launch_phase.tolist()
    durs = np.asarray(dur, dtype=np.float64).tolist()
    ptr, wptr, dptr = layout.ptr.tolist(), layout.wptr.tolist(), layout.dptr.tolist()
    blocks, wblocks, dead = layout.blocks, layout.write_blocks, layout.dead_blocks
    barriers: list[float] = []
    sync_wait = 0.0

    def barrier(k: int) -> None:
        nonlocal sync_wait
        t = max(e.now for e in engines)
        for e in engines:
            sync_wait += t - e.now
            e.now = t
            e.end_iteration(k)
        barriers.append(t)

    t0 = time.perf_counter()
    try:
        for i in range(L):
            if i and its[i] != its[i - 1] and its[i - 1] >= 0:
                barrier(its[i - 1])
            if dptr[i + 1] > dptr[i]:
                for e in engines:
                    e.free(dead[dptr[i]:dptr[i + 1]])
            info = LaunchInfo(index=i, exec_id=exec_ids[i], name=names[i], phase=phases[i], iteration=its[i],
                              duration=durs[i], blocks=blocks[ptr[i]:ptr[i + 1]],
                              write_blocks=wblocks[wptr[i]:wptr[i + 1]])
            for e in sorted(engines, key=lambda e: e.now):
                e.launch(info)
        if L and its[-1] >= 0:
            barrier(its[-1])
        if dptr[L + 1] > dptr[L]:  # frees after the last launch (as replay does)
            for e in engines:
                e.free(dead[dptr[L]:dptr[L + 1]])
    except SimError as e:
        raise ConfigError(f"multi-GPU replay under policy {policy!r}: {e}") from None
    wall = time.perf_counter() - t0
    res = [e.result() for e in engines]
    ideal_s = float(np.sum(dur))
    t_end = max(e.now for e in engines)
    out = {"policy": policies[0].name, "gpu": gpu.name, "n_gpus": n_gpus, "shared_link": shared_link,
           "capacity_bytes": (cap // bs) * bs, "oversub": layout.footprint_blocks / (cap // bs) if cap >= bs else None,
           "footprint_bytes": layout.footprint_blocks * bs, "block_size": bs,
           "time_s": t_end, "ideal_s": ideal_s, "slowdown": t_end / ideal_s if ideal_s > 0 else None,
           "sync_wait_s": sync_wait, "wall_s": wall, "n_launches": L, "iterations": trace.iterations,
           "block_accesses": sum(r["block_accesses"] for r in res)}
    out["events_per_s"] = L * n_gpus / wall if wall > 0 else None
    out["block_accesses_per_s"] = out["block_accesses"] / wall if wall > 0 else None
    for k in _SUMMED:
        out[k] = sum(r[k] for r in res)
    busy = shared.busy_htod if shared_link else sum(e.link.busy_htod for e in engines) / n_gpus
    out["link_busy_htod"] = busy / t_end if t_end > 0 else None
    out["iteration_times_s"] = list(np.diff([0.0] + barriers))
    ideal_iters, prev = [], 0
    for k in sorted(set(i for i in its if i >= 0)):
        last = int(np.flatnonzero(trace.launch_iter == k)[-1]) + 1
        ideal_iters.append(float(np.sum(dur[prev:last])))
        prev = last
    out["ideal_iteration_times_s"] = ideal_iters
    t_it = out["iteration_times_s"]
    out["steady_slowdown"] = t_it[-1] / ideal_iters[-1] if t_it and ideal_iters and ideal_iters[-1] > 0 else None
    out["per_gpu"] = [{"rank": r, "time_s": e.now, "stall_s": x["stall_s"], "faults": x["faults"],
                       "bytes_htod": x["bytes_htod"], "bytes_dtoh": x["bytes_dtoh"]}
                      for r, (e, x) in enumerate(zip(engines, res))]
    out["policy_report"] = policies[0].report()
    out["evict"] = dataclasses.asdict(evict)
    out["copy_path"] = engines[0].copy_on
    return out
