"""The driver's fault path in the simulated GPU, and the link time of a transfer.

Missing blocks fault: ``ceil(entries / fault_batch_size)`` batches of ``fault_batch_latency_s`` each plus the
transfers, which go ahead of queued prefetches (those slip by the link time the faults take, on every GPU sharing
the link). A faulted 2 MiB block costs ``ceil(0.51 * 32) = 17`` fault entries: the driver's density prefetcher
upgrades to the whole block once 51 % of its 64 KiB pages faulted; with 64 KiB blocks each block is one entry and
the density prefetcher is modelled explicitly over its 2 MiB region. ``FaultPath`` holds this part of ``GpuModel``
(``sim/engine.py``).
"""

from __future__ import annotations

import math

import numpy as np

from ..errors import SimError
from ..policy.base import EMPTY, Advice
from .link import fifo_finish

DENSITY = 0.51  # nvidia-uvm tree prefetcher threshold (uvm_perf_prefetch.c, default 51 %)
REGION = 2 << 20  # the driver's VA block: the density prefetcher's scope
_PREFER_HOST = int(Advice.PREFER_HOST)  # (a plain int: enum attribute lookups are slow in the per-launch path)


class FaultPath:
    """The fault path and transfer times, as part of ``GpuModel`` (which has the blocks' state, the link, the room
    and the metrics ``m`` these use)."""

    def _transfer_times(self, b: np.ndarray) -> np.ndarray:
        """Link time per block: dead blocks need none (zero-filled on the GPU); a run of consecutive live
        blocks moves as one transfer (its time shared evenly), which matters for 64 KiB blocks."""
        live = ~self.dead[b]
        t = np.zeros(b.shape[0])
        if self.region_blocks == 1:
            t[live] = self.t_blk_h2d
            return t
        brk = np.ones(b.shape[0], dtype=bool)
        brk[1:] = (b[1:] != b[:-1] + 1) | (live[1:] != live[:-1])
        run_id = np.cumsum(brk) - 1
        run_bytes = np.bincount(run_id) * self.block_size
        per = run_bytes / self._bw_vec(run_bytes) / np.bincount(run_id)
        t = per[run_id]
        t[~live] = 0.0
        return t

    def _bw_vec(self, nbytes: np.ndarray) -> np.ndarray:
        kb = np.maximum(nbytes, 1) / 1024.0
        return self.gpu.link_htod_bw * (2.0 / math.pi) * np.arctan(0.0729 * kb)

    def _service_faults(self, missing: np.ndarray, now: float) -> float:
        """Migrate ``missing`` on demand (with the driver's density prefetch at small block sizes);
        returns when the last one is on the GPU. Faults go ahead of queued prefetches."""
        m = self.m
        gpu = self.gpu
        n = missing.shape[0]
        entries = n * self.entries_per_block
        batches = math.ceil(entries / gpu.fault_batch_size)
        rooms = self._make_room(n, now, can_wait=True)
        if rooms.shape[0] < n:
            raise SimError(f"cannot make room for {n} faulted blocks (capacity {self.capacity_blocks})")
        extra = EMPTY
        if self.region_blocks > 1:
            # The density prefetcher only takes room that can be had without waiting.
            extra = self._density_prefetch(missing)
            if extra.size:
                r_extra = self._make_room(extra.shape[0], now, can_wait=False, pending=n)
                extra = extra[: r_extra.shape[0]]
                rooms = np.concatenate([rooms, r_extra])
        blocks = np.concatenate([missing, extra]) if extra.size else missing
        total = blocks.shape[0]
        times = np.zeros(total)
        live = ~self.dead[blocks]
        times[:n][live[:n]] = self.t_fault_blk
        if extra.size:
            times[n:] = self._transfer_times(extra)
        link = float(times.sum())
        ready = np.maximum(rooms, self.wb_done[blocks])
        if self.tier:
            ready = np.maximum(ready, self._ssd_read(blocks, now))
        ends = fifo_finish(max(now + batches * gpu.fault_batch_latency_s, self.link.fault_end),
                            ready, times)
        done = self._land(blocks, ends, link, now)
        nz = int((~live).sum())
        m["zero_fill_blocks"] += nz
        m["faults"] += n
        m["fault_entries"] += entries
        m["fault_batches"] += batches
        moved_fault = int(live[:n].sum()) * self.block_size
        moved_extra = int(live[n:].sum()) * self.block_size
        m["bytes_htod"] += moved_fault + moved_extra
        m["driver_prefetch_bytes"] += moved_extra
        if self._timeline:
            self.events["fault"].append((now, n, batches))
            self.events["h2d"].append((now, done, total, "fault"))
        return done

    def _land(self, blocks: np.ndarray, ends: np.ndarray, link: float, now: float) -> float:
        """``blocks`` migrate now ahead of the queued prefetches (faults, gated copy-ins) and end at ``ends``; they
        count as resident (the launch waits for ``ends``). Returns the last end."""
        done = float(ends[-1])
        self.link.fault_end = done
        # They preempt the H2D queue: everything queued after now slips by the link time they took (on a shared
        # link, every GPU's queued prefetches do).
        if link > 0:
            for e in self.link.members:
                if len(e._inflight):
                    blk, arr = e._inflight.view()
                    late = arr > now
                    arr[late] += link
                    e.arrive[blk[late]] = arr[late]
        self.t_h2d = max(self.t_h2d + link if self.t_h2d > now else now, done)
        self.link.busy_htod += link
        if self._timeline:
            self._since[blocks] = ends
        self.resident[blocks] = True
        self.n_resident += blocks.shape[0]
        self._migrated(blocks)
        self._lrm.push(blocks, self.mig_seq[blocks])
        self._note_used()
        return done

    def _density_prefetch(self, missing: np.ndarray) -> np.ndarray:
        """The driver's tree prefetcher, at its coarsest level: when more than 51 % of a 2 MiB region would
        be on the GPU after these faults, the rest of the region comes along (host-preferred blocks excepted)."""
        rb = self.region_blocks
        regions = np.unique(missing // rb)
        idx = (regions[:, None] * rb + np.arange(rb)[None, :]).ravel()
        idx = idx[idx < self.max_blocks]
        present = self.resident[idx] | self.in_flight[idx]
        present[np.isin(idx, missing, assume_unique=False)] = True
        reg_of = idx // rb
        frac = np.bincount(np.searchsorted(regions, reg_of), weights=present, minlength=regions.size) / rb
        dense = frac[np.searchsorted(regions, reg_of)] > DENSITY
        take = dense & ~present & (self.advice[idx] != _PREFER_HOST)
        if self.copy_on:  # a mirrored block's pages were discarded: only its copy-in brings its data back
            take &= ~self.mirrored[idx]
        return idx[take]
