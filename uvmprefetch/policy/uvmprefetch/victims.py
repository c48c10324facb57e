"""Victim selection: which resident blocks leave first, and the victim pool that spares most decisions a full scan.

Order (larger key first): dead blocks (discarded, no write-back), then live blocks with no predicted use ahead of
the pointer (clean before dirty, least recently used first), then the farthest predicted use (far ones at a grain of
``victim_grain`` launches). With ``dead_reuse`` a dead block whose *address* is predicted to be used again ranks by
that use like a live one (the allocator hands a freed address to the next tensor within a few launches: evicting it
only sends it back through the H2D queue); chosen, it is still discarded. Equal keys: the highest block first (the
caching allocator hands out free space best fit by (size, address), the dryrun runtime the lowest hole that fits: of
equal holes the lowest is taken first; without discards a dead block taken again comes back over the link).

The *pool*: the top ``victim_pool`` blocks of the last full scan with the lowest of them (its key, dead ones above
every live one, and block: ``min``, ``min_b``), plus every block whose key may have risen since (used, freed,
prefetched, faulted in, or recorded at a position the pointer passed), listed in ``ids[:n]`` (``in_pool`` marks
them). A choice made from the pool stands when its last victim ranks strictly above that one (then no block outside
can rank among them; the block breaks ties, so the many dead blocks with no predicted use while moves are learned
do not fail the pool); otherwise, after ``pool_launches``
decisions, or after a jump of the pointer, a full scan refills it.

A block's key rises when the pointer passes its predicted use. A prediction at a position that records the block,
or records a block the learned moves translate to it, is caught there (``pool_due``). One made through a move that
has since changed or been dropped (``pool_rekey``, ``due_settled``) is *due*: kept, one entry a block at its
earliest such position, in a heap the pointer drains (``pool_due``); a drained block whose prediction still lies
ahead goes back with it. Predictions through a layer stride are tied to nothing: the pool waits (``stale``) until
the pointer has passed them. Without discards (frees are not deaths: ``through_moves`` off) the pool is not kept up
through moves either: it waits as for a stride, since there a live block whose predicted use the pointer passes can
rise outside it (T5 base at 2x). A pointer moving back (not a jump) has the pool refilled. Below 2 MiB blocks the
driver's density prefetch makes blocks resident that no hook reports: no pool there.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .history import INF, flat_span
from .parts import Part

# Victim classes above every history position: dead, then clean unpredicted, then dirty unpredicted.
K_DEAD, K_CLEAN, K_DIRTY = 3 * INF, 2 * INF, INF + 1
AGE = 1 << 40  # launch-index span of the LRU tie-break (added inside a victim class)
CHUNK = 64  # blocks a full scan keys at once (``_chunk_keys``)
TOP = K_DEAD + INF  # a full scan's largest key: dead, no predicted use

POOL = np.dtype([
    ("n", np.int64), ("on", np.bool_),  # the pool's length; filled by a full scan and kept up since
    ("stale", np.int64),  # history position from which no prediction made through a move or stride lies ahead
    ("age", np.int64), ("min", np.int64),  # decisions since the last refill; the refill's lowest key (-1: all) ...
    ("min_b", np.int64),  # ... and its block: among equal keys the lower blocks rank below it
    ("k", np.int64), ("launches", np.int64), ("dead_reuse", np.bool_), ("gmask", np.int64),  # settings
    ("nd", np.int64), ("last_q", np.int64),  # the due heap's fill; the position the pointer last reached
    ("through_moves", np.bool_),  # kept up through learned moves (else a full scan refills it after them)
], align=True)

FIELDS = ("s", "ids", "in_pool", "mark", "due_b", "due_at", "due_i")


class Victims(Part, fields=FIELDS):
    """The victim part: see the module docstring. ``pool_k`` 0: no pool."""

    def __init__(self, n_blocks: int, pool_k: int, pool_launches: int, dead_reuse: bool,
                 through_moves: bool = True, grain: int = 1) -> None:
        self.record_of(POOL, k=pool_k, launches=pool_launches, dead_reuse=dead_reuse, min=-1,
                       through_moves=through_moves, gmask=-grain)  # (``grain``: a power of two)
        self.ids = np.zeros(n_blocks, dtype=np.int64)
        self.in_pool = np.zeros(n_blocks, dtype=bool)
        self.mark = np.zeros(n_blocks, dtype=np.uint8)  # zeroed scratch (left zeroed)
        # the due heap: blocks (``due_b[:nd]``) ordered by their due position (``due_at``, INF: not in the heap),
        # each block's place in it (``due_i``)
        self.due_b = np.zeros(n_blocks, dtype=np.int64)
        self.due_at = np.full(n_blocks, INF, dtype=np.int64)
        self.due_i = np.zeros(n_blocks, dtype=np.int64)
        self.build()



# ------------------------------------------------------------------------------------------- compiled
@nb.njit(cache=True, nogil=True)
def _worse(ka, ba, kb, bb):
    return ka < kb or (ka == kb and ba < bb)


@nb.njit(cache=True, nogil=True)
def _swap(hk, hb, i, j):
    hk[i], hk[j] = hk[j], hk[i]
    hb[i], hb[j] = hb[j], hb[i]


@nb.njit(cache=True, nogil=True)
def _sift_down(hk, hb, i, n):
    while True:
        left = 2 * i + 1
        if left >= n:
            return
        w = left
        r = left + 1
        if r < n and _worse(hk[r], hb[r], hk[left], hb[left]):
            w = r
        if not _worse(hk[w], hb[w], hk[i], hb[i]):
            return
        _swap(hk, hb, i, w)
        i = w


@nb.njit(cache=True, nogil=True)
def _offer(hk, hb, h, key, x):
    """Offer block ``x`` with ``key`` to the heap of the ``hk.size`` best (largest key, then largest block).
    Returns the new fill."""
    if h < hk.shape[0]:
        i = h
        hk[i] = key
        hb[i] = x
        h += 1
        while i > 0:
            par = (i - 1) // 2
            if not _worse(hk[i], hb[i], hk[par], hb[par]):
                break
            _swap(hk, hb, i, par)
            i = par
        return h
    if _worse(hk[0], hb[0], key, x):
        hk[0] = key
        hb[0] = x
        _sift_down(hk, hb, 0, h)
    return h


@nb.njit(cache=True, nogil=True)
def _drain(hk, hb, h, keep):
    """Drop the worst of the heap's ``h`` entries down to ``keep``; return the best ``keep`` in order (key
    descending, equal keys by block, the highest first) as ``(blocks, keys)``."""
    while h > keep:
        h -= 1
        hk[0] = hk[h]
        hb[0] = hb[h]
        _sift_down(hk, hb, 0, h)
    ob = np.empty(h, dtype=np.int64)
    ok = np.empty(h, dtype=np.int64)
    while h > 0:  # pop the worst first: fill from the back
        h -= 1
        ob[h] = hb[0]
        ok[h] = hk[0]
        hk[0] = hk[h]
        hb[0] = hb[h]
        _sift_down(hk, hb, 0, h)
    return ob, ok


@nb.njit(cache=True, nogil=True)
def _ranked(dead_b, live_b, live_k):
    """The victims in eviction order with their keys: the dead ones (``dead_b``, all keyed ``K_DEAD``), then the
    live ones."""
    nd = dead_b.shape[0]
    out_b = np.empty(nd + live_b.shape[0], dtype=np.int64)
    out_k = np.empty(nd + live_b.shape[0], dtype=np.int64)
    out_b[:nd] = dead_b
    out_k[:nd] = K_DEAD
    out_b[nd:] = live_b
    out_k[nd:] = live_k
    return out_b, out_k


@nb.njit(cache=True, nogil=True, inline="always")
def _vkey(x, keys, p):
    """Block ``x``'s rank as a victim: ``(dead, key)``; ``keys``: ``(dead, nu, dirty, last_use, dead_reuse, gmask)``. A
    dead block (with ``dead_reuse``, one with no predicted use ahead of ``p``) ranks before every live one, among
    them by ``key`` (``INF``: no reuse predicted); a live one by its predicted next use, or above every prediction
    when it has none (clean above dirty, least recently used first). ``_chunk_keys`` computes the same rank."""
    dead, nu, dirty, last_use, dead_reuse, gmask = keys
    v = nu[x]
    unpred = v >= INF or v <= p
    if dead[x] and (unpred or not dead_reuse):
        return True, (INF if unpred else v)
    v = v | ~gmask if v - p > -2 * gmask else v  # (far: to its grain's end, a key that only falls as p nears)
    return False, (((K_DIRTY if dirty[x] else K_CLEAN) + (AGE - last_use[x])) if unpred else v)


@nb.njit(cache=True, nogil=True)
def _full_key(x, keys, p):
    """Block ``x``'s rank as one number, as ``_chunk_keys`` keys it: a dead one's key plus ``K_DEAD``."""
    dead, key = _vkey(x, keys, p)
    return K_DEAD + key if dead else key


@nb.njit(cache=True, nogil=True)
def _keep_best(lk, lb, n, k):
    """Keep the best ``k`` of the ``n`` entries ``lk[:n]`` (keys) / ``lb[:n]`` (blocks, descending), in place and in
    their order: the larger key first, equal keys by block (the highest first). Returns ``(k, key of the k-th)``."""
    t = np.partition(lk[:n].copy(), n - k)[n - k]
    need = k
    for i in range(n):
        if lk[i] > t:
            need -= 1
    j = 0
    for i in range(n):
        key = lk[i]
        if key > t or (key == t and need > 0):
            if key == t:
                need -= 1
            lk[j] = key
            lb[j] = lb[i]
            j += 1
    return j, t


@nb.njit(cache=True, nogil=True)
def _chunk_keys(ck, lo, hi, resident, mark, keys, p):
    """``_vkey`` of blocks ``lo`` to ``hi`` as one number each (``ck[x - lo]``; larger: evict first): a dead block's
    key plus ``K_DEAD`` (above every live key), a live one's as it is, -1 for a block not resident or marked.
    Returns the largest (-1 for a chunk with nothing resident) and how many have the largest possible key
    (``TOP``: dead, no predicted use). Branch-free and indexed by unsigned integers (no negative-index wraparound
    to check), so that it compiles to vector code: ~0.4 ns per block against ~1.5 ns per resident block through
    ``_vkey``'s branches. The vectorizer is easily lost: a slice per array, a signed index, a second reduction (a
    minimum) or a loop after this one each made it 4-20x slower; time a change against this version."""
    dead, nu, dirty, last_use, dead_reuse, gmask = keys
    base = np.uint64(lo)
    m = np.uint64(hi - lo)
    anyr = False
    for j in range(m):
        anyr |= resident[base + j]
    if not anyr:
        return np.int64(-1), 0
    live_dead = not dead_reuse
    top = np.int64(-1)
    ntop = 0
    for j in range(m):
        x = base + j
        v = nu[x]
        unpred = (v >= INF) | (v <= p)
        dkey = K_DEAD + (INF if unpred else v)
        vg = v | ~gmask if v - p > -2 * gmask else v  # (``victim_grain``: as ``_vkey``)
        lkey = ((K_DIRTY if dirty[x] else K_CLEAN) + (AGE - last_use[x])) if unpred else vg
        key = dkey if dead[x] & (unpred | live_dead) else lkey
        key = key if resident[x] & (mark[x] == 0) else np.int64(-1)
        ck[j] = key
        top = max(top, key)
        ntop += key == TOP
    return top, ntop


@nb.njit(cache=True, nogil=True)
def _bound(cm, low, k, ck, resident, mark, keys, p):
    """A key that the ``k``-th victim reaches, from the chunks ``low`` on (``cm``: each one's largest key, -1: no
    candidate): the larger of two, each the smallest of ``k`` keys of real candidates (so ``k`` candidates reach it).
    One: the ``k`` largest chunk maxima (tight for few victims). Two: the best ``k`` keys of the chunks with the
    largest maxima, taken until they hold ``k`` candidates (tight for many victims where keys rise from chunk to
    chunk, as least recently used ones do)."""
    nch = cm.shape[0]
    nz = 0
    for c in range(low, nch):
        nz += cm[c] >= 0
    t = np.int64(0)  # (every candidate's key is 0 or more)
    if nz >= k:
        vals = np.empty(nz, dtype=np.int64)
        i = 0
        for c in range(low, nch):
            if cm[c] >= 0:
                vals[i] = cm[c]
                i += 1
        t = np.partition(vals, nz - k)[nz - k]
    g = ck.shape[0]
    n = resident.shape[0]
    got = np.empty(k + g, dtype=np.int64)
    ng = 0
    done = np.zeros(nch - low, dtype=np.bool_)
    while ng < k:
        best = np.int64(-1)
        bc = -1
        for c in range(low, nch):
            if cm[c] > best and not done[c - low]:
                best = cm[c]
                bc = c
        if bc < 0:
            break
        done[bc - low] = True
        lo = bc * g
        hi = min(n, lo + g)
        _chunk_keys(ck, lo, hi, resident, mark, keys, p)
        for j in range(hi - lo):
            if ck[j] >= 0:
                got[ng] = ck[j]
                ng += 1
    if ng >= k:
        t = max(t, np.partition(got[:ng], ng - k)[ng - k])
    return t


@nb.njit(cache=True, nogil=True)
def _scan(resident, keys, p, k, mark):
    """``rank`` over every block (marked ones left out) in two passes over chunks of ``CHUNK`` blocks
    (``_chunk_keys``). The first, from the highest chunk down, keeps each chunk's largest key; it stops once ``k``
    blocks have the largest possible key (no lower block ranks before them). The ``k`` victims all reach a key
    bounded from these (``_bound``): the second pass keys again only the chunks whose largest reaches it, from the
    highest down, and puts their blocks that reach it in a buffer of ``4 k``, cut back to its best ``k`` (which
    raises the threshold) whenever it fills. A later block with the same key ranks after the kept one: the blocks
    come in descending order. Without the bound, a buffer fed keys that rise from block to block (least recently
    used ones, say) is cut every few blocks: up to ~100 us for GPT-2 large's ~14 000 resident blocks at 2x (the
    ``bench/policy_cost.py`` replay), where a full scan takes ~14 us median with the bound."""
    n = resident.shape[0]
    g = CHUNK
    nch = (n + g - 1) // g
    cm = np.empty(nch, dtype=np.int64)
    ck = np.empty(g, dtype=np.int64)
    ntop = 0
    low = nch
    while low > 0 and ntop < k:
        low -= 1
        cm[low], nt = _chunk_keys(ck, low * g, min(n, low * g + g), resident, mark, keys, p)
        ntop += nt
    t = _bound(cm, low, k, ck, resident, mark, keys, p) - 1  # (keys of the bound and above pass)
    cap = max(4 * k, 64)
    lk = np.empty(cap, dtype=np.int64)
    lb = np.empty(cap, dtype=np.int64)
    nl = 0
    ntop = 0
    for c in range(nch - 1, low - 1, -1):
        if cm[c] <= t:
            continue
        lo = c * g
        hi = min(n, lo + g)
        _chunk_keys(ck, lo, hi, resident, mark, keys, p)
        for x in range(hi - 1, lo - 1, -1):
            key = ck[x - lo]
            if key > t:
                lk[nl] = key
                lb[nl] = x
                nl += 1
                if key == TOP:
                    ntop += 1
                    if ntop == k:
                        break
                if nl == cap:
                    nl, t = _keep_best(lk, lb, nl, k)
        if ntop == k:
            break
    if nl > k:
        nl, _ = _keep_best(lk, lb, nl, k)
    order = np.argsort(-lk[:nl], kind="mergesort")  # (stable: equal keys stay highest block first)
    return lb[order], np.minimum(lk[order], K_DEAD)


@nb.njit(cache=True, nogil=True)
def rank(resident, cur, keys, p, k, mark, ids=None, in_pool=None, floor=-1, floor_b=-1):
    """Up to ``k`` resident blocks not in ``cur``, in eviction order, with their keys (``_vkey``; ``keys`` as there;
    ``mark``: zeroed scratch, left zeroed); with ``ids`` (distinct block ids, any order), among those only.

    Over ``ids``: one pass with two bounded heaps, O(ids log k). A full scan (no ``ids``) keys the blocks a chunk at
    a time and keeps the candidates in a buffer (``_scan``, the same result).

    With ``in_pool`` (the victim pool: ``ids`` is its buffer, ``in_pool`` its membership flags) the live blocks among
    ``ids`` that do not rank above ``(floor, floor_b)`` (key, then block) leave the pool: ``ids`` keeps the others at
    its front, in their order.
    The victims are the same as without: the caller uses them only when the ``k``-th ranks above ``floor``. Returns
    ``(blocks, keys, kept)``: ``kept`` how many ids the pool kept (-1 without ``in_pool``)."""
    kept = np.int64(-1)
    if k <= 0:
        if in_pool is not None:
            kept = ids.shape[0]
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), kept
    for i in range(cur.shape[0]):
        mark[cur[i]] = 1
    if ids is None:
        out_b, out_k = _scan(resident, keys, p, k, mark)
        for i in range(cur.shape[0]):
            mark[cur[i]] = 0
        return out_b, out_k, kept
    dk = np.empty(k, dtype=np.int64)
    db = np.empty(k, dtype=np.int64)
    lk = np.empty(k, dtype=np.int64)
    lb = np.empty(k, dtype=np.int64)
    hd = 0
    hl = 0
    nd = 0
    if in_pool is not None:
        kept = 0
    for t in range(ids.shape[0]):
        x = ids[t]
        if not resident[x] or mark[x] != 0:
            if in_pool is not None:
                ids[kept] = x
                kept += 1
            continue
        is_dead, key = _vkey(x, keys, p)
        if in_pool is not None:
            if not is_dead and (key < floor or (key == floor and x <= floor_b)):
                in_pool[x] = False
                continue
            ids[kept] = x
            kept += 1
        if is_dead:
            nd += 1
            if hd < k or key > dk[0] or (key == dk[0] and x > db[0]):  # (the refusal inline)
                hd = _offer(dk, db, hd, key, x)
        elif hl < k or key > lk[0] or (key == lk[0] and x > lb[0]):
            hl = _offer(lk, lb, hl, key, x)
    for i in range(cur.shape[0]):
        mark[cur[i]] = 0
    head, _ = _drain(dk, db, hd, hd)
    if nd >= k:
        return head, np.full(k, K_DEAD, dtype=np.int64), kept
    live, lkeys = _drain(lk, lb, hl, k - nd)
    out_b, out_k = _ranked(head, live, lkeys)
    return out_b, out_k, kept


@nb.njit(cache=True, nogil=True)
def keys_of(vs, bs, nu):
    """The arrays a victim's rank reads (``_vkey``'s ``keys``)."""
    return bs.dead, nu, bs.dirty, bs.last_use, vs.s[0].dead_reuse, vs.s[0].gmask


@nb.njit(cache=True, nogil=True)
def choose(vs, keys, resident, cur, p, k, pool_k):
    """``k`` victims for a decision (``keys``: ``keys_of``): from the pool when it is on and can decide, else from a
    full scan, which refills the pool when ``pool_k`` > 0 (its size here: 0 while the pool waits or is off).
    Returns ``(blocks, keys, from_pool, refill)``: ``refill`` holds the full scan's blocks (``max(k, pool_k)`` of
    them) when the pool is to be built anew from them, and is empty otherwise."""
    s = vs.s[0]
    if s.on and s.age <= s.launches and k <= pool_k // 2:
        # (the pool's live blocks ranked at or below its floor leave it: they could only be chosen after a full
        # scan, which builds the pool anew, and a block whose key rises joins it)
        vict, vkey, s.n = rank(resident, cur, keys, p, k, vs.mark, vs.ids[:s.n], vs.in_pool, s.min, s.min_b)
        # stamp: victims from the pool
        if vict.shape[0] == k:
            key = _full_key(vict[k - 1], keys, p)
            if key > s.min or (key == s.min and vict[k - 1] > s.min_b):
                return vict, vkey, True, np.empty(0, dtype=np.int64)
    kk = max(k, pool_k)
    vict, vkey, _ = rank(resident, cur, keys, p, kk, vs.mark)
    # stamp: victims by a full scan
    refill = np.empty(0, dtype=np.int64)
    if pool_k > 0:
        refill = vict.copy()
        s.min = _full_key(vict[kk - 1], keys, p) if vict.shape[0] == kk else np.int64(-1)
        s.min_b = vict[kk - 1] if vict.shape[0] == kk else np.int64(-1)
    return vict[:k], vkey[:k], False, refill


@nb.njit(cache=True, nogil=True, inline="always")
def _put(vs, x):
    if not vs.in_pool[x]:
        vs.in_pool[x] = True
        s = vs.s[0]
        vs.ids[s.n] = x
        s.n += 1


@nb.njit(cache=True, nogil=True)
def pool_add(vs, blocks):
    """The blocks join the pool (when it is on): their keys may have risen."""
    if vs.s[0].on:
        for i in range(blocks.shape[0]):
            _put(vs, blocks[i])


@nb.njit(cache=True, nogil=True)
def _due_swap(vs, i, j):
    b = vs.due_b
    b[i], b[j] = b[j], b[i]
    vs.due_i[b[i]] = i
    vs.due_i[b[j]] = j


@nb.njit(cache=True, nogil=True)
def _due_push(vs, t, x):
    """Block ``x`` is due at ``t``: it enters the heap, or moves up to ``t`` when it waits for a later position (a
    later prediction of it is caught when the earlier entry is drained)."""
    s = vs.s[0]
    at = vs.due_at
    if t >= at[x]:
        return
    if at[x] >= INF:
        i = s.nd
        vs.due_b[i] = x
        vs.due_i[x] = i
        s.nd += 1
    else:
        i = vs.due_i[x]
    at[x] = t
    while i > 0:
        par = (i - 1) // 2
        if at[vs.due_b[par]] <= t:
            break
        _due_swap(vs, i, par)
        i = par


@nb.njit(cache=True, nogil=True)
def _due_pop(vs):
    """The heap's earliest block, taken out."""
    s = vs.s[0]
    b = vs.due_b
    at = vs.due_at
    x = b[0]
    at[x] = INF
    s.nd -= 1
    n = s.nd
    if n > 0:
        b[0] = b[n]
        vs.due_i[b[0]] = 0
        i = 0
        while True:
            w = 2 * i + 1
            if w >= n:
                break
            if w + 1 < n and at[b[w + 1]] < at[b[w]]:
                w += 1
            if at[b[w]] >= at[b[i]]:
                break
            _due_swap(vs, i, w)
            i = w
    return x


