"""Learned moves and the layer stride: how recorded blocks translate to where the data lives now.

*Moves* (``track_moves``). The caching allocator may place a step's activations elsewhere than last step. When
the launch matched at a position of an earlier iteration writes other blocks than its record, the written blocks
are paired in address order (``learn_moves``): later predicted reads of the recorded block ``x`` are translated to
the new one (``remap[x]``), and the new block takes ``x``'s predicted next use. Only writes are paired (a written
block is where the output tensor lives), and only against earlier iterations (inside one iteration a repeated
layer is another tensor). Where the record later writes a new tensor into ``x`` (``rend[x]``: its *birth*, e.g.
optimizer state where step one's activations were), that tensor is predicted both translated and, if ``x`` holds
live data now, where it is. Translations apply to the positions of the followed record only (``remap_limit``).

*Layer stride* (``layer_stride``). In the first iteration nothing is recorded yet and the pointer follows an
earlier layer of this iteration (same kernels, other blocks). Its blocks are the recorded ones shifted by the
distance between layers, one for older data (weights) and one for this iteration's data (activations): the
caching allocator lays both out layer after layer (``learn_shift``). The window pass applies it to the positions of
this iteration.

At an iteration's end the remap is dropped and the moved blocks' next uses are settled (``settle``).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .history import INF, flat_span, next_birth
from .parts import Part
from .victims import due_settled

MOVES = np.dtype([
    ("moved_at_start", np.int64),  # the count of moved blocks when this iteration began
    ("s_old", np.int64), ("s_new", np.int64),  # layer stride (blocks) of older data / of this iteration's data
    ("shift_it", np.bool_),  # a layer stride was in use this iteration
    ("track_moves", np.bool_), ("layer_stride", np.bool_),  # settings
    ("dead_births", np.bool_),  # setting: a dead block's translated next use is a birth (``history.advance``)
    ("dead_misses", np.int64),  # setting: missed predicted births after which a dead address predicts none (0: off)
], align=True)

FIELDS = ("s", "remap", "rend", "moved_to", "missed")


class Moves(Part, fields=FIELDS):
    """The moves part: see the module docstring."""

    def __init__(self, n_blocks: int, track_moves: bool, layer_stride: bool, dead_births: bool = False,
                 dead_misses: int = 0) -> None:
        self.record_of(MOVES, track_moves=track_moves, layer_stride=layer_stride, dead_births=dead_births,
                       dead_misses=dead_misses)
        self.remap = np.arange(n_blocks, dtype=np.int64)  # recorded block -> where its tensor lives now
        self.rend = np.zeros(n_blocks, dtype=np.int64)  # ... for its recorded entries before this position
        self.moved_to = np.zeros(n_blocks, dtype=bool)  # blocks that took a recorded block's next use
        # per recorded block: births that ``rend`` predicted there in a row that came while it was dead and went
        # elsewhere (``dead_misses``; 0 once it is seen live)
        self.missed = np.zeros(n_blocks, dtype=np.int64)
        self.build()

    def settle(self, hist, victims) -> tuple[int | None, int | None]:
        """At the end of an iteration that learned moves, the pointer on a record (``hist`` not yet told of the
        new iteration): the remap is about to go, and with it what kept the moved blocks' next uses up to date
        (``advance`` moves them on only through it). A block this iteration used is next used where its record
        first has it (``first_pos``, the same offset of the next step), unless a still valid prediction lies in what
        is left of the followed record; a moved block's is not valid (it came from its old address), nor one the
        pointer passed (left there, it would rank as unused all next step: discarded when dead, brought back later;
        ResNet-152 at 1.5x, iteration 3 ran 1.12x the oracle instead of 1.02x).

        Returns ``(back_to, wait)``: the earliest settled position, where the plan must go back to (None: none;
        the plan may already have passed it at the end of a step, when it plans the next one's start from this
        step's record, and a block evicted since for its stale rank would otherwise wait there until the pointer
        is a launch away from its use, then arrive late behind the queue: GPT-2-large at 1.5x, iteration 3 ran
        1.07x the oracle instead of 1.00x); and what the victim pool must still wait for: 0 (nothing), or None
        while a layer stride was in use (keep the wait as it is: shifted predictions are tied to nothing). The moved
        blocks not settled (first used by the running launch, not yet committed) are due at their next use in
        ``victims`` (``due_settled``): no recorded position leads to it once the remap is gone."""
        p = hist.p
        used = np.flatnonzero(hist.first_it == hist.r["iters"])
        nu = hist.nu[used]
        stale = self.moved_to[used] | (nu <= p) | (nu >= INF)
        fix = used[stale]
        hist.nu[fix] = hist.first_pos[fix]
        back = int(hist.first_pos[fix].min()) if fix.size else None
        due_settled(victims.ref, np.flatnonzero(self.moved_to & (hist.first_it != hist.r["iters"])), hist.nu, p)
        wait = None if self.r["shift_it"] else 0
        self.moved_to[:] = False
        return back, wait

    def new_iteration(self, moved: int) -> None:
        """An iteration begins (``moved``: the count of moved blocks so far): predictions now come from this
        iteration's ids, and the strides are learned anew."""
        r = self.r
        r["moved_at_start"] = moved
        r["shift_it"] = False
        if moved:
            self.remap[:] = np.arange(self.remap.shape[0])
            self.rend[:] = 0
            self.missed[:] = 0
        r["s_old"] = r["s_new"] = 0



