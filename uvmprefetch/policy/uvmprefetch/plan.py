"""Move planning: what to prefetch, evict and discard now, from the predicted next uses.

Each decision lists *candidates* in order of need: the running launch's missing blocks, then the blocks of the
next ``window`` predicted launches that are not on the GPU (the *window pass*, in growing chunks of 16, 32, ...
positions, only as far as one decision can place: free room plus what the link can take before the next decision
point). Recorded blocks are translated through the learned moves and the layer stride, and each block's predicted
next use is brought to the earliest candidate position ahead of the pointer. Candidates take free room first;
beyond it each takes a victim only if the victim's predicted next use is later than its own need (never evict a
block needed sooner than the one it brings in). Evictions for launches after the next one are *paced* to the
link: only until the H2D queue reaches the next decision point, rounded up to a whole block after an exact match
(the link never idles for part of a block: ResNet-152 at 2x, steady state 1.05x -> 1.01x the oracle), down after a
soft one (an eviction for an uncertain prediction costs more than the idle). With the queue busy, the running
launch's own misses fault instead (faults go ahead of queued prefetches; their room stays reserved), and so do the
next launch's blocks of older data at a soft slot that would arrive after it starts (``fault_late_soft``); its dead
misses (memory handed out again: a first write) are populated instead (``populate``: mapped without data beside the
queue, where a fault would cost a fault batch each).

The *verified span* ``[v_lo, v_hi]`` lists positions whose recorded blocks all have ``p < nu <= t`` (``t``: the
position); past the list's cut the window pass skips their updates. A pass without translation or layer shift
leaves every position it scanned so, and so the span grows along the passes; nothing else that runs between two
passes breaks it (``advance`` without translation sets a block's next use to its next recorded entry, a commit sets
only next uses that are not ahead of the pointer, and a window update only brings a next use ahead of the pointer
nearer). Whatever else rewrites next uses empties it: a learned move or its revision, an advance through the
translation, a jump, the moves settled at an iteration's end, a trim of the history.

Where nothing is to be placed, a free ``margin`` of the capacity is kept by pre-evicting dead or unpredicted blocks.

*Moved births* (``moved_births``). Where the window pass translates the followed record (moves were learned this
iteration: the caching allocator places this step's tensors elsewhere than the record), the record's first write of
a new tensor into a block (``f_w`` 2) is not a candidate: that tensor is placed elsewhere too, and the recorded
block either holds other live data, which a prefetch would move in for nothing, or is dead, which a prefetch maps
for nothing and takes room for. The entry still updates the block's next use (the allocator may hand that address
out again), a later entry of the block may list it, and the running launch's own first writes are populated or
fault where they land. T5 base at 3x (the H100's costs): iterations 1-3 prefetched 5.8 GiB of such blocks with data
and 22 GiB without; the whole run went from 1.189x to 1.168x the oracle.

*Batches on the copy path* (``batch_share``, off by default). Where evictions leave by the copy path, each
contiguous run a decision brings back costs a fixed ``repopulate_call_s + copy_call_s`` on the H2D engine beside its
blocks' link time (each run sent out ``copy_call_s + discard_call_s`` on D2H). Paced to the next decision point, a
model of short launches (T5 small: 4-250 us each against 42 us per 2 MiB block on the H100's costs) places one to
six blocks a decision, a run each: at 2x its last iteration made 429 copy-in runs where the oracle made 150, and the
extra calls' fixed costs (~8.4 ms H2D, ~5.9 ms D2H) were its whole 14.5 ms gap to the oracle (with the three call
costs set to 0 it ran 1.000 / 1.013 / 1.003x the oracle at 1.5 / 2 / 3x). With ``batch_share`` a decision at an
exact match that evicts for later launches at all places at least the batch whose call cost is at most that share of
its link time (0.1: 8 blocks on the H100's costs). On T5 small recorded with 8 iterations it took the steady state
at 2 / 3x from 1.084 / 1.060x to 1.025 / 1.033x, but at 1.5x the iterations swung between 1.02 and 1.21x (0.3 GB
more an iteration of live victims evicted with their use still ahead; without, 1.057x throughout); keeping the
batch's extra victims to blocks without a predicted use gave nothing (1.055 / 1.083 / 1.060x). The standard set
(5 iterations) moved by -2.0 % .. +0.5 % a trace. Where the caller has no copy path it does nothing.

*Whole launches* (``whole_launches``). Where evictions leave by the copy path, a decision at an exact match on a plain
pass (no learned moves, no layer stride) whose pacing budget reaches into a launch places that launch's candidates
whole, as the oracle places launches, where that launch matched exactly when it was recorded and the blocks this adds
bring data; the window pass then lists whole positions up to that one, and the first candidate left out. A launch
waits for its last block, so part of its blocks early buys nothing, and each decision's blocks are a copy-in call of
their own: at 2x the oracle's calls on T5 small carry 16 or more blocks, the policy's one or two. Blocks without data
(first writes into dead memory) take no link time, so the budget reaches far past them: extended for those alone, a
decision placed a launch 70-160 launches ahead, taking room that the tensors dying before it would have freed (T5 base
at 3x, iteration 3: 109 such extensions, every added block dead, whole run +1.1 %; ViT large at 3x steady state
+1.0 %), so such an extension is not made. On T5 small the steady state at 2 / 3x goes from 1.084 / 1.060x the oracle
to 1.030-1.049 / 1.030x (5 and 8 iterations; 1.5x unchanged), ResNet-152's at 2 / 3x by -2 %, no standard trace worse. On soft or translated
passes, or reaching into a launch recorded softly, it placed the record's blocks of tensors placed elsewhere since
(GPT-2 large at 1.5x, iteration 2: 1.82 s against 1.52 s).

*The write-back clock* (``writeback_clock``). A prefetch into room that an eviction frees cannot start before that
victim's data has left, so a burst of evictions of dirty blocks holds the H2D queue up behind the D2H side, which the
queue estimate does not see. The plan keeps a predicted end of its victims' write-backs (each dirty live victim adds
one block's link time) and, at a soft match, its pacing budget counts from the later of that and the queue's end.
With ``first_writes_free`` the queue estimate is exact and the budget grew where predictions are poor: ResNet-152 at
1.5x, iteration 0, the evictions for it pushed the D2H queue 12 ms ahead and a launch waited 9.6 ms behind the held
queue; ViT large at 2x, iteration 1, 2.7 GiB of prefetched blocks were evicted unused with their use still ahead
(0.2 without). At exact matches (steady state) the clock measured worse (GPT-2 large 2x steady state +1.8 %) and is
not used. Only where the caller discards and frees are deaths (without discards it measured +25 % / -13 % steady
state on single traces).

*Driver victims* (``driver_victims``, ``driver_victims_run``). Where the caller evicts through UVM without discards, every
dirty victim is written back at the D2H rate (281 us per 2 MiB block on the H100's costs, against 42 us H2D) and
holds the mover thread until the D2H queue has drained; the decisions made meanwhile wait in the planner's queue.
With the option, a decision at an exact match lists no victims of its own (as ``pre_evict=false``: the running and
the next launch's blocks go beyond the free room, the driver evicts its least recently migrated blocks for them).
T5 base at 2x (``--no-discard --evict uvm``), last iteration: 11,601 fault batches and 5.02 s with the plan's victims,
923 and 3.79 s with the driver's (the oracle 3,796 and 3.99 s); with evictions that do not hold the mover
(``--host live:blocking_evict=false``) the plan's victims ran level with the oracle (5.70 against 5.72 steady).
At every exact match the standard set's steady state went from 1.132x the oracle to 0.993x on the geomean, but
GPT-2 large's whole run at 1.5x +4.9 %: in iteration 2 exact and soft matches alternate (runs of exact matches of a
median 1-4 launches) and 2.9 GB of the driver's victims came back within the iteration (none of the plan's choice by
predicted use would have). So the driver chooses only once ``driver_victims_run`` (64) launches in a row matched the
record's next launch exactly (``exact_run``): while the pointer re-learns no run gets that long on GPT-2 large, in
the steady state one run spans the iteration. Steady state 0.995x, whole run 1.161x -> 1.101x, no standard trace
worse than +0.52 %. Not where the planning thread issues the calls (``PolicyContext.sync_moves``): no queue builds
up there, and the driver's victims measured only worse (``live-sync``: steady state 1.015x -> 1.177x the oracle).
"""