@nb.njit(cache=True, nogil=True)
def _caught(h, remap, t, x):
    """Whether ``pool_due`` at position ``t`` takes block ``x`` into the pool: ``t`` records it, or records a block
    the moves send to it."""
    s = h.s[0]
    if t < s.base or t >= s.base + s.n:
        return False
    a, b = flat_span(h, t, t + 1)
    for i in range(a, b):
        z = h.f_blk[i]
        if z == x or remap[z] == x:
            return True
    return False


@nb.njit(cache=True, nogil=True)
def pool_rekey(vs, h, remap, touched, p):
    """A learned move changed the next uses of the ``touched`` blocks (and the remap): they join the pool (when it is
    on), their keys may have risen; each whose prediction lies ahead of the pointer ``p`` at a position that will not
    take it into the pool (``_caught``: a prediction moved on from a block the moves had sent elsewhere, one left
    to a block the moves no longer send a recorded block to) is due there."""
    on = vs.s[0].on
    nu = h.nu
    for i in range(touched.shape[0]):
        x = touched[i]
        if on:
            _put(vs, x)
        v = nu[x]
        if p < v < INF and not _caught(h, remap, v, x):
            _due_push(vs, v, x)


@nb.njit(cache=True, nogil=True)
def due_settled(vs, blocks, nu, p):
    """The learned moves are dropped (an iteration ends): the ``blocks`` predicted through them are due where they
    are predicted, when that lies ahead of the pointer ``p``."""
    for i in range(blocks.shape[0]):
        v = nu[blocks[i]]
        if p < v < INF:
            _due_push(vs, v, blocks[i])