# ------------------------------------------------------------------------------------------- compiled
@nb.njit(cache=True, nogil=True)
def remap_limit(mv, moves_now, q, rec_end):
    """Positions before this one take the learned moves: the end ``rec_end`` of the recorded iteration the pointer
    follows at ``q`` (the moves pair its blocks with this iteration's), once a move was learned this iteration
    (``moves_now``); 0 otherwise (then the remap is the identity, and the window pass skips the translation)."""
    if mv.s[0].track_moves and moves_now and q < rec_end:
        return rec_end
    return 0


@nb.njit(cache=True, nogil=True)
def learn_moves(mv, h, q, writes, rec_end, dead):
    """Pair the blocks position ``q`` wrote, in address order, with ``writes`` (the running launch's; ``rec_end``:
    the end of the record ``q`` is in). Where they differ, the recorded block is remapped to the new one and the
    new one takes its predicted next use; the recorded block's ``rend`` is its next birth before ``rec_end``,
    which becomes its next use, dead or not (the next tensor at that address), unless ``dead_misses`` (a setting)
    such predicted births in a row came while it was dead and went elsewhere (``missed``): the allocator does not
    hand the address out as the record did (T5 base at 3x, iteration 3: 100 dead addresses the step never handed
    out again, predicted at each next birth of the followed record, stayed resident through its end, in the room
    of dead memory the next step's first launches write). A recorded block written where the
    record has it drops its earlier move (the tensor stayed). The block an earlier move sent it to, when this write is not there, holds a
    tensor the followed record has no more uses of: it is next used where this iteration first used it (left at a
    passed position it would rank as unused and be dropped before the next step needs it: GPT-2-large at 1.5x,
    iteration 3 ran 1.11x the oracle instead of 1.06x). The new blocks are marked in ``moved_to``. Returns
    ``(moved, settled)``: the number of moved blocks and of earlier moves revised (both 0 when the counts of
    written blocks differ)."""
    s = h.s[0]
    a, b = flat_span(h, q, q + 1)
    f_blk = h.f_blk
    f_w = h.f_w
    nu = h.nu
    remap = mv.remap
    first_it = h.first_it
    it = s.iters
    m = 0
    for i in range(a, b):
        if f_w[i]:
            m += 1
    if m != writes.shape[0] or m == 0:
        return 0, 0
    olds = np.empty(m, dtype=np.int64)
    vals = np.empty(m, dtype=np.int64)
    moved = 0
    j = 0
    for i in range(a, b):
        if f_w[i]:
            if f_blk[i] != writes[j]:
                olds[moved] = j
                vals[moved] = nu[f_blk[i]]  # every old block's next use read before any is written
                moved += 1
            j += 1
    j = 0
    settled = 0
    for i in range(a, b):
        if f_w[i]:
            x = f_blk[i]
            w = writes[j]
            y = remap[x]
            if y != x and y != w and first_it[y] == it:
                nu[y] = h.first_pos[y]  # (the tensor there is not the one written now: next used next step)
                settled += 1
            if x != w:
                remap[x] = w
                mv.moved_to[w] = True
                if not dead[x]:
                    mv.missed[x] = 0
                elif 0 < q == mv.rend[x]:  # (the birth predicted here went elsewhere; 0: no prediction)
                    mv.missed[x] += 1
                e = next_birth(h, x, h.f_next[i], rec_end)
                mv.rend[x] = e
                if e < rec_end and not (0 < mv.s[0].dead_misses <= mv.missed[x]):
                    nu[x] = e
            elif y != x:
                remap[x] = x  # written where the record has it: this tensor stayed
                mv.rend[x] = 0
                mv.missed[x] = 0
                settled += 1
            j += 1
    for t in range(moved):
        nu[writes[olds[t]]] = vals[t]
    return moved, settled