from __future__ import annotations

import numba as nb
import numpy as np

from .blocks import mark_prefetched, moves_data, split_victims, take_victims
from .history import INF, flat_span
from .parts import Part
from .victims import choose, keys_of, pool_add, pool_refill, rank

PLAN = np.dtype([
    ("horizon", np.int64),  # positions before it were planned (re-checked only for the next launch)
    ("q_end", np.float64),  # predicted end of the H2D queue
    ("v_lo", np.int64), ("v_hi", np.int64),  # the verified span (empty: v_lo > v_hi)
    ("waits", np.bool_),  # the running launch waits for blocks still in flight
    # settings
    ("margin", np.int64), ("t_blk", np.float64), ("lat", np.float64), ("lead_s", np.float64),
    ("prefetch", np.bool_), ("pre_evict", np.bool_), ("pace", np.bool_), ("stall_aware", np.bool_),
    ("fault_late_soft", np.bool_), ("populate", np.bool_), ("moved_births", np.bool_),
    ("first_writes_free", np.bool_), ("writeback_clock", np.bool_),
    ("d_end", np.float64),  # predicted end of the victims' write-backs (``writeback_clock``)
    ("batch", np.int64),  # fewest blocks past the next launch issued together at an exact match (0, 1: any)
    ("whole", np.bool_),  # at an exact match the launch the pacing budget reaches into is placed whole
    ("driver_victims", np.bool_),  # at an exact match the driver chooses the victims (``driver_victims``)
    ("dv_run", np.int64),  # ... once this many launches in a row matched exactly (``driver_victims_run``)
    ("exact_run", np.int64),  # launches in a row, up to the running one, that matched the record's next exactly
], align=True)

