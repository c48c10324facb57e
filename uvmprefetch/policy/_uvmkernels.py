"""Numba kernels of the ``uvmprefetch`` policy's hot path (``on_launch``): one pass each over arrays the
policy already keeps, replacing chains of small NumPy operations. Each kernel computes exactly what the
NumPy code it replaces computed (see the comments at the call sites in ``uvmprefetch.py``); the unit
tests compare them with the reference implementations.

Compiled on first use and cached on disk (``cache=True``).

The ``# stamp: <stage>`` comments in the one-kernel path mark where a stage ends (``# stamp-start``: where the
timing starts). They are only comments here; ``bench/kernel_profile.py`` compiles a copy of this module with a
cycle-counter stamp at each and prints the time each stage takes per launch.
"""

from __future__ import annotations

import numba as nb
import numpy as np
from numba.core import types as _nbtypes
from numba.experimental import structref

# The policy's per-block state, packed by type (``UvmPrefetchPolicy._bi`` / ``_bb``; its attributes are views of
# the rows): int64 rows ``I_*``, bool rows ``B_*``.
I_NU, I_W_ITER, I_LAST_FLAT, I_LAST_USE, I_REMAP, I_REND, I_FIRST_IT, I_FIRST_POS, I_POOL_IDS = range(9)
N_I = 9
B_DIRTY, B_DEAD, B_PF_UNUSED, B_THRASHED, B_WRITTEN, B_IN_POOL, B_MOVED_TO = range(7)
N_B = 7
# Its settings (``_kp``, int64; ``_kf``, float64) and the scalars it carries from one launch to the next
# (``_reg``, int64; the H2D queue's end is ``_regf[0]``), which ``after_match`` / ``step`` update in place.
(P_POOL_LAUNCHES, P_POOL_K, P_TRACK_MOVES, P_LAYER_STRIDE, P_STALL_AWARE, P_SCAN_MAX, P_FAULT_LATE_SOFT, P_DEAD_REUSE,
 P_STABLE_SYNC, P_MARGIN, P_INF, P_K_DEAD, P_K_DIRTY, P_K_CLEAN, P_AGE, P_NGRAM, P_HISTORY, P_FUSE) = range(18)
N_P = 18
F_LEAD, F_T_BLK, F_LAT = range(3)
N_F = 3
G_POOL_N, G_POOL_ON, G_POOL_STALE, G_POOL_AGE, G_POOL_MIN, G_S_OLD, G_S_NEW, G_V_LO, G_V_HI, G_HORIZON = range(10)
G_CLOCK, G_RECENT = 10, 11  # the tables' LRU clock; how many launches ``recent`` holds
# The history's lengths (positions, flat entries: ``UvmPrefetchPolicy.h_*`` / ``f_*``); the pointer (``G_HAS_P``
# 0: none, then ``G_P`` is -1) and how the running launch matched; the running launch's n-gram key; the launch
# pending its commit (``G_PEND`` 0: none; its blocks in ``pbuf[:G_PK]``, their write flags in ``wbuf[:G_PK]``
# when ``G_PHAS_W``); where the history and this iteration begin; the iteration count and the moves counted
# when it began; whether the running launch waits for blocks in flight; this iteration's prefetched link blocks;
# whether a layer stride was used in this iteration.
(G_HN, G_FN, G_P, G_HAS_P, G_SOFT, G_NGRAM, G_PEND, G_PK, G_PHAS_W, G_PKEY, G_PNAME, G_PSIG, G_PSTAB, G_PNGRAM,
 G_BASE, G_FBASE, G_ITER_START, G_PREV_START, G_ITERS, G_MOVED_AT_START, G_WAITS, G_LINK, G_SHIFT_IT) = range(12, 35)
N_G = 35
# ``_regf``: the H2D queue's predicted end, the recorded time before the history's end, the pending launch's
# duration, this iteration's compute time.
GF_Q_END, GF_CUM, GF_PDUR, GF_COMPUTE = range(4)
N_GF = 4
# The policy's counts (``UvmPrefetchPolicy.stats``: a mapping over this int64 array, which ``step`` adds to).
STAT_NAMES = ("launches", "matched", "soft", "resync", "unpredicted", "prefetched_blocks", "evicted_blocks",
              "discarded_blocks", "late_blocks", "predicted_faults", "thrash_blocks", "mispredicted_blocks",
              "refetched_blocks", "moved_blocks", "read_mostly_blocks", "prefer_host_blocks", "soft_moves",
              "stable_resync", "pooled_victim_scans", "pool_refills", "pool_waits_lifted", "one_kernel_steps",
              "one_kernel_inexact", "fused_after_match")
(S_LAUNCHES, S_MATCHED, S_SOFT, S_RESYNC, S_UNPREDICTED, S_PREFETCHED, S_EVICTED, S_DISCARDED, _S_LATE, _S_PFAULTS,
 S_THRASH, S_MISPREDICTED, _S_REFETCHED, S_MOVED, _S_RM, _S_PH, _S_SOFT_MOVES, S_STABLE_RESYNC, S_POOLED,
 S_REFILLS, _S_LIFTED, S_ONE_KERNEL, S_INEXACT, _S_FUSED) = range(len(STAT_NAMES))
# The correlation tables (``UvmPrefetchPolicy._tabs``: ``T_*`` map a key to the last history position that had it,
# least recently used out first; ``C_*`` count a key's occurrences in this iteration), set-associative like a
# hardware table: ``_tabs[t]`` is ``rows * TAB_WAYS`` entries of ``(key, value, stamp)``, stamp 0 empty.
T_SIG, T_STAB, T_EXEC, T_NAME, C_NGRAM, C_STAB = range(6)
N_T = 6
TAB_WAYS = 8


@nb.njit(cache=True, nogil=True)
def scan_window(h_ptr, base, fbase, nflat, end, f_blk, resident, in_flight, h_cum, lo, hi, p, cap, chase, q0, t0,
                t_blk, scan_max, scan_hi):
    """The chunked look-ahead scan of ``_plan``: chunks of 16, 32, ... positions from ``lo`` while fewer than
    ``cap`` scanned blocks are missing (or, with ``chase``, while the link is behind), at most ``scan_max``
    flat entries. Returns ``(scan_hi, a, b)``: the last position scanned (the given ``scan_hi`` if none) and
    the flat span ``[a, b)`` of positions ``lo..scan_hi`` (the concatenation of the chunks)."""
    got = 0
    start = lo
    chunk = 16
    scanned = 0
    behind = True
    a0 = h_ptr[lo - base] - fbase
    b_last = a0
    while start <= hi and (got < cap or (chase and behind)) and scanned < scan_max:
        stop = min(hi, start + chunk - 1)
        a = h_ptr[start - base] - fbase
        b = (h_ptr[stop + 1 - base] - fbase) if stop + 1 < end else nflat
        if b > a:
            for i in range(a, b):
                blk = f_blk[i]
                if not (resident[blk] or in_flight[blk]):
                    got += 1
            scanned += b - a
            b_last = b
        scan_hi = stop
        if chase and stop + 1 <= hi:
            behind = q0 + got * t_blk > t0 + (h_cum[stop + 1 - base] - h_cum[p + 1 - base])
        start = stop + 1
        chunk *= 2
    return scan_hi, a0, b_last


@nb.njit(cache=True, nogil=True)
def candidates(miss, f_blk, pa, pb, ppos, a, b, h_ptr, base, fbase, lo, remap, rend, remap_lim, nu, p, has_p, resident,
               in_flight, mark, shift_from, s_old, s_new, w_iter, it, dead):
    """Candidate blocks of ``_plan`` in order of need, with their history positions: ``miss`` (position -1),
    flat entries ``[pa, pb)`` (position ``ppos``), flat entries ``[a, b)`` (positions from ``lo`` on).

    As the NumPy code: blocks recorded before position ``remap_lim`` are translated through ``remap`` (the
    moves were learned against that recorded iteration; later iterations' records hold other addresses and
    are not translated; 0: nothing is); from ``rend[x]`` on (the birth of the next tensor the record has at
    ``x``: ``learn_moves``) a moved block that is not dead is a candidate both translated and as recorded,
    right after: that tensor may have moved as the first did (the allocator shifted a region) or, when the
    address holds live data, stayed there (it was given to data that outlives the step, e.g. optimizer state
    where step one's activations were); the predicted next
    use ``nu`` of each block takes the earliest of its candidate positions ahead of ``p`` when its current one
    is behind ``p`` or later (``has_p``); then blocks resident or in flight are dropped, and repeats after the
    first. ``mark`` is a zeroed scratch array of ``max_blocks`` bytes (left zeroed).

    Blocks recorded at positions from ``shift_from`` on (the pointer follows an earlier layer of this iteration)
    are shifted by the layer stride: ``s_old`` for data from before this iteration (``w_iter != it``: weights),
    ``s_new`` for data written in it (activations); a shift out of range leaves the block as recorded."""
    n = miss.shape[0] + max(0, pb - pa) + max(0, b - a)
    tr = has_p and remap_lim > 0
    blk = np.empty(2 * n if tr else n, dtype=np.int64)
    pos = np.empty(blk.shape[0], dtype=np.int64)
    j = 0
    for i in range(miss.shape[0]):
        blk[j] = miss[i]
        pos[j] = -1
        j += 1
    q = lo
    nh = h_ptr.shape[0]
    for part in range(2):  # the next launch's entries [pa, pb) at ppos, then the scanned span [a, b)
        for i in range(pa if part == 0 else a, pb if part == 0 else b):
            t = ppos
            if part == 1:
                while q + 1 - base < nh and h_ptr[q + 1 - base] - fbase <= i:
                    q += 1
                t = q
            x = f_blk[i]
            y = remap[x] if tr and 0 <= t < remap_lim else x
            blk[j] = y
            pos[j] = t
            j += 1
            if y != x and t >= rend[x] and not dead[x]:  # (also as recorded)
                blk[j] = x
                pos[j] = t
                j += 1
    n = j
    if has_p and (s_old != 0 or s_new != 0):
        nb_ = nu.shape[0]
        for i in range(n):
            if pos[i] >= shift_from:
                x = blk[i]
                y = x + (s_old if w_iter[x] != it else s_new)
                if 0 <= y < nb_:
                    blk[i] = y
    if has_p:
        # nu[blk[upd][::-1]] = pos[upd][::-1] with upd from nu before the update: the first updating
        # occurrence of each block wins.
        for i in range(n):
            x = blk[i]
            ps = pos[i]
            if ps > p and mark[x] == 0:
                old = nu[x]
                if old <= p or old > ps:
                    nu[x] = ps
                    mark[x] = 1
        for i in range(n):
            mark[blk[i]] = 0
    out_b = np.empty(n, dtype=np.int64)
    out_p = np.empty(n, dtype=np.int64)
    m = 0
    for i in range(n):
        x = blk[i]
        if resident[x] or in_flight[x] or mark[x] != 0:
            continue
        mark[x] = 1
        out_b[m] = x
        out_p[m] = pos[i]
        m += 1
    for i in range(m):
        mark[out_b[i]] = 0
    return out_b[:m], out_p[:m]


