"""act (live, real GPU): discards checked against the caching allocator's own books (with
``UVMPREFETCH_DISCARD=1``; ``UVMPREFETCH_DISCARD_AUDIT=1`` makes the check strict).

Why: the runtime decides that a 2 MiB block is dead from what it observed (storage finalizers, the accesses
of the launches it saw). A discard drops the block's contents, so a block wrongly believed dead loses a live
tensor's data. With discards on, GPT-2 large at 1.5x ended with a NaN loss on an H100 (2026-11-23) and again on
an H200 (2026-11-27, iteration 3 of 7), after the discards had been ordered with the compute stream and with
the moves of their blocks. The strict check then found the hole on the H200 (``bench/results/gpu-20261127/``):
a 32 MiB allocation that no observed op ever produced or used (a library's workspace: cuBLAS allocates its
workspace from the caching allocator, outside the dispatcher) lay in blocks whose earlier tensors had died, so
the runtime counted them dead and discarded them.

PyTorch's caching allocator knows for certain which of its blocks hold an allocation:
``torch.cuda.memory_snapshot(include_traces=False)`` lists them. A snapshot costs ~3 ms on GPT-2 large (H200),
too much before every discarding launch (~1 300 per iteration there), so by default the guard takes one only
when the allocator's counts disagree with what the runtime knows: the active allocations and requested bytes
beyond the runtime's live storages (``explained``) differ from what they were at the last snapshot. Each
snapshot leaves the *foreign* allocations (live, not a storage the runtime knows at that address and size); a
discard candidate that one overlaps is refused (evicted instead, the data kept) and recorded. Strict mode
(``UVMPREFETCH_DISCARD_AUDIT=1``) takes a snapshot before every discarding launch and refuses a block that any
live allocation overlaps: the diagnosis the H200 run used. What neither catches: between two checks a foreign
allocation freed and another of exactly the same size allocated elsewhere (the counts agree, the addresses do
not) -- one more reason discards stay off by default.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np

# Allocator block states (torch/cuda/memory.py, ``_snapshot``): anything but "inactive" may hold live data
# ("active_awaiting_free" is freed but still in use on another stream).
FREE_STATE = "inactive"

log = logging.getLogger("uvmprefetch.runtime")


def requested(block: dict) -> int:
    """The bytes an allocator block holds for its tensor (its ``requested_size``; ``size`` where that is absent)."""
    return int(block["requested_size"] if "requested_size" in block else block.get("size", 0))


def live_intervals(segments: list[dict]) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """Sorted ``(starts, ends, blocks)`` of the allocator blocks that may hold live data, from the segment list of
    ``torch.cuda.memory_snapshot()``. A block's extent is its ``requested_size`` (the bytes a tensor can
    hold); rounding beyond it holds nothing."""
    found = []
    for seg in segments:
        for b in seg.get("blocks", ()):
            if b.get("state") == FREE_STATE:
                continue
            size = requested(b)
            if size > 0:
                found.append((int(b["address"]), int(b["address"]) + size, b))
    found.sort(key=lambda t: t[0])
    starts = np.fromiter((s for s, _, _ in found), dtype=np.int64, count=len(found))
    ends = np.fromiter((e for _, e, _ in found), dtype=np.int64, count=len(found))
    return starts, ends, [b for _, _, b in found]


def overlapping(starts: np.ndarray, ends: np.ndarray, addrs: np.ndarray, length: int) -> np.ndarray:
    """For each ``[addr, addr + length)``: the index of a live interval that overlaps it, or -1.

    The intervals do not overlap one another (allocator blocks), so the last one starting before the end of a
    range is the only candidate: if it ends at or before the range's start, every earlier one does too."""
    if not starts.size or not addrs.size:
        return np.full(addrs.shape[0], -1, dtype=np.int64)
    j = np.searchsorted(starts, addrs + length, side="left") - 1
    ok = j >= 0
    hit = np.full(addrs.shape[0], -1, dtype=np.int64)
    jj = j[ok]
    over = ends[jj] > addrs[ok]
    idx = np.flatnonzero(ok)[over]
    hit[idx] = jj[over]
    return hit


