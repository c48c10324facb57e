"""The simulated GPU: unified memory in blocks, a compute stream, two copy engines, the driver's fault path.

``GpuModel`` is stateful and steppable: the replay driver (``sim/replay.py``) feeds it a trace launch by
launch, and the live runtime's ``dryrun`` backend feeds it live observations through the same four calls
(``free``, ``launch``, ``end_iteration``, ``result``). The model and every number in it are described in
``docs/simulator.md``; the short version:

- Memory is ``max_blocks`` blocks of ``block_size`` bytes, each *on the host*, *in flight* to the GPU
  (with an arrival time), or *resident*, plus flags *dirty* (written since it arrived), *dead* (its
  allocation was freed: contents do not matter), *touched* (ever used) and an ``Advice``.
- Capacity counts resident + in-flight blocks + evicted dirty blocks whose write-back has not finished
  (their room is freed when the write-back completes). It is never exceeded.
- The compute stream runs launches in order. Launch ``i`` starts at the end of ``i-1``, or later if some
  of its blocks are still in flight (late prefetch) or missing (faults).
- Host-to-device (H2D) and device-to-host (D2H) copy engines (``sim/link.py``) are separate FIFO queues; one
  block moves in ``gpu.transfer_time(bytes)`` (the UVMSmart size curve); a prefetch of consecutive blocks moves
  as one transfer. Fault migrations go to the front of the H2D queue (the driver services faults first): queued
  prefetches are pushed back by the link time the faults take.
- Missing blocks fault (``sim/faults.py``: fault batches, the driver's density prefetcher).
- When room is needed and the policy left none, the model evicts by the driver's rule: the least recently
  *migrated* resident block, never one of the running launch. Evicting a dirty live block writes it back
  on D2H; a clean or dead one is dropped for free (``writeback_clean=True`` models a driver without dirty
  tracking: every live non-read-mostly block is written back).
- A dead block (its memory was freed) comes back without a transfer (zero-filled), but still faults. So does a
  *fresh* block (``fresh``: no processor has populated its pages, as the trace's allocations show) on its first
  touch, on a profile that models populates (``GpuProfile.populates``): the driver maps it without data.
  A Decision's ``populate`` maps dead blocks whose pages were dropped on the GPU without data, beside the H2D
  queue: ``repopulate_call_s + k * repopulate_block_s`` per decision, from the moment the launch it is applied
  before would start (docs/simulator.md "Populates"); any other block named there is prefetched instead.
  ``discards=False`` models the live cuda backend's default (``UVMPREFETCH_DISCARD`` unset): the driver is
  never told that memory died, so nothing is dead, a Decision's discards are evictions (written back when
  dirty) and freed memory comes back with a transfer.
- ``Advice.READ_MOSTLY``: a write to such a block invalidates the host copy (one fault-batch latency per
  launch that writes any). ``Advice.PREFER_HOST``: the block stays in host memory and the kernel reads it
  over the link: ``blocks * block_size / remote_bw`` is added to the launch's duration.
- Optional host clock (``sim/host.py``; off without ``host``, and then none of its code runs): launch ``i`` cannot
  start before the thread that launches the kernels issued it (per-launch cost, the policy's decision, discards,
  and with ``blocking_evict`` the write-backs the decision queued), or, with a planner thread, its decision takes
  effect only once the planner made it and the mover is free. See ``docs/simulator.md`` "Host clock".
- A policy with ``ideal = True`` gets infinite memory: every launch starts when the previous one ends.
- Optional SSD tier (``sim/ssd.py``, when ``gpu.ssd_bw > 0``): bounded host memory with an SSD behind it. See
  ``docs/tiers.md``.
- Optional copy path (``sim/copypath.py``, ``evict`` other than ``uvm`` on a profile with ``copy_dtoh_bw > 0``):
  copy-out into a pinned mirror + discard, and back by repopulate + copy-in, beside UVM's eviction.
"""

from __future__ import annotations

import math
from operator import attrgetter

import numpy as np

from ..errors import ConfigError, SimError  # SimError lives in the error hierarchy; re-exported here
from ..gpus import GpuProfile
from ..policy.base import Advice, Decision, LaunchInfo, Policy, PolicyContext
from .copypath import CopyPath, EvictModel
from .faults import _PREFER_HOST, DENSITY, REGION, FaultPath
from .host import HOST_PRESETS, HostModel, HostThreads, host_launch, parse_host  # noqa: F401 - (re-exported: their old home)
from .link import Link, Queue, fifo_finish
from .populate import Populates
from .room import Room
from .ssd import SsdTier