@nb.njit(cache=True, nogil=True)
def window_candidates(miss, f_blk, pa, pb, h_ptr, base, fbase, nflat, end, resident, in_flight, lo, hi, p, cap,
                      scan_max, remap, rend, remap_lim, nu, mark, shift_from, s_old, s_new, w_iter, it, dead,
                      extra=-1, v_lo=0, v_hi=-1):
    """``scan_window`` (without ``chase``) and ``candidates`` in one pass over the history entries: the same
    chunks, the same candidates in the same order, the same updates of ``nu``. Returns ``(blk, pos, scan_hi,
    spanned)``: ``scan_hi`` is ``p`` when nothing was scanned (``lo > hi``), ``spanned`` the number of entries
    the chunks covered (``scan_window``'s ``b - a``).

    One pass suffices because positions ascend along the candidates (``miss`` at -1, the next launch's entries
    ``[pa, pb)`` at ``p + 1``, the chunks from ``lo > p``): the first occurrence of a block that updates its ``nu``
    has its earliest position, and no later one can update it again, so ``candidates``' first-occurrence mark is
    not needed for the update and ``mark`` serves the de-duplication alone. The scan counts missing blocks as
    recorded (untranslated), the candidates test them translated, as the two kernels do.

    ``extra >= 0``: the caller reads no more than ``extra`` candidates beyond those at positions up to ``p + 1``
    (``plan_paced``: its free room, its pacing budget, and the first left out); the list stops there, a prefix of
    the whole one, while the scan goes on as before (its chunks, its count, the updates of ``nu``).

    ``[v_lo, v_hi]``: positions whose entries need no update of ``nu`` (every block recorded at a position ``t``
    there has ``p < nu <= t``: ``plan_paced``'s verified span); past the list's cut they are skipped."""
    span = 0
    if lo <= hi:
        hend = (h_ptr[hi + 1 - base] - fbase) if hi + 1 < end else nflat
        span = hend - (h_ptr[lo - base] - fbase)
    n = miss.shape[0] + max(0, pb - pa) + max(0, span)
    if remap_lim > 0:
        n *= 2  # (a moved block may be a candidate twice: ``_cand_entries``)
    out_b = np.empty(n, dtype=np.int64)
    out_p = np.empty(n, dtype=np.int64)
    m = 0
    for i in range(miss.shape[0]):  # (position -1: never translated, shifted, or a next use)
        x = miss[i]
        if not (resident[x] or in_flight[x] or mark[x] != 0):
            mark[x] = 1
            out_b[m] = x
            out_p[m] = -1
            m += 1
    lim = out_b.shape[0]  # (no limit up to position p + 1)
    m, _ = _cand_entries(f_blk, pa, pb, p + 1, m, lim, out_b, out_p, resident, in_flight, remap, rend, remap_lim,
                         nu, mark, p, shift_from, s_old, s_new, w_iter, it, dead, True)
    scan_hi = p
    got = 0
    spanned = 0
    start = lo
    chunk = 16
    while start <= hi and got < cap and spanned < scan_max:
        stop = min(hi, start + chunk - 1)
        for t in range(start, stop + 1):
            if t == max(lo, p + 2) and extra >= 0:
                lim = m + extra
            a = h_ptr[t - base] - fbase
            b = (h_ptr[t + 1 - base] - fbase) if t + 1 < end else nflat
            # (with the list cut and the count past ``cap``, the rest of the chunk only updates ``nu``; not
            # even that in the verified span)
            listing = m < lim or got < cap
            if listing or not v_lo <= t <= v_hi:
                m, g = _cand_entries(f_blk, a, b, t, m, lim, out_b, out_p, resident, in_flight, remap, rend,
                                     remap_lim, nu, mark, p, shift_from, s_old, s_new, w_iter, it, dead, listing)
                got += g
            if b > a:
                spanned += b - a
        scan_hi = stop
        start = stop + 1
        chunk *= 2
    for i in range(m):
        mark[out_b[i]] = 0
    return out_b[:m], out_p[:m], scan_hi, spanned


@nb.njit(cache=True, nogil=True, inline="always")
def _cand_entries(f_blk, a, b, t, m, lim, out_b, out_p, resident, in_flight, remap, rend, remap_lim, nu, mark, p,
                  shift_from, s_old, s_new, w_iter, it, dead, listing):
    """``window_candidates`` for the entries ``[a, b)`` of position ``t``, listing candidates up to ``lim`` of them;
    returns the new count of candidates and how many of the entries were missing as recorded (without
    ``listing``: the updates of ``nu`` alone, neither listed nor counted)."""
    got = 0
    nb_ = nu.shape[0]
    shifted = (s_old != 0 or s_new != 0) and t >= shift_from
    tr = remap_lim > 0 and t < remap_lim
    for i in range(a, b):
        x0 = f_blk[i]
        if listing and not (resident[x0] or in_flight[x0]):
            got += 1
        x = remap[x0] if tr else x0
        # (a moved block from its next birth on, while not dead, is a candidate as recorded too: ``candidates``)
        two = tr and x != x0 and t >= rend[x0] and not dead[x0]
        for k in range(2 if two else 1):
            if k == 1:
                x = x0
            if shifted:
                y = x + (s_old if w_iter[x] != it else s_new)
                if 0 <= y < nb_:
                    x = y
            if t > p:
                old = nu[x]
                if old <= p or old > t:
                    nu[x] = t
            if not listing or m >= lim or resident[x] or in_flight[x] or mark[x] != 0:
                continue
            mark[x] = 1
            out_b[m] = x
            out_p[m] = t
            m += 1
    return m, got


@nb.njit(cache=True, nogil=True)
def _worse(ka, ba, kb, bb):
    return ka < kb or (ka == kb and ba < bb)


@nb.njit(cache=True, nogil=True)
def _sift_down(hk, hb, i, n):
    while True:
        l = 2 * i + 1
        if l >= n:
            return
        w = l
        r = l + 1
        if r < n and _worse(hk[r], hb[r], hk[l], hb[l]):
            w = r
        if _worse(hk[w], hb[w], hk[i], hb[i]):
            hk[i], hk[w] = hk[w], hk[i]
            hb[i], hb[w] = hb[w], hb[i]
            i = w
        else:
            return


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
            if _worse(hk[i], hb[i], hk[par], hb[par]):
                hk[i], hk[par] = hk[par], hk[i]
                hb[i], hb[par] = hb[par], hb[i]
                i = par
            else:
                break
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
def _ranked(dead_b, k_dead, live_b, live_k):
    """The victims in eviction order with their keys: the dead ones (``dead_b``, all keyed ``k_dead``), then the
    live ones."""
    nd = dead_b.shape[0]
    out_b = np.empty(nd + live_b.shape[0], dtype=np.int64)
    out_k = np.empty(nd + live_b.shape[0], dtype=np.int64)
    out_b[:nd] = dead_b
    out_k[:nd] = k_dead
    out_b[nd:] = live_b
    out_k[nd:] = live_k
    return out_b, out_k


@nb.njit(cache=True, nogil=True, inline="always")
def _vkey(x, dead, nu, dirty, last_use, p, inf, k_dirty, k_clean, age0, dead_reuse):
    """Block ``x``'s rank as a victim: ``(dead, key, unpredicted)``. A dead block (with ``dead_reuse``, one with no
    predicted use ahead) ranks before every live one, among them by ``key`` (``inf``: no reuse predicted); a live
    one by ``key``: its predicted next use, or above every prediction when it has none (clean above dirty, least
    recently used first). Equal keys: the highest block first (``UvmPrefetchPolicy._victims_ref``)."""
    v = nu[x]
    unpred = v >= inf or v <= p
    if dead[x] and (unpred or not dead_reuse):
        return True, (inf if unpred else v), unpred
    return False, (((k_dirty if dirty[x] else k_clean) + (age0 - last_use[x])) if unpred else v), unpred


# From this many victims on, a full scan keeps the live candidates in a buffer (``_scan_victims``), not a heap.
_SCAN_K = 32


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
def _scan_victims(resident, dead, nu, dirty, last_use, p, k, mark, inf, k_dead, k_dirty, k_clean, age0, dead_reuse):
    """``victims`` over every block (marked ones left out), from the highest down: the dead ones in a heap as
    there, the live ones in a buffer of ``4 k`` cut back to its best ``k`` whenever it fills; a live block that
    ranks no better than the ``k``-th kept then is left out at once. The blocks come in descending order, so a
    later block with the same key ranks after the kept one. Same result as the heap (``_offer`` per live block),
    with far fewer moves: the heap took ~50-90 us of a ~75-120 us scan of GPT-2-large's ~14 000 resident blocks
    for ``k`` = 256."""
    dk = np.empty(k, dtype=np.int64)
    db = np.empty(k, dtype=np.int64)
    cap = max(4 * k, 64)
    lk = np.empty(cap, dtype=np.int64)
    lb = np.empty(cap, dtype=np.int64)
    hd = 0
    nl = 0
    nd = 0
    ninf = 0
    cut = False
    t = np.int64(0)
    for x in range(resident.shape[0] - 1, -1, -1):
        if not resident[x] or mark[x] != 0:
            continue
        is_dead, key, unpred = _vkey(x, dead, nu, dirty, last_use, p, inf, k_dirty, k_clean, age0, dead_reuse)
        if is_dead:
            nd += 1
            if hd < k or key > dk[0]:
                hd = _offer(dk, db, hd, key, x)
            if unpred:
                ninf += 1
                if ninf == k:
                    break  # (as in ``victims``)
        elif not cut or key > t:
            lk[nl] = key
            lb[nl] = x
            nl += 1
            if nl == cap:
                nl, t = _keep_best(lk, lb, nl, k)
                cut = True
    head, _ = _drain(dk, db, hd, hd)
    if nd >= k:
        return head, np.full(k, k_dead, dtype=np.int64)
    if nl > k:
        nl, _ = _keep_best(lk, lb, nl, k)
    order = np.argsort(-lk[:nl], kind="mergesort")[:k - nd]  # (stable: equal keys stay highest block first)
    return _ranked(head, k_dead, lb[order], lk[order])


