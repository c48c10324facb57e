"""act (live, real GPU): each discard checked against the caching allocator's own books
(``UVMPREFETCH_DISCARD_AUDIT=1``, with ``UVMPREFETCH_DISCARD=1``).

Why: the runtime decides that a 2 MiB block is dead from what it observed (storage finalizers, the accesses
of the launches it saw). A discard drops the block's contents, so a block wrongly believed dead loses a live
tensor's data. With discards on, GPT-2 large at 1.5x ended with a NaN loss on an H100 (2026-11-23) and again on
an H200 (2026-11-27, iteration 3 of 7), after the discards were ordered with the compute stream and with the
moves of their blocks (``bench/results/gpu-20261127/``). So the stream order is not the whole story; the
likelier cause is a block that still holds live data when it is discarded.

PyTorch's caching allocator knows for certain which of its blocks a tensor holds. With the audit on, the
backend takes ``torch.cuda.memory_snapshot(include_traces=False)`` before each launch's discards and refuses
every block that an allocation not ``inactive`` overlaps within its requested bytes: the block is evicted
instead (the data kept) and the case is recorded (the launch, the allocation's address, size and state, and
whether the runtime's tracker knew a storage at that address). The report's ``backend_result.discard_audit``
holds the counts and the first cases. Cost: one snapshot per launch that discards (milliseconds on a large
model), so this is a diagnosis and a safety net, not a default.
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


def live_intervals(segments: list[dict]) -> tuple[np.ndarray, np.ndarray, list[dict]]:
    """Sorted ``(starts, ends, blocks)`` of the allocator blocks that may hold live data, from the segment list of
    ``torch.cuda.memory_snapshot()``. A block's extent is its ``requested_size`` (the bytes a tensor can
    hold); rounding beyond it holds nothing."""
    found = []
    for seg in segments:
        for b in seg.get("blocks", ()):
            if b.get("state") == FREE_STATE:
                continue
            size = int(b["requested_size"] if "requested_size" in b else b.get("size", 0))
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


class DiscardAudit:
    """Refuses discards of blocks that a live allocation overlaps; counts and keeps the first ``keep`` cases.

    ``snapshot``: a callable returning the allocator's segment list (default
    ``torch.cuda.memory_snapshot(include_traces=False)``); ``known``: optional ``address -> str`` describing what
    the runtime's tracker knows at an address (set by the session)."""

    def __init__(self, snapshot: Callable[[], list[dict]] | None = None, keep: int = 20) -> None:
        if snapshot is None:
            import torch

            def snapshot():
                try:
                    return torch.cuda.memory_snapshot(include_traces=False)
                except TypeError:  # torch before include_traces: the same, with the (empty) history
                    return torch.cuda.memory_snapshot()
        self.snapshot = snapshot
        self.known: Callable[[int], str] | None = None
        self.keep = keep
        self.snapshots = 0
        self.snapshot_s = 0.0
        self.checked_blocks = 0
        self.refused_blocks = 0
        self.cases: list[dict] = []

    def check(self, blocks: np.ndarray, addrs: np.ndarray, block_size: int, launch: int) -> np.ndarray:
        """A bool per block: True where it may be discarded (no live allocation overlaps it)."""
        if not blocks.size:
            return np.zeros(0, dtype=bool)
        t0 = time.perf_counter()
        starts, ends, found = live_intervals(self.snapshot())
        self.snapshot_s += time.perf_counter() - t0
        self.snapshots += 1
        hit = overlapping(starts, ends, addrs.astype(np.int64), block_size)
        bad = hit >= 0
        self.checked_blocks += int(blocks.size)
        self.refused_blocks += int(bad.sum())
        for k in np.flatnonzero(bad).tolist():
            if len(self.cases) >= self.keep:
                break
            b = found[int(hit[k])]
            case = {"launch": int(launch), "block": int(blocks[k]), "block_address": int(addrs[k]),
                    "alloc_address": int(b["address"]), "alloc_requested": int(b.get("requested_size") or 0),
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
                log.warning("uvmprefetch: discard audit refused a live block: %s", case)
        return ~bad

    def result(self) -> dict:
        return {"snapshots": self.snapshots, "snapshot_s": round(self.snapshot_s, 3),
                "checked_blocks": self.checked_blocks, "refused_blocks": self.refused_blocks, "cases": self.cases}


__all__ = ["DiscardAudit", "live_intervals", "overlapping"]