FIELDS = ("s", "mark", "out")


def copy_call_s(ctx) -> float:
    """The fixed H2D cost of one copy-in call (``repopulate_call_s + copy_call_s``) where the caller has the copy
    path, else 0."""
    if not getattr(ctx, "copy_path", False):
        return 0.0
    return float(getattr(ctx.gpu, "repopulate_call_s", 0.0)) + float(getattr(ctx.gpu, "copy_call_s", 0.0))


def batch_for(ctx, t_blk: float, share: float) -> int:
    """The fewest blocks a decision at an exact match places once it evicts for later launches (``batch_share``: see
    the module docstring): where the caller has the copy path, enough that one copy-in call's fixed cost is at most
    ``share`` of the batch's link time; 0 (no batch) elsewhere."""
    call_s = copy_call_s(ctx)
    if not (share > 0 and call_s > 0 and t_blk > 0):
        return 0
    return int(np.ceil(call_s / (share * t_blk)))


class Plan(Part, fields=FIELDS):
    """The planning part: see the module docstring. ``out`` receives each decision's blocks: those to prefetch,
    evict, discard and populate, in that order."""

    def __init__(self, n_blocks: int, settings: dict) -> None:
        self.record_of(PLAN, v_hi=-1, **settings)
        self.mark = np.zeros(n_blocks, dtype=np.uint8)  # zeroed scratch (left zeroed)
        self.out = np.zeros(n_blocks, dtype=np.int64)
        self.build()



