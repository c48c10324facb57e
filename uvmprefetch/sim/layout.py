"""Address layout: where a trace's allocations live in (simulated) managed memory, and which blocks each
launch touches.

A trace records allocations by id and size, not by address. On a real GPU the addresses come from
PyTorch's caching allocator sitting on ``cudaMallocManaged`` (our runtime keeps it on top), and that matters
for a unified-memory model: several small tensors share one 2 MB VA block, so touching one of them migrates
its neighbours too, and freed memory is handed to the next tensor, so the same blocks are reused every
iteration. ``build_layout`` replays the allocations and frees through a small model of that allocator:

- *small* requests (<= 1 MiB: PyTorch's ``get_pool`` sends ``size <= kSmallSize`` to the small pool) are
  rounded up to 512 B and packed best-fit into 2 MiB segments of a small pool (PyTorch's ``kSmallSize`` /
  ``kSmallBuffer`` / ``kMinBlockSize``); a request never straddles two
  segments, and segments are cached, never given back;
- *large* requests are rounded up to 2 MiB (``kRoundLarge``) and placed best-fit in the freed space of the
  large pool (free neighbours coalesce), else at the top of the address space, which then grows;
- at one launch index, frees of older allocations happen before new allocations (PyTorch frees the
  inputs of launch ``i-1`` before it allocates the outputs of launch ``i``); an allocation freed at the
  index it was made is freed right after it is made.

This is a model, not PyTorch's exact allocator (no 20 MiB segments for 1-10 MiB requests, no
expandable segments, no per-stream pools), but it reproduces the two effects above.

A second model, ``allocator="first-fit"``, is the live dryrun runtime's own address space
(``uvmprefetch.trace.addrspace.FirstFit``, shared with the runtime and trace stats): every request rounded up to 512 B, one address space, the
lowest hole that fits, coalescing, and the top given back when its last hole is freed. A trace recorded
live by the dryrun backend is replayed with it by default (``allocator="auto"``), so the replay places every
tensor where the live run placed it and both see the same blocks, the same footprint and the same
oversubscription at the same budget; see ``docs/simulator.md`` "Footprint".

From the addresses, everything the simulator needs per launch is precomputed with NumPy: the sorted
unique block ids it touches and the written subset (CSR arrays), and the blocks that become *wholly
dead* (no live allocation overlaps them any more) at each free point.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from ..errors import ConfigError
from ..trace.addrspace import FirstFit, alloc_events, first_fit_addresses
from ..trace.format import READ, WRITE, Trace

SEGMENT = 2 << 20  # 2 MiB: PyTorch's small-pool segment and large-request rounding (kRoundLarge)
SMALL_LIMIT = 1 << 20  # requests up to and including 1 MiB go to the small pool (kSmallSize)
SMALL_ROUND = 512  # kMinBlockSize
BLOCK_SIZES = (2 << 20, 64 << 10)  # the driver's VA block and its big page


@dataclass
class Layout:
    """A trace's allocations placed in a virtual address space, cut in ``block_size`` blocks.

    ``base[a]`` is allocation ``a``'s byte address. Launch ``i`` touches
    ``blocks[ptr[i]:ptr[i+1]]`` (sorted unique int64 block ids) and writes
    ``write_blocks[wptr[i]:wptr[i+1]]``. ``dead_blocks[dptr[i]:dptr[i+1]]`` are the blocks that became
    wholly dead at free point ``i`` (after launch ``i-1``, before launch ``i``; ``i == n_launches`` is the
    end of the trace). ``footprint_blocks`` is the number of distinct blocks any launch touches: the
    working footprint that ``oversub`` is measured against. ``reserved_bytes`` is the peak address space
    the allocator model reserved (what ``torch.cuda.max_memory_reserved`` would report). ``fresh[b]``: no tensor
    that holds data from before the trace overlaps block ``b`` before its first touch (``fresh_blocks``): nothing
    has populated its pages, so a real GPU maps them without data when a launch or a prefetch first touches them.
    """

    block_size: int
    base: np.ndarray
    max_blocks: int
    ptr: np.ndarray
    blocks: np.ndarray
    wptr: np.ndarray
    write_blocks: np.ndarray
    dptr: np.ndarray
    dead_blocks: np.ndarray
    footprint_blocks: int
    reserved_bytes: int
    allocator: str = "caching"
    fresh: np.ndarray | None = None
    _next_use: np.ndarray | None = field(default=None, repr=False)

    @property
    def n_launches(self) -> int:
        return int(self.ptr.shape[0] - 1)

    def launch_blocks(self, i: int) -> np.ndarray:
        """Sorted unique blocks launch ``i`` touches."""
        return self.blocks[self.ptr[i]:self.ptr[i + 1]]

    def launch_writes(self, i: int) -> np.ndarray:
        """Sorted unique blocks launch ``i`` writes (a subset of ``launch_blocks(i)``)."""
        return self.write_blocks[self.wptr[i]:self.wptr[i + 1]]

    def dead_at(self, i: int) -> np.ndarray:
        """Blocks that became wholly dead at free point ``i`` (0 <= i <= n_launches)."""
        return self.dead_blocks[self.dptr[i]:self.dptr[i + 1]]

    @property
    def block_accesses(self) -> int:
        """Total (launch, block) pairs: the simulator's unit of work."""
        return int(self.blocks.shape[0])

    def next_use(self) -> np.ndarray:
        """For every entry of ``blocks`` (launch ``i``, block ``b``): the next launch after ``i`` that touches
        ``b``, or ``n_launches`` if none. Computed once, on demand (offline policies use it)."""
        if self._next_use is None:
            L = self.n_launches
            launch_of = np.repeat(np.arange(L, dtype=np.int64), np.diff(self.ptr))
            order = np.lexsort((launch_of, self.blocks))
            nxt = np.full(self.blocks.shape[0], L, dtype=np.int64)
            sb = self.blocks[order]
            same = sb[1:] == sb[:-1]
            nxt[order[:-1][same]] = launch_of[order[1:][same]]
            self._next_use = nxt
        return self._next_use

    def ran(self, nu: np.ndarray, i: int) -> None:
        """Launch ``i`` ran: in ``nu`` (per block, its next launch; start from ``first_use()``), each block
        launch ``i`` touched moves on to its following use. The offline policies keep their future this way."""
        a, b = self.ptr[i], self.ptr[i + 1]
        nu[self.blocks[a:b]] = self.next_use()[a:b]

    def first_use(self) -> np.ndarray:
        """Per block id: the first launch that touches it (``n_launches`` if none)."""
        return self.use_span()[0]

    def use_span(self) -> tuple[np.ndarray, np.ndarray]:
        """Per block id: the first and the last launch that touch it (``n_launches`` and -1 if none)."""
        L = self.n_launches
        launch_of = np.repeat(np.arange(L, dtype=np.int64), np.diff(self.ptr))
        first = np.full(self.max_blocks, L, dtype=np.int64)
        np.minimum.at(first, self.blocks, launch_of)
        last = np.full(self.max_blocks, -1, dtype=np.int64)
        np.maximum.at(last, self.blocks, launch_of)
        return first, last

    def pressure(self) -> np.ndarray:
        """Per launch: how many blocks the GPU holds when every block stays from its first use to its last (the
        memory pressure without migrations). A new array each call: planners carve it down in place."""
        L = self.n_launches
        first, last = self.use_span()
        used = first < L
        d = np.zeros(L + 1, dtype=np.int64)
        np.add.at(d, first[used], 1)
        np.add.at(d, last[used] + 1, -1)
        return np.cumsum(d)[:L]