class DiscardGuard:
    """Which discard candidates no allocation holds; counts and keeps the first ``keep`` refused cases.

    Parameters
    ----------
    snapshot
        Callable returning the allocator's segment list (default ``torch.cuda.memory_snapshot`` without traces).
    stats
        Callable returning the allocator's ``(active allocations, requested bytes)`` (default
        ``torch.cuda.memory_stats``). Unused in strict mode.
    strict
        Snapshot before every check and refuse blocks any live allocation overlaps (``UVMPREFETCH_DISCARD_AUDIT``).
    keep
        How many refused cases to keep for the report.

    The session sets ``explained`` (``() -> (live storages, their bytes)`` the runtime knows), ``is_known``
    (``(address, nbytes) -> bool``: a live storage the runtime knows starts there with that size) and ``known``
    (``address -> str`` for the report). Without ``explained`` the guard is strict.
    """

    def __init__(self, snapshot: Callable[[], list[dict]] | None = None,
                 stats: Callable[[], tuple[int, int]] | None = None, strict: bool = False, keep: int = 20) -> None:
        if snapshot is None or stats is None:
            import torch
            dev = torch.cuda.current_device()

            def _snapshot():
                try:
                    segs = torch.cuda.memory_snapshot(include_traces=False)
                except TypeError:  # torch before include_traces: the same, with the (empty) history
                    segs = torch.cuda.memory_snapshot()
                return [g for g in segs if g.get("device", dev) == dev]

            def _stats():
                st = torch.cuda.memory_stats(dev)
                return int(st.get("active.all.current", -1)), int(st.get("requested_bytes.all.current", -1))
            snapshot = snapshot or _snapshot
            stats = stats or _stats
        self.snapshot, self.stats, self.strict, self.keep = snapshot, stats, strict, keep
        self.explained: Callable[[], tuple[int, int]] | None = None
        self.is_known: Callable[[int, int], bool] | None = None
        self.known: Callable[[int], str] | None = None
        self._key: tuple[int, int] | None = None  # unexplained (count, bytes) at the last snapshot
        self._starts = self._ends = np.zeros(0, dtype=np.int64)
        self._found: list[dict] = []
        self.snapshots = self.stat_checks = 0
        self.snapshot_s = self.stats_s = 0.0
        self.checked_blocks = self.refused_blocks = 0
        self.cases: list[dict] = []

    def _unexplained(self) -> tuple[int, int]:
        t0 = time.perf_counter()
        n, nbytes = self.stats()
        self.stats_s += time.perf_counter() - t0
        self.stat_checks += 1
        kn, kb = self.explained()
        return n - kn, nbytes - kb

    def _refresh(self, key: tuple[int, int] | None) -> None:
        t0 = time.perf_counter()
        starts, ends, found = live_intervals(self.snapshot())
        self.snapshot_s += time.perf_counter() - t0
        self.snapshots += 1
        if not self.strict and self.is_known is not None:  # keep only what the runtime does not know
            keep = [i for i, b in enumerate(found) if not self.is_known(int(b["address"]), requested(b))]
            starts, ends, found = starts[keep], ends[keep], [found[i] for i in keep]
        self._starts, self._ends, self._found, self._key = starts, ends, found, key

    def check(self, blocks: np.ndarray, addrs: np.ndarray, block_size: int, launch: int) -> np.ndarray:
        """A bool per block: True where it may be discarded (no live allocation the guard knows of overlaps it)."""
        if not blocks.size:
            return np.zeros(0, dtype=bool)
        if self.strict or self.explained is None:
            self._refresh(None)
        else:
            key = self._unexplained()
            if key != self._key:
                self._refresh(key)
        hit = overlapping(self._starts, self._ends, addrs.astype(np.int64), block_size)
        bad = hit >= 0
        self.checked_blocks += int(blocks.size)
        self.refused_blocks += int(bad.sum())
        for k in np.flatnonzero(bad).tolist():
            if len(self.cases) >= self.keep:
                break
            b = self._found[int(hit[k])]
            case = {"launch": int(launch), "block": int(blocks[k]), "block_address": int(addrs[k]),
                    "alloc_address": int(b["address"]), "alloc_requested": requested(b),
                    "alloc_size": int(b.get("size") or 0), "state": b.get("state")}
            if self.known is not None:
                try:
                    case["tracker"] = self.known(int(b["address"]))
                except Exception as e:  # noqa: BLE001 - a diagnosis must not break the run
                    case["tracker"] = f"lookup failed: {e}"
            frames = b.get("frames") or []
            if frames:
                case["frames"] = [f"{f.get('filename')}:{f.get('line')} {f.get('name')}" for f in frames[:8]]
            self.cases.append(case)
            if len(self.cases) <= 3:  # on stderr at once: a run cut by a time limit writes no report
                log.warning("uvmprefetch: discard guard refused a live block: %s", case)
        return ~bad

    def result(self) -> dict:
        return {"strict": self.strict or self.explained is None, "snapshots": self.snapshots,
                "snapshot_s": round(self.snapshot_s, 3), "stat_checks": self.stat_checks,
                "stats_s": round(self.stats_s, 3), "checked_blocks": self.checked_blocks,
                "refused_blocks": self.refused_blocks, "cases": self.cases}


__all__ = ["DiscardGuard", "live_intervals", "overlapping", "requested"]