# ------------------------------------------------------------------------------------------- compiled
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
def first_not_above(vkey, pos, start, nu, vict):
    """The first ``i`` with ``vkey[i] <= pos[start + i]`` (``len(vkey)`` if none): victims are taken while their key
    (next use: ``nu`` itself where the rank compared it at ``victim_grain``) is later than the need of the block
    they make room for."""
    for i in range(vkey.shape[0]):
        if not (vkey[i] if vkey[i] >= INF else nu[vict[i]]) > pos[start + i]:
            return i
    return vkey.shape[0]


@nb.njit(cache=True, nogil=True, inline="always")
def _cand_entries(f_blk, f_w, a, b, t, p, tr, nu, lst, m, lim):
    """The window pass over the entries ``[a, b)`` of position ``t`` (``f_w``: the history's write flags): each
    recorded block translated (``tr``: ``(remap, rend, remap_lim, shift_from, s_old, s_new, w_iter, it, dead,
    moved_births)``), its next use brought to ``t`` when that is nearer and ahead of the pointer ``p``, and listed
    (``lst``: ``(out_b, out_p, mark, resident, in_flight)``) while fewer than ``lim`` are, if not present and not
    listed yet. Returns the new count of listed candidates and how many entries were missing as recorded; ``lim <
    0``: the updates alone (nothing listed or counted)."""
    remap, rend, remap_lim, shift_from, s_old, s_new, w_iter, it, dead, moved_births, dead_births = tr
    out_b, out_p, mark, resident, in_flight = lst
    listing = lim >= 0
    got = 0
    nb_ = nu.shape[0]
    shifted = (s_old != 0 or s_new != 0) and t >= shift_from
    translated = remap_lim > 0 and t < remap_lim
    for i in range(a, b):
        x0 = f_blk[i]
        if listing and not (resident[x0] or in_flight[x0]):
            got += 1
        x = remap[x0] if translated else x0
        if dead_births and x != x0 and f_w[i] == 0 and dead[x]:
            continue  # (a dead block is not read before a birth: the record's tensor lives elsewhere now)
        # (a moved block from its next birth on, while not dead, is a candidate as recorded too: the next tensor
        # at its address may have moved as the first did, or stayed there when the address holds live data; a dead
        # one keeps only its next use, which ranks it as a victim: listing it too costs T5 base's steady state 1.5 %)
        two = translated and x != x0 and t >= rend[x0] and not dead[x0]
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
            if moved_births and translated and f_w[i] == 2:
                continue  # (see Plan's docstring: "moved births")
            mark[x] = 1
            out_b[m] = x
            out_p[m] = t
            m += 1
    return m, got


