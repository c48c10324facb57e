"""observe (live): which 2 MiB blocks hold no live allocation, from PyTorch's CUDA caching allocator itself.

The allocator reports every change of its books through ``attachAllocatorTraceTracker`` (``kernels/
alloc_tracker.cpp`` pushes ``uvm::AllocEvent`` records into a ring); the planner feeds them, in sequence order,
to a ``Liveness``. Unlike the ops the dispatcher sees, this shows every allocation, also those no op touches:
cuBLAS's 32 MiB workspace lay in blocks counted dead, and discarding them lost data on an H100 and an H200.

A block (``address // block_size``) is **dead** when

- every allocation that overlapped it has reached FREE_COMPLETED (FREE_REQUESTED is not enough:
  ``record_stream`` and graph capture defer the free until other streams are done with the memory),
- no ALLOC has reused any byte of it since,
- all of it lies in segments of the allocator's public pool (not a CUDA graph's or a ``MemPool``'s private
  pool, not an expandable segment's driver-mapped pages: those are not managed memory to discard), and
- the tracker's knowledge is complete (``unknown`` is None).

``feed`` returns the blocks that *became* dead (each death once, with the sequence number of the event that
caused it) and those a SEGMENT_FREE gave back to the driver (``released``: the policy forgets them; nothing to
discard). A discard decided from a death is valid only while ``still_dead(blocks, seqs)`` holds: an ALLOC that
reuses the memory before the discard is ordered makes it false.

Incomplete knowledge makes every block live (no death is reported, ``dead_mask`` is all False) until the next
quiescent point where the caller provides a snapshot of the allocator (``quiescent``): a ring overflow (the
caller says so: ``overflow``), an action this build does not know, a free of an allocation the tracker never
saw allocated, and the start itself unless the tracker was attached before the first allocation
(``complete_from_start``).

The event loop is one Numba kernel that runs without the GIL (``nogil``), for the planner thread: ~0.2 us of
CPU per event on GPT-2 large's allocation stream (``bench/liveness_cost.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numba as nb
import numpy as np
from numba import types as nbt
from numba.typed import Dict

# ``uvm::AllocEvent`` (kernels/uvmevents.h), field for field; ``tests/unit/test_alloc_tracker_native.py``
# compiles a program that prints the C struct's offsets and compares them with these.
EVENT_DTYPE = np.dtype({"names": ["seq", "addr", "size", "stream", "action", "device"],
                        "formats": ["<u8", "<u8", "<u8", "<u8", "<u4", "<i4"],
                        "offsets": [0, 8, 16, 24, 32, 36], "itemsize": 40})

# ``uvm::AllocAction`` (the low byte of ``action``) and its flag bits.
ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP = range(7)
SNAPSHOT, OOM, ANNOTATE = 7, 8, 9
UNKNOWN = 15
ACTION_MASK = 0xFF
PRIVATE_POOL = 0x100  # the memory belongs to a private pool (CUDA graph, torch.cuda.MemPool)

# Why every block counts as live (``Liveness.unknown``); 0: knowledge complete.
_WHY = {1: "not attached before the first allocation", 2: "allocator event ring overflowed",
        3: "an allocator action this build does not know", 4: "a free of an allocation never seen allocated"}
WHY_START, WHY_OVERFLOW, WHY_ACTION, WHY_FREE = 1, 2, 3, 4

# Counters (``Liveness.stats``).
COUNT_NAMES = ("events", "allocations_seen", "free_requested", "free_completed", "segment_allocs", "segment_frees",
               "expandable_events", "private_pool_events", "other_device_events", "no_change_events",
               "unknown_actions", "unknown_frees", "stale_allocations", "purged_by_segment_free", "deaths",
               "released_blocks")
(C_EVENTS, C_ALLOCS, C_FREE_REQ, C_FREE_DONE, C_SEG_ALLOC, C_SEG_FREE, C_EXPANDABLE, C_PRIVATE, C_OTHER_DEV,
 C_NO_CHANGE, C_UNKNOWN_ACT, C_UNKNOWN_FREE, C_STALE, C_PURGED, C_DEATHS, C_RELEASED) = range(len(COUNT_NAMES))
# The kernel's scalars: dense ids in use, why knowledge is incomplete (0: it is not), deaths and releases
# written to the output buffers by this call, live allocations, those freed but not completed, rows of the
# block table in use.
M_NIDS, M_WHY, M_NDEAD, M_NREL, M_LIVE, M_PENDING, M_NROWS = range(7)
N_M = 7

_REQUESTED = np.int64(1)  # low bit of an allocation table value: FREE_REQUESTED seen (value = size << 1 | bit)


@dataclass(frozen=True)
class Deaths:
    """What one ``feed`` / ``quiescent`` found: ``blocks`` that became dead (block numbers, address //
    block_size) with the sequence number of the event that killed each (``seqs``, for ``still_dead``), and
    ``released`` blocks whose memory went back to the driver (tell the policy; never discard them)."""

    blocks: np.ndarray
    seqs: np.ndarray
    released: np.ndarray


_NONE = np.zeros(0, dtype=np.int64)
NO_DEATHS = Deaths(_NONE, _NONE, _NONE)


# ----------------------------------------------------------------------------------------------- the kernel
#
# Block numbers are sparse (device addresses), so they map to dense ids through a two-level table: ``pages``
# (a typed dict) maps ``block >> PAGE_BITS`` to a row of ``table``, whose entries are the dense ids of that
# page's blocks (-1: none yet). A range of blocks costs one dict lookup per page, not one per block (a dict
# lookup per block made GPT-2 large's stream cost ~4.8 us per event: its activations span up to ~150 blocks).
#
# ``_feed``'s two hot loops (the blocks of an allocation that starts, of one that ends) call nothing: a call
# with array arguments costs reference counting on each array, ~100 ns, twenty times the loop's own work on a
# block, and a few hundred ns per event when made once per event.

PAGE_BITS, PAGE_MASK = 12, (1 << 12) - 1


@nb.njit(cache=True, nogil=True)
def _row(pages, r, meta, create):
    """The table row of page ``r``; a new one if ``create`` (the caller sized the table), else -1 if none."""
    if r in pages:
        return pages[r]
    if not create:
        return -1
    row = meta[M_NROWS]
    meta[M_NROWS] = row + 1
    pages[r] = row
    return row


@nb.njit(cache=True, nogil=True)
def _settle(i, seq, bs, blk, live, seg, pin, dirty, death, meta, out_blk, out_seq):
    """Report block ``i`` dead if it now is and held an allocation since last reported (``_feed`` inlines it)."""
    if dirty[i] and live[i] == 0 and pin[i] == 0 and seg[i] == bs and meta[M_WHY] == 0:
        dirty[i] = False
        death[i] = seq
        n = meta[M_NDEAD]
        out_blk[n] = blk[i]
        out_seq[n] = seq
        meta[M_NDEAD] = n + 1


@nb.njit(cache=True, nogil=True)
def _stale_in(allocs, a, n):
    """Addresses of the allocations the books hold in ``[a, a + n)`` (memory going back to the driver)."""
    gone = 0
    for k0 in allocs.keys():
        if a <= k0 < a + n:
            gone += 1
    out = np.empty(gone, dtype=np.int64)
    j = 0
    for k0 in allocs.keys():
        if a <= k0 < a + n:
            out[j] = k0
            j += 1
    return out


@nb.njit(cache=True, nogil=True)
def _feed(action, addr, size, seq, device, dev, bs, allocs, pages, table, blk, live, seg, pin, dirty, death, meta,
          counts, out_blk, out_seq, out_rel, start):
    """Apply events ``start:`` in order; deaths go to ``out_blk``/``out_seq``, releases to ``out_rel``. Returns
    the index of the first event not applied: ``len`` when done, else where the block arrays, the table or the
    outputs ran out of room (the caller grows them and calls again from there). The fields are the record
    array's own (unsigned, strided) columns: no copy per call."""
    rng_a = np.empty(2, dtype=np.int64)  # the allocations an event ends (several on a SEGMENT_FREE), then the
    rng_n = np.empty(2, dtype=np.int64)  # one it starts
    last_r = np.int64(-1)  # the last page looked up, and its row
    last_row = np.int64(-1)
    for e in range(start, action.shape[0]):
        act = np.int64(action[e]) & ACTION_MASK
        a = np.int64(addr[e])
        n = np.int64(size[e]) if act <= SEGMENT_UNMAP else np.int64(0)  # (OOM's address is a byte count)
        if n > 0:  # room for every block of the range: new ids, table rows, deaths, releases
            nblk = (a + n - 1) // bs - a // bs + 1
            npg = ((a + n - 1) // bs >> PAGE_BITS) - (a // bs >> PAGE_BITS) + 1
            if (meta[M_NIDS] + nblk > blk.shape[0] or meta[M_NROWS] + npg > table.shape[0]
                    or max(meta[M_NDEAD], meta[M_NREL]) + nblk > out_blk.shape[0]):
                return e
        counts[C_EVENTS] += 1
        if device[e] != dev:
            counts[C_OTHER_DEV] += 1
            continue
        private = (np.int64(action[e]) & PRIVATE_POOL) != 0
        s = np.int64(seq[e])
        if private:
            counts[C_PRIVATE] += 1
        nd = 0  # allocations this event ends: rng_a/rng_n[:nd]
        settle = False  # report the blocks they leave dead
        add = False  # [a, a + n) starts holding its blocks
        if n <= 0 and act <= SEGMENT_UNMAP:
            counts[C_NO_CHANGE] += 1
            continue
        if act == ALLOC:
            counts[C_ALLOCS] += 1
            old = allocs[a] if a in allocs else np.int64(-1)
            if old >= 0:  # the same address handed out again: its free never reached us
                counts[C_STALE] += 1
                if old & _REQUESTED:
                    meta[M_PENDING] -= 1
                rng_a[0], rng_n[0], nd = a, old >> 1, 1
            allocs[a] = n << 1
            add = True
        elif act == FREE_REQUESTED:
            counts[C_FREE_REQ] += 1
            old = allocs[a] if a in allocs else np.int64(-1)
            if old < 0:  # never seen allocated: live until completed, and the books are incomplete
                counts[C_UNKNOWN_FREE] += 1
                if meta[M_WHY] == 0:
                    meta[M_WHY] = WHY_FREE
                allocs[a] = (n << 1) | _REQUESTED
                meta[M_PENDING] += 1
                add = True
            elif not (old & _REQUESTED):
                allocs[a] = old | _REQUESTED
                meta[M_PENDING] += 1
        elif act == FREE_COMPLETED:
            counts[C_FREE_DONE] += 1
            if a not in allocs:
                counts[C_UNKNOWN_FREE] += 1
                if meta[M_WHY] == 0:
                    meta[M_WHY] = WHY_FREE
                continue
            old = allocs.pop(a)
            if old & _REQUESTED:
                meta[M_PENDING] -= 1
            rng_a[0], rng_n[0], nd, settle = a, old >> 1, 1, True
        elif act == SEGMENT_ALLOC or act == SEGMENT_MAP:
            counts[C_SEG_ALLOC] += 1
            expandable = act == SEGMENT_MAP
            if expandable:
                counts[C_EXPANDABLE] += 1
            row = np.int64(-1)
            for k in range(a // bs, (a + n - 1) // bs + 1):
                if row < 0 or (k & PAGE_MASK) == 0:
                    row = _row(pages, k >> PAGE_BITS, meta, True)
                i = table[row, k & PAGE_MASK]
                if i < 0:
                    i = meta[M_NIDS]
                    meta[M_NIDS] = i + 1
                    table[row, k & PAGE_MASK] = i
                    blk[i] = k
                if private or expandable:
                    pin[i] += 1
                    death[i] = 0
                else:
                    seg[i] += min(a + n, (k + 1) * bs) - max(a, k * bs)
                    if dirty[i]:  # (a block that held data and now lies wholly in segments again)
                        _settle(i, s, bs, blk, live, seg, pin, dirty, death, meta, out_blk, out_seq)
            last_r = -1  # (rows may have been created)
        elif act == SEGMENT_FREE or act == SEGMENT_UNMAP:
            counts[C_SEG_FREE] += 1
            expandable = act == SEGMENT_UNMAP
            if expandable:
                counts[C_EXPANDABLE] += 1
            # Nothing can be live in memory given back to the driver: allocations the books still hold there
            # lost their free (a ring gap); they are dropped first (below), then the blocks released.
            stale = _stale_in(allocs, a, n)
            nd = stale.shape[0]
            if nd > 1:
                rng_a, rng_n = np.empty(nd + 1, dtype=np.int64), np.empty(nd + 1, dtype=np.int64)
            for q in range(nd):
                old = allocs.pop(stale[q])
                rng_a[q], rng_n[q] = stale[q], old >> 1
                if old & _REQUESTED:
                    meta[M_PENDING] -= 1
            counts[C_PURGED] += nd
        elif act == SNAPSHOT or act == OOM or act == ANNOTATE:
            counts[C_NO_CHANGE] += 1
            continue
        else:
            counts[C_UNKNOWN_ACT] += 1
            if meta[M_WHY] == 0:
                meta[M_WHY] = WHY_ACTION
            continue

        # Allocations end (``rng[:nd]``: their blocks lose a holder; with ``settle`` those left dead are
        # reported), then one starts (``rng[nd]`` when ``add``: its blocks gain one, new ids on first sight).
        if add:
            rng_a[nd], rng_n[nd] = a, n
        complete = meta[M_WHY] == 0
        out_n = meta[M_NDEAD]
        for q in range(nd + add):
            qa, qn, up = rng_a[q], rng_n[q], q == nd
            row = np.int64(-1)
            for k in range(qa // bs, (qa + qn - 1) // bs + 1):
                j = k & PAGE_MASK
                if row < 0 or j == 0:
                    r = k >> PAGE_BITS
                    if r != last_r:
                        last_r, last_row = r, _row(pages, r, meta, True)
                    row = last_row
                i = table[row, j]
                if up:
                    if i < 0:
                        i = meta[M_NIDS]
                        meta[M_NIDS] = i + 1
                        table[row, j] = i
                        blk[i] = k
                    live[i] += 1
                    dirty[i] = True
                    death[i] = 0
                    continue
                live[i] -= 1
                if settle and complete and live[i] == 0 and dirty[i] and pin[i] == 0 and seg[i] == bs:
                    dirty[i] = False
                    death[i] = s
                    out_blk[out_n] = k
                    out_seq[out_n] = s
                    out_n += 1
            meta[M_LIVE] += 1 if up else -1
        meta[M_NDEAD] = out_n
        if rng_a.shape[0] > 2:
            rng_a, rng_n = np.empty(2, dtype=np.int64), np.empty(2, dtype=np.int64)

        # a segment (or expandable mapping) goes back to the driver: its whole blocks are released
        if act == SEGMENT_FREE or act == SEGMENT_UNMAP:
            for k in range(a // bs, (a + n - 1) // bs + 1):
                row = _row(pages, k >> PAGE_BITS, meta, False)
                if row < 0 or table[row, k & PAGE_MASK] < 0:
                    continue
                i = table[row, k & PAGE_MASK]
                if private or expandable:
                    pin[i] = max(pin[i] - 1, 0)
                else:
                    seg[i] = max(seg[i] - (min(a + n, (k + 1) * bs) - max(a, k * bs)), 0)
                whole = a <= k * bs and (k + 1) * bs <= a + n
                if whole and (dirty[i] or death[i] != 0):
                    out_rel[meta[M_NREL]] = k
                    meta[M_NREL] += 1
                    dirty[i] = False
                elif not whole and death[i] != 0:
                    dirty[i] = True  # dead, but part of it left the allocator: not a whole block any more
                death[i] = 0
    return action.shape[0]


@nb.njit(cache=True, nogil=True)
def _all_settled(seq, bs, blk, live, seg, pin, dirty, death, meta, out_blk, out_seq):
    for i in range(meta[M_NIDS]):
        _settle(i, seq, bs, blk, live, seg, pin, dirty, death, meta, out_blk, out_seq)


@nb.njit(cache=True, nogil=True)
def _lookup(pages, table, blocks, out):
    for j in range(blocks.shape[0]):
        k = blocks[j]
        r = k >> PAGE_BITS
        out[j] = table[pages[r], k & PAGE_MASK] if r in pages else -1


# ----------------------------------------------------------------------------------------------- the tracker

class Liveness:
    """Block liveness of one CUDA device from its caching allocator's events.

    Parameters
    ----------
    block_size
        Bytes per block (a power of two; 2 MiB, the UVM driver's VA block).
    device
        The CUDA device index whose events count (others are counted and skipped); -1 for CPU sources.
    complete_from_start
        The tracker was attached before the allocator's first allocation, so it has seen every allocation.
        Otherwise the books start incomplete: every block is live until the first ``quiescent`` with a snapshot.

    Raises
    ------
    ValueError
        A block size that is not a positive power of two.
    """

    def __init__(self, block_size: int = 2 << 20, device: int = 0, complete_from_start: bool = False) -> None:
        if block_size <= 0 or block_size & (block_size - 1):
            raise ValueError(f"Liveness: block_size {block_size} is not a positive power of two")
        self.block_size = int(block_size)
        self.device = int(device)
        self.counts = np.zeros(len(COUNT_NAMES), dtype=np.int64)
        self._meta = np.zeros(N_M, dtype=np.int64)
        self._reset_books()
        self._meta[M_WHY] = 0 if complete_from_start else WHY_START
        self._last_seq = 0
        self.feed_s = 0.0
        self.overflows = 0
        self.resyncs = 0

    def _reset_books(self) -> None:
        """Empty allocation table and block arrays."""
        self._allocs = Dict.empty(key_type=nbt.int64, value_type=nbt.int64)
        self._pages = Dict.empty(key_type=nbt.int64, value_type=nbt.int64)
        self._table = np.full((4, PAGE_MASK + 1), -1, dtype=np.int64)
        cap = 4096
        self._blk = np.zeros(cap, dtype=np.int64)
        self._live = np.zeros(cap, dtype=np.int32)
        self._seg = np.zeros(cap, dtype=np.int64)
        self._pin = np.zeros(cap, dtype=np.int32)
        self._dirty = np.zeros(cap, dtype=bool)
        self._death = np.zeros(cap, dtype=np.int64)
        why = self._meta[M_WHY]
        self._meta[:] = 0
        self._meta[M_WHY] = why

    def _grow(self, nblk: int, npg: int) -> None:
        """Make room for ``nblk`` more block ids and ``npg`` more table rows (``_feed`` stopped for room)."""
        m = self._meta
        rows = self._table.shape[0]
        if m[M_NROWS] + npg > rows:
            t = np.full((max(2 * rows, int(m[M_NROWS]) + npg), PAGE_MASK + 1), -1, dtype=np.int64)
            t[:rows] = self._table
            self._table = t
        cap = self._blk.shape[0]
        if m[M_NIDS] + nblk > cap:
            cap = max(2 * cap, int(m[M_NIDS]) + nblk)
            for name in ("_blk", "_live", "_seg", "_pin", "_dirty", "_death"):
                old = getattr(self, name)
                new = np.zeros(cap, dtype=old.dtype)
                new[:old.shape[0]] = old
                setattr(self, name, new)

    # ------------------------------------------------------------------------------------- input
    def feed(self, events: np.ndarray) -> Deaths:
        """Apply allocator events (an ``EVENT_DTYPE`` array in increasing ``seq`` order, continuing the
        previous call's); returns what died and what was released.

        Raises
        ------
        ValueError
            Not an ``EVENT_DTYPE`` array, or sequence numbers that do not increase (names the first index).
        """
        ev = np.asarray(events)
        if ev.dtype != EVENT_DTYPE:
            raise ValueError(f"Liveness.feed: events must have EVENT_DTYPE (uvm::AllocEvent), not {ev.dtype}")
        if ev.ndim != 1:
            raise ValueError(f"Liveness.feed: events must be one-dimensional, not shape {ev.shape}")
        if not ev.size:
            return NO_DEATHS
        seq = ev["seq"]
        if int(seq[0]) <= self._last_seq or (seq.size > 1 and not (seq[1:] > seq[:-1]).all()):
            bad = np.flatnonzero(seq[1:] <= seq[:-1])
            i = 0 if int(seq[0]) <= self._last_seq else int(bad[0]) + 1
            prev = int(seq[i - 1]) if i else self._last_seq
            raise ValueError(f"Liveness.feed: event {i} has seq {int(seq[i])}, not after {prev}: events must be "
                             f"fed in increasing sequence order")
        t0 = time.perf_counter()
        out = self._apply(ev)
        self._last_seq = int(seq[-1])
        self.feed_s += time.perf_counter() - t0
        return out

    def _apply(self, ev: np.ndarray) -> Deaths:
        n = ev.size
        out_blk = np.empty(4 * n + 64, dtype=np.int64)
        out_seq = np.empty_like(out_blk)
        out_rel = np.empty_like(out_blk)
        m = self._meta
        m[M_NDEAD] = m[M_NREL] = 0
        e = 0
        while True:
            e = _feed(ev["action"], ev["addr"], ev["size"], ev["seq"], ev["device"], self.device, self.block_size,
                      self._allocs, self._pages, self._table, self._blk, self._live, self._seg, self._pin,
                      self._dirty, self._death, m, self.counts, out_blk, out_seq, out_rel, e)
            if e == n:
                break
            a, size = int(ev["addr"][e]), int(ev["size"][e])
            first, last = a // self.block_size, (a + size - 1) // self.block_size
            nblk = last - first + 1
            self._grow(nblk, (last >> PAGE_BITS) - (first >> PAGE_BITS) + 1)
            if max(m[M_NDEAD], m[M_NREL]) + nblk > out_blk.shape[0]:
                more = out_blk.shape[0] + nblk
                out_blk, out_seq, out_rel = (np.concatenate([x, np.empty(more, dtype=np.int64)])
                                             for x in (out_blk, out_seq, out_rel))
        nd, nr = int(m[M_NDEAD]), int(m[M_NREL])
        self.counts[C_DEATHS] += nd
        self.counts[C_RELEASED] += nr
        if not nd and not nr:
            return NO_DEATHS
        return Deaths(out_blk[:nd].copy(), out_seq[:nd].copy(), out_rel[:nr].copy())

    def overflow(self) -> None:
        """The ring dropped records: every block counts as live until a ``quiescent`` point with a snapshot.
        Call it as soon as the drop count changed, before feeding what was drained with it."""
        self.overflows += 1
        if self._meta[M_WHY] == 0:
            self._meta[M_WHY] = WHY_OVERFLOW

    def quiescent(self, snapshot: Callable[[], object] | None = None) -> Deaths:
        """An iteration end with the streams drained, every record drained and fed, no allocation in flight.

        With incomplete knowledge (``unknown``) and a ``snapshot`` (a callable returning the allocator's state:
        an ``EVENT_DTYPE`` array of SEGMENT_ALLOC / ALLOC / FREE_REQUESTED records, or the segment list of
        ``torch.cuda.memory_snapshot()``), the books are rebuilt from it, knowledge is complete again, and every
        dead block is reported (each block of a known segment once, since what happened to it in the gap is not
        known). Without a snapshot nothing changes. With complete knowledge the snapshot is not taken.
        """
        if self._meta[M_WHY] == 0 or snapshot is None:
            return NO_DEATHS
        state = snapshot()
        ev = state if isinstance(state, np.ndarray) else snapshot_events(state, self.device)
        if ev.dtype != EVENT_DTYPE:
            raise ValueError(f"Liveness.quiescent: the snapshot must give EVENT_DTYPE records, not {ev.dtype}")
        t0 = time.perf_counter()
        keep = self.counts.copy()
        self._reset_books()  # (still incomplete while the records are applied: nothing settles half-built)
        self._apply(np.sort(ev, order="seq", kind="stable"))
        # what happened to each block in the gap is not known: every block of a known segment that holds no
        # allocation is reported dead once
        self._dirty[:int(self._meta[M_NIDS])] = True
        self.counts[:] = keep  # the rebuild's records are not events
        m = self._meta
        m[M_NDEAD] = 0
        m[M_WHY] = 0
        nids = int(m[M_NIDS])
        out_blk = np.empty(nids, dtype=np.int64)
        out_seq = np.empty(nids, dtype=np.int64)
        # the deaths' number: after everything fed. The next event may carry it too, but a block must be reused
        # (one event) and freed (another) to die again, so no later death of a block repeats it.
        seq = self._last_seq + 1
        _all_settled(seq, self.block_size, self._blk, self._live, self._seg, self._pin, self._dirty, self._death, m,
                     out_blk, out_seq)
        self.resyncs += 1
        nd = int(m[M_NDEAD])
        self.counts[C_DEATHS] += nd
        self.feed_s += time.perf_counter() - t0
        return Deaths(out_blk[:nd].copy(), out_seq[:nd].copy(), _NONE)

    # ------------------------------------------------------------------------------------- queries
    @property
    def unknown(self) -> str | None:
        """Why every block counts as live now, or None when the books are complete."""
        return _WHY.get(int(self._meta[M_WHY]))

    def _dense_of(self, blocks: np.ndarray) -> np.ndarray:
        b = np.ascontiguousarray(blocks, dtype=np.int64)
        out = np.empty(b.shape[0], dtype=np.int64)
        _lookup(self._pages, self._table, b, out)
        return out

    def dead_mask(self, blocks: np.ndarray) -> np.ndarray:
        """A bool per block number: dead now (all False while knowledge is incomplete)."""
        i = self._dense_of(blocks)
        if self._meta[M_WHY] != 0:
            return np.zeros(i.shape[0], dtype=bool)
        ok = i >= 0
        out = np.zeros(i.shape[0], dtype=bool)
        out[ok] = self._death[i[ok]] != 0
        return out

    def still_dead(self, blocks: np.ndarray, seqs: np.ndarray) -> np.ndarray:
        """A bool per block: still dead from the same death (``Deaths.seqs``), i.e. nothing reused any byte of
        it since and knowledge is complete: the check right before a discard is ordered."""
        i = self._dense_of(blocks)
        if self._meta[M_WHY] != 0:
            return np.zeros(i.shape[0], dtype=bool)
        ok = i >= 0
        out = np.zeros(i.shape[0], dtype=bool)
        out[ok] = self._death[i[ok]] == np.asarray(seqs, dtype=np.int64)[ok]
        return out & (np.asarray(seqs) != 0)

    def live_blocks(self) -> np.ndarray:
        """Block numbers an allocation (or a private pool / expandable segment) holds now, sorted."""
        n = int(self._meta[M_NIDS])
        held = (self._live[:n] > 0) | (self._pin[:n] > 0)
        return np.sort(self._blk[:n][held])

    def stats(self) -> dict:
        """Counts for the run report (``backend_result.liveness``)."""
        c = {k: int(v) for k, v in zip(COUNT_NAMES, self.counts)}
        ev = c["events"]
        c.update(live_allocations=int(self._meta[M_LIVE]), pending_frees=int(self._meta[M_PENDING]),
                 blocks_seen=int(self._meta[M_NIDS]), overflows=self.overflows, resyncs=self.resyncs,
                 unknown=self.unknown, feed_s=round(self.feed_s, 6),
                 us_per_event=round(self.feed_s / ev * 1e6, 4) if ev else None)
        return c


# A block freed but still in use on another stream: the name the snapshot's C++ side writes, and the one
# torch/cuda/memory.py's documentation gives.
_PENDING_FREE = ("active_pending_free", "active_awaiting_free")


def snapshot_events(segments: list[dict], device: int = 0) -> np.ndarray:
    """The allocator's state as events (``seq`` 0): a SEGMENT_ALLOC per segment (SEGMENT_MAP for an expandable
    one; PRIVATE_POOL where it belongs to a private pool), an ALLOC per block that is not inactive, followed by a
    FREE_REQUESTED where its free waits for other streams. ``segments`` is ``torch.cuda.memory_snapshot()``'s
    list; a block's extent is its ``requested_size`` (what a tensor can hold), else its ``size``."""
    rows: list[tuple[int, int, int]] = []
    for g in segments:
        if int(g.get("device", device)) != device:
            continue
        pool = tuple(g.get("segment_pool_id") or (0, 0))
        flag = PRIVATE_POOL if any(pool) else 0
        kind = SEGMENT_MAP if g.get("is_expandable") else SEGMENT_ALLOC
        rows.append((kind | flag, int(g["address"]), int(g["total_size"])))
        for b in g.get("blocks", ()):
            state = b.get("state")
            if state == "inactive":
                continue
            size = int(b["requested_size"] if "requested_size" in b else b.get("size", 0))
            rows.append((ALLOC | flag, int(b["address"]), size))
            if state in _PENDING_FREE:
                rows.append((FREE_REQUESTED | flag, int(b["address"]), size))
    ev = np.zeros(len(rows), dtype=EVENT_DTYPE)
    if rows:
        a = np.asarray(rows, dtype=np.int64)
        ev["action"], ev["addr"], ev["size"] = a[:, 0], a[:, 1], a[:, 2]
    ev["device"] = device
    return ev


__all__ = ["ACTION_MASK", "ALLOC", "ANNOTATE", "Deaths", "EVENT_DTYPE", "FREE_COMPLETED", "FREE_REQUESTED",
           "Liveness", "NO_DEATHS", "OOM", "PRIVATE_POOL", "SEGMENT_ALLOC", "SEGMENT_FREE", "SEGMENT_MAP",
           "SEGMENT_UNMAP", "SNAPSHOT", "UNKNOWN", "snapshot_events"]