class _FreeList:
    """Free extents of an address space: best fit by (size, start), coalescing neighbours.

    ``seg`` > 0 forbids coalescing across multiples of ``seg`` (small-pool segments stay separate)."""

    def __init__(self, seg: int = 0) -> None:
        self.seg = seg
        self.by_size: list[tuple[int, int]] = []
        self.by_start: dict[int, int] = {}
        self.by_end: dict[int, int] = {}

    def _add(self, start: int, size: int) -> None:
        bisect.insort(self.by_size, (size, start))
        self.by_start[start] = size
        self.by_end[start + size] = start

    def _remove(self, start: int, size: int) -> None:
        i = bisect.bisect_left(self.by_size, (size, start))
        del self.by_size[i]
        del self.by_start[start]
        del self.by_end[start + size]

    def put(self, start: int, size: int) -> None:
        end = start + size
        left = self.by_end.get(start)
        if left is not None and not (self.seg and start % self.seg == 0):
            lsize = self.by_start[left]
            self._remove(left, lsize)
            start, size = left, size + lsize
        rsize = self.by_start.get(end)
        if rsize is not None and not (self.seg and end % self.seg == 0):
            self._remove(end, rsize)
            size += rsize
        self._add(start, size)

    def take(self, size: int) -> int | None:
        i = bisect.bisect_left(self.by_size, (size, -1))
        if i == len(self.by_size):
            return None
        fsize, fstart = self.by_size[i]
        self._remove(fstart, fsize)
        if fsize > size:
            self._add(fstart + size, fsize - size)
        return fstart