@nb.njit(cache=True, nogil=True)
def window_candidates(h, miss, span, p, cap, tr, present, verified, extra, whole):
    """The candidates in order of need, with their positions: ``miss`` (position -1), the next launch's entries
    ``[pa, pb)`` (position ``p + 1``; listed when the horizon is past it), then the window pass over positions
    ``lo..hi`` (``span``: ``(pa, pb, lo, hi)``) in chunks of 16, 32, ... while fewer than ``cap`` scanned blocks
    are missing, at most ``scan_max`` entries. ``present``: ``(resident, in_flight, mark)``. Returns ``(blk, pos,
    scan_hi, spanned)``: ``scan_hi`` the last position scanned (``p`` if none), ``spanned`` the entries the chunks
    covered.

    One pass suffices because positions ascend along the candidates: the first occurrence of a block that updates
    its next use has its earliest position, and no later one can update it again. ``extra >= 0``: the caller reads
    no more than ``extra`` candidates beyond those up to position ``p + 1`` (its free room, its pacing budget, and
    the first left out); the list stops there, a prefix of the whole one, while the scan goes on as before (its
    chunks, its count, the updates). ``verified``: ``(v_lo, v_hi)``, positions past that cut whose updates can be
    skipped (see the module docstring). ``whole``: the list ends at a position's end, then the first left out."""
    s = h.s[0]
    pa, pb, lo, hi = span
    v_lo, v_hi = verified
    resident, in_flight, mark = present
    base = s.base
    fbase = s.fbase
    nflat = s.fn
    end = base + s.n
    h_ptr = h.h_ptr
    f_blk = h.f_blk
    f_w = h.f_w
    nu = h.nu
    n = 0
    if lo <= hi:
        hend = (h_ptr[hi + 1 - base] - fbase) if hi + 1 < end else nflat
        n = hend - (h_ptr[lo - base] - fbase)
    n += miss.shape[0] + max(0, pb - pa)
    if tr[2] > 0:
        n *= 2  # (a moved block may be a candidate twice)
    out_b = np.empty(n, dtype=np.int64)
    out_p = np.empty(n, dtype=np.int64)
    lst = (out_b, out_p, mark, resident, in_flight)
    m = 0
    for i in range(miss.shape[0]):  # (position -1: never translated, shifted, or a next use)
        x = miss[i]
        if not (resident[x] or in_flight[x] or mark[x] != 0):
            mark[x] = 1
            out_b[m] = x
            out_p[m] = -1
            m += 1
    lim = out_b.shape[0]  # (no limit up to position p + 1)
    m, _ = _cand_entries(f_blk, f_w, pa, pb, p + 1, p, tr, nu, lst, m, lim)
    scan_hi = p
    got = 0
    spanned = 0
    start = lo
    chunk = 16
    topped = False
    grew = False
    while start <= hi and got < cap and spanned < s.scan_max:
        stop = min(hi, start + chunk - 1)
        for t in range(start, stop + 1):
            if t == max(lo, p + 2) and extra >= 0:
                lim = m + extra
            lim_t = lim
            if whole and not topped and lim < out_b.shape[0]:
                # (``whole``: a position the list reaches into is listed whole, then the first candidate left out)
                if m < lim - 1:
                    lim_t = out_b.shape[0]
                    grew = True
                else:
                    if grew and m >= lim:
                        lim = m + 1
                        lim_t = lim
                    topped = True
            a = h_ptr[t - base] - fbase
            b = (h_ptr[t + 1 - base] - fbase) if t + 1 < end else nflat
            # (with the list cut and the count past ``cap``, the rest of the chunk only updates next uses; not even
            # that in the verified span)
            if m < lim or got < cap:
                m, g = _cand_entries(f_blk, f_w, a, b, t, p, tr, nu, lst, m, lim_t)
                got += g
            elif not v_lo <= t <= v_hi:
                m, _ = _cand_entries(f_blk, f_w, a, b, t, p, tr, nu, lst, m, -1)
            if b > a:
                spanned += b - a
        scan_hi = stop
        start = stop + 1
        chunk *= 2
    for i in range(m):
        mark[out_b[i]] = 0
    return out_b[:m], out_p[:m], scan_hi, spanned


@nb.njit(cache=True, nogil=True)
def margin(bs, vs, nu, cur, view, p):
    """Keep the free margin: dead or unpredicted victims for the room it lacks (``view``: ``(resident, capacity,
    used, margin)``), written to the caller's ``out`` by ``plan``. Returns the victims (evicted, then discarded)."""
    resident, capacity, used, want = view
    empty = np.empty(0, dtype=np.int64)
    short = want - (capacity - used)
    if short <= 0:
        return empty, empty
    vict, vkey, _ = rank(resident, cur, keys_of(vs, bs, nu), p, short, vs.mark)
    c = 0
    for i in range(vkey.shape[0]):  # (only dead or unpredicted blocks go for the margin: a prefix)
        if vkey[i] > INF:
            c += 1
    return split_victims(bs, vict[:c])


