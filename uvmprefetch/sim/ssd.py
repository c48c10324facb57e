"""The SSD tier of the simulated GPU (docs/tiers.md): bounded host memory with an SSD behind it, reached over a
direct GPU <-> SSD path (the link, then the SSD's own queue). Write-backs that do not fit in host memory, and those a
policy sends with ``Decision.evict_ssd``, go to the SSD and come back through it.

``SsdTier`` holds the tier's part of ``GpuModel`` (``sim/engine.py``), which calls these methods only when the GPU
profile has an SSD (``ssd_bw > 0``); without one none of this runs.
"""

from __future__ import annotations

import numpy as np

from .link import clear_flags, fifo_finish


class SsdTier:
    """The SSD tier's state and methods, as part of ``GpuModel`` (which has the blocks' residency, the link, the
    metrics ``m`` and the write-back queue these read)."""

    def _tier_setup(self, gpu, n: int) -> None:
        """The tier's state for ``n`` blocks (``self.tier``: whether the profile has an SSD) and its metrics."""
        self.tier = bool(getattr(gpu, "ssd_bw", 0) > 0)
        if not self.tier:
            return
        bs = self.block_size
        self.on_ssd = np.zeros(n, dtype=bool)  # the block's current data has a copy on the SSD
        self.hosted = np.zeros(n, dtype=bool)  # the block's current data holds room in (bounded) host memory
        self.unbacked = np.zeros(n, dtype=bool)  # resident, clean, but its host copy was reclaimed: write back
        self.n_host = 0
        hc = int(gpu.host_capacity_bytes)
        self.host_cap = hc // bs if hc > 0 else None  # None = unlimited host memory
        self.t_ssd = 0.0  # the SSD's one FIFO queue (reads and writes): when it is next free
        self.ssd_lat = float(gpu.ssd_latency_s)
        self.t_ssd_rd = bs / gpu.ssd_bw
        self.t_ssd_wr = bs / (gpu.ssd_write_bw or gpu.ssd_bw)
        self.m.update(bytes_to_ssd=0, bytes_from_ssd=0, ssd_busy_s=0.0, host_to_ssd_bytes=0, host_reclaimed_blocks=0,
                      peak_host_blocks=0, host_capacity_blocks=self.host_cap if self.host_cap is not None else -1)

    def _check_tier(self) -> None:
        assert self.n_host == int(self.hosted.sum()), (self.n_host, int(self.hosted.sum()))
        assert self.host_cap is None or self.n_host <= self.host_cap, (self.n_host, self.host_cap)
        assert not (self.hosted & self.on_ssd).any(), "a block is both in host memory and on the SSD"
        assert not (self.unbacked & ~self.resident).any(), "an unbacked block is not resident"
        assert not (self.unbacked & (self.hosted | self.on_ssd)).any()
        assert not (self.dirty & self.on_ssd).any(), "a dirty block has a current SSD copy"
        _, rel = self._wb.view()
        assert (np.diff(rel) >= 0).all(), "write-back queue out of order"

    def _release(self, b: np.ndarray) -> None:
        """``b``'s host/SSD copies are no longer current (written on the GPU, or dead): free their room."""
        self.n_host -= clear_flags(self.hosted, b)
        self.on_ssd[b] = False
        self.unbacked[b] = False

    def _reclaim(self, k: int, victims: np.ndarray) -> int:
        """Free up to ``k`` blocks of host room held by copies of blocks now resident on the GPU (clean: the copy
        is a cache while the GPU has the data); those blocks then need a write-back when evicted."""
        cand = np.flatnonzero(self.hosted & self.resident)
        if victims.size and cand.size:
            cand = cand[~np.isin(cand, victims)]
        cand = cand[:k]
        if cand.size:
            self.hosted[cand] = False
            self.n_host -= cand.shape[0]
            self.unbacked[cand] = True
            self.m["host_reclaimed_blocks"] += cand.shape[0]
        return int(cand.shape[0])

    def _tier_split(self, victims: np.ndarray, live: np.ndarray, wb: np.ndarray, to_ssd: bool):
        """Where evicted ``victims`` go: (to host, to SSD) masks. A block whose current data is on the SSD is
        dropped. Asked for SSD: every block that needs a write-back is written there. Otherwise the blocks that need a
        write-back go to host memory while it has room (a block that still holds host room reuses it), the
        rest to the SSD."""
        cur = self.on_ssd[victims]
        if to_ssd:  # write-backs go to the SSD; clean blocks with a current copy anywhere are dropped
            return np.zeros(victims.shape[0], dtype=bool), wb & ~cur
        need = wb & ~cur
        host = need & self.hosted[victims]
        sw = np.zeros(victims.shape[0], dtype=bool)
        new = np.flatnonzero(need & ~host)
        if self.host_cap is None:
            host[new] = True
        else:
            room = max(self.host_cap - self.n_host, 0)
            if new.shape[0] > room:
                room += self._reclaim(new.shape[0] - room, victims)
            host[new[:room]] = True
            sw[new[room:]] = True
        return host, sw

    def _host_store(self, b: np.ndarray) -> None:
        """Written back to host memory: ``b`` now holds host room."""
        new = b[~self.hosted[b]]
        self.hosted[new] = True
        self.n_host += new.shape[0]
        self.on_ssd[b] = False
        if self.n_host > self.m["peak_host_blocks"]:
            self.m["peak_host_blocks"] = self.n_host

    def _to_ssd(self, victims: np.ndarray, sw: np.ndarray, rel: np.ndarray, now: float) -> None:
        """GPU -> SSD, the direct path (GPUDirect Storage style, as G10 assumes): each block crosses the link on
        the D2H engine, then is written by the SSD (its own FIFO queue), store-and-forward per block and
        pipelined across blocks. The block's GPU room is free when its SSD write ends."""
        b = victims[sw]
        k = b.shape[0]
        m = self.m
        start = max(self.t_d2h, now)
        d2h_end = start + self.t_blk_d2h * np.arange(1, k + 1)
        self.t_d2h = float(d2h_end[-1])
        link = getattr(self, "link", None)
        if link is not None and hasattr(link, "busy_dtoh"):
            link.busy_dtoh += k * self.t_blk_d2h
        ends = fifo_finish(max(self.t_ssd, now) + self.ssd_lat, d2h_end, np.full(k, self.t_ssd_wr))
        self.t_ssd = float(ends[-1])
        rel[sw] = ends
        self.wb_done[b] = ends
        self._release(b)
        self.on_ssd[b] = True
        m["bytes_dtoh"] += k * self.block_size
        m["writebacks"] += k
        m["bytes_to_ssd"] += k * self.block_size
        m["ssd_busy_s"] += self.ssd_lat + k * self.t_ssd_wr
        if self._timeline:
            self.events["d2h"].append((start, self.t_d2h, k, "to-ssd"))

    def _host_to_ssd(self, b: np.ndarray, now: float) -> None:
        """Off-GPU blocks whose data is in host memory move to the SSD (host room is freed at once: the host
        buffer is handed to the SSD's DMA; the GPU link is not used). A block whose write-back to host memory is
        still under way is written to the SSD once it has arrived (in order, as ``_to_ssd`` does)."""
        k = b.shape[0]
        ends = fifo_finish(max(self.t_ssd, now) + self.ssd_lat, self.wb_done[b], np.full(k, self.t_ssd_wr))
        end = float(ends[-1])
        self.t_ssd = end
        self.wb_done[b] = np.maximum(self.wb_done[b], ends)
        self._release(b)
        self.on_ssd[b] = True
        self.m["bytes_to_ssd"] += k * self.block_size
        self.m["host_to_ssd_bytes"] += k * self.block_size
        self.m["ssd_busy_s"] += self.ssd_lat + k * self.t_ssd_wr

    def _ssd_read(self, b: np.ndarray, now: float) -> np.ndarray:
        """SSD reads for those of ``b`` (about to cross the link to the GPU, in this order) whose data is on the
        SSD: one request batch on the SSD queue (latency once, then one block per ``t_ssd_rd``). Returns per
        block when it is ready to cross the link (0 for blocks that come from host memory)."""
        src = self.on_ssd[b] & ~self.dead[b]
        ready = np.zeros(b.shape[0])
        k = int(src.sum())
        if k:
            s = max(self.t_ssd, now) + self.ssd_lat
            ends = s + self.t_ssd_rd * np.arange(1, k + 1)
            ready[src] = ends
            self.t_ssd = float(ends[-1])
            self.m["bytes_from_ssd"] += k * self.block_size
            self.m["ssd_busy_s"] += self.ssd_lat + k * self.t_ssd_rd
        return ready
