"""The policy's hooks in compiled code, composed from its parts: one call per launch (``step``), one per fault,
eviction and free. The policy class (``__init__.py``) calls them and builds the ``Decision``.

``step``, for the launch about to run:

1. the pending (previous) launch is committed to the history and the correlation tables learn it; the running
   launch's n-gram and stable keys are counted; the history is trimmed when full;
2. the correlation tables find where the launch is (``find``) and the pointer moves there: on along the history
   (``advance``, with the victim pool's due blocks) or by a jump (``rebuild``);
3. with known accesses, the moves and the layer stride are learned from the launch, and its blocks marked; without,
   what it used is taken to be what was predicted (and came in) plus what faults add (``fault``);
4. it becomes the pending launch; when blocks it needs came back after thrash or are late, the window monitor (in
   Python) must see them before the plan: the call stops (``MONITOR``) and the policy calls ``replan``;
5. the plan, its decision in the plan's ``out``, and the counts.

The ``# stamp: <stage>`` comments here and in the parts' kernels mark where a stage ends (``# stamp-start``: where
the timing starts). They are only comments; ``bench/kernel_profile.py`` compiles a copy of the policy with a
cycle-counter read at each and prints the time each stage takes per launch.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from . import correlation as corr
from .blocks import cur_marks, decided, launch_marks, note_thrash
from .history import INF, advance, commit_pending, flat_span, has_room, rebuild, record_end, set_pending, trim
from .moves import learn_moves, learn_shift, move_touches, moved_reach, remap_limit
from .parts import define_part
from .plan import plan
from .victims import pool_add, pool_due, pool_rekey

# The policy's counts (``UvmPrefetchPolicy.stats`` is a mapping over this record).
STAT_NAMES = ("launches", "matched", "soft", "resync", "unpredicted", "prefetched_blocks", "evicted_blocks",
              "discarded_blocks", "populated_blocks", "late_blocks", "predicted_faults", "thrash_blocks", "mispredicted_blocks",
              "refetched_blocks", "moved_blocks", "read_mostly_blocks", "prefer_host_blocks", "stable_resync",
              "pooled_victim_scans", "pool_refills", "pool_waits_lifted")
COUNTS = np.dtype([(n, np.int64) for n in STAT_NAMES])
# The link time and compute time of this iteration, for the advice
ADVICE = np.dtype([("link_blocks", np.int64), ("compute_s", np.float64)], align=True)

# What ``step`` / ``replan`` leave to the caller: grow the history and call again; the window monitor, then
# ``replan``; the decision is in the plan's ``out``
NEED_ROOM, MONITOR, DECIDED = range(3)

FIELDS = ("hist", "corr", "moves", "blocks", "victims", "plan", "advice", "counts")


# Every part of the policy (``FIELDS``: the parts' StructRefs, the advice and count records) as one argument
PolicyStateType, PolicyStateRef, policy_state = define_part(__name__, "PolicyState", FIELDS)


def entry_point(kernel, args: tuple):
    """The compiled entry point of ``kernel`` (a Numba dispatcher already called with ``args``) for the types of
    ``args``, or None where this Numba keeps it elsewhere. Calling it skips the dispatcher's type resolution (~1 us
    warm, ~10 us with the caches cold as between two live hooks, measured with ``bench/policy_cost.py --disturb``)
    and checks no argument type: the caller passes only arguments of the same types."""
    try:
        return kernel.overloads[tuple(kernel.typeof_pyval(a) for a in args)].entry_point
    except (AttributeError, KeyError, TypeError):
        return None


# ------------------------------------------------------------------------------------------- compiled
@nb.njit(cache=True, nogil=True)
def _go(st, q, moves_now):
    """The pointer advances to ``q``: the positions before the remap limit are translated (a translation empties the
    verified span), the pool takes the blocks whose key may rise there, then ``advance``."""
    h = st.hist
    s = h.s[0]
    lim = 0
    if q < s.iter_start:
        lim = remap_limit(st.moves, moves_now, q, record_end(h, q))
    if lim > 0:
        ps = st.plan.s[0]
        ps.v_lo = 0
        ps.v_hi = -1
    pool_due(st.victims, h, st.moves.remap, q)
    advance(h, st.moves, q, lim, st.blocks.dead)


@nb.njit(cache=True, nogil=True)
def _jump(st, q):
    """The pointer jumps to ``q``: the plan starts after it, the pool and the verified span are gone (and the pool
    waits for the shifted predictions of this iteration's record), every next use is rebuilt."""
    h = st.hist
    s = h.s[0]
    ps = st.plan.s[0]
    vr = st.victims.s[0]
    mr = st.moves.s[0]
    ps.horizon = q + 1
    ps.v_lo = 0
    ps.v_hi = -1
    vr.on = False
    vr.last_q = q
    vr.stale = s.base + s.n + 1 if (mr.s_old != 0 or mr.s_new != 0) else 0
    rebuild(h, q)


@nb.njit(cache=True, nogil=True)
def _learn(st, q, launch, rec_end):
    """A launch with known accesses (``launch``: ``(blocks, writes)``) matched at ``q``: the moves against an earlier
    iteration's record (``rec_end`` > ``q``: its end), the layer stride against an earlier layer of this one."""
    h = st.hist
    s = h.s[0]
    mv = st.moves
    mr = mv.s[0]
    vr = st.victims.s[0]
    blocks, writes = launch
    touched = move_touches(mv, h, q, writes) if mr.track_moves and q < rec_end else writes[:0]
    if touched.shape[0]:  # (empty: the moves would change nothing)
        moved, settled = learn_moves(mv, h, q, writes, rec_end, st.blocks.dead)
        if moved or settled:  # (next uses changed: a moved block took its old address's, revised ones rose)
            if vr.through_moves:
                pool_rekey(st.victims, h, mv.remap, touched, q)
            else:
                vr.on = False
            ps = st.plan.s[0]
            ps.v_lo = 0
            ps.v_hi = -1
        if moved:
            if not vr.through_moves:  # (translated predictions lie before the end of the followed record)
                vr.stale = max(vr.stale, moved_reach(h, writes, rec_end))
            st.counts[0].moved_blocks += moved
    if s.soft != 0 and q >= s.iter_start and mr.layer_stride:
        a, b = flat_span(h, q, q + 1)
        ok_o, d_o, ok_n, d_n = learn_shift(h.f_blk[a:b], h.f_w[a:b], launch, st.blocks.w_iter, s.iters)
        if ok_o:
            mr.s_old = d_o
        if ok_n:
            mr.s_new = d_n
        if ok_o or ok_n:  # (shifted predictions lie within this iteration's record so far)
            vr.on = False
            vr.stale = max(vr.stale, s.base + s.n + 1)
        if mr.s_old != 0 or mr.s_new != 0:
            mr.shift_it = True


@nb.njit(cache=True, nogil=True)
def _decide(st, cur, view, timing):
    """The plan for the running launch (``timing``: ``(duration, window)``), counted."""
    h = st.hist
    s = h.s[0]
    mv = st.moves
    c = st.counts[0]
    lim = 0
    shift_from = INF
    if s.has_p and s.p < s.iter_start:
        lim = remap_limit(mv, c.moved_blocks != mv.s[0].moved_at_start, s.p, record_end(h, s.p))
    if s.has_p and s.p >= s.iter_start and (mv.s[0].s_old != 0 or mv.s[0].s_new != 0):
        shift_from = s.iter_start
    dur, window = timing
    status, n_pf, n_ev, n_dc, n_pp, wasted, mis, live, pooled, refilled = plan(
        (h, mv, st.blocks, st.victims, st.plan), cur, view, (dur, window, lim, shift_from))
    if pooled:
        c.pooled_victim_scans += 1
    if refilled:
        c.pool_refills += 1
    if status:
        c.mispredicted_blocks += mis
        c.thrash_blocks += wasted
        c.evicted_blocks += n_ev
        c.discarded_blocks += n_dc
        c.populated_blocks += n_pp
        if n_pf:
            c.prefetched_blocks += n_pf
            st.advice[0].link_blocks += live
    decided(st.blocks, cur)
    # stamp: counted
    return n_pf, n_ev, n_dc, n_pp


@nb.njit(cache=True, nogil=True)
def _count_match(c, how):
    if how == corr.M_MATCHED:
        c.matched += 1
    elif how == corr.M_STABLE:
        c.stable_resync += 1
    elif how == corr.M_SOFT:
        c.soft += 1
    elif how == corr.M_NONE:
        c.unpredicted += 1
    else:
        c.resync += 1


@nb.njit(cache=True, nogil=True)
def step(st, launch, blocks, writes, view):
    """``on_launch``: see the module docstring. ``launch`` is ``(key, name, sig, index, duration, known, window)``
    (``sig`` only without known accesses: the launch's exact signature is then its exec id's hash); ``blocks`` /
    ``writes`` its accesses (empty when not known); ``view`` is ``(resident, in_flight, n_ids, capacity, used,
    now)``. Returns ``(code, n_prefetch, n_evict, n_discard, again, late, has_p, n_populate)``: ``code`` one of
    ``NEED_ROOM`` (nothing done), ``MONITOR`` (``again`` blocks back after thrash, ``late`` ones in flight; the plan
    is left to ``replan``) or ``DECIDED`` (the decision's lengths in ``out``)."""
    h = st.hist
    s = h.s[0]
    c = st.counts[0]
    if not has_room(h):
        return NEED_ROOM, 0, 0, 0, 0, 0, False, 0
    key, name, sig, index, dur, known, window = launch
    c.launches += 1
    # stamp-start
    if known:
        sig = corr.launch_sig(name, blocks)
    moves_now = c.moved_blocks != st.moves.s[0].moved_at_start
    committed = s.pend
    if committed:
        keys = (s.pstab, s.pngram)
        pkey, pname, psig = s.pkey, s.pname, s.psig
        r = commit_pending(h)
        corr.commit(st.corr, pkey, pname, psig, r, keys)
    bs = st.blocks
    stab, ngram = corr.count(st.corr, key, known and st.corr.s[0].stable_sync, (blocks, writes, bs.w_iter, s.iters))
    # stamp: commit_step
    ps = st.plan.s[0]
    if committed and s.n > s.limit:
        trim(h, s.n // 2)
        ps.v_lo = 0
        ps.v_hi = -1
        ps.horizon = max(ps.horizon, s.base)
    how, q, soft = corr.find(st.corr, h, (key, name, sig, stab), moves_now)
    _count_match(c, how)
    s.soft = soft
    ps.exact_run = ps.exact_run + 1 if how == corr.M_MATCHED else 0
    if how == corr.M_NONE:
        s.has_p = False
        s.p = -1
    elif how == corr.M_MATCHED or how == corr.M_SOFT:
        _go(st, q, moves_now)
    else:
        if s.has_p:
            corr.visit(st.corr, h, s.p, q, c.launches)
        _jump(st, q)
    # stamp: match
    resident, in_flight = view[0], view[1]
    vs = st.victims
    if known:
        if s.has_p:
            _learn(st, q, (blocks, writes), record_end(h, q) if q < s.iter_start else 0)
            # stamp: learn moves and stride
        launch_marks(bs, (blocks, writes), s.iters, index, h.wbuf)
        pool_add(vs, blocks)
        again, late = cur_marks(bs, blocks, resident, in_flight)
        # stamp: launch_marks
        cur = blocks
    else:
        # what the launch used is what was predicted (and came in) plus what faults add (``fault``)
        cur = np.empty(0, dtype=np.int64)
        if s.has_p:
            a, b = flat_span(h, q, q + 1)
            cur = h.f_blk[a:b].copy()
        pool_add(vs, cur)
        again = 0
        late = 0
        if cur.shape[0]:
            again, late = cur_marks(bs, cur, resident, in_flight)
    set_pending(h, (key, name, sig, stab, ngram, dur), cur, known)
    # stamp: pending set
    st.advice[0].compute_s += dur
    st.plan.s[0].waits = late > 0
    if again and s.has_p:  # (without a prediction the window is not what failed)
        c.refetched_blocks += again
    if late:
        c.late_blocks += late
    if again or late:
        return MONITOR, 0, 0, 0, again, late, s.has_p, 0
    n_pf, n_ev, n_dc, n_pp = _decide(st, cur, view, (dur, window))
    return DECIDED, n_pf, n_ev, n_dc, 0, 0, s.has_p, n_pp


@nb.njit(cache=True, nogil=True)
def replan(st, launch, blocks, view):
    """The plan of a launch that ``step`` left to the window monitor (arguments as ``step``'s)."""
    # stamp-start
    h = st.hist
    s = h.s[0]
    _, _, _, _, dur, known, window = launch
    cur = blocks if known else h.pbuf[:s.pk]
    n_pf, n_ev, n_dc, n_pp = _decide(st, cur, view, (dur, window))
    return DECIDED, n_pf, n_ev, n_dc, 0, 0, s.has_p, n_pp


@nb.njit(cache=True, nogil=True)
def fault(st, blocks, known):
    """``on_fault``: blocks the running launch needed that were neither resident nor in flight. They join what it
    used (without known accesses), the link time of this iteration and the pool; returns how many of them were
    predicted for it (late: the window was too short), counted."""
    h = st.hist
    s = h.s[0]
    if s.pend and not known:
        u = np.unique(np.concatenate((h.pbuf[:s.pk], blocks)))
        h.pbuf[:u.shape[0]] = u
        s.pk = u.shape[0]
        s.phas_w = False
    st.advice[0].link_blocks += blocks.shape[0]
    pool_add(st.victims, blocks)
    late = 0
    if s.has_p:
        a, b = flat_span(h, s.p, s.p + 1)
        mark = st.plan.mark
        for i in range(a, b):
            mark[h.f_blk[i]] = 1
        for i in range(blocks.shape[0]):
            if mark[blocks[i]]:
                late += 1
        for i in range(a, b):
            mark[h.f_blk[i]] = 0
        st.counts[0].predicted_faults += late
    return late


@nb.njit(cache=True, nogil=True)
def evicted(st, blocks):
    """``on_evict``: the caller evicted these on its own; prefetched ones unused are thrash or mispredictions."""
    h = st.hist
    bs = st.blocks
    for i in range(blocks.shape[0]):
        bs.dirty[blocks[i]] = False
    wasted, mis = note_thrash(bs, blocks, h.nu, h.s[0].p if h.s[0].has_p else -1, -1)
    c = st.counts[0]
    c.mispredicted_blocks += mis
    c.thrash_blocks += wasted


@nb.njit(cache=True, nogil=True)
def freed(st, blocks):
    """``on_free`` where frees count as deaths: the blocks are dead (and may rank higher as victims)."""
    for i in range(blocks.shape[0]):
        st.blocks.dead[blocks[i]] = True
    pool_add(st.victims, blocks)