@nb.njit(cache=True, nogil=True)
def victims(resident, cur, dead, nu, dirty, last_use, p, k, mark, inf, k_dead, k_dirty, k_clean, age0, dead_reuse,
            ids=None, in_pool=None, floor=-1):
    """Up to ``k`` resident blocks not in ``cur``, in eviction order, with their keys (see ``_victims_ref``);
    with ``ids`` (distinct block ids, any order), among those only.

    Dead blocks first (by predicted reuse, none or farthest first), then the live ones by key, largest first;
    equal keys by block, the highest first (as the reference). One pass, from the highest block down (or over
    ``ids``), with two bounded heaps: O(blocks + resident log k); a full scan for ``k >= _SCAN_K`` keeps the live
    ones in a buffer instead (``_scan_victims``, the same result). With ``dead_reuse`` a dead block whose next
    use is predicted ranks as a live one (the policy's ``_victim_dead``).

    With ``in_pool`` (the victim pool: ``ids`` is its buffer, ``in_pool`` its membership flags) the live blocks
    among ``ids`` whose key is not above ``floor`` leave the pool: ``ids`` keeps the others at its front, in their
    order, and they leave ``in_pool``. The victims are the same as without: the caller uses them only when the
    ``k``-th ranks above ``floor``. Returns ``(blocks, keys, kept)``: ``kept`` how many ids the pool kept (-1
    without ``in_pool``)."""
    kept = np.int64(-1)
    if k <= 0:
        if in_pool is not None:
            kept = ids.shape[0]
        return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64), kept
    for i in range(cur.shape[0]):
        mark[cur[i]] = 1
    if ids is None and k >= _SCAN_K:
        out_b, out_k = _scan_victims(resident, dead, nu, dirty, last_use, p, k, mark, inf, k_dead, k_dirty, k_clean,
                                     age0, dead_reuse)
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
    ninf = 0
    if in_pool is not None:
        kept = 0
    use_ids = ids is not None
    m = ids.shape[0] if use_ids else resident.shape[0]
    for t in range(m):
        x = ids[t] if use_ids else m - 1 - t
        if not resident[x] or mark[x] != 0:
            if in_pool is not None:
                ids[kept] = x
                kept += 1
            continue
        is_dead, key, unpred = _vkey(x, dead, nu, dirty, last_use, p, inf, k_dirty, k_clean, age0, dead_reuse)
        if in_pool is not None:
            if not is_dead and key <= floor:
                in_pool[x] = False
                continue
            ids[kept] = x
            kept += 1
        if is_dead:
            nd += 1
            if hd < k or key > dk[0] or (use_ids and key == dk[0] and x > db[0]):  # (the refusal inline)
                hd = _offer(dk, db, hd, key, x)
            if unpred and not use_ids:
                ninf += 1
                if ninf == k:
                    # k dead blocks with the largest possible dead key, the highest k: no block after
                    # them (lower) can come before them, and only dead blocks are returned (nd >= k)
                    break
        elif hl < k or key > lk[0] or (use_ids and key == lk[0] and x > lb[0]):
            hl = _offer(lk, lb, hl, key, x)
    for i in range(cur.shape[0]):
        mark[cur[i]] = 0
    head, _ = _drain(dk, db, hd, hd)
    if nd >= k:
        return head, np.full(k, k_dead, dtype=np.int64), kept
    live, lkeys = _drain(lk, lb, hl, k - nd)
    out_b, out_k = _ranked(head, k_dead, live, lkeys)
    return out_b, out_k, kept


@nb.njit(cache=True, nogil=True)
def commit_launch(h_cum, h_key, h_name, h_sig, h_soft, h_ptr, hn, cum, key, name, sig, soft, f_blk, f_w, f_next,
                  fn, blocks, wmask, has_w, fbase, last_flat, r, nu, p, inf, first_it, first_pos, it):
    """``_commit``'s array work in one call: the launch's entry at history index ``hn`` (absolute position
    ``r``) and its blocks at flat index ``fn`` (``f_next`` of new entries already holds ``inf``, ``f_w``
    False: the buffers' fill), then ``commit_blocks``; a block's first position in iteration ``it`` is kept in
    ``first_pos`` (``first_it`` says which iteration it is from). The buffers have room (``GrowArray.reserve``)."""
    h_cum[hn] = cum
    h_key[hn] = key
    h_name[hn] = name
    h_sig[hn] = sig
    h_soft[hn] = soft
    f0 = fbase + fn
    h_ptr[hn] = f0
    k = blocks.shape[0]
    for i in range(k):
        f_blk[fn + i] = blocks[i]
    if has_w:
        for i in range(k):
            f_w[fn + i] = wmask[i]
    for i in range(k):
        x = blocks[i]
        if first_it[x] != it:
            first_it[x] = it
            first_pos[x] = r
    commit_blocks(blocks, f_next, fbase, last_flat, f0, r, nu, p, inf, first_pos)


@nb.njit(cache=True, nogil=True)
def advance(q, h_ptr, base, fbase, nh, nflat, f_blk, f_next, remap, rend, remap_lim, nu, first_it, first_pos, it,
            dead, pool_on, in_pool, buf, n):
    """``_advance``: the blocks recorded at position ``q`` (before ``remap_lim``: through ``remap``) are next used
    where their entries link to. A moved block whose recorded address is next used only after ``remap_lim``
    (the followed iteration's end: another tensor at that address) is next used where this iteration first used
    it (``first_pos`` when ``first_it`` is ``it``): the same offset of the next iteration. When the recorded
    address's next entry holds a later tensor (from ``rend``, its birth) and the address is not dead, the
    address itself is predicted there too (see ``candidates``). With ``pool_on``, first ``pool_due`` (the victim
    pool ``buf[:n]``); returns the pool's new length."""
    if pool_on:
        n = pool_due(q, h_ptr, base, fbase, nh, nflat, f_blk, remap, in_pool, buf, n)
    a = h_ptr[q - base] - fbase
    b = (h_ptr[q + 1 - base] - fbase) if q + 1 - base < nh else nflat
    for i in range(a, b):
        x = f_blk[i]
        nx = f_next[i]
        if remap_lim > 0 and q < remap_lim:
            y = remap[x]
            if y != x:
                if nx >= rend[x] and not dead[x]:
                    nu[x] = nx  # the next tensor at the recorded address may stay there
                if nx >= remap_lim and first_it[y] == it:
                    nx = first_pos[y]
            x = y
        nu[x] = nx
    return n


@nb.njit(cache=True, nogil=True)
def _pool_put(x, in_pool, buf, n):
    if not in_pool[x]:
        in_pool[x] = True
        buf[n] = x
        n += 1
    return n


@nb.njit(cache=True, nogil=True)
def pool_add(ids, in_pool, buf, n):
    """Append the ids not yet ``in_pool`` to ``buf[n:]`` (room for every block id) and mark them; returns the
    new length."""
    for i in range(ids.shape[0]):
        n = _pool_put(ids[i], in_pool, buf, n)
    return n


@nb.njit(cache=True, nogil=True)
def pool_due(q, h_ptr, base, fbase, nh, nflat, f_blk, remap, in_pool, buf, n):
    """``pool_add`` the blocks whose eviction key may rise when the pointer reaches position ``q``: those recorded
    there, as recorded and translated (``advance`` moves their next use on; a block predicted at ``q`` is one of
    them unless the prediction came through a move or stride: the caller's ``_pool_stale`` condition)."""
    a = h_ptr[q - base] - fbase
    b = (h_ptr[q + 1 - base] - fbase) if q + 1 - base < nh else nflat
    for i in range(a, b):
        n = _pool_put(f_blk[i], in_pool, buf, n)
        n = _pool_put(remap[f_blk[i]], in_pool, buf, n)
    return n


@nb.njit(cache=True, nogil=True)
def learn_moves(q, h_ptr, base, fbase, nh, nflat, f_blk, f_w, f_next, writes, remap, rend, remap_lim, nu, dead,
                first_it, first_pos, it, moved_to):
    """``_learn_moves``' pairing: the blocks position ``q`` wrote, in address order, against ``writes`` (the
    running launch's); where they differ, the recorded block is remapped to the new one and the new one takes
    its predicted next use. ``rend`` of the recorded block: where the record next writes a new tensor into it
    (``_next_birth``, before ``remap_lim``; the caching allocator gave the address to another tensor, e.g.
    optimizer state where step one's activations were), which becomes the recorded block's next use unless it
    is dead. A recorded block written where the record has it drops its earlier move (the tensor stayed); the
    block an earlier move sent it to, when this write is not there, holds a tensor the followed record has no
    more uses of: it is next used where this iteration first used it (``first_pos``, if ``first_it`` is ``it``;
    left at a passed position it would rank as unused and be dropped before the next step needs it: GPT-2-large
    at 1.5x, iteration 3 at 1.11x the oracle instead of 1.06x). The new blocks are marked in ``moved_to``.
    Returns ``(moved, settled)``: the number of moved blocks and of earlier moves revised (both 0 when the
    counts differ)."""
    a = h_ptr[q - base] - fbase
    b = (h_ptr[q + 1 - base] - fbase) if q + 1 - base < nh else nflat
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
                vals[moved] = nu[f_blk[i]]  # read every old block's next use before any write (as NumPy)
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
                nu[y] = first_pos[y]  # (the tensor there is not the one written now: next used next step)
                settled += 1
            if x != w:
                remap[x] = w
                moved_to[w] = True
                e = _next_birth(x, f_next[i], h_ptr, base, fbase, nh, nflat, f_blk, f_w, f_next, remap_lim)
                rend[x] = e
                if e < remap_lim and not dead[x]:
                    nu[x] = e
            elif y != x:
                remap[x] = x  # written where the record has it: this tensor stayed
                rend[x] = 0
                settled += 1
            j += 1
    for t in range(moved):
        nu[writes[olds[t]]] = vals[t]
    return moved, settled


@nb.njit(cache=True, nogil=True)
def learn_moves_pool(q, h_ptr, base, fbase, nh, nflat, f_blk, f_w, f_next, writes, remap, rend, rec_end, nu, dead,
                     first_it, first_pos, it, moved_to, pool_on, pool_stale, inf):
    """``learn_moves`` (``rec_end``: the followed record's end) and what it means for the victim pool: a move or
    a revision changed next uses (``pool_on`` off); a moved block's prediction is not tied to the positions the
    pointer passes, so the pool stays unused up to the record's end and the moved blocks' next uses
    (``pool_stale``). Returns ``(moved, pool_on, pool_stale, revised)``: ``revised``, next uses were rewritten (a
    move or a revision)."""
    moved, settled = learn_moves(q, h_ptr, base, fbase, nh, nflat, f_blk, f_w, f_next, writes, remap, rend, rec_end,
                                 nu, dead, first_it, first_pos, it, moved_to)
    if moved or settled:
        pool_on = False
    if moved:
        top = rec_end
        for i in range(writes.shape[0]):
            v = nu[writes[i]]
            if v < inf and v + 1 > top:
                top = v + 1
        pool_stale = max(pool_stale, top)
    return moved, pool_on, pool_stale, moved > 0 or settled > 0


