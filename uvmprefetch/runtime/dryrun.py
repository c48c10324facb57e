"""act (live, simulated): the ``dryrun`` backend.

The user's script runs on the CPU, unchanged; every launch the observer sees drives the simulator's
``GpuModel`` live, with the budget as the model's GPU capacity. The whole runtime path (start-up hook,
dispatcher observation, tensor deaths, policy hooks, budget, report, trace) therefore runs in CI, and the
report says what the run would have cost on the modelled GPU.
"""

from __future__ import annotations

import os

import numpy as np

from ..errors import ConfigError
from ..gpus import get_profile
from ..policy.base import LaunchInfo, Policy
from ..sim.engine import SimError
from ..trace.format import WRITE

BLOCK_SIZE = 2 << 20  # the driver's VA block


def _host_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 64 << 30


_SPAN_SET_MAX = 64  # blocks of one span above which ``launch_blocks`` takes NumPy's set routines


class DryrunBackend:
    """Drives ``uvmprefetch.sim.engine.GpuModel`` from live observations.

    Parameters
    ----------
    cfg
        The runtime config: ``gpu`` names the modelled profile; ``budget`` (bytes or a fraction of the
        profile's memory) is the model's capacity; none = the profile's whole memory. ``discard``: as on the
        GPU, dead data is dropped only with ``UVMPREFETCH_DISCARD=1``; by default the model's discards are
        evictions (``GpuModel(discards=False)``), so the report says what the cuda backend's default would cost.
    policy
        The policy; ``GpuModel`` calls its hooks.
    """

    name = "dryrun"
    virtual_addresses = True
    device_type = "cpu"

    def __init__(self, cfg, policy: Policy) -> None:
        from ..sim.engine import GpuModel
        self.gpu = get_profile(cfg.gpu)
        self.block_size = BLOCK_SIZE
        self.capacity_bytes = (cfg.budget.resolve(self.gpu.memory_bytes) if cfg.budget is not None
                               else self.gpu.memory_bytes)
        self.capacity_bytes = max(self.capacity_bytes, self.block_size)
        # Virtual addresses grow with the peak of live bytes (first fit reuses holes); host memory bounds it.
        self.max_blocks = max(_host_memory_bytes(), 4 * self.capacity_bytes) // self.block_size + 1
        self.discards = bool(cfg.discard)
        # UVMPREFETCH_EVICT=auto: the simulated GPU's copy path (sim/copypath.py), on a profile that has one, with
        # the mirror cap of UVMPREFETCH_HOST_LIMIT resolved against this host
        self.evict = None
        if getattr(cfg, "evict", "uvm") == "auto" and self.gpu.copy_path:
            from ..sim.copypath import EvictModel
            from .copyout import _host_available
            cap = cfg.host_limit.resolve(_host_available()) // self.block_size * self.block_size
            self.evict = EvictModel(mode="auto", mirror_bytes=cap) if cap else None  # 0 would mean unbounded there
        self.model = GpuModel(self.gpu, self.capacity_bytes, self.block_size, self.max_blocks, policy,
                              discards=self.discards, evict=self.evict)
        self.last: dict = {}

    def block_ids(self, start: int, length: int) -> np.ndarray:
        return np.arange(start // self.block_size, (start + max(length, 1) - 1) // self.block_size + 1,
                         dtype=np.int64)

    def launch_blocks(self, spans: list) -> tuple[np.ndarray, np.ndarray]:
        """A launch's sorted unique block ids and written block ids from its ``(address, length, mode)`` spans
        (the session's per-launch step: what ``block_ids`` per span and their union give, in integer arithmetic
        for the few blocks of a typical launch)."""
        bs = self.block_size
        ids: set = set()
        wids: set = set()
        for st, ln, m in spans:
            lo, hi = st // bs, (st + max(ln, 1) - 1) // bs
            if lo == hi:
                ids.add(lo)
                if m & WRITE:
                    wids.add(lo)
            elif hi - lo > _SPAN_SET_MAX:  # a big tensor: NumPy over ranges
                return self._union_ranges(spans)
            else:
                r = range(lo, hi + 1)
                ids.update(r)
                if m & WRITE:
                    wids.update(r)
        return np.array(sorted(ids), dtype=np.int64), np.array(sorted(wids), dtype=np.int64)

    def _union_ranges(self, spans: list) -> tuple[np.ndarray, np.ndarray]:
        rs = [(self.block_ids(st, ln), m) for st, ln, m in spans]
        w = [r for r, m in rs if m & WRITE]
        return (np.unique(np.concatenate([r for r, _ in rs])),
                np.unique(np.concatenate(w)) if w else np.zeros(0, dtype=np.int64))

    def free(self, blocks: np.ndarray) -> None:
        self.model.free(blocks)

    def launch(self, info: LaunchInfo) -> None:
        if info.blocks.size > self.model.capacity_blocks:
            # the model cannot run a launch bigger than the GPU: say which variable to change
            raise ConfigError(f"UVMPREFETCH_BUDGET: launch {info.index} alone touches {info.blocks.size} blocks "
                              f"({info.blocks.size * self.block_size >> 20} MiB) but the budget holds "
                              f"{self.model.capacity_blocks}; raise the budget")
        try:
            self.last = self.model.launch(info)
        except SimError as e:
            raise SimError(f"simulated GPU: {e}") from None

    def end_iteration(self, k: int) -> None:
        self.model.end_iteration(k)

    def monitor(self) -> dict:
        """Cumulative counts of the exact monitor (the simulated GPU knows them): late prefetches, faults,
        prefetched blocks evicted before any use."""
        m = self.model.m
        return {"late_blocks": int(m["late_blocks"]), "fault_blocks": int(m["faults"]),
                "evicted_unused_blocks": int(m["prefetch_wasted_bytes"]) // self.block_size, "source": "model"}

    def resident_bytes(self) -> int:
        return int(self.model.used_blocks) * self.block_size

    def result(self) -> dict:
        r = self.model.result()
        r["peak_resident_bytes"] = int(r.get("peak_used_blocks", 0)) * self.block_size
        # The replay's footprint definition (docs/simulator.md "Footprint"): distinct blocks any launch touched,
        # and oversub = those blocks / capacity blocks, so a live report and its replay compare key by key.
        fp = int(np.count_nonzero(self.model.touched))
        r["footprint_bytes"] = fp * self.block_size
        cap = self.capacity_bytes // self.block_size  # what replay divides by, ideal policies included
        r["oversub"] = fp / cap if cap else None
        r["gpu"] = self.gpu.name
        r["discards_issued"] = self.discards  # the key the cuda backend reports: a replay needs it to agree
        r["evict"] = self.evict.mode if self.evict is not None else "uvm"
        return r

    def close(self) -> None:
        pass