@nb.njit(cache=True, nogil=True)
def move_touches(mv, h, q, writes):
    """The blocks whose next use ``learn_moves`` at ``q`` may change, read before it runs: each block ``q`` wrote
    and where the moves sent it so far, then ``writes``; empty when it will change none (the same blocks written,
    none of them moved: the common case, checked without allocating)."""
    a, b = flat_span(h, q, q + 1)
    remap = mv.remap
    nw = writes.shape[0]
    j = 0
    same = True
    for i in range(a, b):
        if h.f_w[i]:
            x = h.f_blk[i]
            if j >= nw or x != writes[j] or remap[x] != x:
                same = False
                break
            j += 1
    if same and j == nw:
        return np.empty(0, dtype=np.int64)
    out = np.empty(2 * (b - a) + nw, dtype=np.int64)
    n = 0
    for i in range(a, b):
        if h.f_w[i]:
            x = h.f_blk[i]
            out[n] = x
            out[n + 1] = remap[x]
            n += 2
    out[n:n + nw] = writes
    return out[:n + nw]


@nb.njit(cache=True, nogil=True)
def learn_shift(rec, rec_w, launch, w_iter, it):
    """The layer stride between the running launch (``launch``: ``(blocks, writes)``) and the recorded launch of an
    earlier layer it matched (``rec``, ``rec_w`` its write flags): for the blocks read and not written, separately
    for data from before this iteration (``w_iter != it``) and data written in it, the common difference of the two
    in address order. Returns ``(ok_old, d_old, ok_new, d_new)``: ok when both launches read as many such blocks
    (at least one) and all differences agree."""
    blocks, writes = launch
    d = np.zeros(2, dtype=np.int64)
    ok = np.zeros(2, dtype=np.bool_)
    for cls in range(2):
        i = 0  # (walks rec)
        j = 0  # (walks blocks)
        w = 0
        good = True
        seen = False
        nr = rec.shape[0]
        nb_ = blocks.shape[0]
        nw = writes.shape[0]
        while True:
            while i < nr and (rec_w[i] or ((w_iter[rec[i]] == it) != (cls == 1))):
                i += 1
            while j < nb_:
                x = blocks[j]
                while w < nw and writes[w] < x:
                    w += 1
                if (w < nw and writes[w] == x) or ((w_iter[x] == it) != (cls == 1)):
                    j += 1
                else:
                    break
            if i >= nr or j >= nb_:
                if i < nr or j < nb_:
                    good = False
                break
            dd = blocks[j] - rec[i]
            if not seen:
                d[cls] = dd
                seen = True
            elif dd != d[cls]:
                good = False
                break
            i += 1
            j += 1
        ok[cls] = good and seen
    return ok[0], d[0], ok[1], d[1]


@nb.njit(cache=True, nogil=True)
def moved_reach(h, writes, rec_end):
    """One past the furthest predicted next use among the moved blocks ``writes`` (at least ``rec_end``): until the
    pointer passes it, a prediction made through the move is not tied to a recorded position (the victim pool waits
    for it where it is not kept up through moves)."""
    top = rec_end
    nu = h.nu
    for i in range(writes.shape[0]):
        v = nu[writes[i]]
        if v < INF and v + 1 > top:
            top = v + 1
    return top
