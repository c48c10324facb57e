"""What the policy knows of each block besides its predicted next use: dirty (written since it came to the GPU),
dead (freed, where the caller can discard), fresh (no launch touched it yet, where the caller populates),
prefetched and not used yet, thrashed (prefetched, evicted unused while still predicted), ever written, the last
iteration that wrote it, its last use, and how many launches used it this iteration. The running launch's blocks are marked here (``launch_marks``, ``cur_marks``); so are prefetches and
victims (``mark_prefetched``, ``take_victims``)."""

from __future__ import annotations

import numba as nb
import numpy as np

from .history import INF
from .parts import Part

FIELDS = ("dirty", "dead", "fresh", "pf_unused", "thrashed", "written", "w_iter", "last_use", "uses")


class Blocks(Part, fields=FIELDS):
    """The block-state part: see the module docstring."""

    def __init__(self, n_blocks: int, fresh: bool = False) -> None:
        self.dirty = np.zeros(n_blocks, dtype=bool)
        self.dead = np.zeros(n_blocks, dtype=bool)
        # With ``fresh`` (the GPU maps memory nothing has used without data), every block until a launch touches it: a
        # first write there is a new tensor's, as into dead memory, and moves no data (the caller checks that no older
        # data lies there). A block the running launch writes stays fresh until its decision is made.
        self.fresh = np.full(n_blocks, bool(fresh))
        self.pf_unused = np.zeros(n_blocks, dtype=bool)
        self.thrashed = np.zeros(n_blocks, dtype=bool)
        self.written = np.zeros(n_blocks, dtype=bool)  # ever written (advice)
        self.w_iter = np.full(n_blocks, -1, dtype=np.int64)  # last iteration (count of on_iteration) writing it
        self.last_use = np.zeros(n_blocks, dtype=np.int64)  # launch index of the last use (LRU tie-break)
        self.uses = np.zeros(n_blocks, dtype=np.int32)  # launches touching it this iteration (advice)
        self.build()



# ------------------------------------------------------------------------------------------- compiled
@nb.njit(cache=True, nogil=True)
def launch_marks(bs, launch, it, index, wbuf):
    """A launch with known accesses (``launch``: ``(blocks, writes)``, sorted, writes a subset): its blocks are not
    dead, not unused prefetches, used once more this iteration and last used now; its writes are dirty, written
    and from iteration ``it``. The write flags over its blocks go to ``wbuf`` (0 read, 1 written, 2 written while
    dead or fresh: a new tensor's first write, as the history keeps them); those it only reads are no longer fresh
    (``decided`` clears the others). A block listed twice counts one use."""
    blocks, writes = launch
    n = blocks.shape[0]
    dead = bs.dead
    fresh = bs.fresh
    uses = bs.uses
    wbuf[:n] = 0
    for i in range(writes.shape[0]):
        x = writes[i]
        wbuf[np.searchsorted(blocks, x)] = 2 if dead[x] or fresh[x] else 1
    inc = np.empty(n, dtype=uses.dtype)
    for i in range(n):
        inc[i] = uses[blocks[i]] + 1
    for i in range(n):
        x = blocks[i]
        dead[x] = False
        if wbuf[i] == 0:
            fresh[x] = False
        bs.pf_unused[x] = False
        uses[x] = inc[i]
        bs.last_use[x] = index
    for i in range(writes.shape[0]):
        x = writes[i]
        bs.dirty[x] = True
        bs.written[x] = True
        bs.w_iter[x] = it


@nb.njit(cache=True, nogil=True)
def decided(bs, cur):
    """The running launch's decision is made: its blocks are no longer fresh."""
    for i in range(cur.shape[0]):
        bs.fresh[cur[i]] = False


@nb.njit(cache=True, nogil=True)
def moves_data(bs, x):
    """Whether bringing block ``x`` to the GPU moves data: not dead, not fresh."""
    return not (bs.dead[x] or bs.fresh[x])


@nb.njit(cache=True, nogil=True)
def cur_marks(bs, cur, resident, in_flight):
    """The running launch's blocks: ``(again, late)``, those it needs again after they were thrashed and are not
    back, and those still in flight; clears ``thrashed`` on them."""
    n = cur.shape[0]
    thrashed = bs.thrashed
    thr = np.empty(n, dtype=np.bool_)
    late = 0
    for i in range(n):
        thr[i] = thrashed[cur[i]]
        if in_flight[cur[i]]:
            late += 1
    again = 0
    for i in range(n):
        if thr[i]:
            thrashed[cur[i]] = False
            if not resident[cur[i]]:
                again += 1
    return again, late


@nb.njit(cache=True, nogil=True)
def note_thrash(bs, blocks, nu, p, lim):
    """Prefetched ``blocks`` leave unused. Only those whose predicted use is still ahead of the pointer ``p`` (and,
    with ``lim >= 0``, not after ``lim``) count as thrash (the window ran ahead of the room): marked, and counted
    when they are needed again before they are back; the others were mispredictions, which a narrower window cannot
    fix. Returns ``(thrash, mispredicted)`` block counts."""
    n = blocks.shape[0]
    pf_unused = bs.pf_unused
    unused = np.empty(n, dtype=np.bool_)
    anyu = False
    for i in range(n):
        unused[i] = pf_unused[blocks[i]]
        anyu = anyu or unused[i]
    if not anyu:
        return 0, 0
    wasted = 0
    mis = 0
    for i in range(n):
        if unused[i]:
            x = blocks[i]
            pf_unused[x] = False
            v = nu[x]
            if v > p and v < INF and (lim < 0 or v <= lim):
                wasted += 1
                bs.thrashed[x] = True
            if v <= p or v >= INF:
                mis += 1
    return wasted, mis


@nb.njit(cache=True, nogil=True)
def split_victims(bs, chosen):
    """Victims leave: ``(evict, discard)`` (dead ones are discarded, no write-back; order kept); then clean."""
    n = chosen.shape[0]
    dead = bs.dead
    nd = 0
    for i in range(n):
        if dead[chosen[i]]:
            nd += 1
    evict = np.empty(n - nd, dtype=np.int64)
    discard = np.empty(nd, dtype=np.int64)
    a = 0
    for i in range(n):
        x = chosen[i]
        if dead[x]:
            discard[i - a] = x
        else:
            evict[a] = x
            a += 1
        bs.dirty[x] = False
    return evict, discard


@nb.njit(cache=True, nogil=True)
def take_victims(bs, chosen, nu, p, lim):
    """Victims chosen for a decision: ``note_thrash`` within ``lim`` (our own Belady choice of a prefetched block
    for a sooner need is not thrash by itself: it counts for victims whose predicted use is within the next
    launches), then ``split_victims``. Returns ``(evict, discard, thrash, mispredicted)``."""
    wasted, mis = note_thrash(bs, chosen, nu, p, lim)
    evict, discard = split_victims(bs, chosen)
    return evict, discard, wasted, mis


@nb.njit(cache=True, nogil=True)
def mark_prefetched(bs, pf):
    """Prefetched blocks are unused until a launch touches them."""
    for i in range(pf.shape[0]):
        bs.pf_unused[pf[i]] = True