_READ_MOSTLY = int(Advice.READ_MOSTLY)  # (a plain int: enum attribute lookups are slow in the per-launch path)
# Counters also reported per iteration (``result()``: ``iteration_<name>``, from one ``end_iteration`` to the next)
_PER_ITERATION = ("bytes_htod", "bytes_dtoh", "stall_s", "faults")


def _link_clock(direction: str) -> property:
    """A copy engine's clock (when its queue drains, seconds): it lives on the (possibly shared) link."""
    def fset(self, t: float) -> None:
        setattr(self.link, direction, t)
    return property(attrgetter(f"link.{direction}"), fset)


class GpuModel(FaultPath, Room, SsdTier, CopyPath, Populates):
    """One simulated GPU driven launch by launch. See the module docstring for the model.

    Parameters
    ----------
    gpu
        Link, fault and capacity numbers (``uvmprefetch.gpus``).
    capacity_bytes
        GPU memory available to managed data; rounded down to whole blocks.
    block_size
        Bytes per block (2 MiB: the driver's VA block; 64 KiB: its big page).
    max_blocks
        Block ids are ``0 <= b < max_blocks``.
    policy
        The policy driven through the hooks of ``uvmprefetch.policy.base``; ``on_start`` is called here.
    timeline
        Record per-event intervals for ``timeline()`` (Perfetto export, plots). Costs memory.
    trace, layout
        Given to the policy's context when it is ``offline`` (planners, the oracle).
    writeback_clean
        Model a driver without dirty tracking: evicting any live block that is not read-mostly writes it back.
    discards
        The runtime may drop dead data (the live cuda backend with ``UVMPREFETCH_DISCARD=1``). ``False`` is
        that backend's default: frees make no block dead (evicting freed memory writes it back, bringing it
        back moves it) and a Decision's discards are evictions, counted in ``refused_discards``.
    check
        Verify invariants after every launch (capacity, counters): for tests; O(max_blocks) per launch.
    link
        The host link's copy engines (``Link``); a new one unless GPUs share one (``sim/multigpu.py``).
    evict, copy_blocks
        The eviction paths (``EvictModel``; None = UVM's only, as the live runtime today) and which blocks are
        copy-eligible (bool per block; None = all: ``sim/copypath.py``).
    fresh
        Bool per block: nothing populated its pages before its first touch (``Layout.fresh``; None = none). On a
        profile that models populates (``GpuProfile.populates``) a fresh block is dead until a launch touches it.

    Raises
    ------
    ConfigError
        If the capacity is under one block or the block size is not positive.
    """

    def __init__(self, gpu: GpuProfile, capacity_bytes: int, block_size: int, max_blocks: int, policy: Policy,
                 *, timeline: bool = False, trace=None, layout=None, writeback_clean: bool = False,
                 discards: bool = True, check: bool = False, link: Link | None = None,
                 host: HostModel | None = None, evict: EvictModel | None = None, copy_blocks=None,
                 fresh=None) -> None:
        if block_size <= 0:
            raise ConfigError(f"block size must be positive, got {block_size}")
        self.gpu = gpu
        self.block_size = int(block_size)
        self.ideal = bool(getattr(policy, "ideal", False))
        cap = int(capacity_bytes) // self.block_size
        if cap < 1 and not self.ideal:
            raise ConfigError(f"capacity {capacity_bytes} bytes is less than one {block_size}-byte block")
        self.capacity_blocks = cap if not self.ideal else max(cap, int(max_blocks))
        self.max_blocks = int(max_blocks)
        self.policy = policy
        # The naive driver never learns that PyTorch freed memory; a policy says so with invalidates_frees=False.
        # Without discards (the live default) no runtime tells it either, whatever the policy would do.
        self.discards = bool(discards)
        self.invalidate_frees = bool(getattr(policy, "invalidates_frees", True)) and self.discards
        self.writeback_clean = writeback_clean
        self.check = check
        self._timeline = timeline
        n = self.max_blocks
        self.resident = np.zeros(n, dtype=bool)
        self.in_flight = np.zeros(n, dtype=bool)
        self.arrive = np.zeros(n, dtype=np.float64)
        self.dirty = np.zeros(n, dtype=bool)
        self.dead = np.zeros(n, dtype=bool)
        self.touched = np.zeros(n, dtype=bool)
        # Truth, whatever the policy models: every allocation in the block was freed since a launch last touched
        # it. Only such blocks may be discarded (a discard of live data would lose it on a real GPU).
        self.freed = np.zeros(n, dtype=bool)
        self.advice = np.zeros(n, dtype=np.int8)
        self.pf_pending = np.zeros(n, dtype=bool)
        self.mig_seq = np.zeros(n, dtype=np.int64)
        self.wb_done = np.zeros(n, dtype=np.float64)  # a block cannot come back before its write-back ends
        self._protect = np.zeros(n, dtype=bool)
        self._seq = 0
        self._lrm = Queue(np.int64)  # resident blocks in migration order (lazy deletion by mig_seq)
        self._inflight = Queue(np.float64)  # in-flight blocks in H2D order, with arrival times
        self._wb = Queue(np.float64)  # evicted blocks whose write-back holds a slot until the given time
        self.n_resident = 0
        self.n_inflight = 0
        # Clocks.
        self.now = 0.0  # the compute stream: end of the last launch
        self.host = host  # the launching thread's model, or None (the host is never the bottleneck)
        self.host_t = 0.0  # when the host has issued the last launch
        self.threads = HostThreads() if host is not None and host.planner else None  # the planner's and mover's clocks
        self.link = link if link is not None else Link()
        self.link.members.append(self)
        # Per-block transfer and fault costs.
        bs = self.block_size
        self.t_blk_h2d = gpu.transfer_time(bs, "htod")
        self.t_blk_d2h = gpu.transfer_time(bs, "dtoh")
        # Faulted data moves in fault-granule pieces (64 KiB), slower than one large prefetch copy.
        g = min(gpu.fault_granule_bytes, bs)
        self.t_fault_blk = gpu.transfer_time(g, "htod") * (bs / g)
        granules = max(1, bs // gpu.fault_granule_bytes)
        self.entries_per_block = math.ceil(DENSITY * granules) if granules > 1 else 1
        self.region_blocks = max(1, REGION // bs)
        self.remote_bw = gpu.remote_access_bw or gpu.link_htod_bw
        # Metrics.
        self.m = dict(launches=0, block_accesses=0, stall_s=0.0, fault_stall_s=0.0, late_stall_s=0.0, faults=0,
                      fault_entries=0, fault_batches=0, late_blocks=0, bytes_htod=0, bytes_dtoh=0,
                      prefetch_issued_bytes=0, prefetch_useful_bytes=0, prefetch_wasted_bytes=0,
                      prefetch_dropped_blocks=0, driver_prefetch_bytes=0, zero_fill_blocks=0, evictions=0,
                      policy_evictions=0, writebacks=0, drops=0, discards=0, refused_discards=0, remote_bytes=0,
                      remote_s=0.0,
                      invalidations=0, peak_used_blocks=0, cold_first_touch_bytes=0, cold_first_touch_s=0.0,
                      compute_s=0.0)
        if host is not None:
            self.m.update(host_stall_s=0.0, host_decision_s=0.0, host_blocked_s=0.0)
            if self.threads is not None:
                self.m.update(mover_busy_s=0.0, planner_pending_max=0)
        self._tier_setup(gpu, n)  # (the SSD tier, when the profile has one: docs/tiers.md)
        self._copy_setup(evict or EvictModel(), copy_blocks, n)  # (the copy path: sim/copypath.py)
        self._populate_setup(gpu, n, fresh)  # (populates and fresh blocks: sim/populate.py)
        self.iter_ends: list[tuple[int, float]] = []
        self._iter_counts: list[tuple] = []  # the counters of ``_PER_ITERATION`` at each ``end_iteration``
        self.events: dict[str, list] = {"compute": [], "h2d": [], "d2h": [], "fault": [], "resident": [], "block": []}
        self._since = np.full(n, np.nan) if timeline else None  # when each block landed on the GPU
        ctx = PolicyContext(block_size=bs, capacity_blocks=self.capacity_blocks, max_blocks=n, gpu=gpu,
                            live=False, discards=self.discards, trace=trace if policy.offline else None,
                            layout=layout if policy.offline else None, copy_path=self.copy_on,
                            populates=self.populate_on and not self.ideal, fresh_memory=bool(self.fresh.any()),
                            sync_moves=host is not None and not host.mover)
        policy.on_start(ctx)

    t_h2d = _link_clock("h2d")
    t_d2h = _link_clock("d2h")

    # ------------------------------------------------------------------------------------ ResidencyView
    @property
    def used_blocks(self) -> int:
        """Resident + in flight + evicted blocks still being written back (all hold GPU room)."""
        return self.n_resident + self.n_inflight + len(self._wb)

    # ------------------------------------------------------------------------------------------- API
    def free(self, blocks: np.ndarray) -> None:
        """Blocks that became wholly dead (their allocations were freed) before the next launch.

        Calls ``policy.on_free``; unless the policy models a driver that never learns of frees
        (``invalidates_frees = False``), touched blocks are marked dead: evicting them is free and they
        come back without a transfer (fresh ones stay dead). Resident dead blocks keep their room until evicted.
        """
        blocks = self._ids(blocks, "free")
        if not blocks.size:
            return
        self.freed[blocks] = True
        self.policy.on_free(blocks)
        if self.invalidate_frees and not self.ideal:
            self.dead[blocks] = self.touched[blocks] | self.fresh[blocks]
            if self.tier:
                self._release(blocks[self.dead[blocks]])
            if self.copy_on:
                self._unmirror(blocks[self.dead[blocks]])

    def launch(self, info: LaunchInfo) -> dict:
        """Run launch ``info`` on the compute stream: ``on_launch`` -> apply the Decision -> faults -> run.

        Returns a dict with ``start``, ``end``, ``stall`` (seconds the compute stream waited),
        ``faults`` (blocks faulted) and ``late`` (blocks that were still in flight).

        Raises
        ------
        SimError
            If the launch touches more blocks than the capacity, or a block id is out of range.
        """
        now = self.now
        blocks = self._ids(info.blocks, "launch blocks")
        writes = self._ids(info.write_blocks, "launch write_blocks")
        if blocks.size > 1 and not (blocks[1:] > blocks[:-1]).all():  # live callers may repeat blocks
            blocks = np.unique(blocks)
        nb = blocks.shape[0]
        m = self.m
        m["launches"] += 1
        m["block_accesses"] += nb
        first = blocks[~self.touched[blocks]]
        if first.size:
            moved = first.size - int(self.fresh[first].sum())  # (fresh ones are zero-filled: nothing moves)
            m["cold_first_touch_bytes"] += moved * self.block_size
            m["cold_first_touch_s"] += (moved * self.t_fault_blk + self.gpu.fault_batch_latency_s *
                                        math.ceil(first.size * self.entries_per_block / self.gpu.fault_batch_size))
        if self.ideal:
            self.policy.on_launch(info, self)
            start = now
            n_fault = n_late = 0
            extra = 0.0
        else:
            self._advance(now)
            if nb > self.capacity_blocks:
                raise SimError(f"launch {info.index} touches {nb} blocks but the capacity is "
                               f"{self.capacity_blocks} blocks: raise the capacity")
            self._protect[blocks] = True
            host = self.host
            if host is None:
                dec = self.policy.on_launch(info, self)
                if dec is not None and not dec.is_empty():
                    self._apply(dec, now)
            else:
                now, dec = host_launch(self, info, now, host)
            far = self.advice[blocks] == _PREFER_HOST
            need = blocks[~far] if far.any() else blocks
            missing = need[~self.resident[need] & ~self.in_flight[need]]
            fault_done = now
            n_fault = int(missing.size)
            if n_fault:
                self.policy.on_fault(info, missing)
                fault_done = (self._service_missing if self.copy_on else self._service_faults)(missing, now)
            inf = need[self.in_flight[need]]
            n_late = int(inf.size)
            wait = float(self.arrive[inf].max()) if n_late else now
            if self._pop_end > now and need.size:  # (a populate of its blocks still running)
                wait = self._populate_wait(need, max(now, fault_done, wait))
            start = max(now, fault_done, wait)
            m["fault_stall_s"] += fault_done - now
            m["late_stall_s"] += start - max(now, fault_done)
            m["late_blocks"] += n_late
            pf = need[self.pf_pending[need]]
            if pf.size:
                m["prefetch_useful_bytes"] += pf.size * self.block_size
                self.pf_pending[pf] = False
            # Remote reads of host-preferred blocks and read-mostly invalidations stretch the launch.
            extra = 0.0
            if far.any():
                nbytes = int(far.sum()) * self.block_size
                t = nbytes / self.remote_bw
                if self.gpu.remote_write_bw:  # written blocks at the write bandwidth (reads overlap: duplex link)
                    kw = int(np.isin(blocks[far], writes).sum()) * self.block_size
                    t += kw / self.gpu.remote_write_bw - kw / self.remote_bw
                extra += t
                m["remote_bytes"] += nbytes
                m["remote_s"] += t
            if writes.size:
                wr = writes[self.advice[writes] != _PREFER_HOST]
                if (self.advice[wr] == _READ_MOSTLY).any():
                    extra += self.gpu.fault_batch_latency_s
                    m["invalidations"] += 1
                self.dirty[wr] = True
                if self.tier and wr.size:
                    self._release(wr)  # written on the GPU: the host/SSD copies are stale
                if self.copy_on:
                    self._unmirror(wr)
            self.dead[blocks] = False
            self.fresh[blocks] = False
            self._protect[blocks] = False
        self.touched[blocks] = True
        self.freed[blocks] = False
        end = start + float(info.duration) + extra
        m["compute_s"] += float(info.duration)
        m["stall_s"] += start - now
        self.now = end
        if self._timeline:
            self.events["compute"].append((start, end, info.index, info.name))
            self.events["resident"].append((start, self.n_resident + self.n_inflight))
        if self.check:
            self._check_invariants()
        return {"start": start, "end": end, "stall": start - now, "faults": n_fault, "late": n_late}

    def end_iteration(self, k: int) -> None:
        """Iteration ``k`` ended with the last launch given; calls ``policy.on_iteration(k)``."""
        self.iter_ends.append((int(k), self.now))
        if self.host is not None and self.host.sync_iterations:
            self.host_t = max(self.host_t, self.now)  # (the host waited for the GPU: the next launch starts from here)
        m = self.m
        self._iter_counts.append(tuple(m[f] for f in _PER_ITERATION))
        self.policy.on_iteration(int(k))

    def result(self) -> dict:
        """The metrics so far (docs/design.md §4 fields that the engine knows; ``replay`` adds the rest)."""
        m = dict(self.m)
        m["time_s"] = self.now
        issued, useful = m["prefetch_issued_bytes"], m["prefetch_useful_bytes"]
        m["accuracy"] = useful / issued if issued else None
        served = useful // self.block_size
        m["coverage"] = served / (served + m["faults"]) if served + m["faults"] else None
        m["capacity_blocks"] = self.capacity_blocks
        m["block_size"] = self.block_size
        m["resident_blocks_end"] = self.n_resident
        times, prev = [], 0.0
        for _, t in self.iter_ends:
            times.append(t - prev)
            prev = t
        m["iteration_times_s"] = times
        prev = (0,) * len(_PER_ITERATION)
        per = {f: [] for f in _PER_ITERATION}
        for c in self._iter_counts:
            for f, a, b in zip(_PER_ITERATION, c, prev):
                per[f].append(a - b)
            prev = c
        for f, v in per.items():
            m["iteration_" + f] = v
        return m

    def timeline(self) -> dict:
        """Recorded intervals (when built with ``timeline=True``): lists of tuples per track, seconds.

        ``compute``: (start, end, launch index, name id); ``h2d``/``d2h``: (start, end, blocks, kind);
        ``fault``: (time, blocks, batches); ``resident``: (time, used blocks); ``block``: (block ids, landed,
        left) arrays, one entry per eviction batch plus the blocks still on the GPU (left = now)."""
        if not self._timeline:
            return self.events
        on = np.flatnonzero(~np.isnan(self._since))
        ev = dict(self.events)
        ev["block"] = self.events["block"] + ([(on, self._since[on], np.full(on.size, self.now))] if on.size else [])
        return ev

    # ------------------------------------------------------------------------------------ internals
    def _ids(self, blocks, what: str) -> np.ndarray:
        b = np.asarray(blocks, dtype=np.int64)
        if b.ndim == 1 and b.size <= 32:  # a launch's few blocks: a list's min/max cost a fraction of two reductions
            ids = b.tolist()
            if not ids or (min(ids) >= 0 and max(ids) < self.max_blocks):
                return b
        if b.size and (b.min() < 0 or b.max() >= self.max_blocks):
            raise SimError(f"{what}: block id out of range 0..{self.max_blocks - 1} "
                           f"(got {int(b.min())}..{int(b.max())})")
        return b

    def _advance(self, t: float) -> None:
        """Arrivals and write-back completions up to time ``t`` take effect."""
        q = self._inflight
        if len(q):
            blk, arr = q.view()
            k = int(np.searchsorted(arr, t, side="right"))
            if k:
                done = blk[:k].copy()
                q.head += k
                self.in_flight[done] = False
                self.resident[done] = True
                self.n_inflight -= k
                self.n_resident += k
                self._lrm.push(done, self.mig_seq[done])
        w = self._wb
        if len(w):
            _, rel = w.view()
            w.head += int(np.searchsorted(rel, t, side="right"))

    def _note_used(self) -> None:
        u = self.used_blocks
        if u > self.m["peak_used_blocks"]:
            self.m["peak_used_blocks"] = u

    def _migrated(self, blocks: np.ndarray) -> None:
        n = blocks.shape[0]
        self.mig_seq[blocks] = np.arange(self._seq + 1, self._seq + n + 1)
        self._seq += n

    def _evict(self, victims: np.ndarray, now: float, to_ssd: bool = False, copy=None) -> np.ndarray:
        """Take resident ``victims`` off the GPU; returns when each one's room is free (write-back end). ``copy``
        (bool, or per victim): it may leave by the copy path; None: by UVM into the managed range (PREFER_HOST)."""
        if self.check:
            assert self.resident[victims].all(), "evicting a block that is not resident"
        n = victims.shape[0]
        m = self.m
        live = ~self.dead[victims]
        self.dropped[victims] = ~live
        if self.writeback_clean:
            wb = live & ((self.advice[victims] != _READ_MOSTLY) | self.dirty[victims])
        else:
            wb = live & self.dirty[victims]
        cp = self._copy_choice(victims, live, copy) if self.copy_on and copy is not None else None
        if cp is not None:
            wb &= ~cp
        rel = np.full(n, now)
        k_ssd = 0
        if self.tier:
            wb = wb | (live & self.unbacked[victims])
            self.unbacked[victims] = False
            wb, sw = self._tier_split(victims, live, wb, to_ssd)
            k_ssd = int(sw.sum())
        k = int(wb.sum())
        if k:
            start = max(self.t_d2h, now)
            ends = start + self.t_blk_d2h * np.arange(1, k + 1)
            rel[wb] = ends
            self.wb_done[victims[wb]] = ends
            self.t_d2h = self._uvm_d2h_end = float(ends[-1])
            self.link.busy_dtoh += k * self.t_blk_d2h
            m["bytes_dtoh"] += k * self.block_size
            m["writebacks"] += k
            if self._timeline:
                self.events["d2h"].append((start, self.t_d2h, k, "writeback"))
        if k_ssd:
            self._to_ssd(victims, sw, rel, now)
        if self.tier and k:
            self._host_store(victims[wb])
        k_cp = 0
        if cp is not None:
            k_cp = int(cp.sum())
            rel[cp] = self._copy_out(victims[cp], now)
        m["drops"] += n - k - k_ssd - k_cp
        m["evictions"] += n
        wasted = self.pf_pending[victims]
        if wasted.any():
            m["prefetch_wasted_bytes"] += int(wasted.sum()) * self.block_size
            self.pf_pending[victims] = False
        if self._timeline:
            self.events["block"].append((victims.copy(), self._since[victims], rel.copy()))
            self._since[victims] = np.nan
        self.resident[victims] = False
        self.dirty[victims] = False
        self.n_resident -= n
        return rel

    def _apply(self, dec: Decision, now: float) -> None:
        m = self.m
        if dec.discard.size:
            b = np.unique(self._ids(dec.discard, "Decision.discard"))
            b = b[~self._protect[b] & ~self.in_flight[b]]
            live = ~self.freed[b] & self.touched[b] if self.discards else np.ones(b.shape[0], dtype=bool)
            if live.any():
                # A block some live allocation still uses: its data must survive, so it is evicted (written
                # back if dirty) instead of dropped, as the live runtime does (docs/simulator.md "Discards").
                # Without discards every block is: the runtime issues them all as evictions.
                lb = b[live]
                m["refused_discards"] += lb.size
                b = b[~live]
                lb = lb[self.resident[lb]]
                if lb.size:
                    self._evict_to_host(lb, now, copy=self._copy_default)
            m["discards"] += b.size
            res = b[self.resident[b]]
            if res.size:
                self.dead[res] = True  # dropped: no write-back
                self._evict(res, now)
            self.dead[b] = self.touched[b] | self.fresh[b]
            self.dropped[b] |= self.dead[b]  # (off the GPU too: its host pages are dropped)
            if self.tier:
                self._release(b[self.dead[b]])
            if self.copy_on:
                self._unmirror(b[self.dead[b]])
        if dec.evict.size:
            b, cp = self._evict_choice(dec)  # (unique blocks; whether each may leave by the copy path)
            keep = self.resident[b] & ~self._protect[b]
            if keep.any():
                self._evict_to_host(b[keep], now, copy=cp[keep])
        if dec.evict_ssd.size:
            if not self.tier:
                raise SimError("Decision.evict_ssd needs the SSD tier: give the GPU profile ssd_bw > 0 "
                               "(e.g. --ssd pcie4-nvme or --gpu-set ssd_bw=7e9)")
            b = np.unique(self._ids(dec.evict_ssd, "Decision.evict_ssd"))
            res = b[self.resident[b] & ~self._protect[b]]
            if res.size:
                self._evict_to_host(res, now, to_ssd=True)
            off = b[~self.resident[b] & ~self.in_flight[b] & self.hosted[b]]
            if off.size:
                self._host_to_ssd(off, now)
        for blocks, adv in dec.advise:
            b = np.unique(self._ids(blocks, "Decision.advise"))
            self.advice[b] = int(Advice(adv))
            if int(adv) == _PREFER_HOST:
                if self.copy_on:
                    self._restore_mirrors(b)
                res = b[self.resident[b] & ~self._protect[b]]
                if res.size:
                    self._evict_to_host(res, now)
        if dec.populate.size:
            self._populate(self._ids(dec.populate, "Decision.populate"), now)
        if dec.prefetch.size:
            self._prefetch(self._ids(dec.prefetch, "Decision.prefetch"), now)

    def _evict_to_host(self, b: np.ndarray, now: float, to_ssd: bool = False, copy=None) -> None:
        rel = self._evict(b, now, to_ssd) if self.tier else self._evict(b, now, copy=copy)
        self.m["policy_evictions"] += b.shape[0]
        pending = rel > now
        if pending.any():
            pb, pr = b[pending], rel[pending]
            if self.tier:
                self._wb.push_sorted(pb, pr)
            else:
                if self.copy_on:  # (write-backs and copy-outs end out of the victims' order)
                    o = np.argsort(pr, kind="stable")
                    pb, pr = pb[o], pr[o]
                self._wb.push(pb, pr)

    def _prefetch(self, b: np.ndarray, now: float) -> None:
        b, rooms = self._room_for(self._to_bring(b), now)
        if not b.size:
            return
        times = self._transfer_times(b)
        moved = int((times > 0).sum()) * self.block_size
        start = max(self.t_h2d, now)
        ready = np.maximum(rooms, self.wb_done[b])
        if self.tier:
            ready = np.maximum(ready, self._ssd_read(b, now))
        runs = self._copy_in_runs(b, times, ready) if self.copy_on else None  # (mirrored blocks: copy-ins)
        arr = fifo_finish(start, ready, times)
        if runs is not None:
            arr[runs[0]] = arr[runs[1]]
        self._issue(b, arr)
        self.t_h2d = float(arr[-1])
        self.link.busy_htod += float(times.sum())
        nbytes = b.shape[0] * self.block_size
        self.m["prefetch_issued_bytes"] += nbytes
        self.m["bytes_htod"] += moved
        self.pf_pending[b] = True
        if self._timeline:
            self.events["h2d"].append((start, self.t_h2d, b.shape[0], "prefetch"))

    def _issue(self, b: np.ndarray, arrive: np.ndarray) -> None:
        if self._timeline:
            self._since[b] = arrive
        self.in_flight[b] = True
        self.arrive[b] = arrive
        self.n_inflight += b.shape[0]
        self._migrated(b)
        self._inflight.push(b, arrive)
        self._note_used()

    def _check_invariants(self) -> None:
        assert self.used_blocks <= self.capacity_blocks, (self.used_blocks, self.capacity_blocks)
        assert self.n_resident == int(self.resident.sum()), (self.n_resident, int(self.resident.sum()))
        assert self.n_inflight == int(self.in_flight.sum())
        assert not (self.resident & self.in_flight).any()
        assert len(self._inflight) == self.n_inflight
        if self.tier:
            self._check_tier()
        if self.copy_on:
            self._check_copy()