@nb.njit(cache=True, nogil=True)
def _moves(h, bs, ps, x):
    """Whether bringing candidate ``x`` moves data: ``moves_data``, but with ``first_writes_free`` not for the running
    launch's own first writes into dead memory (its misses; no other candidate is one of its blocks), which its
    marks already took for live data: counted, the predicted end of the H2D queue ran ahead of the link's (T5 base
    at 3x: ~5 300 blocks an iteration in iterations 1-3, 0.2 s of link time), and the pacing budget left the link
    idle while taking it for busy (``bench/link_idle.py``)."""
    if not moves_data(bs, x):
        return False
    s = h.s[0]
    if not (ps.first_writes_free and s.phas_w):
        return True
    cur = h.pbuf[:s.pk]
    k = np.searchsorted(cur, x)
    return not (k < cur.shape[0] and cur[k] == x and h.wbuf[k] == 2)


@nb.njit(cache=True, nogil=True)
def _late_left_out(h, bs, pl, cand, timing):
    """The prefetches and populates of a decision made while the H2D queue is busy (``cand``: ``(blk, pos, placed,
    q)``; ``timing``: ``(now, dur)``): the running launch's own misses fault instead (a fault goes ahead of queued
    prefetches) but for those it writes first into dead memory, populated with ``populate`` (no data to wait for),
    and, with ``fault_late_soft``, a soft next launch's blocks of older data that would arrive after it starts fault
    too (its guesses; what this iteration wrote is where the record said). Returns ``(prefetch, populate)``."""
    s = h.s[0]
    ps = pl.s[0]
    blk, pos, placed, q = cand
    now, dur = timing
    p = s.p
    soft_next = ps.fault_late_soft and s.has_p and p + 1 < s.base + s.n and h.h_soft[p + 1 - s.base] > 0
    keep = np.zeros(placed, dtype=np.int8)  # 1: prefetched, 2: populated
    cur = h.pbuf[:s.pk]  # (the running launch's blocks, sorted; their write flags in ``wbuf`` when ``phas_w``)
    first = ps.populate and s.phas_w
    c = 0
    m = 0
    for i in range(placed):
        if _moves(h, bs, ps, blk[i]):
            c += 1  # (arrival = q + t_blk * the blocks that move data queued up to here)
        if pos[i] < 0:
            if first and h.wbuf[np.searchsorted(cur, blk[i])] == 2:  # (written while dead: a first write)
                keep[i] = 2
            continue
        if (soft_next and pos[i] == p + 1 and bs.w_iter[blk[i]] != s.iters
                and q + ps.t_blk * c > now + dur + ps.lat):
            continue
        keep[i] = 1
        m += 1
    out = np.empty(m, dtype=np.int64)
    pop = np.empty(placed - m, dtype=np.int64)
    j = 0
    k = 0
    for i in range(placed):
        if keep[i] == 1:
            out[j] = blk[i]
            j += 1
        elif keep[i] == 2:
            pop[k] = blk[i]
            k += 1
    return out, pop[:k]


@nb.njit(cache=True, nogil=True)
def _write_out(out, pf, evict, discard, populate):
    a = pf.shape[0]
    b = a + evict.shape[0]
    c = b + discard.shape[0]
    out[:a] = pf
    out[a:b] = evict
    out[b:c] = discard
    out[c:c + populate.shape[0]] = populate