@nb.njit(cache=True, nogil=True)
def _next_birth(x, t, h_ptr, base, fbase, nh, nflat, f_blk, f_w, f_next, lim):
    """The first position from ``t`` on (along block ``x``'s entries) where the record writes a new tensor into
    ``x`` (``f_w`` 2: written while dead); ``lim`` if none before it. In-place writes (1) keep the tensor. A
    position's blocks are sorted (``x`` is found by ``searchsorted``, as in ``launch_marks``)."""
    end = base + nh
    while t < lim and t < end:
        a = h_ptr[t - base] - fbase
        b = (h_ptr[t + 1 - base] - fbase) if t + 1 < end else nflat
        lo = a + np.searchsorted(f_blk[a:b], x)
        if lo >= b or f_blk[lo] != x:
            return t  # (not recorded there: the links are stale, stop)
        if f_w[lo] == 2:
            return t
        t = f_next[lo]
    return lim


@nb.njit(cache=True, nogil=True)
def commit_blocks(blocks, f_next, fbase, last_flat, f0, r, nu, p, inf, first_pos):
    """``_commit``'s per-block bookkeeping: link each block's previous history entry to position ``r``, make
    the new entries ``f0 ..`` the blocks' last, and when a block has no predicted use ahead of ``p``, predict
    it at its first position in this iteration's record (``first_pos``; the same offset of the next step) if
    that is ahead of ``p``, else at ``r``."""
    for i in range(blocks.shape[0]):
        pv = last_flat[blocks[i]]
        if pv >= fbase:
            f_next[pv - fbase] = r
    for i in range(blocks.shape[0]):
        last_flat[blocks[i]] = f0 + i
    for i in range(blocks.shape[0]):
        x = blocks[i]
        v = nu[x]
        if v >= inf or v <= p:
            nu[x] = first_pos[x] if first_pos[x] > p else r


@nb.njit(cache=True, nogil=True)
def note_thrash(blocks, pf_unused, nu, thrashed, p, lim, use_lim, inf):
    """``_note_thrash``: prefetched blocks leave unused. Returns ``(thrash, mispredicted)`` block counts."""
    n = blocks.shape[0]
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
            if v > p and v < inf and (not use_lim or v <= lim):
                wasted += 1
                thrashed[x] = True
            if v <= p or v >= inf:
                mis += 1
    return wasted, mis


@nb.njit(cache=True, nogil=True)
def rebuild_nu(nu, f_blk, a, b, h_ptr, base, fbase, lo, scan_max, inf):
    """``_rebuild_nu``: every block's predicted next use = the position of its first entry in the flat span
    ``[a, b)`` (positions from ``lo``), only the first ``scan_max`` entries read; INF for the others."""
    nu[:] = inf
    m = min(b - a, scan_max)
    if m <= 0:
        return
    pos = np.empty(m, dtype=np.int64)
    q = lo
    nh = h_ptr.shape[0]
    for i in range(m):
        while q + 1 - base < nh and h_ptr[q + 1 - base] - fbase <= a + i:
            q += 1
        pos[i] = q
    for i in range(m - 1, -1, -1):  # the first entry of a block is written last
        nu[f_blk[a + i]] = pos[i]


@nb.njit(cache=True, nogil=True)
def stable_sig(blocks, writes, w_iter, iters_seen, key):
    """The *stable signature* of a launch (``_match``): a hash of its exec id and the blocks it reads that hold
    data from before this iteration (not written by it, not written earlier in this iteration: weights,
    optimizer state, inputs), 0 when it reads none. Unlike the exact signature it does not see where the
    caching allocator placed this step's activations. ``blocks`` sorted, ``writes`` a sorted subset."""
    h = np.uint64(key & 0x7FFFFFFFFFFFFFFF) * np.uint64(0x9E3779B97F4A7C15)
    n = 0
    j = 0
    nw = writes.shape[0]
    for i in range(blocks.shape[0]):
        x = blocks[i]
        while j < nw and writes[j] < x:
            j += 1
        if (j < nw and writes[j] == x) or w_iter[x] == iters_seen:
            continue
        h = (h ^ np.uint64(x)) * np.uint64(0x100000001B3)
        h ^= h >> np.uint64(29)
        n += 1
    if n == 0:
        return 0
    return np.int64(h >> np.uint64(2)) + 1


@nb.njit(cache=True, nogil=True)
def learn_shift(rec, rec_w, blocks, writes, w_iter, it):
    """The layer stride between the launch running now (``blocks``, ``writes`` its writes) and the recorded
    launch of an earlier layer it matched (``rec``, ``rec_w`` its write flags): for the blocks read and not
    written, separately for data from before this iteration (``w_iter != it``) and data written in it, the
    common difference of the two in address order. Returns ``(ok_old, d_old, ok_new, d_new)``: ok when both
    launches read as many such blocks (at least one) and all differences agree."""
    d = np.zeros(2, dtype=np.int64)
    ok = np.zeros(2, dtype=np.bool_)
    for cls in range(2):
        # i walks rec, j walks blocks; each side's next block of this class
        i = 0
        j = 0
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
def launch_marks(blocks, writes, iters_seen, index, dead, pf_unused, dirty, written, w_iter, uses, last_use, thrashed,
                 resident, in_flight, pool_on, in_pool, buf, pn):
    """``on_launch``'s bookkeeping of a launch with known accesses (``blocks`` sorted, ``writes`` a subset):
    not dead, not an unused prefetch, written ones dirty, one more use, last used now; then ``cur_marks``, and
    with ``pool_on`` the blocks join the victim pool ``buf[:pn]``. Returns ``(wmask, (thrashed, again, late),
    pool length)``, ``wmask`` the write flags over ``blocks`` (int8: 0 read, 1 written, 2 written while dead:
    a new tensor's first write, the history's ``f_w``). NumPy's buffered ``uses[blocks] += 1`` counts a repeat
    once."""
    n = blocks.shape[0]
    wmask = np.zeros(n, dtype=np.int8)
    for i in range(writes.shape[0]):
        x = writes[i]
        wmask[np.searchsorted(blocks, x)] = 2 if dead[x] else 1
    inc = np.empty(n, dtype=uses.dtype)
    for i in range(n):
        inc[i] = uses[blocks[i]] + 1
    for i in range(n):
        x = blocks[i]
        dead[x] = False
        pf_unused[x] = False
        uses[x] = inc[i]
        last_use[x] = index
    for i in range(writes.shape[0]):
        x = writes[i]
        dirty[x] = True
        written[x] = True
        w_iter[x] = iters_seen
    if pool_on:
        pn = pool_add(blocks, in_pool, buf, pn)
    return wmask, cur_marks(blocks, thrashed, resident, in_flight), pn


@nb.njit(cache=True, nogil=True)
def cur_marks(cur, thrashed, resident, in_flight):
    """The running launch's blocks: ``(thrashed ones, of those not resident, in flight)``; clears
    ``thrashed`` on them."""
    n = cur.shape[0]
    thr = np.empty(n, dtype=np.bool_)
    nthr = 0
    late = 0
    for i in range(n):
        thr[i] = thrashed[cur[i]]
        if thr[i]:
            nthr += 1
        if in_flight[cur[i]]:
            late += 1
    again = 0
    for i in range(n):
        if thr[i]:
            thrashed[cur[i]] = False
            if not resident[cur[i]]:
                again += 1
    return nthr, again, late


@nb.njit(cache=True, nogil=True)
def take_victims(chosen, dead, dirty, pf_unused, nu, thrashed, p, lim, inf):
    """``_plan``'s chosen victims: split into ``(evict, discard)`` (dead ones are discarded; order kept),
    ``note_thrash`` with a limit, then clean. Returns ``(evict, discard, thrash, mispredicted)``."""
    n = chosen.shape[0]
    nd = 0
    for i in range(n):
        if dead[chosen[i]]:
            nd += 1
    evict = np.empty(n - nd, dtype=np.int64)
    discard = np.empty(nd, dtype=np.int64)
    a = 0
    b = 0
    for i in range(n):
        x = chosen[i]
        if dead[x]:
            discard[b] = x
            b += 1
        else:
            evict[a] = x
            a += 1
    wasted, mis = note_thrash(chosen, pf_unused, nu, thrashed, p, lim, True, inf)
    for i in range(n):
        dirty[chosen[i]] = False
    return evict, discard, wasted, mis


@nb.njit(cache=True, nogil=True)
def mark_prefetched(pf, pf_unused, dead):
    """Prefetched blocks are unused until a launch touches them; returns how many are live (move data)."""
    live = 0
    for i in range(pf.shape[0]):
        pf_unused[pf[i]] = True
        if not dead[pf[i]]:
            live += 1
    return live


@nb.njit(cache=True, nogil=True)
def missing(cur, resident, in_flight):
    """``cur`` blocks neither resident nor in flight, in order."""
    out = np.empty(cur.shape[0], dtype=np.int64)
    m = 0
    for i in range(cur.shape[0]):
        x = cur[i]
        if not (resident[x] or in_flight[x]):
            out[m] = x
            m += 1
    return out[:m]


@nb.njit(cache=True, nogil=True)
def count_le(pos, start, v):
    """How many of ``pos[start:]`` are ``<= v``."""
    c = 0
    for i in range(start, pos.shape[0]):
        if pos[i] <= v:
            c += 1
    return c


@nb.njit(cache=True, nogil=True)
def first_not_above(vkey, pos, start):
    """The first ``i`` with ``vkey[i] <= pos[start + i]`` (``len(vkey)`` if none): victims are taken while
    their key (next use) is later than the need of the block they make room for."""
    for i in range(vkey.shape[0]):
        if not vkey[i] > pos[start + i]:
            return i
    return vkey.shape[0]