@nb.njit(cache=True, nogil=True)
def pool_due(vs, h, remap, q):
    """The blocks whose key may rise when the pointer reaches position ``q`` join the pool (when it is on): those
    recorded there, as recorded and translated (their next use moves on), and those due up to ``q`` (a drained one
    predicted further ahead by now stays due there). The pointer moving back refills the pool: a drained block
    whose prediction lies ahead again is due nowhere."""
    s = vs.s[0]
    if q < s.last_q:
        s.on = False
    s.last_q = q
    nu = h.nu
    while s.nd > 0 and vs.due_at[vs.due_b[0]] <= q:
        x = _due_pop(vs)
        if s.on:
            _put(vs, x)
        v = nu[x]
        if q < v < INF:
            _due_push(vs, v, x)
    if not s.on:
        return
    a, b = flat_span(h, q, q + 1)
    for i in range(a, b):
        _put(vs, h.f_blk[i])
        _put(vs, remap[h.f_blk[i]])


@nb.njit(cache=True, nogil=True)
def pool_refill(vs, new, cur, in_flight, pf):
    """The pool after a full scan: the old one unmarked, then the scan's blocks ``new``, the running launch's
    (``cur``, which the scan skipped), those in flight (whose keys it did not read) and the prefetched ``pf``."""
    s = vs.s[0]
    for i in range(s.n):
        vs.in_pool[vs.ids[i]] = False
    s.n = 0
    for i in range(new.shape[0]):
        _put(vs, new[i])
    for i in range(cur.shape[0]):
        _put(vs, cur[i])
    for x in range(in_flight.shape[0]):
        if in_flight[x]:
            _put(vs, x)
    for i in range(pf.shape[0]):
        _put(vs, pf[i])
    s.on = True
    s.age = 0