@nb.njit(cache=True, nogil=True)
def plan(parts, cur, view, ctx):
    """The decision for the running launch (``cur``: its blocks). ``parts``: ``(history, moves, blocks, victims,
    plan)``; ``view``: ``(resident, in_flight, n_ids, capacity, used, now)``; ``ctx``: ``(duration, window,
    remap_lim, shift_from)``: the running launch's duration, the window, the positions the learned moves apply
    before (0: none) and the first position the layer stride applies to (``INF``: none). The blocks go to the plan's
    ``out``: those to prefetch, evict, discard, populate. Returns ``(status, n_prefetch, n_evict, n_discard,
    n_populate, thrash, mispredicted, live, pooled, refilled)``: status 0 when there was nothing to place (then at most the free
    margin was kept; counted nowhere), ``live`` the prefetched blocks that cross the link, ``pooled`` whether the
    victims came from the pool, ``refilled`` whether a full scan refilled it."""
    h, mv, bs, vs, pl = parts
    s = h.s[0]
    ps = pl.s[0]
    vr = vs.s[0]
    resident, in_flight, n_ids, capacity, used, now = view
    dur, window, remap_lim, shift_from = ctx
    res = resident[:n_ids]
    infl = in_flight[:n_ids]
    has_p = s.has_p
    p = s.p if has_p else np.int64(-1)
    base = s.base
    end = base + s.n
    nu = h.nu
    empty = np.empty(0, dtype=np.int64)
    pool_k = 0
    if has_p:
        vr.age += 1
        if p >= vr.stale:
            pool_k = vr.k
    # stamp: plan (its call)
    miss = missing(cur, res, infl) if cur.shape[0] else empty
    # stamp: missing
    scan = ps.prefetch and has_p
    pa = 0
    pb = 0
    lo = 0
    hi = -1
    if scan:
        lo = max(p + 1, ps.horizon)
        hi = min(p + window, end - 1)
        if lo > p + 1:  # (always re-check the very next launch: a block may have been evicted since)
            pa, pb = flat_span(h, p + 1, p + 2)
    free = max(0, capacity - used - ps.margin)
    # (we choose the victims)
    own = ps.pre_evict and not (ps.driver_victims and has_p and s.soft == 0 and ps.exact_run >= ps.dv_run)
    paced = ps.pace and own and ps.t_blk > 0
    q = max(ps.q_end, now)
    waits = ps.stall_aware and ps.waits
    cap = 0
    if lo <= hi:
        # the window pass stops once more blocks are missing than this decision could place (free room + what the
        # link can take before the next decision): the rest would be re-read next time anyway
        if paced:
            spare = (now + dur + ps.lead_s - q) / ps.t_blk
            if waits:  # (the next decision point comes only after the running launch's blocks arrive)
                spare = (dur + ps.lead_s) / ps.t_blk
            cap = free + max(0, int(spare)) + 8
        else:
            cap = free + capacity
        if free == 0 and cap <= 8:
            hi = min(hi, p + 1)  # link busy, no room: only the next launch can be served now
    until = now + dur + ps.lead_s
    if waits:
        until += max(0.0, q - now)
    budget = 0
    extra = -1
    if paced:
        # evictions make room for at most the candidates up to the next launch and this many more (read only when
        # the candidates outnumber the free room): rounded up after an exact match, down after a soft one
        # (with ``writeback_clock``, at a soft match from the later of the queue's end and the predicted end of the
        # write-backs: see the module docstring)
        qb = max(q, ps.d_end) if ps.writeback_clock and s.soft != 0 else q
        room = (until - (qb + free * ps.t_blk)) / ps.t_blk
        budget = max(0, int(np.ceil(room) if s.soft == 0 else room))
        if ps.batch > 1 and s.soft == 0 and budget > 0:
            budget = max(budget, ps.batch)  # (``batch_share``: see the module docstring)
        extra = free + budget + 1
    s_old = mv.s[0].s_old
    s_new = mv.s[0].s_new
    plain = remap_lim == 0 and not (shift_from < INF and (s_old != 0 or s_new != 0))
    whole = paced and ps.whole and s.soft == 0 and budget > 0 and plain
    if not plain:  # (a translated or shifted pass updates other blocks than those recorded)
        ps.v_lo = 0
        ps.v_hi = -1
    tr = (mv.remap, mv.rend, remap_lim, shift_from, s_old, s_new, bs.w_iter, s.iters, bs.dead,
          ps.moved_births, mv.s[0].dead_births)
    blk, pos, scan_hi, spanned = window_candidates(h, miss, (pa, pb, lo, hi), p, cap, tr, (res, infl, pl.mark),
                                                   (ps.v_lo, ps.v_hi), extra, whole)
    # stamp: window pass
    if scan and plain and lo <= scan_hi:
        if ps.v_lo <= lo <= ps.v_hi + 1:
            ps.v_hi = max(ps.v_hi, scan_hi)
        else:
            ps.v_lo = lo
            ps.v_hi = scan_hi
    if not (miss.shape[0] or pb > pa or spanned > 0):
        if own and ps.margin > 0:
            evict, discard = margin(bs, vs, nu, cur, (res, capacity, used, ps.margin), p)
            _write_out(pl.out, empty, evict, discard, empty)
            return 0, 0, evict.shape[0], discard.shape[0], 0, 0, 0, 0, False, False
        return 0, 0, 0, 0, 0, 0, 0, 0, False, False
    n = blk.shape[0]
    near_pos = p + 1 if has_p else np.int64(-1)
    evict = empty
    discard = empty
    wasted = 0
    mis = 0
    pooled = False
    refill = empty
    if not own:
        # without victims of our own the driver evicts for whatever is queued: the running and the next launch's
        # blocks go beyond the free room, further ones only into free room
        placed = min(n, max(count_le(pos, 0, near_pos), free))
    else:
        placed = min(free, n)
        rest = n - placed
        if rest and paced:
            k = min(rest, count_le(pos, placed, near_pos) + budget)
            if whole and 0 < k < rest:  # (``whole``: see the module docstring)
                t_last = pos[placed + k - 1]
                if base <= t_last < end and h.h_soft[t_last - base] == 0:
                    kw = count_le(pos, placed, t_last)
                    for i in range(placed + k, placed + kw):
                        if moves_data(bs, blk[i]):  # (only where the blocks it adds bring data: the docstring)
                            k = kw
                            break
            rest = k
        if rest:
            vict, vkey, pooled, refill = choose(vs, keys_of(vs, bs, nu), res, cur, p, rest, pool_k)
            k_ok = first_not_above(vkey, pos, placed, nu, vict)
            if k_ok and ps.writeback_clock:
                nd = 0
                for i in range(k_ok):
                    if bs.dirty[vict[i]] and not bs.dead[vict[i]]:
                        nd += 1
                if nd:
                    ps.d_end = max(ps.d_end, now) + nd * ps.t_blk
            if k_ok:
                evict, discard, wasted, mis = take_victims(bs, vict[:k_ok], nu, p, near_pos + max(1, window // 8))
                # stamp: take_victims
            placed += k_ok
    pf = empty
    pop = empty
    if ps.prefetch:
        pf = blk[:placed]
        if placed and q > now + ps.lat:
            pf, pop = _late_left_out(h, bs, pl, (blk, pos, placed, q), (now, dur))
            # stamp: late blocks left out
        if has_p:
            if placed == blk.shape[0]:
                ps.horizon = max(ps.horizon, scan_hi + 1)
            elif placed:
                ps.horizon = max(ps.horizon, pos[placed] if pos[placed] >= 0 else p + 1)
    live = 0
    if pop.shape[0]:
        mark_prefetched(bs, pop)  # (the running launch's blocks: already in the pool)
    if pf.shape[0]:
        mark_prefetched(bs, pf)
        for i in range(pf.shape[0]):
            if _moves(h, bs, ps, pf[i]):
                live += 1
        ps.q_end = q + live * ps.t_blk
        if has_p and not refill.shape[0]:
            pool_add(vs, pf)
    # stamp: prefetched marked, pool
    if refill.shape[0]:
        pool_refill(vs, refill, cur, infl, pf)
        # stamp: pool_refill
    _write_out(pl.out, pf, evict, discard, pop)
    # stamp: decision copied out
    return (1, pf.shape[0], evict.shape[0], discard.shape[0], pop.shape[0], wasted, mis, live, pooled,
            refill.shape[0] > 0)