ALLOCATORS = ("caching", "first-fit")


def allocator_for(t: Trace) -> str:
    """The allocator model ``allocator="auto"`` picks for ``t``: ``"first-fit"`` for a trace the live dryrun
    runtime recorded (its addresses came from that model), ``"caching"`` for everything else."""
    meta = t.meta or {}
    live = str(meta.get("source", "")).startswith("uvmprefetch live runtime")
    return "first-fit" if live and meta.get("backend") == "dryrun" else "caching"


# The live dryrun runtime's address space. One implementation (trace/addrspace.py) serves the runtime, this
# replay and trace stats, so a replay of a live trace places every tensor where the live run did;
# ``_FirstFit`` is kept as this module's name for it (tests/unit/test_sim_live_consistency.py).
_FirstFit = FirstFit


def _allocate_addresses(t: Trace, allocator: str = "caching") -> tuple[np.ndarray, np.ndarray, int, list]:
    """Run the allocator model; returns (base, reserved size per allocation, peak top, the
    (free point, +1 alloc / -1 free, allocation) events in the order they were applied)."""
    A = t.n_allocs
    base = np.zeros(A, dtype=np.int64)
    if allocator == "first-fit":
        return first_fit_addresses(t)
    rsize = np.zeros(A, dtype=np.int64)
    small = t.alloc_size <= SMALL_LIMIT  # exactly 1 MiB is small: a 1 MiB tensor in its own 2 MiB would waste half
    rsize[small] = -(-t.alloc_size[small] // SMALL_ROUND) * SMALL_ROUND
    rsize[~small] = -(-t.alloc_size[~small] // SEGMENT) * SEGMENT
    large_free = _FreeList()
    small_free = _FreeList(seg=SEGMENT)
    top = 0

    def alloc_large(size: int) -> int:
        nonlocal top
        start = large_free.take(size)
        if start is None:
            start, top = top, top + size
        return start

    def do_alloc(a: int) -> None:
        size = int(rsize[a])
        if small[a]:
            start = small_free.take(size)
            if start is None:
                seg = alloc_large(SEGMENT)
                small_free.put(seg, SEGMENT)
                start = small_free.take(size)
            base[a] = start
        else:
            base[a] = alloc_large(size)

    def do_free(a: int) -> None:
        (small_free if small[a] else large_free).put(int(base[a]), int(rsize[a]))

    events = _apply_events(t, do_alloc, do_free)
    return base, rsize, top, events


def _apply_events(t: Trace, do_alloc, do_free) -> list:
    """Apply ``t``'s allocations and frees in the order of the module docstring
    (``trace.addrspace.alloc_events``); returns the events."""
    events = alloc_events(t)
    for _, kind, a in events:
        (do_alloc if kind > 0 else do_free)(a)
    return events


def build_layout(t: Trace, block_size: int = 2 << 20, allocator: str = "auto") -> Layout:
    """Place ``t``'s allocations with an allocator model and precompute per-launch blocks.

    Parameters
    ----------
    t
        The trace.
    block_size
        Bytes per block.
    allocator
        ``"caching"`` (PyTorch's caching allocator, modelled), ``"first-fit"`` (the live dryrun runtime's
        address space) or ``"auto"``: ``allocator_for(t)``.

    Raises
    ------
    ConfigError
        If ``block_size`` is not a power of two between 4 KiB and 2 MiB, or ``allocator`` is unknown.
    """
    block_size = int(block_size)
    if block_size < 4096 or block_size > SEGMENT or block_size & (block_size - 1):
        raise ConfigError(f"block size {block_size} must be a power of two between 4 KiB and 2 MiB "
                          f"(the driver's choices are 2 MiB and 64 KiB)")
    if allocator == "auto":
        allocator = allocator_for(t)
    if allocator not in ALLOCATORS:
        raise ConfigError(f"allocator {allocator!r} is not one of auto, {', '.join(ALLOCATORS)}")
    L = t.n_launches
    base, rsize, top, events = _allocate_addresses(t, allocator)
    max_blocks = max(1, -(-top // block_size))

    # Blocks that become wholly dead at each free point: a live-allocation count per block.
    count = np.zeros(max_blocks, dtype=np.int32)
    dead_lists: list[list[np.ndarray]] = [[] for _ in range(L + 1)]
    b0s = base // block_size
    b1s = (base + np.maximum(t.alloc_size, 1) - 1) // block_size
    for i, kind, a in events:
        lo, hi = int(b0s[a]), int(b1s[a]) + 1
        if kind > 0:
            count[lo:hi] += 1
        else:
            count[lo:hi] -= 1
            z = np.flatnonzero(count[lo:hi] == 0)
            if z.size:
                dead_lists[i].append(z + lo)
    dead_parts = [np.unique(np.concatenate(d)) if d else np.zeros(0, np.int64) for d in dead_lists]
    dsizes = np.array([p.size for p in dead_parts], dtype=np.int64)
    dptr = np.concatenate([[0], np.cumsum(dsizes)]).astype(np.int64)
    dead_blocks = np.concatenate(dead_parts).astype(np.int64) if dead_parts else np.zeros(0, np.int64)

    # Per-launch block sets, vectorised over all accesses.
    launch_of = np.repeat(np.arange(L, dtype=np.int64), np.diff(t.acc_ptr))
    start = base[t.acc_alloc] + t.acc_off
    end = start + t.acc_len
    ab0 = start // block_size
    ab1 = (end - 1) // block_size

    def csr(mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        lo, hi, lf = (ab0, ab1, launch_of) if mask is None else (ab0[mask], ab1[mask], launch_of[mask])
        n = hi - lo + 1
        total = int(n.sum())
        if total == 0:
            return np.zeros(L + 1, np.int64), np.zeros(0, np.int64)
        offs = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(n) - n, n)
        blk = np.repeat(lo, n) + offs
        key = np.repeat(lf, n) * max_blocks + blk
        key.sort()  # sort + adjacent-difference: numpy's hash-based np.unique is ~6x slower at this size
        keep = np.ones(key.shape[0], dtype=bool)
        keep[1:] = key[1:] != key[:-1]
        key = key[keep]
        lid = key // max_blocks
        ptr = np.searchsorted(lid, np.arange(L + 1)).astype(np.int64)
        return ptr, (key % max_blocks).astype(np.int64)

    ptr, blocks = csr(None)
    wptr, wblocks = csr((t.acc_mode & WRITE) != 0)
    footprint = int(np.unique(blocks).size)
    lay = Layout(block_size=block_size, base=base, max_blocks=max_blocks, ptr=ptr, blocks=blocks, wptr=wptr,
                 write_blocks=wblocks, dptr=dptr, dead_blocks=dead_blocks, footprint_blocks=footprint,
                 reserved_bytes=int(top), allocator=allocator)
    lay.fresh = fresh_blocks(t, lay, b0s, b1s)
    return lay


def fresh_for(t: Trace, lay: Layout) -> np.ndarray | None:
    """``lay.fresh`` for the simulated GPU of a replay of ``t``; None for a trace the live dryrun runtime recorded:
    that runtime models no fresh memory (it cannot tell, launch by launch, which blocks a tensor from before the run
    shares), and its replay must agree with it (tests/unit/test_sim_live_consistency.py)."""
    return None if allocator_for(t) == "first-fit" else lay.fresh


def born_in_trace(t: Trace) -> np.ndarray:
    """Per allocation: made inside the trace, i.e. the first launch that touches it writes it and reads none of it
    (an op's new output). The recorders register a tensor that existed before the trace (a weight, a buffer) when
    they start or when a launch first touches it, and its first use reads it: that holds data. An allocation no
    launch touches counts as holding data."""
    L, A = t.n_launches, t.n_allocs
    launch_of = np.repeat(np.arange(L, dtype=np.int64), np.diff(t.acc_ptr))
    first = np.full(A, L, dtype=np.int64)
    np.minimum.at(first, t.acc_alloc, launch_of)
    at_first = launch_of == first[t.acc_alloc]
    read_first = at_first & ((t.acc_mode & READ) != 0)
    return (first < L) & (np.bincount(t.acc_alloc[read_first], minlength=A) == 0)


def fresh_blocks(t: Trace, lay: Layout, b0s: np.ndarray, b1s: np.ndarray) -> np.ndarray:
    """Per block of ``lay``: no allocation that holds data (``born_in_trace`` false) was placed over it by the time
    a launch first touches it (``first_use``; any time for a block no launch touches). ``b0s``/``b1s``: each
    allocation's first and last block."""
    held = np.flatnonzero(~born_in_trace(t))
    fresh = np.ones(lay.max_blocks, dtype=bool)
    if held.size:
        lo, n = b0s[held], b1s[held] - b0s[held] + 1
        blk = np.repeat(lo, n) + (np.arange(int(n.sum()), dtype=np.int64) - np.repeat(np.cumsum(n) - n, n))
        at = np.repeat(t.alloc_at[held], n)
        fresh[blk[at <= lay.first_use()[blk]]] = False
    return fresh
