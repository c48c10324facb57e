"""A fake CUDA caching allocator for the liveness tests: the event source (the allowed fake boundary: on a CPU
there is no caching allocator to attach to) and the byte-level truth the tracker is checked against.

Slow and obvious on purpose: memory is a set of live byte addresses, segments are a dict, and a block's truth
is read off byte by byte. It follows the caching allocator's rules that matter for liveness:

- allocations lie inside segments and never overlap; sizes are rounded up to 512 bytes, the event carries the
  requested size (the bytes a tensor can hold), as ``record_trace`` does;
- a free is FREE_REQUESTED, then FREE_COMPLETED (at once, or later when other streams used the memory);
- a segment goes back to the driver (SEGMENT_FREE, ``empty_cache``) only when nothing in it is allocated;
- private pools (CUDA graphs, ``MemPool``) and expandable segments have segments of their own.
"""

from __future__ import annotations

import numpy as np

from uvmprefetch.runtime.liveness import (ALLOC, EVENT_DTYPE, FREE_COMPLETED, FREE_REQUESTED, PRIVATE_POOL,
                                          SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP)

ROUND = 512


class FakeAllocator:
    """Emits ``EVENT_DTYPE`` records as a caching allocator's trace tracker would, and knows the truth."""

    def __init__(self, device: int = 0) -> None:
        self.device = device
        self.seq = 0
        self.queue: list[tuple] = []  # emitted, not yet delivered: (seq, action, addr, size)
        self.segments: dict[int, dict] = {}  # base -> {"size", "private", "expandable"}
        self.allocs: dict[int, dict] = {}  # addr -> {"size" (requested), "rounded", "pending", "seg"}
        self.next_base = 1 << 20  # fresh segments go above every earlier one unless a base is given

    # ------------------------------------------------------------------------------------- actions
    def _emit(self, action: int, addr: int, size: int) -> None:
        self.seq += 1
        self.queue.append((self.seq, action, addr, size))

    def segment(self, size: int, base: int | None = None, private: bool = False, expandable: bool = False) -> int:
        if base is None:
            base = self.next_base
        assert all(base + size <= b or b + s["size"] <= base for b, s in self.segments.items()), "segments overlap"
        self.next_base = max(self.next_base, base + size)
        self.segments[base] = {"size": size, "private": private, "expandable": expandable}
        act = (SEGMENT_MAP if expandable else SEGMENT_ALLOC) | (PRIVATE_POOL if private else 0)
        self._emit(act, base, size)
        return base

    def release(self, base: int) -> None:
        """SEGMENT_FREE (or UNMAP): the segment goes back to the driver; nothing may be allocated in it."""
        seg = self.segments[base]
        assert not [a for a, x in self.allocs.items() if x["seg"] == base], "segment still holds allocations"
        del self.segments[base]
        act = (SEGMENT_UNMAP if seg["expandable"] else SEGMENT_FREE) | (PRIVATE_POOL if seg["private"] else 0)
        self._emit(act, base, seg["size"])

    def empty_cache(self) -> list[int]:
        """Release every segment with nothing allocated in it (what ``torch.cuda.empty_cache`` does)."""
        used = {x["seg"] for x in self.allocs.values()}
        free = [b for b in self.segments if b not in used]
        for b in free:
            self.release(b)
        return free

    def alloc(self, size: int, seg: int | None = None) -> int | None:
        """First fit in ``seg`` (or any segment); None when nothing fits."""
        rounded = -(-size // ROUND) * ROUND
        for base in ([seg] if seg is not None else sorted(self.segments)):
            s = self.segments[base]
            taken = sorted((a, x["rounded"]) for a, x in self.allocs.items() if x["seg"] == base)
            at = base
            for a, r in taken + [(base + s["size"], 0)]:
                if a - at >= rounded:
                    break
                at = max(at, a + r)
            else:
                continue
            if at + rounded > base + s["size"]:
                continue
            self.allocs[at] = {"size": size, "rounded": rounded, "pending": False, "seg": base}
            self._emit(ALLOC | (PRIVATE_POOL if s["private"] else 0), at, size)
            return at
        return None

    def free(self, addr: int, deferred: bool = False) -> None:
        """FREE_REQUESTED, and FREE_COMPLETED at once unless ``deferred`` (record_stream: ``complete`` later)."""
        x = self.allocs[addr]
        flag = PRIVATE_POOL if self.segments[x["seg"]]["private"] else 0
        self._emit(FREE_REQUESTED | flag, addr, x["size"])
        x["pending"] = True
        if not deferred:
            self.complete(addr)

    def complete(self, addr: int) -> None:
        x = self.allocs.pop(addr)
        assert x["pending"], "FREE_COMPLETED before FREE_REQUESTED"
        flag = PRIVATE_POOL if self.segments[x["seg"]]["private"] else 0
        self._emit(FREE_COMPLETED | flag, addr, x["size"])

    # ------------------------------------------------------------------------------------- delivery
    def deliver(self, drop: set[int] | None = None) -> tuple[np.ndarray, int]:
        """The queued events as a record array, less the indices in ``drop`` (a ring overflow); and how many
        were dropped."""
        rows = [r for i, r in enumerate(self.queue) if not drop or i not in drop]
        dropped = len(self.queue) - len(rows)
        self.queue = []
        ev = np.zeros(len(rows), dtype=EVENT_DTYPE)
        for i, (seq, act, addr, size) in enumerate(rows):
            ev[i] = (seq, addr, size, 0x7000, act, self.device)
        return ev, dropped

    def snapshot(self) -> list[dict]:
        """``torch.cuda.memory_snapshot()``'s shape: segments with their blocks (free gaps as inactive)."""
        out = []
        for base, s in sorted(self.segments.items()):
            blocks = []
            for a, x in sorted(self.allocs.items()):
                if x["seg"] == base:
                    blocks.append({"address": a, "size": x["rounded"], "requested_size": x["size"],
                                   "state": "active_pending_free" if x["pending"] else "active_allocated"})
            out.append({"device": self.device, "address": base, "total_size": s["size"], "blocks": blocks,
                        "is_expandable": s["expandable"], "segment_pool_id": (1, 0) if s["private"] else (0, 0)})
        return out

    # ------------------------------------------------------------------------------------- truth
    def live_bytes(self) -> set[int]:
        """Every byte an allocation (completed or not) holds: the requested extent."""
        out: set[int] = set()
        for a, x in self.allocs.items():
            out.update(range(a, a + x["size"]))
        return out

    def discardable_bytes(self) -> set[int]:
        """Bytes in public, non-expandable segments (managed memory of the allocator's own pool)."""
        out: set[int] = set()
        for b, s in self.segments.items():
            if not s["private"] and not s["expandable"]:
                out.update(range(b, b + s["size"]))
        return out

    def dead(self, block: int, block_size: int, live: set[int] | None = None, ok: set[int] | None = None) -> bool:
        """The truth: every byte of the block is discardable memory that no allocation holds."""
        live = self.live_bytes() if live is None else live
        ok = self.discardable_bytes() if ok is None else ok
        return all(b in ok and b not in live for b in range(block * block_size, (block + 1) * block_size))

    def dead_by_extents(self, block: int, block_size: int) -> bool:
        """``dead`` over extents instead of byte sets (for address spaces of GiB): the block lies wholly in one
        public, non-expandable segment and no allocation's requested extent overlaps it."""
        lo, hi = block * block_size, (block + 1) * block_size
        inside = any(b <= lo and hi <= b + s["size"] and not s["private"] and not s["expandable"]
                     for b, s in self.segments.items())
        return inside and not any(a < hi and lo < a + x["size"] for a, x in self.allocs.items())