@nb.njit(cache=True, nogil=True)
def plan_paced(cur, resident, in_flight, capacity, used, margin, now, dur, lead, q_end, cur_waits, stall_aware, sure,
               p, window, horizon, h_ptr, base, fbase, nh, nflat, f_blk, h_soft, scan_max, remap, rend,
               remap_lim, nu, mark, dead, dirty, last_use, pf_unused, thrashed, t_blk, lat, fault_late_soft, inf,
               k_dead, k_dirty, k_clean, age0, dead_reuse, shift_from, s_old, s_new, w_iter, it, pool_buf, pool_n,
               in_pool, pool_live, pool_on, pool_min, pool_k, v_lo, v_hi):
    """``_plan`` in one call for its common case: a prediction (``p >= 0``), prefetch + pre-eviction paced to the
    link (``t_blk > 0``), no deadline chase, no soft-slot guard, no whole-launch rounding, no ``fault_late``.
    ``sure``: the running launch matched its record exactly (the pacing budget is rounded up, else down).
    The same steps as the Python code, in the same order and with the same float arithmetic (see the comments
    there). ``h_ptr`` is the filled part; ``f_blk`` / ``h_soft`` may be whole buffers. Returns ``(status, pf,
    evict, discard, horizon, q_end, thrash, mispredicted, live, pool_new, pool_min, pooled, pool_n, v_lo, v_hi)``:
    status 0 = nothing was scanned (the caller takes the margin path), 1 = planned; ``pooled``: the victims came
    from the pool; ``pool_n``: its length after the prefetched blocks joined it (with ``pool_live``: the pool is
    kept up, and no full scan refilled it; after a refill the caller builds it anew).

    The verified span ``[v_lo, v_hi]`` (empty: ``v_lo > v_hi``; kept by the caller from one call to the next): the
    positions whose recorded blocks all have ``p < nu <= t`` (``t``: the position), which the window pass then
    need not update (``window_candidates``). A pass without translation or layer shift leaves every position it
    scanned so, and so the span grows along the passes; it stays so as the pointer moves on, since nothing else
    that runs between two passes can break it: ``advance`` without translation sets a block's next use to its
    next recorded entry, ``commit_launch`` sets only next uses that are not ahead of the pointer, and the updates of
    a window pass (this one's or ``candidates``') only bring a next use ahead of the pointer nearer. Whatever else
    writes ``nu`` (a learned move or its revision, an advance through a translation, a jump's ``rebuild_nu``,
    the end of an iteration that learned moves) empties the span: a pass with translation or shift here, the
    callers elsewhere. (The Python plan, ``_fast_plan`` off, never calls this kernel.)

    The victim pool (``pool_k > 0``; ``UvmPrefetchPolicy._pool_ids``): victims come from the blocks
    ``pool_buf[:pool_n]`` lists (``pool_on``) when the ``k``-th of them ranks strictly above ``pool_min``, the
    lowest key of the full scan that filled the pool (no block outside it can then rank among the ``k``, as long
    as the caller has marked every block whose key may have risen since); otherwise from a full scan for
    ``max(k, pool_k)``, whose blocks are returned as ``pool_new`` with their lowest key as ``pool_min`` (-1: the
    scan found all there were). The same victims either way."""
    # stamp: plan_paced (its call)
    end = base + nh
    empty = np.empty(0, dtype=np.int64)
    pool = pool_buf[:pool_n]
    miss = missing(cur, resident, in_flight) if cur.shape[0] else empty
    # stamp: missing
    pa = 0
    pb = 0
    lo = max(p + 1, horizon)
    hi = min(p + window, end - 1)
    if lo > p + 1:
        pa = h_ptr[p + 1 - base] - fbase
        pb = (h_ptr[p + 2 - base] - fbase) if p + 2 < end else nflat
    cap = 0
    if lo <= hi:
        free0 = max(0, capacity - used - margin)
        spare = (now + dur + lead - max(q_end, now)) / t_blk
        if stall_aware and cur_waits:
            spare = (dur + lead) / t_blk
        cap = free0 + max(0, int(spare)) + 8
        if free0 == 0 and cap <= 8:
            hi = min(hi, p + 1)
    free = max(0, capacity - used - margin)
    q = max(q_end, now)
    until = now + dur + lead
    if stall_aware and cur_waits:
        until += max(0.0, q - now)
    # The pacing budget once the free room is filled: evictions make room for at most the candidates up to the
    # next launch (``near``) and this many more (read only when the candidates outnumber the free room).
    room = (until - (q + free * t_blk)) / t_blk
    budget = max(0, int(np.ceil(room) if sure else room))
    plain = remap_lim == 0 and not (shift_from < inf and (s_old != 0 or s_new != 0))
    if not plain:
        v_lo = 0  # (a translated or shifted pass updates other blocks than those recorded)
        v_hi = -1
    # (the scan and the candidates in one pass: ``window_candidates``, the list cut after the last candidate
    # read below, the first left out: the horizon; when it finds nothing, nothing changed)
    blk, pos, scan_hi, spanned = window_candidates(miss, f_blk, pa, pb, h_ptr, base, fbase, nflat, end, resident,
                                                   in_flight, lo, hi, p, cap, scan_max, remap, rend, remap_lim, nu,
                                                   mark, shift_from, s_old, s_new, w_iter, it, dead,
                                                   free + budget + 1, v_lo, v_hi)
    # stamp: window pass
    if plain and lo <= scan_hi:
        if v_lo <= lo <= v_hi + 1:
            v_hi = max(v_hi, scan_hi)
        else:
            v_lo = lo
            v_hi = scan_hi
    if not (miss.shape[0] or pb > pa or spanned > 0):
        return 0, empty, empty, empty, horizon, q_end, 0, 0, 0, empty, pool_min, False, pool_n, v_lo, v_hi
    n = blk.shape[0]
    evict = empty
    discard = empty
    wasted = 0
    mis = 0
    placed = min(free, n)
    rest = n - placed
    if rest:  # (then ``placed`` is ``free``, and a cut list still leaves more than ``near + budget``)
        rest = min(rest, count_le(pos, placed, p + 1) + budget)
    pool_new = empty
    found = False
    if rest:
        vict = empty
        vkey = empty
        if pool_on and rest <= pool_k // 2:
            # (pool: the ids, pool_add's buffer; its live blocks ranked at or below pool_min leave it: they could
            # only be chosen after a full scan, which builds the pool anew, and a block whose key rises joins it)
            vict, vkey, pool_n = victims(resident, cur, dead, nu, dirty, last_use, p, rest, mark, inf, k_dead,
                                         k_dirty, k_clean, age0, dead_reuse, pool, in_pool, pool_min)
            # stamp: victims from the pool
            found = vict.shape[0] == rest and vkey[rest - 1] > pool_min
        if not found:
            kk = max(rest, pool_k)
            vict, vkey, _ = victims(resident, cur, dead, nu, dirty, last_use, p, kk, mark, inf, k_dead, k_dirty,
                                    k_clean, age0, dead_reuse)
            # stamp: victims by a full scan
            if pool_k > 0:
                pool_new = vict.copy()
                pool_min = vkey[kk - 1] if vict.shape[0] == kk else np.int64(-1)
            vict = vict[:rest]
            vkey = vkey[:rest]
        k_ok = first_not_above(vkey, pos, placed)
        if k_ok:
            evict, discard, wasted, mis = take_victims(vict[:k_ok], dead, dirty, pf_unused, nu, thrashed, p,
                                                       (p + 1) + max(1, window // 8), inf)
            # stamp: take_victims
        placed += k_ok
    pf = blk[:placed]
    if placed and q > now + lat:
        # the running launch's misses fault instead; with fault_late_soft, so do a soft next launch's blocks
        # of older data that would arrive after it starts (its guesses; this iteration's data is not one)
        soft_next = fault_late_soft and p + 1 < end and h_soft[p + 1 - base] > 0
        keep = np.empty(placed, dtype=np.bool_)
        c = 0
        m = 0
        for i in range(placed):
            if not dead[blk[i]]:
                c += 1  # arrival = q + t_blk * (live blocks queued up to here), as the NumPy code's cumsum
            ok = pos[i] >= 0
            if ok and soft_next and pos[i] == p + 1 and w_iter[blk[i]] != it and q + t_blk * c > now + dur + lat:
                ok = False
            keep[i] = ok
            if ok:
                m += 1
        out = np.empty(m, dtype=np.int64)
        j = 0
        for i in range(placed):
            if keep[i]:
                out[j] = blk[i]
                j += 1
        pf = out
    # stamp: late blocks left out
    if placed == n:
        horizon = max(horizon, scan_hi + 1)
    elif placed:
        horizon = max(horizon, pos[placed] if pos[placed] >= 0 else p + 1)
    live = 0
    if pf.shape[0]:
        live = mark_prefetched(pf, pf_unused, dead)
        q_end = q + live * t_blk
        if pool_live and not pool_new.shape[0]:
            pool_n = pool_add(pf, in_pool, pool_buf, pool_n)
    # stamp: prefetched marked, pool
    return 1, pf, evict, discard, horizon, q_end, wasted, mis, live, pool_new, pool_min, found, pool_n, v_lo, v_hi


@nb.njit(cache=True, nogil=True)
def _remap_limit(track_moves, moves_now, q, rec_end):
    """``UvmPrefetchPolicy._remap_lim`` with the pointer at ``q``: the followed record's end ``rec_end`` (0 when
    ``q`` is in this iteration) once a move was learned this iteration (``moves_now``), else 0."""
    if track_moves and moves_now and q < rec_end:
        return rec_end
    return 0


_U30, _U27, _U31 = np.uint64(30), np.uint64(27), np.uint64(31)
_GOLD, _M1, _M2 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)
_SEED = np.int64(0x5EED)


@nb.njit(cache=True, nogil=True, inline="always")
def _mix(h, v):
    """A 64-bit hash of ``h`` combined with ``v`` (splitmix64's finaliser), never 0 (the tables' "none")."""
    x = np.uint64(h) ^ (np.uint64(v) + _GOLD)
    x = (x ^ (x >> _U30)) * _M1
    x = (x ^ (x >> _U27)) * _M2
    k = np.int64(x ^ (x >> _U31))
    return k if k != 0 else np.int64(1)


@nb.njit(cache=True, nogil=True, inline="always")
def _set_of(tabs, key):
    """First entry of ``key``'s set in a table of ``_tabs``."""
    return np.int64(np.uint64(_mix(key, 0)) % np.uint64(tabs.shape[1] // TAB_WAYS)) * TAB_WAYS


@nb.njit(cache=True, nogil=True)
def tab_get(tabs, t, key, reg):
    """The value of ``key`` in table ``t`` of ``tabs``, -1 if it is not there; a use (the entry's LRU stamp is
    the clock ``reg[G_CLOCK]``, advanced)."""
    s = _set_of(tabs, key)
    for i in range(s, s + TAB_WAYS):
        if tabs[t, i, 2] != 0 and tabs[t, i, 0] == key:
            reg[G_CLOCK] += 1
            tabs[t, i, 2] = reg[G_CLOCK]
            return tabs[t, i, 1]
    return -1


@nb.njit(cache=True, nogil=True)
def tab_put(tabs, t, key, val, reg):
    """``key`` -> ``val`` in table ``t`` of ``tabs`` (a use); a new key takes an empty way of its set, else the
    least recently used one."""
    s = _set_of(tabs, key)
    j = s
    for i in range(s, s + TAB_WAYS):
        st = tabs[t, i, 2]
        if st != 0 and tabs[t, i, 0] == key:
            j = i
            break
        if st < tabs[t, j, 2]:
            j = i
    reg[G_CLOCK] += 1
    tabs[t, j, 0] = key
    tabs[t, j, 1] = val
    tabs[t, j, 2] = reg[G_CLOCK]


@nb.njit(cache=True, nogil=True)
def tab_count(tabs, t, key, gen):
    """How many times ``key`` was counted before in generation ``gen`` (> 0: an iteration; older entries are
    free) in table ``t``, this time counted. A set full of this generation's keys starts its first way over."""
    s = _set_of(tabs, key)
    j = -1
    for i in range(s, s + TAB_WAYS):
        if tabs[t, i, 2] == gen:
            if tabs[t, i, 0] == key:
                c = tabs[t, i, 1]
                tabs[t, i, 1] = c + 1
                return c
        elif j < 0:
            j = i
    if j < 0:
        j = s
    tabs[t, j, 0] = key
    tabs[t, j, 1] = 1
    tabs[t, j, 2] = gen
    return np.int64(0)


@nb.njit(cache=True, nogil=True, inline="always")
def _seq_key(row, a, b, last):
    """The key of the sequence ``row[a:b]`` followed by ``last``."""
    h = _SEED
    for i in range(a, b):
        h = _mix(h, row[i])
    return _mix(h, last)


@nb.njit(cache=True, nogil=True)
def name_key(recent, reg, name, n):
    """The name n-gram of a launch named ``name``: the last ``n`` committed names (``recent[1]``) and it."""
    m = reg[G_RECENT]
    return _seq_key(recent[1], m - n, m, name)


@nb.njit(cache=True, nogil=True)
def count_ngram(tabs, recent, reg, key, n, gen):
    """The running launch's exec-id n-gram (the last ``n`` committed exec ids, ``recent[0]``, and ``key``) with
    how many times it occurred before in this iteration (``gen``), as one key; 0 while fewer than ``n``
    launches were committed."""
    m = reg[G_RECENT]
    if m < n:
        return np.int64(0)
    g = _seq_key(recent[0], m - n, m, key)
    return _mix(g, tab_count(tabs, C_NGRAM, g, gen))


@nb.njit(cache=True, nogil=True)
def stab_key(tabs, h, gen):
    """A stable signature ``h`` with how many times it occurred before in this iteration (``gen``), as one key."""
    return _mix(h, tab_count(tabs, C_STAB, h, gen))


@nb.njit(cache=True, nogil=True)
def commit_tables(tabs, recent, reg, key, name, sig, r, stab, ngram, n):
    """``_commit``'s table part for the launch committed at position ``r``: its signature, its stable key
    ``stab`` and exec n-gram key ``ngram`` (0: none), and once ``n`` launches precede it, its name n-gram, all
    map to ``r``; its exec id and name join ``recent`` (the last ``n + 1``; ``reg[G_RECENT]`` of them)."""
    tab_put(tabs, T_SIG, sig, r, reg)
    if stab != 0:
        tab_put(tabs, T_STAB, stab, r, reg)
    m = reg[G_RECENT]
    if m == n + 1:
        for i in range(n):
            recent[0, i] = recent[0, i + 1]
            recent[1, i] = recent[1, i + 1]
        m = n
    recent[0, m] = key
    recent[1, m] = name
    m += 1
    reg[G_RECENT] = m
    if m == n + 1:
        if ngram != 0:
            tab_put(tabs, T_EXEC, ngram, r, reg)
        tab_put(tabs, T_NAME, _seq_key(recent[1], 0, n, name), r, reg)


@nb.njit(cache=True, nogil=True)
def commit_step(h_cum, h_key, h_name, h_sig, h_soft, h_ptr, f_blk, f_w, f_next, hn, fn, cum, pkey, pname, psig, psoft,
                pblocks, pwmask, p_has_w, pp, base, fbase, committing, counting, key, blocks, writes, stable, it, bi,
                kp, tabs, recent, reg, pstab, pngram):
    """A launch's steps before its pointer moves, in one call. With ``committing``, the pending (previous) launch
    is committed: ``commit_launch`` at history index ``hn`` and flat index ``fn`` (the caller reserved room; its
    pointer ``pp``, its match ``psoft``, its write flags ``pwmask`` when ``p_has_w``, its predicted start ``cum``)
    and ``commit_tables`` (its stable key ``pstab`` and n-gram key ``pngram``). With ``counting``, the running launch
    (exec id ``key``) is counted: ``count_ngram``, and with ``stable`` (known accesses and ``stable_sync``) its
    ``stable_sig`` and ``stab_key``. Returns ``(stab, ngram)``: the running launch's keys (0: none)."""
    if committing:
        commit_launch(h_cum, h_key, h_name, h_sig, h_soft, h_ptr, hn, cum, pkey, pname, psig, psoft, f_blk, f_w,
                      f_next, fn, pblocks, pwmask, p_has_w, fbase, bi[I_LAST_FLAT], base + hn, bi[I_NU], pp, kp[P_INF],
                      bi[I_FIRST_IT], bi[I_FIRST_POS], it)
        commit_tables(tabs, recent, reg, pkey, pname, psig, base + hn, pstab, pngram, kp[P_NGRAM])
    stab = np.int64(0)
    ngram = np.int64(0)
    if counting:
        ngram = count_ngram(tabs, recent, reg, key, kp[P_NGRAM], it + 1)
        if stable:
            h = stable_sig(blocks, writes, bi[I_W_ITER], it, key)
            if h != 0:
                stab = stab_key(tabs, h, it + 1)
    return stab, ngram


@nb.njit(cache=True, nogil=True)
def after_match(q, soft, blocks, writes, index, it, rec_end, moves_now, iter_start, h_ptr, h_soft, f_blk, f_w, f_next,
                base, fbase, nh, nflat, resident, in_flight, n_ids, capacity, used, now, dur, window, bi, bb, uses,
                mark, kp, kf, reg, regf, wbuf, out):
    """``on_launch`` after the pointer moved to ``q`` (``soft``: how the launch matched, ``_match``), for a launch
    with known accesses, in one call: the same kernels in the same order as the Python hooks. The policy's
    per-block state comes packed (``bi`` / ``bb``: rows ``I_*`` / ``B_*``), its settings in ``kp`` / ``kf``
    (``P_*`` / ``F_*``), and the scalars it carries from one launch to the next in ``reg`` / ``regf`` (``G_*``,
    ``regf[0]``: the H2D queue's end), which this call updates in place. What it decides comes back in place too
    (a NumPy array made here costs ~0.8 us to hand back): the write flags over ``blocks`` in ``wbuf[:k]`` (int8:
    0 read, 1 written, 2 written while dead, as ``launch_marks``), the blocks to prefetch, evict and discard, in
    that order, in ``out`` (disjoint: blocks not resident, then resident ones; as long as ``nu``).

    1. ``learn_moves_pool`` (``track_moves`` and ``q`` before this iteration: ``rec_end``, the followed
       record's end, is then > ``q``; 0 otherwise); rewritten next uses empty ``plan_paced``'s verified span;
    2. ``learn_shift`` (a soft match inside this iteration, ``layer_stride``): the strides; a new one empties the
       victim pool and makes it stale up to the history's end;
    3. ``launch_marks``; when a block came back after thrash or is late (``again`` / ``late``), the window
       monitor must see it before the plan: stop here (``stage`` 1, the caller plans);
    4. ``plan_paced`` (``sure`` on an exact match, not waiting), the pool age counted; the remap limit is
       ``rec_end`` once a move was learned this iteration (``moves_now`` or step 1); a full victim scan refills
       the pool (``pool_refill``).

    Returns ``(stage, moved, again, late, status, n_pf, n_evict, n_discard, wasted, mis, live, pooled, refilled,
    shifted)``: ``status`` and ``wasted`` .. ``pooled`` as ``plan_paced`` returns them (``status`` 0 at stage 1), the
    three lengths of its decision in ``out``, ``refilled`` whether a full scan refilled the pool,
    ``shifted`` whether a layer stride is in use."""
    # stamp: after_match (its call)
    empty = np.empty(0, dtype=np.int64)
    nu = bi[I_NU]
    w_iter = bi[I_W_ITER]
    last_use = bi[I_LAST_USE]
    remap = bi[I_REMAP]
    rend = bi[I_REND]
    first_it = bi[I_FIRST_IT]
    first_pos = bi[I_FIRST_POS]
    pool_buf = bi[I_POOL_IDS]
    dirty = bb[B_DIRTY]
    dead = bb[B_DEAD]
    pf_unused = bb[B_PF_UNUSED]
    thrashed = bb[B_THRASHED]
    written = bb[B_WRITTEN]
    in_pool = bb[B_IN_POOL]
    moved_to = bb[B_MOVED_TO]
    inf = kp[P_INF]
    track_moves = kp[P_TRACK_MOVES] != 0
    pool_n = reg[G_POOL_N]
    pool_on = reg[G_POOL_ON] != 0
    pool_stale = reg[G_POOL_STALE]
    pool_age = reg[G_POOL_AGE]
    pool_min = reg[G_POOL_MIN]
    s_old = reg[G_S_OLD]
    s_new = reg[G_S_NEW]
    v_lo = reg[G_V_LO]
    v_hi = reg[G_V_HI]
    lim = _remap_limit(track_moves, moves_now, q, rec_end)
    moved = 0
    if track_moves and q < rec_end:
        moved, pool_on, pool_stale, revised = learn_moves_pool(
            q, h_ptr, base, fbase, nh, nflat, f_blk, f_w, f_next, writes, remap, rend, rec_end, nu, dead, first_it,
            first_pos, it, moved_to, pool_on, pool_stale, inf)
        # stamp: learn_moves_pool
        if moved:
            lim = rec_end
        if revised:
            v_lo = 0
            v_hi = -1
    if soft and q >= iter_start and kp[P_LAYER_STRIDE]:
        a = h_ptr[q - base] - fbase
        b = nflat
        if q + 1 < base + nh:
            b = h_ptr[q + 1 - base] - fbase
        ok_o, d_o, ok_n, d_n = learn_shift(f_blk[a:b], f_w[a:b], blocks, writes, w_iter, it)
        # stamp: learn_shift
        if ok_o:
            s_old = d_o
        if ok_n:
            s_new = d_n
        if ok_o or ok_n:  # (shifted predictions lie within this iteration's record so far)
            pool_on = False
            pool_stale = max(pool_stale, base + nh + 1)
    wmask, marks, pool_n = launch_marks(blocks, writes, it, index, dead, pf_unused, dirty, written, w_iter, uses,
                                        last_use, thrashed, resident, in_flight, pool_on, in_pool, pool_buf, pool_n)
    # stamp: launch_marks
    wbuf[:wmask.shape[0]] = wmask
    again = marks[1]
    late = marks[2]
    stage = 1
    status = 0
    pf = empty
    evict = empty
    discard = empty
    wasted = 0
    mis = 0
    live = 0
    pooled = False
    refilled = False
    if not (again or late):
        stage = 0
        pool_age += 1
        on = pool_on and pool_age <= kp[P_POOL_LAUNCHES]
        pk = 0
        if q >= pool_stale:
            pk = kp[P_POOL_K]
        shift_from = inf
        if q >= iter_start and (s_old != 0 or s_new != 0):
            shift_from = iter_start
        (status, pf, evict, discard, horizon, q_end, wasted, mis, live, pool_new, pool_min, pooled, pool_n, v_lo,
         v_hi) = plan_paced(blocks, resident[:n_ids], in_flight[:n_ids], capacity, used, kp[P_MARGIN], now, dur,
                            kf[F_LEAD], regf[0], False, kp[P_STALL_AWARE] != 0, soft == 0, q, window,
                            reg[G_HORIZON], h_ptr[:nh], base, fbase, nh, nflat, f_blk, h_soft, kp[P_SCAN_MAX], remap,
                            rend, lim, nu, mark, dead, dirty, last_use, pf_unused, thrashed, kf[F_T_BLK], kf[F_LAT],
                            kp[P_FAULT_LATE_SOFT] != 0, inf, kp[P_K_DEAD], kp[P_K_DIRTY], kp[P_K_CLEAN], kp[P_AGE],
                            kp[P_DEAD_REUSE] != 0, shift_from, s_old, s_new, w_iter, it, pool_buf, pool_n, in_pool,
                            pool_on, on, pool_min, pk, v_lo, v_hi)
        # stamp: plan_paced (its return)
        reg[G_HORIZON] = horizon
        regf[0] = q_end
        if pool_new.shape[0]:
            refilled = True
            pool_n = pool_refill(pool_new, blocks, in_flight[:n_ids], pf, in_pool, pool_buf, pool_n)
            # stamp: pool_refill
            pool_on = True
            pool_age = 0
        a = pf.shape[0]
        b = a + evict.shape[0]
        out[:a] = pf
        out[a:b] = evict
        out[b:b + discard.shape[0]] = discard
        # stamp: decision copied out
    reg[G_POOL_N] = pool_n
    reg[G_POOL_ON] = pool_on
    reg[G_POOL_STALE] = pool_stale
    reg[G_POOL_AGE] = pool_age
    reg[G_POOL_MIN] = pool_min
    reg[G_S_OLD] = s_old
    reg[G_S_NEW] = s_new
    reg[G_V_LO] = v_lo
    reg[G_V_HI] = v_hi
    return (stage, moved, again, late, status, pf.shape[0], evict.shape[0], discard.shape[0], wasted, mis, live,
            pooled, refilled, s_old != 0 or s_new != 0)


@nb.njit(cache=True, nogil=True)
def pool_refill(pool_new, cur, in_flight, pf, in_pool, buf, n):
    """The victim pool after a full scan (``plan_paced``'s ``pool_new``): the old ``buf[:n]`` unmarked, then the
    scan's blocks, the running launch's (``cur``, which the scan skipped), those in flight (whose keys it did not
    read) and the prefetched ``pf``. Returns the new length."""
    for i in range(n):
        in_pool[buf[i]] = False
    n = pool_add(pool_new, in_pool, buf, 0)
    n = pool_add(cur, in_pool, buf, n)
    for x in range(in_flight.shape[0]):
        if in_flight[x]:
            n = _pool_put(x, in_pool, buf, n)
    return pool_add(pf, in_pool, buf, n)


# How ``match`` placed the pointer (``UvmPrefetchPolicy._match``'s branches; the policy counts them)
M_MATCHED, M_STABLE, M_SOFT, M_NONE, M_RESYNC = range(5)
# ``step``'s results in its ``res`` argument: what the caller does next (``C_*``), the launch's signature and
# stable key, then what ``after_match`` found: blocks back after thrash, late blocks, whether it planned, and the
# lengths of its decision in ``out`` (prefetch, evict, discard)
R_CODE, R_SIG, R_STAB, R_AGAIN, R_LATE, R_STATUS, R_NPF, R_NEV, R_NDC = range(9)
N_R = 9
# ``step`` did nothing (no launch pending, no room in the history, or the history full: the general path commits
# and trims); matched, the rest is ``UvmPrefetchPolicy._rest``; decided (the decision in ``out``); stopped for
# the window monitor (blocks back after thrash, or late: the caller plans)
C_NOT_TAKEN, C_REST, C_DECIDED, C_MONITOR = -2, -1, 0, 1
# the count of each ``M_*``
MATCH_STAT = (S_MATCHED, S_STABLE_RESYNC, S_SOFT, S_UNPREDICTED, S_RESYNC)


@nb.njit(cache=True, nogil=True)
def record_end(q, starts, iter_start):
    """``UvmPrefetchPolicy._record_end``: one past the last position of the recorded iteration holding ``q``
    (``starts``: the later iterations' first positions, ascending; ``iter_start`` past them)."""
    for i in range(starts.shape[0]):
        if starts[i] > q:
            return starts[i]
    return iter_start


@nb.njit(cache=True, nogil=True)
def _go(q, moves_now, starts, iter_start, h_ptr, base, fbase, nh, nflat, f_blk, f_next, it, bi, bb, kp,
        reg):
    """``UvmPrefetchPolicy._advance`` to ``q``: the remap limit (``_remap_limit``; a translation empties the
    verified span), then ``advance``."""
    lim = 0
    if q < iter_start:
        lim = _remap_limit(kp[P_TRACK_MOVES] != 0, moves_now, q, record_end(q, starts, iter_start))
    if lim > 0:
        reg[G_V_LO] = 0
        reg[G_V_HI] = -1
    reg[G_POOL_N] = advance(q, h_ptr, base, fbase, nh, nflat, f_blk, f_next, bi[I_REMAP], bi[I_REND], lim, bi[I_NU],
                            bi[I_FIRST_IT], bi[I_FIRST_POS], it, bb[B_DEAD], reg[G_POOL_ON] != 0, bb[B_IN_POOL],
                            bi[I_POOL_IDS], reg[G_POOL_N])


@nb.njit(cache=True, nogil=True)
def _jump(q, h_ptr, base, fbase, nh, nflat, f_blk, bi, kp, reg):
    """A jump of the pointer to ``q``: the horizon after it, then ``UvmPrefetchPolicy._rebuild_nu``."""
    reg[G_HORIZON] = q + 1
    reg[G_POOL_ON] = 0
    reg[G_V_LO] = 0
    reg[G_V_HI] = -1
    reg[G_POOL_STALE] = base + nh + 1 if (reg[G_S_OLD] != 0 or reg[G_S_NEW] != 0) else 0
    a = nflat
    if q + 1 < base + nh:
        a = h_ptr[q + 1 - base] - fbase
    rebuild_nu(bi[I_NU], f_blk, a, nflat, h_ptr[:nh], base, fbase, q + 1, kp[P_SCAN_MAX], kp[P_INF])


@nb.njit(cache=True, nogil=True)
def match(p, has_p, key, name, sig, stab, ngram, moves_now, iter_start, prev_start, starts, h_key, h_name, h_sig,
          h_soft, h_ptr, base, fbase, nh, nflat, f_blk, f_next, it, tabs, recent, bi, bb, kp, reg):
    """``UvmPrefetchPolicy._match`` compiled (its docstring says why each branch is there), with the pointer at
    ``p`` (``has_p``: else none) and the history committed through ``base + nh - 1``; the same table uses in the
    same order. Returns ``(how, p, soft)``: ``how`` one of ``M_*``, the new pointer (-1 with ``M_NONE``: none), how
    the launch matched."""
    end = base + nh
    nxt = p + 1 if has_p else np.int64(-1)
    if 0 <= nxt < end and h_sig[nxt - base] == sig:
        _go(nxt, moves_now, starts, iter_start, h_ptr, base, fbase, nh, nflat, f_blk, f_next, it, bi, bb,
            kp, reg)
        return M_MATCHED, nxt, 0
    q = tab_get(tabs, T_SIG, sig, reg)
    if (q >= iter_start and nxt >= 0 and starts.shape[0] > 0 and starts[0] <= nxt < iter_start
            and h_name[nxt - base] == name):
        q = -1  # (a repeat inside the step: see ``_match``)
    if not base <= q < end and stab != 0:
        q2 = tab_get(tabs, T_STAB, stab, reg)
        if q2 >= 0 and prev_start <= q2 < end and h_key[q2 - base] == key and q2 != nxt:
            _jump(q2, h_ptr, base, fbase, nh, nflat, f_blk, bi, kp, reg)
            return M_STABLE, q2, 1
    if not base <= q < end:
        if 0 <= nxt < end and h_name[nxt - base] == name:
            _go(nxt, moves_now, starts, iter_start, h_ptr, base, fbase, nh, nflat, f_blk, f_next, it, bi,
                bb, kp, reg)
            return M_SOFT, nxt, 2 if h_soft[nxt - base] else 1
        n = kp[P_NGRAM]
        q = -1
        if reg[G_RECENT] >= n:
            if ngram != 0:
                q = tab_get(tabs, T_EXEC, ngram, reg)
            if not base <= q < end:
                q = tab_get(tabs, T_NAME, name_key(recent, reg, name, n), reg)
        if not base <= q < end:
            return M_NONE, np.int64(-1), 0
    if q == nxt:
        _go(q, moves_now, starts, iter_start, h_ptr, base, fbase, nh, nflat, f_blk, f_next, it, bi, bb, kp,
            reg)
        return M_MATCHED, q, 0
    _jump(q, h_ptr, base, fbase, nh, nflat, f_blk, bi, kp, reg)
    return M_RESYNC, q, 0


@nb.njit(cache=True, nogil=True)
def launch_sig(name, blocks):
    """The exact signature of a launch with known accesses: a hash of its kernel name and its blocks (sorted),
    never 0 (the tables' "none")."""
    h = _mix(_SEED, name)
    for i in range(blocks.shape[0]):
        h = _mix(h, blocks[i])
    return _mix(h, blocks.shape[0])


@nb.njit(cache=True, nogil=True)
def count_plan(cnt, reg, pooled, refilled, status, mis, wasted, n_pf, n_ev, n_dc, live):
    """The counts of a plan made in one kernel (``plan_paced``: ``status`` 0, nothing was scanned, counts only how
    its victims were found): its victims, its mispredicted and thrashed blocks, what it evicts, discards and
    prefetches (``live``: the prefetched blocks that cross the link, this iteration's ``reg[G_LINK]``)."""
    if pooled:
        cnt[S_POOLED] += 1
    if refilled:
        cnt[S_REFILLS] += 1
    if not status:
        return
    cnt[S_MISPREDICTED] += mis
    cnt[S_THRASH] += wasted
    cnt[S_EVICTED] += n_ev
    cnt[S_DISCARDED] += n_dc
    if n_pf:
        cnt[S_PREFETCHED] += n_pf
        reg[G_LINK] += live


# The policy's arrays that ``step`` reads, behind one argument: a test call with 29 array arguments cost 2.4 us
# warm and ~6 us with the caches disturbed (as between two launches), against ~1 and ~3 us with one structref; the
# step gained ~1.5 us a launch (bench/results/policy-cost-20261124d).
STEP_ARRAYS = ("h_cum", "h_key", "h_name", "h_sig", "h_soft", "h_ptr", "f_blk", "f_w", "f_next", "tabs", "recent",
               "starts", "bi", "bb", "uses", "mark", "kp", "kf", "reg", "regf", "wbuf", "pbuf", "out", "res", "cnt")


def entry_point(kernel, args: tuple):
    """The compiled entry point of ``kernel`` (a Numba dispatcher already called with ``args``) for the types of
    ``args``, or None where this Numba keeps it elsewhere. Calling it skips the dispatcher's type resolution and
    checks no argument type: the caller passes only arguments of the same types
    (``UvmPrefetchPolicy._step_entry``)."""
    try:
        return kernel.overloads[tuple(kernel.typeof_pyval(a) for a in args)].entry_point
    except (AttributeError, KeyError, TypeError):
        return None


@structref.register
class StepArraysType(_nbtypes.StructRef):
    def preprocess_fields(self, fields):
        return tuple((n, _nbtypes.unliteral(t)) for n, t in fields)


class StepArrays(structref.StructRefProxy):
    """``step``'s arrays (``STEP_ARRAYS``), held by reference: the policy builds it anew whenever one of them is
    replaced (``UvmPrefetchPolicy._step_arrays``)."""


structref.define_proxy(StepArrays, StepArraysType, list(STEP_ARRAYS))


@nb.njit(cache=True, nogil=True)
def step_arrays(h_cum, h_key, h_name, h_sig, h_soft, h_ptr, f_blk, f_w, f_next, tabs, recent, starts, bi, bb, uses,
                mark, kp, kf, reg, regf, wbuf, pbuf, out, res, cnt):
    """A ``StepArrays`` of these arrays (compiled and cached: the proxy's own constructor compiles in each process)."""
    return StepArrays(h_cum, h_key, h_name, h_sig, h_soft, h_ptr, f_blk, f_w, f_next, tabs, recent, starts, bi, bb,
                      uses, mark, kp, kf, reg, regf, wbuf, pbuf, out, res, cnt)


@nb.njit(cache=True, nogil=True)
def step(key, name, blocks, writes, index, dur, resident, in_flight, n_ids, capacity, used, now, window, arrays):
    """``on_launch`` in one call for a launch with known accesses (exec id ``key``, kernel ``name``): the same
    kernels in the same order as the Python hooks, with the same arguments, the policy's state read from and
    written back to its arrays (``arrays``, a ``StepArrays``: ``reg`` / ``regf``: ``G_*`` / ``GF_*``; ``cnt``: the
    counts, ``S_*``). ``starts``: ``UvmPrefetchPolicy._istarts``; the history buffers are whole (their lengths are
    ``reg[G_HN]`` / ``reg[G_FN]``).

    Without a launch pending, without room in the buffers for it, or with the history full, it returns at once
    (``res[R_CODE]`` ``C_NOT_TAKEN``: the caller takes the general path). Otherwise:

    1. the lengths with the pending launch counted (``_commit_lengths``); ``commit_step``: the pending launch
       committed, this launch's n-gram and (``kp[P_STABLE_SYNC]``) stable keys;
    2. ``match`` (the advance, or the jump's rebuilt next uses), counted; without a pointer after it, or without
       ``kp[P_FUSE]`` (``soft_moves``: its classification runs in between), stop: ``C_REST``;
    3. ``after_match``; this launch becomes the pending one (``pbuf``, ``wbuf``); then, if it planned
       (``C_DECIDED``), its counts (``count_plan``, as ``UvmPrefetchPolicy._decide``), else ``C_MONITOR``.

    ``res`` (``R_*``) says which, with the signature and stable key, and what ``after_match`` found."""
    h_cum = arrays.h_cum
    h_key = arrays.h_key
    h_name = arrays.h_name
    h_sig = arrays.h_sig
    h_soft = arrays.h_soft
    h_ptr = arrays.h_ptr
    f_blk = arrays.f_blk
    f_w = arrays.f_w
    f_next = arrays.f_next
    tabs = arrays.tabs
    recent = arrays.recent
    starts = arrays.starts
    bi = arrays.bi
    bb = arrays.bb
    uses = arrays.uses
    mark = arrays.mark
    kp = arrays.kp
    kf = arrays.kf
    reg = arrays.reg
    regf = arrays.regf
    wbuf = arrays.wbuf
    pbuf = arrays.pbuf
    out = arrays.out
    res = arrays.res
    cnt = arrays.cnt
    res[:] = 0
    res[R_CODE] = C_NOT_TAKEN
    nh = reg[G_HN]
    nflat = reg[G_FN]
    pk = reg[G_PK]
    h_room = min(h_cum.shape[0], h_key.shape[0], h_name.shape[0], h_sig.shape[0], h_soft.shape[0], h_ptr.shape[0])
    f_room = min(f_blk.shape[0], f_w.shape[0], f_next.shape[0])
    if reg[G_PEND] == 0 or nh >= kp[P_HISTORY] or nh + 1 > h_room or nflat + pk > f_room:
        return
    cnt[S_LAUNCHES] += 1
    # stamp-start
    sig = launch_sig(name, blocks)
    moves_now = cnt[S_MOVED] != reg[G_MOVED_AT_START]
    cum = regf[GF_CUM]
    regf[GF_CUM] = cum + regf[GF_PDUR]
    nh += 1
    nflat += pk
    reg[G_HN] = nh
    reg[G_FN] = nflat
    pp = reg[G_P]
    has_p = reg[G_HAS_P] != 0
    it = reg[G_ITERS]
    base = reg[G_BASE]
    fbase = reg[G_FBASE]
    iter_start = reg[G_ITER_START]
    p_has_w = reg[G_PHAS_W] != 0
    pwmask = wbuf[:pk] if p_has_w else wbuf[:0]
    stab, ngram = commit_step(h_cum, h_key, h_name, h_sig, h_soft, h_ptr, f_blk, f_w, f_next, nh - 1, nflat - pk, cum,
                              reg[G_PKEY], reg[G_PNAME], reg[G_PSIG], reg[G_SOFT], pbuf[:pk],
                              pwmask, p_has_w, pp, base, fbase, True, True, key, blocks,
                              writes, kp[P_STABLE_SYNC] != 0, it, bi, kp, tabs, recent, reg, reg[G_PSTAB],
                              reg[G_PNGRAM])
    # stamp: commit_step
    how, q, soft = match(pp, has_p, key, name, sig, stab, ngram, moves_now, iter_start, reg[G_PREV_START], starts,
                         h_key, h_name, h_sig, h_soft, h_ptr, base, fbase, nh, nflat, f_blk, f_next, it, tabs, recent,
                         bi, bb, kp, reg)
    # stamp: match
    reg[G_NGRAM] = ngram
    reg[G_P] = q
    reg[G_HAS_P] = how != M_NONE
    reg[G_SOFT] = soft
    cnt[MATCH_STAT[how]] += 1
    res[R_SIG] = sig
    res[R_STAB] = stab
    res[R_CODE] = C_REST
    if how == M_NONE or kp[P_FUSE] == 0:
        return
    rec_end = 0
    if q < iter_start:
        rec_end = record_end(q, starts, iter_start)
    (stage, moved, again, late, status, n_pf, n_ev, n_dc, wasted, mis, live, pooled, refilled, shifted) = after_match(
        q, soft, blocks, writes, index, it, rec_end, moves_now, iter_start, h_ptr, h_soft, f_blk, f_w, f_next, base,
        fbase, nh, nflat, resident, in_flight, n_ids, capacity, used, now, dur, window, bi, bb, uses, mark, kp, kf, reg,
        regf, wbuf, out)
    # stamp: after_match (its return)
    cnt[S_ONE_KERNEL] += 1
    if how != M_MATCHED or not has_p or q != pp + 1:
        cnt[S_INEXACT] += 1
    if shifted:
        reg[G_SHIFT_IT] = 1
    cnt[S_MOVED] += moved
    # this launch pending its commit (its write flags are in ``wbuf``)
    k = blocks.shape[0]
    pbuf[:k] = blocks
    reg[G_PEND] = 1
    reg[G_PK] = k
    reg[G_PHAS_W] = 1
    reg[G_PKEY] = key
    reg[G_PNAME] = name
    reg[G_PSIG] = sig
    reg[G_PSTAB] = stab
    reg[G_PNGRAM] = ngram
    regf[GF_PDUR] = dur
    regf[GF_COMPUTE] += dur
    reg[G_WAITS] = late > 0
    res[R_AGAIN] = again
    res[R_LATE] = late
    if stage:
        res[R_CODE] = C_MONITOR
        return
    res[R_CODE] = C_DECIDED
    count_plan(cnt, reg, pooled, refilled, status, mis, wasted, n_pf, n_ev, n_dc, live)
    # stamp: counted
    res[R_STATUS] = status
    if not status:
        return
    res[R_NPF] = n_pf
    res[R_NEV] = n_ev
    res[R_NDC] = n_dc
